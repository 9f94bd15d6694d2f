"""One training run over many processes with JAX's own multi-controller runtime (``jax.distributed``).

Every process runs the same script. :func:`initialize` joins the processes into one JAX
runtime; :class:`jes.generation.Trainer` then builds its device mesh over every device of
every process, and the one compiled generation step shards the population's chunks over
all of them (fitness and per-chunk statistics are all-gathered, then summed in chunk
order, so the result is bit-identical to one process on one device). Process 0 writes the
logs and checkpoints; every process returns the same result.

Where the coordinates come from, first match wins:

1. the arguments of :func:`initialize`;
2. ``JES_COORDINATOR``, ``JES_NUM_PROCESSES``, ``JES_PROCESS_ID`` (set by ``jes launch``);
3. JAX's cluster detection: Slurm (``srun``), Cloud TPU pods, Open MPI, Kubernetes
   (``JAX_COORDINATOR_ADDRESS`` is honoured there too).

JAX's runtime is not elastic: when one process dies, the others stop (JAX's coordination
service ends them once the dead process misses its heartbeats; ``jes launch`` stops them
at once). Resume from the last checkpoint with any number of processes. For fleets where
machines come and go, use the ZeroMQ backend (``jes-worker``) instead.
"""
from __future__ import annotations

import dataclasses
import errno
import ipaddress
import os
import signal
import socket
import sys
import threading
import time
from typing import Sequence

import jax

from jes.distributed.launch import coordinator_error

ENV_COORDINATOR = "JES_COORDINATOR"
ENV_NUM_PROCESSES = "JES_NUM_PROCESSES"
ENV_PROCESS_ID = "JES_PROCESS_ID"

HOW_TO_START = (
    "start every process of the run with the same script: `jes launch --processes N -- python script.py` on one "
    "machine or on hosts without a scheduler, `srun` under Slurm, or on every host of a TPU pod slice; or call "
    "jes.distributed.initialize(coordinator='HOST:PORT', num_processes=N, process_id=I) in each process"
)


class DistributedSetupError(RuntimeError):
    """The multi-process runtime could not be started as asked (:func:`initialize`, ``jes.train(...,
    distributed=True)``); the message says what to change. Importable as ``jes.distributed.DistributedSetupError``."""


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """Where this process stands in a multi-process run.

    Attributes:
        process_id: this process's index (0 writes logs and checkpoints).
        num_processes: processes in the run.
        local_devices: this process's devices.
        num_devices: devices over all processes (the population is sharded over all of them).
    """

    process_id: int
    num_processes: int
    local_devices: tuple
    num_devices: int

    @property
    def is_primary(self) -> bool:
        """Whether this is process 0."""
        return self.process_id == 0


def is_initialized() -> bool:
    """Whether ``jax.distributed`` has been initialised in this process (by jes or by the user)."""
    from jes.cpu import distributed_initialized

    return distributed_initialized()


def _backends_started() -> bool:
    from jes.cpu import _backends_initialized

    return _backends_initialized()


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise DistributedSetupError(f"{name}={value!r} must be an integer") from None


def info() -> ProcessInfo:
    """This process's :class:`ProcessInfo` (starts JAX's backends if they are not yet running)."""
    return ProcessInfo(process_id=jax.process_index(), num_processes=jax.process_count(),
                       local_devices=tuple(jax.local_devices()), num_devices=jax.device_count())


