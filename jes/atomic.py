"""Files written whole or not at all: a temporary file beside the target, then ``os.replace`` over it."""
from __future__ import annotations

import errno
import os
import tempfile
from typing import Any, Callable


def write_atomically(path: str, write: Callable[[Any], None], mode: str = "wb") -> None:
    """Write a file through ``write(f)`` into a temporary file beside ``path``, then ``os.replace`` it over ``path``:
    an interrupt or an error midway (Ctrl-C while a GIF's frames are encoded, a full disk) leaves the file that was
    at ``path`` as it was, and removes the temporary one. The file keeps the permissions of the file it replaces; a new one gets those a plain ``open`` gives.

    Raises:
        OSError: ``path`` cannot be written (its folder is a file, or takes no new file; ``path`` is a folder): the
            message names ``path``, never the temporary file. Errors of ``write`` itself are raised as they are.
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as err:
        raise _cannot_write(path, err) from err
    tmp = None
    try:
        # Inside the try: a Ctrl-C right after mkstemp created the file still removes it
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
        except OSError as err:
            raise _cannot_write(path, err) from err
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, file_mode(path))  # mkstemp's 0600 would keep a picture from whoever else reads the folder
        try:
            os.replace(tmp, path)
        except OSError as err:
            raise _cannot_write(path, err) from err
    except BaseException:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        raise


def plain_file_mode() -> int:
    """``0666 & ~umask``: the permissions a plain ``open`` gives a new file, for a file made with ``tempfile.mkstemp``
    (always 0600, which keeps it from the folder's other readers: a group sharing runs, a colleague's ``jes eval``)."""
    return 0o666 & ~_umask()


def file_mode(path: str) -> int:
    """The permissions a file written over ``path`` gets: those of the file there now (a deliberate ``chmod 600`` or
    ``644`` stays), else :func:`plain_file_mode`'s."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        return plain_file_mode()


def _umask() -> int:
    """The process's umask, read without setting it (``os.umask`` sets it process-wide, a race with other threads
    creating files): from ``/proc/self/status`` where Linux says it, else as it was when jes was imported."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return _UMASK_AT_IMPORT


def _read_umask_once() -> int:
    umask = os.umask(0o022)  # once, at import; set back at once
    os.umask(umask)
    return umask


_UMASK_AT_IMPORT = _read_umask_once()


def check_writable(path: str) -> None:
    """Raise an ``OSError`` naming ``path`` when a file cannot be written there (see :func:`write_atomically`), before
    the work whose result goes there: a file is created in (and removed from) its folder, or the nearest folder
    above it that exists (:func:`write_atomically` makes the rest)."""
    problem = _unwritable(path)
    if problem is not None:
        raise _error(path, *problem)


def _unwritable(path: str) -> tuple[type[OSError], int | None, str] | None:
    """``(error type, errno, why)`` a file cannot be written at ``path``; ``None``: it can, as a probe file says."""
    target = os.path.abspath(path)
    if os.path.isdir(target):
        return IsADirectoryError, errno.EISDIR, "it is a folder; give a file name in it"
    return folder_problem(os.path.dirname(target))


def folder_problem(folder: str) -> tuple[type[OSError], int | None, str] | None:
    """``(error type, errno, why)`` files cannot be created in ``folder``, or in the nearest folder above it that
    exists (the writer makes the rest); ``None``: they can, as a probe file created there and removed says."""
    existing = os.path.abspath(folder)
    while not os.path.isdir(existing):
        if os.path.lexists(existing):
            return NotADirectoryError, errno.ENOTDIR, f"{existing!r} is a file, not a folder"
        existing = os.path.dirname(existing)
    try:
        fd, probe = tempfile.mkstemp(prefix=".jes-write-check.", suffix=".tmp", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        return type(err), err.errno, f"a file cannot be created in {existing!r} ({err.strerror or err})"
    return None


def _cannot_write(path: str, err: OSError) -> OSError:
    """An error of creating the folder, the temporary file or the final rename, as one that names the path the caller
    gave and the cause: "File exists: 'run/checkpoint.ckpt'" (a file where the folder should be) read as a refusal to
    overwrite it, and jes's hidden temporary file is nothing the caller asked for."""
    problem = _unwritable(path)
    return _error(path, *(problem if problem is not None else (type(err), err.errno, err.strerror or str(err))))


def _error(path: str, error_type: type[OSError], number: int | None, reason: str) -> OSError:
    error = error_type(f"cannot write {path!r}: {reason}")  # one argument: the message as it is, no "[Errno n]"
    error.errno = number
    return error
