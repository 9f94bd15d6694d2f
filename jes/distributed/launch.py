"""``jes launch``: start the N processes of a ``jax.distributed`` run on this machine.

For trying the multi-process backend on one machine, and for clusters without a scheduler
(run ``jes launch --coordinator HOST0:PORT --num-processes N --first-process-id K`` on each host).
Each process gets ``JES_COORDINATOR``, ``JES_NUM_PROCESSES`` and ``JES_PROCESS_ID`` (read by
:func:`jes.distributed.initialize` and ``jes.train(..., distributed=True)``), and on CPU
``JES_CPU_DEVICES``/``JAX_NUM_CPU_DEVICES`` for its device count. Their output is forwarded line
by line with a ``[pI]`` prefix; each gets its own share of the cores. When one exits with an error, the others are stopped at once
(JAX's runtime is not elastic) and the launcher exits with that process's status. Ctrl-C or SIGTERM to the
launcher is passed on to every process as a Ctrl-C, and their output is forwarded while they save and exit (a
second signal is waited through); the launcher then exits with 128 + that signal.

The launcher owns the process tree of the run. Each command runs under a small watchdog
(:mod:`jes.distributed._reaper`) in a session and process group of its own, and a process is
stopped by signalling its whole group (SIGTERM, ``grace`` seconds, SIGKILL), so what the command
started goes with it. When a command exits, what it left behind in its group is stopped too. When
the launcher dies, even by SIGKILL, each watchdog stops its group: at once on Linux (parent-death
signal), within a fraction of a second elsewhere (it watches its parent pid); and a watchdog that is
SIGKILLed has its group SIGKILLed by the launcher. Only processes that leave their group
(``setsid``, ``setpgid``) escape this.

This module does not import JAX.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Sequence, TextIO

NOT_ELASTIC = ("JAX's multi-process runtime is not elastic: a run stops when one of its processes stops. If the "
               "message above is an error before the run began (a usage error, a refusal, a busy coordinator port), "
               "fix that and launch again; a run that had begun continues from its last checkpoint (jes train "
               "--resume CKPT, or jes.train(..., resume=CKPT)) with any number of processes. For fleets where "
               "machines come and go, use the ZeroMQ backend (jes-worker)")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing on ``host`` listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def coordinator_error(coordinator: str) -> str | None:
    """Why ``coordinator`` is not ``HOST:PORT`` with a port in 1..65535 (``None``: it is)."""
    host, _, port = coordinator.rpartition(":")
    if host and port.isdigit() and 1 <= int(port) <= 65535:
        return None
    return f"coordinator={coordinator!r} must be HOST:PORT with a port in 1..65535, e.g. '10.0.0.1:1234'"


def process_env(base: dict, coordinator: str, num_processes: int, process_id: int,
                devices_per_process: int | None) -> dict:
    """The environment of process ``process_id``."""
    env = dict(base)
    env.update(JES_COORDINATOR=coordinator, JES_NUM_PROCESSES=str(num_processes), JES_PROCESS_ID=str(process_id))
    env.setdefault("PYTHONUNBUFFERED", "1")  # lines arrive as they are printed
    if devices_per_process is not None:
        # CPU devices per process (accelerators: choose with CUDA_VISIBLE_DEVICES / TPU topology instead).
        env["JES_CPU_DEVICES"] = str(devices_per_process)
        env["JAX_NUM_CPU_DEVICES"] = str(devices_per_process)
    return env


def core_shares(processes: int) -> list[set[int]]:
    """This machine's usable cores split into ``processes`` disjoint shares (shared round-robin when fewer cores)."""
    if not hasattr(os, "sched_getaffinity"):
        raise ValueError("--pin-cores needs an OS with CPU affinity (Linux)")
    cores = sorted(os.sched_getaffinity(0))
    if processes >= len(cores):
        return [{cores[i % len(cores)]} for i in range(processes)]
    per = len(cores) // processes
    return [set(cores[i * per:(i + 1) * per]) for i in range(processes)]


def _forward(stream, prefix: str, out: TextIO, lock: threading.Lock) -> None:
    for line in iter(stream.readline, ""):
        with lock:
            out.write(prefix + line if prefix else line)
            out.flush()
    stream.close()


REAPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_reaper.py")


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the process group ``proc`` leads (every process of that share of the run)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _exited(proc: subprocess.Popen) -> int | None:
    """``proc``'s return code once it has exited, after SIGKILLing what is left of its process group; else None.

    The group is killed before ``proc`` is reaped: until then its zombie holds the pid, so the group id
    cannot have been reused by an unrelated process.
    """
    if proc.returncode is not None:
        return proc.returncode
    if hasattr(os, "waitid") and hasattr(os, "WNOWAIT"):
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                return None
        except ChildProcessError:
            pass  # reaped already
        _signal_group(proc, signal.SIGKILL)
        return proc.wait()
    code = proc.poll()
    if code is not None:
        _signal_group(proc, signal.SIGKILL)
    return code


def _signal_each(procs: Sequence[subprocess.Popen], sig: int) -> None:
    """Send ``sig`` to each running watchdog of ``procs``, which forwards it to its group.

    Not ``Popen.send_signal``: that reaps an exited process, before ``_exited`` has killed its group.
    """
    for proc in procs:
        if _exited(proc) is None:
            try:
                os.kill(proc.pid, sig)
            except ProcessLookupError:
                pass


def _wait(procs: Sequence[subprocess.Popen], seconds: float) -> list[subprocess.Popen]:
    """Wait up to ``seconds`` for ``procs`` to exit; those still running."""
    deadline = time.monotonic() + seconds
    running = [proc for proc in procs if _exited(proc) is None]
    while running and time.monotonic() < deadline:
        time.sleep(0.05)
        running = [proc for proc in running if _exited(proc) is None]
    return running


def _stop(procs: Sequence[subprocess.Popen], grace: float) -> None:
    """SIGTERM every process of ``procs``' groups (their watchdogs forward it); SIGKILL the groups after ``grace``."""
    _signal_each(procs, signal.SIGTERM)
    for proc in _wait(procs, grace):
        _signal_group(proc, signal.SIGKILL)
        proc.wait()


