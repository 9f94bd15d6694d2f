"""Host-side watchers of a run: TensorBoard scalars and a console progress bar (or lines).

A *logger* is any callable taking one generation's metrics record (the dict
:func:`jes.train` hands to ``callbacks``); it may also have ``close()``,
which :func:`jes.train` calls when the run ends, however it ends. A
:class:`Logger` is also flushed before each checkpoint is saved (see
:meth:`Logger.flush`). Nothing here
runs inside compiled code: the host loop reads a few scalars back per
generation and passes them on.

Add your own sink by passing a function (or a :class:`Logger` subclass) in
``callbacks=``::

    jes.train(policy, "CartPole-v1", callbacks=[lambda record: print(record["pop_mean"])])
"""
from __future__ import annotations

import contextlib
import datetime
import glob
import inspect
import math
import os
import socket
import struct
import sys
import time
import warnings
from typing import Any, Iterable, Mapping

# record key -> TensorBoard tag. Everything in a record is a plain Python scalar.
SCALAR_TAGS = {
    "pop_mean": "population/mean_return",
    "pop_max": "population/max_return",
    "pop_min": "population/min_return",
    "pop_std": "population/std_return",
    "centre_return": "centre/return",
    "noise_std": "es/noise_std",
    "learning_rate": "es/learning_rate",
    "grad_norm": "es/grad_norm",
    "update_norm": "es/update_norm",
    "param_norm": "es/param_norm",
    "env_steps": "perf/env_steps",
    "env_steps_per_second": "perf/env_steps_per_second",
    "generation_time": "perf/generation_time",
    "wall_time": "perf/wall_time",
}


class Logger:
    """The logger interface: called with each generation's record, closed once at the end.

    Subclass it (or pass any plain callable) to send metrics elsewhere.
    """

    def __call__(self, record: Mapping[str, Any]) -> None:
        """Handle one generation's metrics record (plain Python scalars, ``generation`` 1-based)."""
        raise NotImplementedError

    def flush(self, generation: int | None = None) -> None:
        """Write out what was logged, up to ``generation``: called before each checkpoint is saved, with the
        generation it holds, so that the logs go at least as far as the checkpoint (a killed run loses none of
        its curves) and never past it (a generation interrupted among its callbacks is not in the checkpoint, and
        a resumed run logs it again). ``None``: everything."""

    def close(self, completed: bool = True) -> None:
        """Flush and release resources; called once when the run ends.

        Args:
            completed: ``False`` when the run ended on an interrupt or an error before its end (a run to be
                resumed), ``True`` when it reached its end: all its generations, or stopped early by
                ``stop_at_return`` or :class:`jes.StopTraining` (also when a Ctrl-C or an error came during its final
                checkpoint's save). :func:`jes.train` passes it to a ``close`` that takes it (by its name).

        A subclass of :class:`TensorBoardLogger` that overrides ``close`` must take ``completed`` and pass it on,
        ``super().close(completed=completed)``: a ``close(self)`` of its own calling ``super().close()`` closes every
        run as completed, writing the final metrics of an interrupted one (which its resume writes again).
        """


def default_run_name(env_name: str, policy_name: str, optimizer_name: str) -> str:
    """``<env>-<policy>-<optimizer>-<YYYYmmdd-HHMMSS>``, the directory name under ``runs/``; each part is cut to its
    first 64 characters (a long env instance's or optimizer's name would pass a file system's 255-byte limit on a
    name, and the run would fail at its first log), and characters other than letters, digits, ``-_.`` are ``_``."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = lambda s: "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in str(s)[:64])
    return f"{safe(env_name)}-{safe(policy_name)}-{safe(optimizer_name)}-{stamp}"


def claim_dir(path: str) -> str:
    """Make and return the folder ``path``, or ``path_1``, ``path_2``... where it exists: made at once, so that a
    process starting in the same second (two sweeps of an array job) takes the next name, not the same folder."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    candidate, n = path, 0
    while True:
        try:
            os.mkdir(candidate)
            return candidate
        except FileExistsError:
            n += 1
            candidate = f"{path}_{n}"


