"""Local worker processes: ``jes.train(..., num_workers=N)`` / ``jes train --workers N``.

A run with local workers is a distributed run on this machine: a :class:`~jes.distributed.master.Master`
listens on ``127.0.0.1`` (a free port, a fresh random secret) and ``N`` ``jes-worker`` processes connect to
it. Each worker rebuilds the run from its plain-data description (so the env travels by name, e.g.
``"gymnasium:CartPole-v1"``, never as code), evaluates the chunk ranges it is handed and returns
fitness; the master applies the same compiled update, so the result is bit-identical to one process.

A worker process that dies is replaced (the master re-queues what it held, and evaluates a re-queued
chunk itself), so nothing is lost.
"""
from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
import threading
import time

from jes.distributed.worker import DISTRUSTED_EXIT

log = logging.getLogger("jes.distributed.local")

# Timing knobs of a master serving local processes: a dead worker is noticed within seconds.
LOCAL_MASTER_OPTIONS = dict(heartbeat_interval=0.5, worker_timeout=5.0, min_deadline=5.0)


class LocalWorkers:
    """``count`` ``jes-worker`` processes of this Python serving the master at ``endpoint``, replaced when they die.

    Args:
        endpoint: the master's ``host:port`` (127.0.0.1).
        secret: the master's HMAC secret (passed through the environment, never the command line).
        count: worker processes.
        max_restarts: replacements in all before giving up on replacing (a worker that cannot start is not
            restarted forever; the master then evaluates what is left itself).
        allow_modules: modules of the user's own the workers may build classes from (``--allow-module``): the
            run's own policy module, which this process runs already. The workers get this process's
            ``sys.path``, so they import it from where this process did.
        imports: modules the workers import first (``jes-worker --import``): the module behind a Gymnasium id
            the user registered (:func:`jes.envs.gymnasium.registering_module`).
        curve_server_key: the master's own CURVE public key (Z85), when it has a key pair of its own.

    Attributes:
        names: each slot's worker as the master's log names it: ``local-0``, its replacements ``local-0 (restart 1)``,
            ``local-0 (restart 2)``, ... (a replacement may connect before the master notices the loss of the worker
            it replaces; both were ``local-0``).
        restarts: replacements started so far, in all.
    """

    def __init__(self, endpoint: str, secret: str, count: int, max_restarts: int | None = None,
                 log_level: str = "WARNING", allow_modules: tuple[str, ...] = (), imports: tuple[str, ...] = (),
                 curve_server_key: str | None = None):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"num_workers must be a positive integer, got {count!r}")
        self.endpoint, self.secret, self.count = endpoint, secret, count
        self.allow_modules = tuple(allow_modules)
        self.imports = tuple(imports)
        self.curve_server_key = curve_server_key
        self.max_restarts = 3 * count if max_restarts is None else max_restarts
        self.restarts = 0
        self.log_level = log_level
        self.processes: list[subprocess.Popen | None] = [None] * count
        self.names: list[str] = [""] * count  # each slot's worker, as the master's log names it
        self._slot_restarts = [0] * count
        self._stop = threading.Event()
        self._lock = threading.Lock()
        for i in range(count):
            self.processes[i] = self._spawn(i)
        self._watcher = threading.Thread(target=self._watch, name="jes-local-workers", daemon=True)
        self._watcher.start()

    def _spawn(self, index: int) -> subprocess.Popen:
        env = dict(os.environ, JES_SECRET=self.secret)
        # A replacement is named apart from the worker it replaces, whose loss the master may log after it connects
        restarts = self._slot_restarts[index]
        self.names[index] = f"local-{index}" + (f" (restart {restarts})" if restarts else "")
        command = [sys.executable, "-m", "jes.distributed.worker", "--master", self.endpoint,
                   "--name", self.names[index], "--log-level", self.log_level, "--exit-with", str(os.getpid())]
        for module in self.allow_modules:
            command += ["--allow-module", module]
        for module in self.imports:
            command += ["--import", module]
        if self.curve_server_key is not None:  # a public key: fine on a command line
            command += ["--curve-server-key", self.curve_server_key]
        if self.allow_modules or self.imports:  # the user's modules import from where this process did ("": its cwd)
            env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) if p else os.getcwd() for p in sys.path)
        return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                for i, process in enumerate(self.processes):
                    if process is None or process.poll() is None:
                        continue
                    if process.returncode == DISTRUSTED_EXIT:  # a replacement would compute the same other bits
                        log.warning("local worker %s exited: the master distrusts its results (logged above); not "
                                    "replaced", self.names[i])
                        self.processes[i] = None
                        continue
                    if self.restarts >= self.max_restarts:
                        log.warning("local worker %s exited (code %s); not replaced (%d restarts already)",
                                    self.names[i], process.returncode, self.restarts)
                        self.processes[i] = None
                        continue
                    self.restarts += 1
                    self._slot_restarts[i] += 1
                    exited = self.names[i]
                    self.processes[i] = self._spawn(i)
                    log.warning("local worker %s exited (code %s); started %s to replace it", exited,
                                process.returncode, self.names[i])

    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        with self._lock:
            return [p.pid for p in self.processes if p is not None and p.poll() is None]

    def close(self, timeout: float = 10.0) -> None:
        """Stop the workers: SIGTERM (each hands its range back and exits), then SIGKILL after ``timeout``."""
        self._stop.set()
        self._watcher.join(timeout=2.0)
        with self._lock:
            alive = [p for p in self.processes if p is not None and p.poll() is None]
            for process in alive:
                process.terminate()
            deadline = time.monotonic() + timeout
            for process in alive:
                try:
                    process.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()

    def __enter__(self) -> "LocalWorkers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def new_secret() -> str:
    """A fresh random secret for a run's local master and workers."""
    return secrets.token_hex(32)
