"""The watchdog ``jes launch`` puts between itself and each command it starts (run as a script, stdlib only).

``python -I -S _reaper.py --parent PID [--grace S] [--cores 0,1] -- COMMAND ...``

The launcher starts this in a new session, so it leads a process group that the command and every
process the command starts are born into; the launcher and this watchdog signal that whole group,
never one pid, which is what takes grandchildren (``bash -c "python train.py"``) down with it.

- A SIGTERM or SIGINT it receives is forwarded to its group (it ignores its own copy).
- When the command exits, what it left running in the group gets SIGTERM, and up to ``grace``
  seconds to exit; then this exits with the command's status (dying by the same signal if the
  command was killed, so the launcher reports it as before). The launcher SIGKILLs the group after
  that, taking whatever ignored the SIGTERM.
- When the launcher dies, even by SIGKILL, the group gets SIGTERM, ``grace`` seconds, then SIGKILL
  (this watchdog included). Linux tells it at once (``prctl(PR_SET_PDEATHSIG)``); elsewhere it
  notices its parent changed within a fraction of a second.
- On Linux it is a child subreaper (``PR_SET_CHILD_SUBREAPER``): orphans of the command are
  re-parented to it, so it reaps them and knows when none are left.

If this watchdog itself is SIGKILLed, the launcher SIGKILLs its group. Processes that leave the
group (``setsid``, ``setpgid``) are outside all of this.

Imports nothing from jes, so it starts in a few milliseconds without the package on the path.
"""
from __future__ import annotations

import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
POLL_SECONDS = 0.1


def _prctl(option: int, value: int) -> bool:
    """``prctl(option, value)``; False where there is no prctl (not Linux) or it failed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _signal_group(sig: int) -> None:
    """Send ``sig`` to this watchdog's process group, except itself (an ignored signal is discarded when sent)."""
    previous = signal.signal(sig, signal.SIG_IGN)
    try:
        os.killpg(0, sig)
    except OSError:
        pass
    finally:
        signal.signal(sig, previous)


def _die_like(status: int) -> None:
    """Exit the way a process with wait status ``status`` ended: same exit code, or killed by the same signal."""
    sys.stdout.flush()
    sys.stderr.flush()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the command dumped core already, if it did
        except (ImportError, ValueError, OSError):
            pass
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(1)  # the signal arrives before this returns; a stopping signal would not kill
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _parse(argv: list[str]) -> tuple[int, float, set[int] | None, list[str]]:
    parent, grace, cores = None, 5.0, None
    args = list(argv)
    while args and args[0] != "--":
        flag, value = args.pop(0), args.pop(0)
        if flag == "--parent":
            parent = int(value)
        elif flag == "--grace":
            grace = float(value)
        elif flag == "--cores":
            cores = {int(core) for core in value.split(",")}
        else:
            raise SystemExit(f"jes launch watchdog: unknown flag {flag}")
    if parent is None or not args[1:]:
        raise SystemExit("usage: _reaper.py --parent PID [--grace S] [--cores 0,1] -- COMMAND ...")
    return parent, grace, cores, args[1:]


def main(argv: list[str]) -> None:
    parent, grace, cores, command = _parse(argv)
    subreaper = _prctl(PR_SET_CHILD_SUBREAPER, 1)
    stops: list[int] = []

    def on_signal(sig, frame):
        _signal_group(sig)
        if sig == signal.SIGTERM:
            stops.append(sig)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the launcher died before the line above
        sys.exit(1)
    if cores:
        os.sched_setaffinity(0, cores)  # the command and its children inherit it
    if stops:  # stopped before it started
        sys.exit(128 + signal.SIGTERM)
    # Python ignores SIGPIPE (and SIGXFSZ); the command gets the default actions, as subprocess gives them.
    defaults = [getattr(signal, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(signal, name)]
    try:
        pid = os.posix_spawnp(command[0], command, os.environ, setsigdef=defaults)
    except OSError as error:
        print(f"jes launch: cannot start {command[0]!r}: {error}", file=sys.stderr, flush=True)
        sys.exit(127)
    status = None
    deadline = None  # set once the command has exited or a stop began: leftovers get `grace` seconds
    orphaned = False
    while True:
        children = True
        while True:  # reap the command and, as a subreaper, the orphans it left
            try:
                reaped, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children = False
                break
            if reaped == 0:
                break
            if reaped == pid:
                status = wait_status
                _signal_group(signal.SIGTERM)  # what the command left behind
                deadline = deadline or time.monotonic() + grace
        if not orphaned and os.getppid() != parent:
            orphaned = True  # the launcher is gone: end the run
            _signal_group(signal.SIGTERM)
            deadline = time.monotonic() + grace
        if stops and deadline is None:
            deadline = time.monotonic() + grace
        if orphaned:
            # Without a subreaper, "no children" only says the command is gone: leftovers get the whole grace.
            if (subreaper and not children) or time.monotonic() > deadline:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.killpg(0, signal.SIGKILL)  # this watchdog too: nobody is waiting for its status
        elif status is not None and (not subreaper or not children or time.monotonic() > deadline):
            _die_like(status)  # the launcher SIGKILLs the group after this
        time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    main(sys.argv[1:])