def unique_dir(path: str) -> str:
    """``path``, or ``path_1``, ``path_2``... if it already exists (two runs started in the same second)."""
    candidate, n = path, 0
    while os.path.exists(candidate):
        n += 1
        candidate = f"{path}_{n}"
    return candidate


def _hparam_value(value: Any) -> bool | str | float | int:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "inf" (stop_at_return=inf): as a number tensorboardX logs a stray "NaN or Inf found"
    if isinstance(value, (bool, int, float, str)):
        return value
    return "None" if value is None else repr(value)


# Written generations reach the event file at least this often (tensorboardX's SummaryWriter: every 120 s)
LIVE_FLUSH_SECONDS = 10.0


class TensorBoardLogger(Logger):
    """Writes each generation's scalars to a TensorBoard event file in ``log_dir`` (tensorboardX).

    The centre return is written only on generations that evaluated the centre. A generation's scalars are
    written when the next generation's record comes, or at :meth:`flush` or :meth:`close`: a generation a
    checkpoint does not hold (Ctrl-C among its callbacks) is never written, so a resumed run logs each generation
    once. Events are on disk after a :meth:`flush` (before each checkpoint) or :meth:`close`, and in between
    every ``LIVE_FLUSH_SECONDS`` (10 s) and whenever the file's buffer fills.
    The event file is created with the first generation written (or the first :meth:`flush`, which comes before a
    checkpoint is saved): a run stopped (or killed) before any, during the step's compile say, leaves none behind.
    ``hparams`` (e.g. ``config.to_dict()`` plus env/policy/optimizer) are written
    as a text table at the file's start and as a TensorBoard HPARAMS entry at :meth:`close`, with the final
    metrics (``hparams/*`` scalars at the last generation) only when the run completed: an interrupted run's
    resume writes them once, at its end, where both would draw them as a two-point curve. A resume of a run that
    completed (stopped by :class:`jes.StopTraining`, or given more generations) drops the final metrics of its
    earlier session: its restart marker is at the checkpoint's generation, and ``again``, that generation's record
    (its checkpoint's last history row), is written again after it (the marker drops every scalar from its step on).

    Args:
        log_dir: directory for the event file (created if missing).
        hparams: flat mapping of hyperparameter names to values.
        final: final metrics (``hparams/final_pop_mean``, ...) to write instead of the ones the records give (a
            sweep's configuration: its row's means over seeds); a non-finite one is left as the records give it.
    """

    def __init__(self, log_dir: str, hparams: Mapping[str, Any] | None = None, best_centre: float = -math.inf,
                 purge_from: int | None = None, again: Mapping[str, Any] | None = None,
                 final: Mapping[str, float] | None = None):
        self.log_dir = log_dir
        self.hparams = {k: _hparam_value(v) for k, v in (hparams or {}).items()}
        self._writer: _EventFile | None = None  # opened at the first write (see the writer property)
        self._purge_from = purge_from
        self._again = dict(again) if again is not None else None  # written after the marker (at purge_from)
        self._last: dict = {}
        self._pending: dict | None = None  # the newest record, not written yet (see flush)
        self._flushed_at = time.monotonic()
        self._best_centre = best_centre  # a resumed run's: the best centre return of its earlier sessions
        # Final metrics given by the caller (a sweep's: its table row's aggregates over seeds, not its mean curve's)
        self._final = {k: float(v) for k, v in (final or {}).items() if v is not None and math.isfinite(float(v))}

    @property
    def writer(self) -> "_EventFile":
        """The run's event file, created (with its restart marker and hyperparameter table) when first written:
        a run stopped before its first generation (a Ctrl-C or a kill during the step's compile) leaves no file
        without generations, which a later run into the folder would take for an earlier run's."""
        if self._writer is None:
            # tensorboardX names the file by the second and the host only: a second writer in the same directory
            # within the same second (a short run resumed at once into its log dir) would overwrite the first's events
            writer = _EventFile(self.log_dir, filename_suffix=f".{os.getpid()}.{time.time_ns()}")
            if self._purge_from is not None:
                # A resumed run's restart marker (tensorboardX's purge_step): TensorBoard, and read_scalars, drop the
                # earlier sessions' points from this step on, which a killed run may have written past its checkpoint.
                writer.add_session_start(self._purge_from)
            if self.hparams:
                table = "| hyperparameter | value |\n|---|---|\n" + "\n".join(
                    f"| {k} | {v} |" for k, v in sorted(self.hparams.items())
                )
                writer.add_text("hparams", table, 0)
            self._writer = writer
            if self._again is not None:  # the generation at the marker, which drops its points: written again
                self._write_scalars(self._again)
        return self._writer

    def create_file(self) -> None:
        """Create the event file if it is not there yet (before a checkpoint is saved: a resume of that checkpoint
        finds its run's log dir by it, even at generation 0)."""
        self.writer  # noqa: B018  (the property creates it)

    def __call__(self, record: Mapping[str, Any]) -> None:
        # The record before this one is the run's for good (its generation's state is the run's now); this one is
        # held until the next, a flush or close: an interrupt among its generation's callbacks leaves it out of
        # the checkpoint, and the flush before that checkpoint's save drops it. The file itself is made with the
        # first record (its scalars wait): `jes plot` of a run in its first generation finds a run that has logged
        # no generation yet, not a folder without event files; a run stopped before its first record leaves none.
        self._write_pending()
        self._pending = dict(record)
        self.create_file()

    def _write_pending(self) -> None:
        record = self._pending
        if record is None:
            return
        self._write_scalars(record)
        centre = record.get("centre_return")
        if centre is not None and math.isfinite(centre):
            self._best_centre = max(self._best_centre, float(centre))
        self._last = record
        self._pending = None  # after the writes: an interrupt among them leaves it to write again (same values)
        if time.monotonic() - self._flushed_at >= LIVE_FLUSH_SECONDS:  # TensorBoard open beside the run: live curves
            self.writer.flush()
            self._flushed_at = time.monotonic()

    def _write_scalars(self, record: Mapping[str, Any]) -> None:
        step = int(record["generation"])
        for key, tag in SCALAR_TAGS.items():
            value = record.get(key)
            if value is None or not math.isfinite(float(value)):
                continue  # centre_return is NaN on generations without a centre evaluation
            self.writer.add_scalar(tag, float(value), step)

    def flush(self, generation: int | None = None) -> None:
        """Write what is pending (up to ``generation``) and hand the file to the OS; with nothing written yet and
        nothing pending, no file is created (a Ctrl-C during the first generation, no checkpoint saved after it:
        :func:`flush_all` creates it before a checkpoint's save)."""
        if self._pending is not None and generation is not None and int(self._pending["generation"]) > generation:
            self._pending = None  # interrupted among its callbacks: not in the checkpoint, logged again on resume
        if self._writer is None and self._pending is None:
            return
        self._write_pending()
        self.writer.flush()

    def close(self, completed: bool = True) -> None:
        """Write what is pending and close the file; with ``completed`` (the run returned its result), the final
        metrics too. An interrupted run's (``completed=False``) HPARAMS entry has its hyperparameters and no
        metrics: a point at its interrupted generation would stay beside the one its resume writes at its end
        (TensorBoard cannot take a point back), drawn as a two-point curve of "final" values."""
        self._write_pending()
        if self.hparams and self._last:
            from tensorboardX.summary import hparams as hparams_summary

            metrics = {
                "hparams/final_pop_mean": float(self._last.get("pop_mean", math.nan)),
                "hparams/best_centre_return": self._best_centre if math.isfinite(self._best_centre) else math.nan,
                "hparams/generations": float(self._last.get("generation", 0)),
            }
            metrics.update((k, v) for k, v in self._final.items() if k in metrics)
            # Written into this run's own event file (SummaryWriter.add_hparams would start a sub-run).
            for summary in hparams_summary(self.hparams, metrics):
                self.writer.add_summary(summary)
            step = int(self._last.get("generation", 0))
            for tag, value in metrics.items():
                if completed and math.isfinite(value):
                    self.writer.add_scalar(tag, value, step)
        if self._writer is not None:
            self._writer.close()


