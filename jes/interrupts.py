"""Signals as interrupts: SIGTERM taken as Ctrl-C while a run (or ``jes train``) runs, a Ctrl-C that Python dropped
(in a gc callback) raised again, and SIGINT/SIGTERM held back while a checkpoint is written.

Host code shared by :func:`jes.train` / :func:`jes.run`, their checkpoint saves and the ``jes`` command; standard
library only.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any, Iterator


class SigtermAsInterrupt:
    """SIGTERM (``timeout``, ``kill``, Slurm, ``docker stop``) taken as Ctrl-C between :meth:`install` and
    :meth:`restore`: it raises ``KeyboardInterrupt`` in the main thread, so a run saves its checkpoint on it, and
    :attr:`terminated` records that it came.

    While installed it also catches the ``KeyboardInterrupt`` Python drops where it cannot raise one (a Ctrl-C
    landing in JAX's gc callback): :attr:`dropped` keeps it for :func:`raise_if_terminated` to raise again.

    Signal handlers belong to the main thread: in another thread nothing is installed. With ``unless_handled``,
    SIGTERM is not taken when it does not have its default action (a handler of the program's own, ``SIG_IGN``, or
    one installed outside Python before it started): that handler stays in charge. A handler that C
    code installed later (JAX's preemption notifier, by ``jax.distributed.initialize``) is invisible here
    (``signal.getsignal`` still says ``SIG_DFL``): the caller must not install then (``jes.loop._take_sigterm``).
    :meth:`restore` puts the previous handler back only while this one is still installed (one the program
    installed meanwhile stays).
    """

    def __init__(self, *, unless_handled: bool = False):
        self.unless_handled = unless_handled
        self.terminated: list[int] = []  # SIGTERM, once one came
        self.dropped: list[BaseException] = []  # Ctrl-Cs Python dropped (in a gc callback), not raised again yet
        self._previous: Any = None
        self._installed = False
        self._pid = os.getpid()

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._pid:  # a child forked meanwhile (a callback's multiprocessing pool) inherited this:
            terminate_as_sigterm()    # it ends as SIGTERM ends it, as it would have without jes
            return
        self.terminated.append(signum)
        # Python runs a handler between any two bytecodes: in a gc callback (JAX's), a weakref callback or a
        # __del__ this exception is printed as "Exception ignored" and dropped. raise_if_terminated, called where a
        # run can stop (each generation), raises it again then.
        raise KeyboardInterrupt

    def install(self) -> "SigtermAsInterrupt":
        """Take SIGTERM (where it has its default action, with ``unless_handled``), and in any case catch the
        interrupts Python drops (a Ctrl-C's too) so that :func:`raise_if_terminated` raises them again. (A
        ``jax.distributed`` process installs none: ``jes.loop._take_sigterm``.)"""
        if threading.current_thread() is threading.main_thread() and not self._installed:
            if not (self.unless_handled and signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
                self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._installed, self._pid = True, os.getpid()
            _INSTALLED.append(self)
            self._unraisablehook = sys.unraisablehook
            sys.unraisablehook = self._unraisable
        return self

    def _unraisable(self, unraisable: Any) -> None:
        """An interrupt dropped where Python cannot raise it (a gc callback, a weakref callback, a ``__del__``): not
        printed as "Exception ignored", since :func:`raise_if_terminated` raises it again (a SIGTERM's, or a
        Ctrl-C's, which the run would otherwise never see: it trained on to its end); anything else as before."""
        if not (self._installed and isinstance(unraisable.exc_value, KeyboardInterrupt)) or os.getpid() != self._pid:
            self._unraisablehook(unraisable)  # (in a child forked meanwhile, which never checks: as without jes)
        elif not any(taking.terminated for taking in _INSTALLED):  # a Ctrl-C's (a SIGTERM's is raised again anyway)
            self.dropped.append(unraisable.exc_value)

    def restore(self, ended_by: BaseException | None = None) -> None:
        """Give SIGTERM back the handler it had (again: nothing). ``ended_by``: what ended the block, if anything
        did (an interrupt, an error); where nothing did, a Ctrl-C Python dropped and no check raised again is said
        on stderr."""
        if self._installed:
            self._installed = False
            if self in _INSTALLED:
                _INSTALLED.remove(self)
            if sys.unraisablehook == self._unraisable:  # not over a hook installed meanwhile
                sys.unraisablehook = self._unraisablehook
            if self.dropped and ended_by is None and os.getpid() == self._pid:  # came too late to stop anything
                print("jes: a Ctrl-C that Python dropped (its KeyboardInterrupt landed in a gc callback) came after "
                      "the last point where jes could raise it again: it interrupted nothing", file=sys.stderr,
                      flush=True)
            self.dropped.clear()
            # Not over a handler installed meanwhile (by a callback, a library it set up); and None (a handler from
            # outside Python) cannot be given back, as before this module
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm and self._previous is not None:
                signal.signal(signal.SIGTERM, self._previous)


# The SigtermAsInterrupt instances installed now, innermost last (jes train's, a run's inside it: one at most takes
# SIGTERM, the others seeing a handler there already)
_INSTALLED: list[SigtermAsInterrupt] = []


def raise_if_terminated() -> None:
    """Raise ``KeyboardInterrupt`` if a SIGTERM came while a :class:`SigtermAsInterrupt` is installed (the one its
    handler raised was dropped: it landed in a gc or weakref callback, or a ``__del__``, or it would have ended the
    run already), or if Python dropped a Ctrl-C's there (raised again once). Called where a run can stop cleanly
    (before each generation), so neither a SIGTERM nor a Ctrl-C is lost."""
    if any(taking.terminated or taking.dropped for taking in _INSTALLED):
        for taking in _INSTALLED:
            taking.dropped.clear()  # raised now, once
        raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt(*, unless_handled: bool = False) -> Iterator[list[int]]:
    """:class:`SigtermAsInterrupt` while the block runs; yields its ``terminated`` list (``[SIGTERM]`` once one came)."""
    taking, ended_by = SigtermAsInterrupt(unless_handled=unless_handled), None
    try:
        yield taking.install().terminated
    except BaseException as err:
        ended_by = err
        raise
    finally:
        taking.restore(ended_by)


def terminate_as_sigterm() -> None:
    """End this process as SIGTERM's default action ends it (status 143 in a shell, ``-15`` to ``subprocess``), with
    SIGTERM's default action restored first: what a ``SIGTERM`` that :func:`sigterm_as_interrupt` took as an
    interrupt would have done, once the run is saved. Returns only where the signal is not delivered at once (it is
    then pending: the process ends as soon as it is)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back while the block runs, then deliver them: a checkpoint save is never cut off.

    Only signals with a Python handler are held (SIGINT's ``KeyboardInterrupt``, :func:`sigterm_as_interrupt`'s
    SIGTERM); their handlers are restored when the block ends, and the first signal that came is handed to its
    handler then (which raises ``KeyboardInterrupt``; more Ctrl-Cs meanwhile count as that one). Signal handlers
    belong to the main thread: in another thread the block runs unprotected. SIGKILL cannot be held: it leaves the
    previous checkpoint.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[tuple[int, Any]] = []
    previous: dict = {}
    holding = [True]

    def hold(signum, frame):
        if holding[0]:
            pending.append((signum, frame))
        else:  # left in place by an interrupt among the restores below: the signal's own handler
            previous[signum](signum, frame)

    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(sig)
            if callable(handler):  # not SIG_DFL, SIG_IGN, nor a handler installed outside Python
                previous[sig] = handler
                signal.signal(sig, hold)
        yield
    finally:
        holding[0] = False
        # Each handler is restored even when a Ctrl-C lands among the restores (raised by a handler restored
        # already): the other would keep ``hold`` for good otherwise (which then passes signals on).
        _restore_handlers(list(previous.items()))
        if pending:
            signum, frame = pending[0]
            previous[signum](signum, frame)


def _restore_handlers(handlers: list) -> None:
    if handlers:
        try:
            signal.signal(*handlers[0])
        finally:
            _restore_handlers(handlers[1:])
