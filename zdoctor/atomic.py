"""Write files the careful way: temp file in the same directory, fsync, rename, fsync the directory."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import tempfile
import time
from pathlib import Path

from .errors import InputError


def _write_through(target: Path, text: str, follow: bool) -> Path:
    """Write ``text`` into an existing device, pipe or socket.

    ``O_NONBLOCK`` on the open: a FIFO nobody reads (ENXIO) is waited for :data:`FIFO_READER_WAIT`
    seconds, then refused, instead of hanging zdoctor; blocking writes are restored once it is open.
    ``follow`` False adds ``O_NOFOLLOW``.
    """
    own = _own_stream(target) if follow else None
    if own is not None:  # /dev/stdout of a redirected zdoctor: write where the stream is, not at offset 0
        try:
            data = text.encode("utf-8", "backslashreplace")
            while data:
                data = data[os.write(own, data):]
        except OSError as exc:
            raise InputError(f"{target}: cannot write ({exc.strerror or exc})") from None
        return target
    flags = os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    deadline = time.monotonic() + FIFO_READER_WAIT
    while True:
        try:
            fd = os.open(target, flags)
            break
        except OSError as exc:
            if exc.errno == errno.ENXIO and time.monotonic() < deadline:
                time.sleep(0.05)  # a FIFO whose reader is about to open it
                continue
            err = exc
        if err.errno == errno.ENXIO:
            raise InputError(f"{target}: no process read this FIFO within {FIFO_READER_WAIT:g}s; "
                             "nothing written") from None
        if err.errno == errno.ELOOP:
            raise InputError(f"{target}: became a symbolic link; nothing written") from None
        raise InputError(f"{target}: cannot write ({err.strerror or err})") from None
    try:
        os.set_blocking(fd, True)
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace", newline="") as fh:
            fh.write(text)
    except OSError as exc:
        raise InputError(f"{target}: cannot write ({exc.strerror or exc})") from None
    return target


#: How long a FIFO named as the output may go without a reader before the write is refused.
FIFO_READER_WAIT = 10.0


def _own_stream(target: Path) -> int | None:
    """1 or 2 when ``target`` is this process's standard output or error (``/dev/stdout``)."""
    try:
        st = os.stat(target)
    except OSError:
        return None
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            own = os.fstat(fd)
            if (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino):
                if fd == 1:
                    sys.stdout.flush()
                return fd
    return None


def _system_link(target: Path) -> bool:
    """Whether ``target`` is a link the system itself keeps (``/dev/stdout``, ``/proc/self/fd/1``):
    under /dev or /proc, in a folder that only root can change."""
    full = os.path.abspath(target)
    if not full.startswith(("/dev/", "/proc/")):
        return False
    try:
        parent = os.lstat(os.path.dirname(full))
    except OSError:
        return False
    return full.startswith("/proc/") or (parent.st_uid == 0 and not parent.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _special_target(target: Path) -> bool | None:
    """How to treat an existing ``target`` that is not a regular file: True to write through it
    following links, False to write through it without following, None for a plain (atomic) write.

    A device, FIFO or socket named by the user is written through. A symbolic link that leads to one
    is refused unless the system keeps the link (``/dev/stdout``): a link planted in a shared folder
    would otherwise make an export write into a disk or hang on a FIFO.
    """
    try:
        lst = os.lstat(target)
    except OSError:
        return None
    if stat.S_ISLNK(lst.st_mode):
        if _system_link(target):  # /dev/stdout: whatever it leads to (a redirected file too), never replaced
            return True
        try:
            st = os.stat(target)
        except OSError:  # a dangling link: replaced by the new file, its target untouched
            return None
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
            return None
        from .userfile import kind_of

        raise InputError(f"{target}: a symbolic link to {kind_of(st.st_mode)} ({os.path.realpath(target)}); "
                         "refusing to write through it (name the file itself, or -o - for standard output)")
    if stat.S_ISREG(lst.st_mode) or stat.S_ISDIR(lst.st_mode):
        return None
    if lst.st_uid != os.geteuid() and not _system_path(target):
        from .userfile import kind_of

        raise InputError(f"{target}: {kind_of(lst.st_mode)} that belongs to another user (uid {lst.st_uid}); "
                         "refusing to write into it (name a file of your own, or -o - for standard output)")
    return False


def _system_path(target: Path) -> bool:
    """Whether ``target`` lies under /dev or /proc, which only the system populates (``/dev/null``)."""
    return os.path.abspath(target).startswith(("/dev/", "/proc/"))


def write_text_atomic(path: str | os.PathLike[str], text: str, mode: int = 0o600) -> Path:
    """Replace ``path`` with ``text`` atomically; readers see the old file or the new one, never half.

    Undecodable characters (file names that are not UTF-8) are written as backslash escapes. Any
    failure leaves the old file untouched and raises :class:`InputError` with one line. A target that
    is a device, pipe or socket (``/dev/null``, ``/dev/stdout``, a FIFO) is written through, never
    replaced: renaming over it would swap the device node for a plain file; a symbolic link to one is
    refused unless the system keeps it (see :func:`_special_target`). A symbolic link to a regular file
    is replaced by the new file (the rename never follows it).
    """
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise InputError(f"{target}: is a directory")
    special = _special_target(target)
    if special is not None:
        return _write_through(target, text, follow=special)
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