class _EventFile:
    """A TensorBoard event file written in the caller's thread, so that :meth:`flush` puts every event added so far
    in the file. (tensorboardX's ``SummaryWriter`` hands events to a thread of its own, whose queue its ``flush``
    does not wait for: a killed process lost every event of its last ``flush_secs``, 120 s.)

    Each record (length, its CRC, the event, its CRC: TFRecord framing) goes to the file in one ``write``: a Ctrl-C
    between the four writes tensorboardX makes would leave a torn record, and every event after it unreadable.
    :meth:`flush` hands the file to the OS (which a killed process cannot undo), without ``fsync``: the training
    thread does not wait on the disk (a network file system) every few seconds."""

    def __init__(self, log_dir: str, filename_suffix: str = ""):
        from tensorboardX.proto import event_pb2

        os.makedirs(log_dir, exist_ok=True)
        # tensorboardX's EventsWriter's name: events.out.tfevents.<seconds>.<host><suffix>
        name = f"events.out.tfevents.{str(time.time())[:10]}.{socket.gethostname()}{filename_suffix}"
        self.path = os.path.join(log_dir, name)
        self._file = open(self.path, "ab")
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    @contextlib.contextmanager
    def _naming_the_file(self):
        """A failed write, flush or close (a full disk: a bare ``[Errno 28] No space left on device``) names this
        file, so that the user knows which disk filled up."""
        try:
            yield
        except OSError as err:
            if err.filename is None:
                err.filename = self.path
            raise

    def _write(self, event: Any) -> None:
        from tensorboardX.record_writer import masked_crc32c

        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        with self._naming_the_file():
            self._file.write(header + struct.pack("<I", masked_crc32c(header)) + data
                             + struct.pack("<I", masked_crc32c(data)))

    def add_summary(self, summary: Any, step: int | None = None) -> None:
        from tensorboardX.proto import event_pb2

        event = event_pb2.Event(summary=summary, wall_time=time.time())
        if step is not None:
            event.step = int(step)
        self._write(event)

    def add_session_start(self, step: int) -> None:
        from tensorboardX.proto import event_pb2

        start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
        self._write(event_pb2.Event(step=int(step), session_log=start, wall_time=time.time()))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        from tensorboardX.summary import scalar

        self.add_summary(scalar(tag, value), step)

    def add_text(self, tag: str, text: str, step: int) -> None:
        from tensorboardX.summary import text as text_summary

        self.add_summary(text_summary(tag, text), step)

    def flush(self) -> None:
        with self._naming_the_file():
            self._file.flush()

    def close(self) -> None:
        with self._naming_the_file():
            self._file.close()