def initialize(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None,
               *, local_device_ids: Sequence[int] | None = None, heartbeat_timeout_seconds: int | None = None,
               initialization_timeout: int = 300, coordinator_bind_address: str | None = None) -> ProcessInfo:
    """Join this process to a multi-process JAX run; call it first, before any JAX computation.

    Example (every process runs the same script)::

        import jes
        jes.distributed.initialize()          # coordinates from jes launch / Slurm / a TPU pod
        result = jes.train(jes.GRUPolicy(), "CartPole-v1")

    Args:
        coordinator: ``"HOST:PORT"`` of process 0's coordination service (default:
            ``$JES_COORDINATOR``, else detected from the cluster).
        num_processes: processes in the run (default: ``$JES_NUM_PROCESSES``, else detected).
        process_id: this process's index, ``0 .. num_processes-1`` (default: ``$JES_PROCESS_ID``,
            else detected).
        local_device_ids: this process's accelerator ids (default: all it sees).
        heartbeat_timeout_seconds: how long the others wait for a silent process before they all
            stop (JAX's default, 100 s, when ``None``).
        initialization_timeout: seconds to wait for every process to join.
        coordinator_bind_address: ``"HOST:PORT"`` where process 0's coordination service listens (default:
            ``$JAX_COORDINATOR_BIND_ADDRESS``, else the coordinator's own address when it is a loopback one
            (``127.0.0.1``, ``::1``, ``localhost``), else every interface, as JAX does). The service does not
            authenticate: bind it to the interface the other hosts reach, on a network you trust.

    Returns:
        This process's :class:`ProcessInfo`. Calling it again (or after your own
        ``jax.distributed.initialize``) returns the running runtime's info.

    Raises:
        DistributedSetupError: bad or missing coordinates, JAX already computing in this process, or (process 0)
            the coordinator's address cannot be listened on (a port in use).
    """
    if is_initialized():
        current = info()
        if (num_processes is not None and num_processes != current.num_processes) or (
                process_id is not None and process_id != current.process_id):
            raise DistributedSetupError(
                f"jax.distributed is already running as process {current.process_id} of {current.num_processes}; "
                f"cannot join again as process {process_id} of {num_processes}")
        return current
    coordinator = coordinator or os.environ.get(ENV_COORDINATOR) or None
    num_processes = num_processes if num_processes is not None else _env_int(ENV_NUM_PROCESSES)
    process_id = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
    if num_processes is not None and (isinstance(num_processes, bool) or not isinstance(num_processes, int)
                                      or num_processes < 1):
        raise DistributedSetupError(f"num_processes must be a positive integer, got {num_processes!r}")
    if process_id is not None and num_processes is not None and not 0 <= process_id < num_processes:
        raise DistributedSetupError(f"process_id={process_id} is outside 0..{num_processes - 1} "
                                    f"(num_processes={num_processes})")
    if coordinator is not None and (why := coordinator_error(coordinator)):
        raise DistributedSetupError(why)
    if _backends_started():
        raise DistributedSetupError(
            "JAX is already computing in this process, so it can no longer join a multi-process run: call "
            "jes.distributed.initialize() (or jes.train(..., distributed=True)) before any other JAX code, "
            "e.g. first thing in the script")
    kwargs = dict(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id,
                  local_device_ids=local_device_ids, initialization_timeout=initialization_timeout)
    if heartbeat_timeout_seconds is not None:
        kwargs["heartbeat_timeout_seconds"] = heartbeat_timeout_seconds
    if coordinator is not None:
        bind = bind_address(coordinator, coordinator_bind_address)
        if bind is not None:  # None: JAX's default, every interface
            kwargs["coordinator_bind_address"] = bind
        if process_id == 0:
            # JAX's coordination service crashes the process (SIGSEGV inside gRPC) when it cannot listen: say why.
            _check_can_listen(bind or "[::]:" + coordinator.rpartition(":")[2], coordinator)
    elif coordinator_bind_address is not None:
        kwargs["coordinator_bind_address"] = coordinator_bind_address
    try:
        jax.distributed.initialize(**kwargs)
    except (ValueError, TypeError) as err:
        raise DistributedSetupError(f"could not start the multi-process JAX runtime ({err}); {HOW_TO_START}") from err
    except RuntimeError as err:
        raise DistributedSetupError(
            f"could not join the multi-process JAX runtime at {coordinator or 'the detected coordinator'} "
            f"as process {process_id} of {num_processes}: {err}. Check that every process was started, that "
            f"process 0 can listen on that address and the others reach it") from err
    _end_at_once_on_an_uncaught_error()
    return info()


END_DELAY_SECONDS = 1.0


