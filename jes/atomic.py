"""Files written whole or not at all: a temporary file beside the target, then ``os.replace`` over it."""
from __future__ import annotations

import os
import tempfile
from typing import Any, Callable


def write_atomically(path: str, write: Callable[[Any], None], mode: str = "wb") -> None:
    """Write a file through ``write(f)`` into a temporary file beside ``path``, then ``os.replace`` it over ``path``:
    an interrupt or an error midway (Ctrl-C while a GIF's frames are encoded, a full disk) leaves the file that was
    at ``path`` as it was, and removes the temporary one. The file gets the permissions a plain ``open`` would give."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = None
    try:
        # Inside the try: a Ctrl-C right after mkstemp created the file still removes it
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would keep a picture from whoever else reads the folder
        os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        raise
