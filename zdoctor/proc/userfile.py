"""The one way zdoctor opens a file a user named (ds_config, model config, log, snapshot, hostfile,
playbook): a regular file only, checked before it is opened, and never read past a size cap.

``/dev/zero`` would be read until memory runs out, a FIFO blocks the open (and every read) until a
writer comes, a directory or a socket is not a document: each is refused with one line. The file is
opened with ``O_NONBLOCK`` (a FIFO swapped in after the check cannot hang the open) and checked
again on the open descriptor.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from typing import BinaryIO, TextIO

from zdoctor.core.errors import InputError
from zdoctor.proc.asuser import open_as

#: Who reads a file where a group or everyone may change the folder: no user in particular.
NOBODY = 65534

#: What a file type is called in messages.
_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def kind_of(mode: int) -> str:
    """``a FIFO (named pipe)``, ``a character device`` ... for a non-regular ``st_mode``."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):g} MiB"


def controller(path: str) -> int | None:
    """The uid whose rights root reads ``path`` with: the owner of the first folder on the way that a user
    other than root can change (``asuser.NOBODY`` where a group or everyone may, with no sticky bit), or of a
    link that is the last part; None when only root can change the way to it (then root reads it)."""
    full = os.path.abspath(path)
    folder = "/"
    for part in [p for p in os.path.dirname(full).split("/") if p]:
        folder = os.path.join(folder, part)
        try:
            st = os.stat(folder)
        except OSError:
            return None  # the open fails, and says why
        if st.st_uid != 0 and st.st_mode & stat.S_IWUSR:
            return st.st_uid
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            return NOBODY
    try:
        last = os.lstat(full)
    except OSError:
        return None
    return last.st_uid if stat.S_ISLNK(last.st_mode) and last.st_uid != 0 else None


def _open_as_controller(path: str, uid: int, what: str, cap: int | None) -> tuple[BinaryIO, os.stat_result]:
    """``path`` opened with the rights of ``uid`` (see :func:`controller`)."""

    try:
        fd = open_as(path, uid)
    except FileNotFoundError:
        raise InputError(f"{path}: no such {what}") from None
    except PermissionError:
        raise InputError(f"{path}: permission denied (read as uid {uid}, who can change the folder it is "
                         "in)") from None
    except OSError as exc:
        if exc.errno == errno.EINVAL and str(exc.strerror).startswith("mode "):
            raise _not_regular(path, int(str(exc.strerror)[5:], 8), what) from None
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return _regular(fd, path, what, None)


def _not_regular(path: str, mode: int, what: str) -> InputError:
    return InputError(f"{path}: is {kind_of(mode)}, not a regular file; only regular files are read as a {what}")


def _too_large(path: str, size: int, cap: int, what: str) -> InputError:
    return InputError(f"{path}: {size} bytes, larger than the {_mib(cap)} a {what} may be")


def _regular(fd: int, path: str, what: str, cap: int | None) -> tuple[BinaryIO, os.stat_result]:
    """The open descriptor ``fd`` as a file, checked on the descriptor itself: a regular file (replaced
    between a check and the open, or opened as another user), at most ``cap`` bytes; closed when refused."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, st.st_mode, what)
        if cap is not None and st.st_size > cap:
            raise _too_large(path, st.st_size, cap, what)
        return os.fdopen(fd, "rb"), st
    except BaseException:
        os.close(fd)
        raise


def open_user_file(path: str, what: str = "file", cap: int | None = None) -> tuple[BinaryIO, os.stat_result]:
    """Open ``path`` for reading after checking that it is a regular file (at most ``cap`` bytes when
    given); any refusal is an :class:`InputError` of one line naming the file and ``what`` it was to be.
    As root, a file on a way another user can change is opened with that user's rights (:func:`controller`):
    a link they planted to a file only root may read is not read."""
    owner = controller(path) if os.geteuid() == 0 else None
    if owner is not None:
        return _open_as_controller(path, owner, what, cap)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such {what}") from None
    except PermissionError:
        raise InputError(f"{path}: permission denied") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st.st_mode, what)
    if cap is not None and st.st_size > cap:
        raise _too_large(path, st.st_size, cap, what)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except PermissionError:
        raise InputError(f"{path}: permission denied") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return _regular(fd, path, what, cap)


def read_user_file(path: str, what: str = "file", cap: int = 16 * 1024 * 1024) -> bytes:
    """The bytes of the regular file ``path``, refused (:class:`InputError`) past ``cap`` bytes."""
    fh, _st = open_user_file(path, what, cap)
    try:
        with fh:
            raw = fh.read(cap + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(raw) > cap:  # it grew after the check
        raise InputError(f"{path}: larger than the {_mib(cap)} a {what} may be")
    return raw


class NotARegularFile(OSError):
    """A path zdoctor reads on its own (a library, a build file, a log) is a FIFO, a device or a socket.

    An :class:`OSError`, so code that already treats an unreadable file as such keeps doing so."""


def open_regular(path: str | os.PathLike[str], *, nofollow: bool = False) -> BinaryIO:
    """Open ``path`` for binary reading, refusing anything but a regular file, without ever blocking.

    Every file zdoctor reads goes through here or :func:`open_user_file`: ``O_NONBLOCK`` makes the open
    of a FIFO return at once (a FIFO named ``libstdc++.so.6`` or ``build.ninja`` would block the open
    until a writer came), and the open descriptor is checked to be a regular file before a byte is read.
    ``nofollow`` refuses a symbolic link at ``path`` (a folder another user writes into).
    Raises :class:`OSError` (:class:`NotARegularFile` for a FIFO, device, socket or directory).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    if nofollow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(errno.EINVAL, f"is {kind_of(st.st_mode)}, not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_regular_text(path: str | os.PathLike[str], *, encoding: str = "utf-8", errors: str = "strict",
                      nofollow: bool = False) -> TextIO:
    """:func:`open_regular` for text."""
    return io.TextIOWrapper(open_regular(path, nofollow=nofollow), encoding=encoding, errors=errors)


def read_system_table(path: str | os.PathLike[str]) -> str | None:
    """The whole text of the regular file ``path`` (a table of the system's: bytes that are not UTF-8 kept
    as surrogates), or None when it cannot be read."""
    try:
        with open_regular_text(path, encoding="utf-8", errors="surrogateescape") as fh:
            return fh.read()
    except OSError:
        return None


def read_prefix(path: str | os.PathLike[str], limit: int, *, nofollow: bool = False) -> tuple[bytes, bool]:
    """At most ``limit`` bytes from the start of the regular file ``path``: (data, cut)."""
    with open_regular(path, nofollow=nofollow) as fh:
        data = fh.read(limit + 1)
    return data[:limit], len(data) > limit


def read_suffix(path: str | os.PathLike[str], limit: int, *, nofollow: bool = False) -> tuple[bytes, bool]:
    """At most the last ``limit`` bytes of the regular file ``path``: (data, cut)."""
    with open_regular(path, nofollow=nofollow) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            fh.seek(size - limit)
        return fh.read(limit), size > limit