def end_now_if_multi_process(status: int, error: BaseException | None = None) -> None:
    """End a process that failed alone in a multi-process run at once, with ``status``.

    JAX's shutdown at exit waits at a barrier for every process, while the others wait for this one in a collective:
    a process that failed (a compile error on one host) hung for 5 minutes, until JAX aborted another process, which
    ``jes launch`` then named as the one that failed (a trial). Ended at once, the launcher (or the cluster) sees this
    process exit and stops the others, naming it. Output is flushed first.

    Left to JAX's shutdown, which waits for every process: an ``error`` every process of the run raised at the same
    generation (``error.stops_every_process``: a callback's error, which each process hears of, non-finite values),
    and Ctrl-C or SIGTERM (``status`` 130 or 143, which a launcher or a cluster usually sends every process). There
    process 0 is still saving the run's checkpoint (seconds in a multi-process run), and a process ended first would
    have had a launcher (jes launch, Slurm's --kill-on-bad-exit) kill process 0 in the save (a review). That wait is
    bounded (:func:`end_grace_seconds`, 120 s): where the others never come (a signal to one process alone), the
    process then ends with ``status``. One process: nothing waits for it, and ``atexit`` handlers and open files are
    left to end as they do."""
    if not _several_processes():
        return
    if status in (128 + signal.SIGINT, 128 + signal.SIGTERM) or getattr(error, "stops_every_process", False):
        # Waited for, boundedly: a signal one process alone got (a Ctrl-C in one host's terminal, one pod evicted),
        # or got while the others were already in the next generation's collective, left both waiting for each other
        # (in the barrier and in the collective) until JAX's 5-minute deadline aborted them (a review)
        grace = end_grace_seconds()
        ender = threading.Timer(grace, _end, (status,))
        ender.daemon = True
        ender.start()
        return
    # A moment first: a process whose error is another's failure (a collective's "connection closed by peer") then
    # ends that long after the process that failed first, which jes launch names (both ended within its 50 ms poll)
    time.sleep(END_DELAY_SECONDS)
    _end(status)


END_GRACE_ENV = "JES_END_GRACE_SECONDS"
END_GRACE_SECONDS = 120.0


def end_grace_seconds() -> float:
    """How long a process of a multi-process run that stopped with the others (or was interrupted) waits in JAX's
    shutdown for them, process 0's checkpoint save included, before it ends anyway: ``$JES_END_GRACE_SECONDS``, else
    120 s."""
    try:
        value = float(os.environ.get(END_GRACE_ENV, END_GRACE_SECONDS))
    except ValueError:
        return END_GRACE_SECONDS
    return value if value >= 0 else END_GRACE_SECONDS


def _several_processes() -> bool:
    if not is_initialized():
        return False
    try:
        return jax.process_count() > 1
    except Exception:  # noqa: BLE001 - a runtime that cannot say: as one process
        return False


