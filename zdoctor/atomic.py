"""Write files the careful way: temp file in the same directory, fsync, rename, fsync the directory."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from .errors import InputError


def _write_through(target: Path, text: str) -> Path:
    """Write ``text`` into an existing device, pipe or socket."""
    try:
        fd = os.open(target, os.O_WRONLY | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace", newline="") as fh:
            fh.write(text)
    except OSError as exc:
        raise InputError(f"{target}: cannot write ({exc.strerror or exc})") from None
    return target


def write_text_atomic(path: str | os.PathLike[str], text: str, mode: int = 0o600) -> Path:
    """Replace ``path`` with ``text`` atomically; readers see the old file or the new one, never half.

    Undecodable characters (file names that are not UTF-8) are written as backslash escapes. Any
    failure leaves the old file untouched and raises :class:`InputError` with one line. A target that
    is a device, pipe or socket (``/dev/null``, ``/dev/stdout``, a FIFO) is written through, never
    replaced: renaming over it would swap the device node for a plain file.
    """
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise InputError(f"{target}: is a directory")
    with contextlib.suppress(OSError):
        if not stat.S_ISREG(os.stat(target).st_mode):
            return _write_through(target, text)
    if not folder.is_dir():
        raise InputError(f"{target}: directory {folder} does not exist")
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace", newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        raise InputError(f"{target}: cannot write ({exc.strerror or exc})") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    with contextlib.suppress(OSError):
        dfd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return target