class ProgressBar(Logger):
    """A tqdm bar over generations showing best/mean return, env steps/s and the ETA; or console lines.

    When stdout is not a terminal (logs, notebooks' captured output, CI) and ``enabled`` is ``None``,
    a bar would only appear at the end, so it prints one line per generation instead (every
    ``line_every`` generations for long runs, and always the last one).

    Args:
        total: the run's total generations.
        initial: generations already done (when resuming).
        enabled: ``None``: a bar on a terminal, else console lines; ``True``: always the bar;
            ``False``: nothing.
        line_every: generations between console lines (default: 1 up to 50 generations, else
            ``ceil(total / 50)``).
        stream: where console lines go (default ``sys.stdout``).
        best: the best member fitness so far (a resumed run's, so that "best" continues; default none yet).
    """

    def __init__(self, total: int, initial: int = 0, enabled: bool | None = None, desc: str = "generations",
                 line_every: int | None = None, stream: Any = None, best: float = -math.inf):
        self.stream = stream
        tty = sys.stdout.isatty()
        self.enabled = tty if enabled is None else bool(enabled)
        self.lines = enabled is None and not tty
        self.total = total
        self.line_every = line_every or (1 if total <= 50 else math.ceil(total / 50))
        self.bar = None
        if self.enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, unit="gen", dynamic_ncols=True)
        self._best = float(best)

    def __call__(self, record: Mapping[str, Any]) -> None:
        self._best = max(self._best, float(record["pop_max"]))
        if self.lines:
            generation = int(record["generation"])
            if generation % self.line_every == 0 or generation >= self.total:
                print(format_line(record, self.total, self._best), file=self.stream or sys.stdout, flush=True)
            return
        if self.bar is None:
            return
        postfix = {"best": f"{self._best:.1f}", "mean": f"{record['pop_mean']:.1f}"}
        centre = record.get("centre_return")
        if centre is not None and math.isfinite(centre):
            postfix["centre"] = f"{centre:.1f}"
        if "env_steps_per_second" in record:
            postfix["steps/s"] = f"{record['env_steps_per_second']:.3g}"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(int(record["generation"]) - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def format_line(record: Mapping[str, Any], total: int, best: float) -> str:
    """``generation 3/25: mean 21.3, max 45.0 (best 45.0), centre 30.2, 1.2e+04 steps/s, 2.1 s``."""
    parts = [f"generation {int(record['generation'])}/{total}: mean {record['pop_mean']:.1f}",
             f"max {record['pop_max']:.1f} (best {best:.1f})"]
    centre = record.get("centre_return")
    if centre is not None and math.isfinite(centre):
        parts.append(f"centre {centre:.1f}")
    if "env_steps_per_second" in record:
        parts.append(f"{record['env_steps_per_second']:.3g} steps/s")
    if "wall_time" in record:
        parts.append(f"{record['wall_time']:.1f} s")
    return ", ".join(parts)


def close_all(loggers: Iterable[Any], warn: bool = False, completed: bool = True) -> None:
    """Call ``close()`` on every logger that has one, even if an earlier one fails; then raise the first failure, or,
    with ``warn``, warn of each (:func:`jes.train`'s: an error closing the logs, a full log disk, must not replace the
    error that stopped the run, which carries the run so far, nor cost a finished run its result). ``completed``
    goes to each ``close`` that takes it (see :meth:`Logger.close`)."""
    failures = []
    for logger in loggers:
        close = getattr(logger, "close", None)
        if callable(close):
            try:
                try:
                    inspect.signature(close).bind(completed=completed)
                except (TypeError, ValueError):  # a close() of one's own without it (or no signature to read)
                    close()
                else:
                    close(completed=completed)
            except Exception as err:  # keep closing the others; report the failures once all are closed
                failures.append((logger, err))
    if not warn:
        if failures:
            raise failures[0][1]
        return
    # After every close: a warning raised as an error (-W error) leaves no logger unclosed
    for logger, err in failures:
        warnings.warn(f"could not close {type(logger).__name__} ({type(err).__name__}: {err}); what it had not written "
                      f"yet is missing from its logs (the run's result and checkpoint are not affected)", stacklevel=3)


def flush_all(loggers: Iterable[Any], generation: int | None = None, saving: bool = False) -> None:
    """:meth:`Logger.flush` every :class:`Logger` in ``loggers`` up to ``generation``; a logger that fails is
    warned of, not raised: the checkpoint saved next matters more than its logs. ``saving``: a checkpoint is saved
    next, so a :class:`TensorBoardLogger` creates its event file even with nothing to write (the resume of a
    generation-0 checkpoint finds its log dir by it)."""
    for logger in loggers:
        if isinstance(logger, Logger):
            try:
                if saving and isinstance(logger, TensorBoardLogger):
                    logger.create_file()
                try:
                    inspect.signature(logger.flush).bind(generation)
                except TypeError:  # a Logger of one's own whose flush() predates the generation argument
                    logger.flush()
                else:
                    logger.flush(generation)
            except Exception as err:  # noqa: BLE001
                warnings.warn(f"could not flush {type(logger).__name__} ({type(err).__name__}: {err}); its newest "
                              f"scalars may be missing if the run is killed", stacklevel=2)


def event_files(log_dir: str) -> list[str]:
    """``log_dir``'s event files, oldest first: by the second in their names, then by the nanoseconds jes's own add
    (two writers in one second: the resumed run after the run it continues)."""
    def started(path: str) -> tuple:
        parts = os.path.basename(path).split(".")
        seconds = int(parts[3]) if len(parts) > 3 and parts[3].isdigit() else 0
        nanoseconds = int(parts[-1]) if len(parts) > 5 and parts[-1].isdigit() and len(parts[-1]) >= 18 else 0
        return seconds, nanoseconds, path

    return sorted(glob.glob(os.path.join(log_dir, "events.out.tfevents.*")), key=started)


def check_callbacks(callbacks: Any) -> None:
    """``callbacks`` must be a list (any iterable but a string) of functions: one function alone, the common slip,
    failed generations later as "not iterable"."""
    if callable(callbacks) or isinstance(callbacks, (str, bytes)) or not hasattr(callbacks, "__iter__"):
        raise TypeError(f"callbacks must be a list of functions, got {callbacks!r}: pass callbacks=[fn]")
    if isinstance(callbacks, (list, tuple)) and not all(callable(c) for c in callbacks):  # an iterator stays unread
        raise TypeError(f"callbacks must be a list of functions, got {callbacks!r}")


def has_event_files(log_dir: str) -> bool:
    """Whether ``log_dir`` (not its subdirectories) already holds TensorBoard event files."""
    return bool(event_files(log_dir))


def has_logged_scalars(log_dir: str) -> bool:
    """Whether ``log_dir``'s event files (not its subdirectories') hold a scalar: an earlier run's curves, which a
    run logged beside them would be shown with. A file without any (a run stopped during its step's compile by a
    jes that made the file at its start) shows nothing. Each file is read only as far as its first scalar."""
    return any(_holds_scalar(path) for path in event_files(log_dir))


def _holds_scalar(path: str) -> bool:
    """Whether the event file ``path`` holds a scalar before its end or a record that cannot be read (where
    TensorBoard stops reading it too)."""
    from google.protobuf.message import DecodeError
    from tensorboardX.proto import event_pb2

    try:
        with open(path, "rb") as f:
            while True:
                header = f.read(12)
                if len(header) < 12:
                    return False
                (length,) = struct.unpack_from("<Q", header)
                payload = f.read(length)
                if len(payload) < length or len(f.read(4)) < 4:
                    return False
                try:
                    event = event_pb2.Event.FromString(payload)
                except DecodeError:
                    return False
                if any(value.HasField("simple_value") for value in event.summary.value):
                    return True
    except OSError:  # unreadable: TensorBoard cannot show it either
        return False


def final_metrics_at(log_dir: str, generation: int) -> bool:
    """Whether ``log_dir``'s event files hold the final metrics (``hparams/generations``) at step ``generation``:
    a session that completed there wrote them (:meth:`TensorBoardLogger.close`), and its resume's restart marker
    goes at that step to drop them. Only files that name the tag at all are read through."""
    tag = "hparams/generations"
    for path in event_files(log_dir):
        try:
            with open(path, "rb") as f:
                if tag.encode() not in f.read():
                    continue
            for event in _file_events(path):
                if int(event.step) == generation and any(value.tag == tag and value.HasField("simple_value")
                                                         for value in event.summary.value):
                    return True
        except OSError:  # unreadable: TensorBoard cannot show it either
            continue
    return False


def iter_events(log_dir: str):
    """Yield every ``Event`` protobuf in the TensorBoard event files of ``log_dir`` (not its subdirectories).

    Reads the TFRecord framing (u64 length, u32 crc, payload, u32 crc) directly, so it needs only
    tensorboardX's protobufs, not TensorFlow or TensorBoard. A damaged record (a checksum that does not match, a
    file cut short) is warned of, naming the file and the last generation read before it; the records after a
    damaged stretch are read on.

    Raises:
        FileNotFoundError: ``log_dir`` does not exist or holds no event files (the message names the runs its
            subfolders hold, a sweep's configurations).
    """
    for path in _files_to_read(log_dir):
        yield from _file_events(path)


def _files_to_read(log_dir: str) -> list[str]:
    files = event_files(log_dir)
    if files:
        return files
    if not os.path.exists(log_dir):
        raise FileNotFoundError(f"{log_dir!r} does not exist")
    if not os.path.isdir(log_dir):
        raise FileNotFoundError(f"{log_dir!r} is a file, not a run directory (the folder that holds a run's "
                                f"events.out.tfevents.* files)")
    runs = sorted(name for name in os.listdir(log_dir) if event_files(os.path.join(log_dir, name)))
    inside = (f"; its subfolders {', '.join(runs[:4])}{', ...' if len(runs) > 4 else ''} hold runs (a sweep's "
              f"configurations): name those" if runs else "")
    raise FileNotFoundError(f"no TensorBoard event files in {log_dir!r}{inside}")


def _file_events(path: str):
    """The events of one event file, each record's two checksums checked. TensorBoard's reader stops at the first
    bad record, with a warning; here reading goes on at the next whole record after a damaged stretch, and one
    warning at the file's end names the file, each stretch, the generations on either side and the last one read.
    A last record cut short (still being written, or a killed writer's) is left out without a warning."""
    with open(path, "rb") as f:
        data = f.read()
    offset, last_step, damaged, pending = 0, None, [], None
    while offset < len(data):
        record = _record_at(data, offset)
        if record is None:
            resumed = _next_record(data, offset + 1)
            if pending is None:  # a new damaged stretch (else the one before goes on)
                pending = [offset, resumed, _cut_short(data, offset) and resumed is None, last_step, None]
                damaged.append(pending)
            pending[1] = resumed
            if resumed is None:
                break
            offset = resumed
            continue
        event, offset = record
        if any(value.HasField("simple_value") for value in event.summary.value):
            last_step = int(event.step)
            if pending is not None:
                pending[4] = last_step
                pending = None
        yield event
    # A last record cut short is most often one still being written (a writer that writes a record in several
    # calls: tensorboardX's SummaryWriter), or the one a killed run was writing: read up to it without a word, as
    # TensorBoard does.
    damaged = [stretch for stretch in damaged if not stretch[2]]
    if damaged:
        stretches = []
        for start, end, _, before, after in damaged:
            written = ("the scalars written there" + (" (of the file's first generation)" if before is None else
                       f", from generation {before} to {after}" if after is not None and after != before else
                       f", of generation {before}" if after is not None else f", after generation {before}"))
            if end is None:
                stretches.append(f"nothing from byte {start} of {len(data)} on can be read (checksums that do not "
                                 f"match): {written}, are missing")
            else:
                stretches.append(f"bytes {start}-{end} of {len(data)} cannot be read (checksums that do not match) "
                                 f"and are skipped: {written}, are missing")
        warnings.warn(f"TensorBoard event file {path} is damaged: {'; '.join(stretches)}. The last generation read "
                      f"from it is {last_step if last_step is not None else 'none'}", stacklevel=3)


def _record_at(data: bytes, offset: int) -> tuple[Any, int] | None:
    """``(event, next offset)`` of the whole record at ``offset`` whose checksums match and whose payload is an
    ``Event``; ``None``: none there."""
    from google.protobuf.message import DecodeError
    from tensorboardX.proto import event_pb2
    from tensorboardX.record_writer import masked_crc32c

    if offset + 12 > len(data):
        return None
    (length,) = struct.unpack_from("<Q", data, offset)
    end = offset + 12 + length
    if end + 4 > len(data) or struct.unpack_from("<I", data, offset + 8)[0] != masked_crc32c(data[offset: offset + 8]):
        return None
    payload = data[offset + 12: end]
    if struct.unpack_from("<I", data, end)[0] != masked_crc32c(payload):
        return None
    try:
        return event_pb2.Event.FromString(payload), end + 4
    except DecodeError:
        return None


def _cut_short(data: bytes, offset: int) -> bool:
    """Whether the record at ``offset`` is whole as far as it goes but runs past the file's end."""
    from tensorboardX.record_writer import masked_crc32c

    if offset + 12 > len(data):
        return True
    (length,) = struct.unpack_from("<Q", data, offset)
    return (struct.unpack_from("<I", data, offset + 8)[0] == masked_crc32c(data[offset: offset + 8])
            and offset + 16 + length > len(data))


def _next_record(data: bytes, offset: int) -> int | None:
    """The offset of the next whole record at or after ``offset`` (two matching checksums: not a chance match)."""
    for start in range(offset, len(data) - 15):
        (length,) = struct.unpack_from("<Q", data, start)
        if start + 16 + length <= len(data) and _record_at(data, start) is not None:
            return start
    return None


class _Scalars:
    """One run's scalars as TensorBoard reads them: a restart marker purges, a point written again is read once."""

    def __init__(self) -> None:
        self.scalars: dict[str, list[tuple[int, float]]] = {}
        self._seen: set = set()
        self.key: str | None = None  # the run key its files name (see _run_key)

    def add(self, event: Any) -> None:
        if _is_restart(event):
            for tag, points in self.scalars.items():
                self.scalars[tag] = [point for point in points if point[0] < event.step]
            self._seen = {(tag, point) for tag, point in self._seen if point[0] < event.step}
            return
        for value in event.summary.value:
            if value.HasField("simple_value"):
                point = (int(event.step), float(value.simple_value))
                if (value.tag, point) not in self._seen:
                    self._seen.add((value.tag, point))
                    self.scalars.setdefault(value.tag, []).append(point)

    @property
    def last_step(self) -> int:
        return max((step for points in self.scalars.values() for step, _ in points), default=0)

    def result(self) -> dict[str, list[tuple[int, float]]]:
        return {tag: points for tag, points in self.scalars.items() if points}


def _run_key(events: list) -> str | None:
    """The run key in a file's hyperparameter table (``| key | [0, 3] |``, written by :class:`TensorBoardLogger`
    when the run starts or resumes), or ``None``."""
    for event in events:
        for value in event.summary.value:
            if value.tag.startswith("hparams") and value.tensor.string_val:
                for line in value.tensor.string_val[0].decode("utf-8", "replace").splitlines():
                    cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
                    if len(cells) == 2 and cells[0] == "key":
                        return cells[1]
    return None


def _is_restart(event: Any) -> bool:
    return event.HasField("session_log") and event.session_log.status == event.session_log.START


def read_scalars(log_dir: str) -> dict[str, list[tuple[int, float]]]:
    """All scalars in ``log_dir``'s event files: ``{tag: [(step, value), ...]}`` in file order, as TensorBoard shows
    the folder (one run, whatever wrote it; :func:`read_runs` tells separate runs apart).

    A resumed run's restart marker (a ``SessionLog.START`` event at step S, as TensorBoard reads it) drops the
    points read so far from step S on: those a killed run wrote past its last checkpoint, which the resumed run
    logs again. A point written again with the same value is read once (an earlier jes, without the marker,
    logged a generation interrupted among its callbacks again, with the same bits). Other values at a step already
    read are all kept: another run's in the same folder, and, in logs of an earlier jes, the timings (``perf/*``)
    of such a generation logged twice."""
    scalars = _Scalars()
    for event in iter_events(log_dir):
        scalars.add(event)
    return scalars.result()


def read_runs(log_dir: str) -> list[dict[str, list[tuple[int, float]]]]:
    """The scalars of each run that logged into ``log_dir``, oldest first, each as :func:`read_scalars` gives a
    folder's; a run that logged no scalar is left out.

    A run resumed from its checkpoint (its event file starts with the restart marker) continues the run it resumes,
    as in TensorBoard: the points logged past the checkpoint are superseded, and its curves go on. A fresh run
    logged into a folder that already held another (its checkpoint deleted to start over, or written elsewhere)
    starts at generation 1 without a marker: it is a run of its own, where TensorBoard would draw both as one
    line. Files of an earlier jes, which wrote no marker, continue the run before them unless they start at
    generation 1.

    Raises:
        FileNotFoundError: as :func:`iter_events`.
    """
    runs: list[_Scalars] = []
    for path in _files_to_read(log_dir):
        events = list(_file_events(path))
        restart = next((int(event.step) for event in events if _is_restart(event)), None)
        first = next((int(event.step) for event in events
                      if any(value.HasField("simple_value") for value in event.summary.value)), None)
        start = restart if restart is not None else first
        key = _run_key(events)
        # A resumed run continues its key's run (two runs of one key and config are the same run, bit for bit): another
        # run in the folder, longer or newer, is never the one it resumes. Files without a key (an earlier jes) can
        # only be told by their generations.
        candidates = [run for run in runs if key is None or run.key is None or run.key == key]
        if candidates and start is not None and (restart is not None or start > 1):
            # the newest run that got as far as the generation before this file's first: the one it resumes
            run = next((run for run in reversed(candidates) if run.last_step >= start - 1), candidates[-1])
        else:
            run = _Scalars()
            runs.append(run)
        run.key = run.key if run.key is not None else key
        for event in events:
            run.add(event)
    return [run.result() for run in runs if run.result()]


def read_summary_tags(log_dir: str) -> list[str]:
    """Tags of every non-scalar summary (text, hparams plugin entries) in ``log_dir``'s event files."""
    return [value.tag for event in iter_events(log_dir) for value in event.summary.value
            if not value.HasField("simple_value")]