def _end(status: int) -> None:
    """End the process now with ``status``, its output flushed (no atexit handlers: JAX's would wait)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream: nothing to flush
            pass
    os._exit(status)


def _end_at_once_on_an_uncaught_error() -> None:
    """A script's uncaught exception in a process of a multi-process run ends it at once, after Python prints it
    (:func:`end_now_if_multi_process`, status 1): it otherwise hung in JAX's shutdown. An error every process raised
    (``stops_every_process``) and Ctrl-C wait in JAX's shutdown for the others, boundedly; ``sys.exit`` is left as it
    is. Installed once, by :func:`initialize`."""
    previous = sys.excepthook
    if getattr(previous, "_jes_ends_at_once", False):
        return

    def hook(kind, value, traceback):
        previous(kind, value, traceback)
        if issubclass(kind, Exception):
            end_now_if_multi_process(1, value)
        elif issubclass(kind, KeyboardInterrupt):  # waits for the others, boundedly
            end_now_if_multi_process(128 + signal.SIGINT, value)

    hook._jes_ends_at_once = True
    sys.excepthook = hook


def bind_address(coordinator: str, explicit: str | None = None) -> str | None:
    """Where process 0's coordination service listens for ``coordinator`` (``None``: every interface).

    ``explicit``, else ``$JAX_COORDINATOR_BIND_ADDRESS``, else the coordinator itself when it is a loopback address:
    the service does not authenticate, and a run on one machine has no reason to be reachable from others. Any other
    host binds every interface, as JAX does: the name the other hosts use may resolve to another address on process
    0's host (NAT, containers, a hostname mapped to 127.0.1.1), where binding it alone would leave them unable to
    connect.
    """
    if explicit or os.environ.get("JAX_COORDINATOR_BIND_ADDRESS"):
        return explicit or os.environ["JAX_COORDINATOR_BIND_ADDRESS"]
    return coordinator if _is_loopback(coordinator.rpartition(":")[0]) else None


def _is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


def _check_can_listen(address: str, coordinator: str) -> None:
    """Raise :class:`DistributedSetupError` unless a TCP socket can listen on ``address`` (``HOST:PORT``) right now."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, ValueError) as err:
        if host in ("::", "") and port.isdigit():  # the IPv6 wildcard on a host without IPv6: gRPC's is IPv4's
            return _check_can_listen(f"0.0.0.0:{port}", coordinator)
        raise DistributedSetupError(f"process 0 cannot listen on the coordinator address {address} ({err}); check "
                                    f"the coordinator's HOST:PORT") from err
    failures, unsupported = [], 0
    for family, kind, proto, _, sockaddr in infos:
        try:
            sock = socket.socket(family, kind, proto)
        except OSError:  # a host without IPv6 (ipv6.disable=1): gRPC listens on IPv4 alone there
            unsupported += 1
            if family == socket.AF_INET6 and host in ("::", ""):
                _check_can_listen(f"0.0.0.0:{port}", coordinator)
            continue  # (another family's address of the name: gRPC listens on those it can)
        with sock:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC: a port in TIME_WAIT is free
                if family == socket.AF_INET6 and host in ("::", ""):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # [::] takes IPv4 too, as gRPC's
                sock.bind(sockaddr)
                sock.listen()
            except OSError as err:
                failures.append(err)
    # gRPC listens on whichever of the name's addresses it can (localhost without IPv6), but one taken by another
    # program would take the other processes' connections.
    busy = [err for err in failures if err.errno == errno.EADDRINUSE]
    if busy or (failures and len(failures) + unsupported >= len(infos)):
        err = (busy or failures)[0]
        what = address if address == coordinator else f"{address} (coordinator {coordinator})"
        if busy:
            why = (f"port {port} is in use (another program, or an earlier run still stopping, listens on it). "
                   f"Choose another port: jes launch --coordinator HOST:PORT (or leave --coordinator out for a free "
                   f"one on this machine), or coordinator='HOST:PORT' in jes.distributed.initialize")
        else:
            why = (f"{err.strerror or err}. Give an address of process 0's own host (coordinator_bind_address= or "
                   f"$JAX_COORDINATOR_BIND_ADDRESS)")
        raise DistributedSetupError(f"process 0 cannot listen on the coordinator address {what}: {why}") from err


def ensure_initialized() -> ProcessInfo:
    """What ``jes.train(..., distributed=True)`` calls: the running runtime, or one started from the environment."""
    if is_initialized():
        return info()
    if os.environ.get(ENV_NUM_PROCESSES) is None and not _cluster_detected():
        raise DistributedSetupError(f"distributed=True, but this process was not started as part of a "
                                    f"multi-process run: {HOW_TO_START}")
    return initialize()


def _cluster_detected() -> bool:
    """Whether JAX's cluster detection (Slurm, TPU pod, Open MPI, k8s, ...) recognises this environment."""
    try:
        from jax._src.clusters import ClusterEnv
    except ImportError:  # pragma: no cover - other jax layouts: let jax.distributed decide
        return True
    for env in getattr(ClusterEnv, "_cluster_types", ()):
        try:
            if env.is_env_present():
                return True
        except Exception:  # a detector that cannot run here (missing optional package)
            continue
    return bool(os.environ.get("JAX_COORDINATOR_ADDRESS"))
