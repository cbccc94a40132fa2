"""Write files the careful way: temp file in the same directory, fsync, rename, fsync the directory."""

from __future__ import annotations

import contextlib
import os
import tempfile

from .errors import InputError


def write_text_atomic(path: str | os.PathLike[str], text: str, mode: int = 0o600) -> None:
    """Replace ``path`` with ``text`` atomically; readers see the old file or the new one, never half.

    Any failure leaves the old file untouched and raises :class:`InputError` with one line.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".zdoctor-", suffix=".tmp", dir=directory)
    except FileNotFoundError:
        raise InputError(f"{path}: directory {directory} does not exist") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot write ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise InputError(f"{path}: cannot write ({exc.strerror or exc})") from None
    try:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