def launch(command: Sequence[str], num_processes: int, *, devices_per_process: int | None = 1,
           coordinator: str | None = None, first_process_id: int = 0, local_processes: int | None = None,
           prefix: bool = True, grace: float = 5.0, pin_cores: bool = True, out: TextIO | None = None,
           err: TextIO | None = None) -> int:
    """Run ``command`` as processes ``first_process_id ..`` of an ``num_processes``-process run; their exit status.

    Args:
        command: the program and its arguments (the same for every process).
        num_processes: processes in the whole run.
        devices_per_process: CPU devices each process exposes (``None``: leave the environment as it is).
        coordinator: ``HOST:PORT`` of process 0's coordination service (default: a free loopback port,
            for runs on this machine only).
        first_process_id: id of the first process started here (multi-host runs without a scheduler).
        local_processes: how many to start here (default: all of ``num_processes - first_process_id``).
        prefix: prefix each output line with ``[pI] ``.
        grace: seconds the others get to exit after SIGTERM before SIGKILL, once one has failed (and what a
            process leaves running gets, once it has exited).
        pin_cores: give each local process its own share of this machine's cores (measured on 2 vCPUs,
            benchmarks/scaling.py: 2 processes pinned ran generations 1.4-2.6x faster than unpinned).

    Returns:
        0 if every process exited with 0; else the first failing process's status (128+signal if killed).
    """
    out = out or sys.stdout
    err = err or sys.stderr
    if not command:
        raise ValueError("no command to launch: jes launch --processes N -- python my_script.py")
    if num_processes < 1:
        raise ValueError(f"--processes must be >= 1, got {num_processes}")
    if devices_per_process is not None and devices_per_process < 1:
        raise ValueError(f"--devices-per-process must be >= 1, got {devices_per_process}")
    local = num_processes - first_process_id if local_processes is None else local_processes
    if not 0 <= first_process_id < num_processes:
        raise ValueError(f"--first-process-id {first_process_id} is not a process of a {num_processes}-process run "
                         f"(ids 0 to {num_processes - 1})")
    if not (local >= 1 and first_process_id + local <= num_processes):
        raise ValueError(f"--local-processes {local} from --first-process-id {first_process_id} asks for process ids "
                         f"{first_process_id} to {first_process_id + local - 1}, but a {num_processes}-process run has "
                         f"ids 0 to {num_processes - 1}")
    if coordinator is not None and (why := coordinator_error(coordinator)):
        raise ValueError(why)
    if coordinator is None:
        if local != num_processes:
            raise ValueError("a run spread over several hosts needs --coordinator HOST:PORT (process 0's host)")
        coordinator = f"127.0.0.1:{free_port()}"
    shares = core_shares(local) if pin_cores else [None] * local
    # Ctrl-C and SIGTERM (timeout, docker stop, a scheduler) are noted, not raised: the launcher passes the first on
    # as a Ctrl-C (which every process saves on) and keeps forwarding their output until they have exited; a second
    # one must not cut that wait off (process 0 may be saving a checkpoint).
    stops: list[int] = []
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, frame: stops.append(signum))
    lock = threading.Lock()
    procs: list[subprocess.Popen] = []
    threads = []
    try:
        for i in range(first_process_id, first_process_id + local):
            env = process_env(os.environ, coordinator, num_processes, i, devices_per_process)
            cores = shares[i - first_process_id]
            watchdog = [sys.executable, "-I", "-S", REAPER, "--parent", str(os.getpid()), "--grace", str(grace)]
            watchdog += ["--cores", ",".join(map(str, sorted(cores)))] if cores else []
            try:
                if shutil.which(command[0], path=env.get("PATH", os.defpath)) is None:
                    raise FileNotFoundError("no such executable file" + ("" if os.sep in command[0] else " on PATH"))
                # Its own session: the watchdog leads a process group that holds every process of this share.
                proc = subprocess.Popen([*watchdog, "--", *command], env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
            except OSError as error:
                _stop(procs, grace)
                raise ValueError(f"cannot start {command[0]!r}: {error}") from error
            procs.append(proc)
            thread = threading.Thread(target=_forward, args=(proc.stdout, f"[p{i}] " if prefix else "", out, lock),
                                      daemon=True)
            thread.start()
            threads.append(thread)
        try:
            status = _watch(procs, first_process_id, grace, stops, lock, err)
        except KeyboardInterrupt:  # launch() called outside the main thread: Ctrl-C reaches it as an exception
            stops.append(signal.SIGINT)
            status = _stop_on_signal(procs, grace, stops, lock, err)
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: a handler installed outside Python, which cannot be put back
                signal.signal(sig, handler)
    for thread in threads:
        thread.join(timeout=grace)
    return status


def _watch(procs: Sequence[subprocess.Popen], first_process_id: int, grace: float, stops: list[int],
           lock: threading.Lock, err: TextIO) -> int:
    """Wait for ``procs``; stop them all when one fails or a stop signal comes. The run's status."""
    running = set(range(len(procs)))
    while running:
        if stops:
            return _stop_on_signal(procs, grace, stops, lock, err)
        for index in sorted(running):
            code = _exited(procs[index])
            if code is None:
                continue
            running.discard(index)
            if code != 0:
                others = [p for j, p in enumerate(procs) if j in running]
                with lock:
                    reason = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
                    # No exit status tells a refusal before the first generation from a failure mid-run (a full
                    # disk exits 2 as a usage error does, a script's refusal 1 as its crash): the advice covers both.
                    err.write(f"jes launch: process {first_process_id + index} {reason}; stopping the other "
                              f"{len(others)} process(es). {NOT_ELASTIC}\n")
                    err.flush()
                _stop(others, grace)
                return code if code > 0 else 128 - code
        time.sleep(0.05)
    return 0


def _stop_on_signal(procs: Sequence[subprocess.Popen], grace: float, stops: list[int], lock: threading.Lock,
                    err: TextIO) -> int:
    """The launcher got Ctrl-C or SIGTERM: pass a Ctrl-C on, give the processes time to checkpoint, then stop them.

    The processes are in sessions of their own, out of the terminal's reach. They get SIGINT whichever signal came:
    every process saves on Ctrl-C, where JAX's preemption notifier takes SIGTERM over in a script of one's own.
    Further signals are waited through (once the processes have exited, or ``6 * grace`` s, they are stopped).
    """
    first = stops[0]
    patience = grace * 6
    _signal_each(procs, signal.SIGINT)
    if first != signal.SIGINT:
        with lock:
            err.write(f"jes launch: {signal.Signals(first).name}: passing it on as a Ctrl-C and waiting up to "
                      f"{patience:.0f} s for the processes to save and exit\n")
            err.flush()
    noted = 1
    deadline = time.monotonic() + patience
    running = [proc for proc in procs if _exited(proc) is None]
    while running and time.monotonic() < deadline:
        if len(stops) > noted:
            noted = len(stops)
            with lock:
                err.write(f"jes launch: still waiting for the processes to save and exit (they are stopped "
                          f"{max(deadline - time.monotonic(), 0):.0f} s from now at the latest)\n")
                err.flush()
        time.sleep(0.05)
        running = [proc for proc in running if _exited(proc) is None]
    _stop(running, grace)
    return 128 + first
