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

from zdoctor.core.errors import InputError
from zdoctor.proc.userfile import kind_of


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
        raise InputError(f"{target}: a symbolic link to {kind_of(st.st_mode)} ({os.path.realpath(target)}); "
                         "refusing to write through it (name the file itself, or -o - for standard output)")
    if stat.S_ISREG(lst.st_mode) or stat.S_ISDIR(lst.st_mode):
        return None
    if lst.st_uid != os.geteuid() and not _system_path(target):
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


# -- replacing a file another user may control -------------------------------------------------------------

#: Read at most this much of a file being replaced (fstab, ds_config).
REPLACE_CAP = 64 * 1024 * 1024
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY


def _read_fd(fd: int, cap: int) -> bytes:
    chunks, size = [], 0
    while size <= cap:
        block = os.read(fd, 1 << 20)
        if not block:
            break
        chunks.append(block)
        size += len(block)
    if size > cap:
        raise OSError(errno.EFBIG, f"larger than {cap} bytes")
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class CheckedReplace:
    """One file replaced the careful way, in steps the caller can put a check between (fstab's
    ``findmnt --verify`` of the staged file).

    :meth:`stage` opens the folder once and works relative to that descriptor from then on: the file is
    opened with ``O_NOFOLLOW`` (a symbolic link is refused), must be a regular file, owned by
    ``expect_uid`` when given and hold exactly the bytes the preview showed (``expect``), and the new
    bytes are written beside it (``O_EXCL``, the file's mode and, as root, its owner; fsync).
    :meth:`commit` backs the old bytes up under a name no file has yet (written aside, then hard-linked
    into place, so a backup is never overwritten nor half-written), checks once more that the file is
    the one that was read and unchanged (a concurrent edit is refused, not lost), renames the new file
    into place and fsyncs the folder. A kill at any point leaves the old file or the new one.
    """

    def __init__(self, path: str, dir_fd: int, name: str, original: bytes, st: os.stat_result, tmp: str) -> None:
        self.path, self.dir_fd, self.name, self.original, self.st, self.tmp = path, dir_fd, name, original, st, tmp
        self.backup: str | None = None

    @property
    def folder(self) -> str:
        return os.path.dirname(os.path.abspath(self.path))

    @property
    def staged_path(self) -> str:
        return os.path.join(self.folder, self.tmp)

    @classmethod
    def stage(cls, path: str, new: bytes, *, expect: bytes | None = None, expect_uid: int | None = None,
              what: str = "file") -> CheckedReplace:
        """Check ``path`` and write ``new`` beside it; :class:`InputError` (nothing changed) on any refusal."""
        folder, name = os.path.split(os.path.abspath(path))
        try:
            dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise InputError(f"{folder}: cannot open the folder of the {what} ({exc.strerror or exc}); "
                             "nothing changed") from None
        try:
            original, st = _read_checked(path, dir_fd, name, expect, expect_uid, what)
            tmp = _create_beside(dir_fd, name, new, st, path)
            return cls(path, dir_fd, name, original, st, tmp)
        except BaseException:
            os.close(dir_fd)
            raise

    def back_up(self, backup: str) -> str:
        """Keep the old bytes under ``backup`` (the preferred name, in the same folder) or the next free
        name; returns the path used. :class:`InputError` (nothing changed) when that fails."""
        try:
            self.backup = _link_backup(self, os.path.basename(backup))
        except OSError as exc:
            raise InputError(f"{backup}: cannot write the backup ({exc.strerror or exc}); nothing changed") from None
        return self.backup

    def commit(self, backup: str | None) -> str | None:
        """Back up (``backup``: see :meth:`back_up`; None: no new backup), re-check and rename into place.
        Returns the backup's path. :class:`InputError` leaves the file as it was."""
        try:
            if backup is not None:
                self.back_up(backup)
            _read_checked(self.path, self.dir_fd, self.name, self.original, self.st.st_uid, "file",
                          same_as=self.st)
            os.rename(self.tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
            self.tmp = ""
            with contextlib.suppress(OSError):
                os.fsync(self.dir_fd)
            return self.backup
        except OSError as exc:
            raise InputError(f"{self.path}: cannot replace ({exc.strerror or exc}); nothing changed") from None
        finally:
            self.close()

    def close(self) -> None:
        """Remove the staged file if it was not committed, and let go of the folder."""
        if self.dir_fd < 0:
            return
        if self.tmp:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp, dir_fd=self.dir_fd)
            self.tmp = ""
        os.close(self.dir_fd)
        self.dir_fd = -1


def _read_checked(path: str, dir_fd: int, name: str, expect: bytes | None, expect_uid: int | None, what: str,
                  same_as: os.stat_result | None = None) -> tuple[bytes, os.stat_result]:
    """Open ``name`` in ``dir_fd`` without following links and check it (see :class:`CheckedReplace`)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(f"{path}: is a symbolic link; refusing to write through it (nothing changed)") from None
        raise InputError(f"{path}: cannot read ({exc.strerror or exc}); nothing changed") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):

            raise InputError(f"{path}: is {kind_of(st.st_mode)}, not a regular file; nothing changed")
        if same_as is not None and (st.st_dev, st.st_ino) != (same_as.st_dev, same_as.st_ino):
            raise InputError(f"{path}: was replaced by another file while zdoctor worked; nothing changed")
        if expect_uid is not None and st.st_uid != expect_uid:
            raise InputError(f"{path}: now belongs to uid {st.st_uid}, not uid {expect_uid} as when it was "
                             "shown; nothing changed")
        try:
            data = _read_fd(fd, REPLACE_CAP)
        except OSError as exc:
            raise InputError(f"{path}: cannot read ({exc.strerror or exc}); nothing changed") from None
    finally:
        os.close(fd)
    if expect is not None and data != expect:
        raise InputError(f"{path}: changed since it was shown (someone edited it); nothing changed - look at "
                         "it again and re-run")
    return data, st


def _create_beside(dir_fd: int, name: str, data: bytes, like: os.stat_result, path: str) -> str:
    """A new file next to ``name`` (``O_EXCL``) holding ``data``, with ``like``'s mode (and owner, as root)."""
    for _ in range(100):
        tmp = f".{name}.zdoctor-{os.urandom(4).hex()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=dir_fd)
            break
        except FileExistsError:
            continue
        except OSError as exc:
            raise InputError(f"{path}: cannot write beside it ({exc.strerror or exc}); nothing changed") from None
    else:
        raise InputError(f"{path}: no free name to write beside it; nothing changed")
    try:
        try:
            _write_all(fd, data)
            if os.geteuid() == 0:
                os.fchown(fd, like.st_uid, like.st_gid)
            os.fchmod(fd, stat.S_IMODE(like.st_mode))
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        if isinstance(exc, OSError):
            raise InputError(f"{path}: cannot write beside it ({exc.strerror or exc}); nothing changed") from None
        raise
    return tmp


def _link_backup(rep: CheckedReplace, preferred: str) -> str:
    """Write the original bytes aside and hard-link them in as ``preferred`` (``-2``, ``-3`` ... when that
    name is taken): ``link`` never replaces an existing name, so no backup is ever overwritten."""
    tmp = _create_beside(rep.dir_fd, rep.name, rep.original, rep.st, rep.path)
    try:
        with contextlib.suppress(OSError):
            os.utime(tmp, ns=(rep.st.st_atime_ns, rep.st.st_mtime_ns), dir_fd=rep.dir_fd, follow_symlinks=False)
        for n in range(1, 1000):
            cand = preferred if n == 1 else f"{preferred}-{n}"
            try:
                os.link(tmp, cand, src_dir_fd=rep.dir_fd, dst_dir_fd=rep.dir_fd, follow_symlinks=False)
            except FileExistsError:
                continue
            with contextlib.suppress(OSError):
                os.fsync(rep.dir_fd)
            return os.path.join(rep.folder, cand)
        raise InputError(f"{rep.path}: no free backup name like {preferred}; nothing changed")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=rep.dir_fd)


def replace_checked(path: str, new: bytes, *, expect: bytes, backup: str | None, expect_uid: int | None = None,
                    what: str = "file") -> str | None:
    """Replace ``path`` with ``new`` if it still holds ``expect`` (see :class:`CheckedReplace`); returns
    the backup's path. :class:`InputError` (one line, nothing changed) on any refusal."""
    return CheckedReplace.stage(path, new, expect=expect, expect_uid=expect_uid, what=what).commit(backup)


def create_checked(path: str, new: bytes, mode: int = 0o644) -> None:
    """Create ``path`` holding ``new`` only while no file has that name: its folder is opened without
    following links, the bytes are written beside it (``O_EXCL``, ``mode``, fsync) and hard-linked in as
    the name (``link`` fails rather than replace what appeared meanwhile), so the file appears whole or
    not at all. :class:`InputError` (one line, nothing changed) on any refusal."""
    folder, name = os.path.split(os.path.abspath(path))
    try:
        dir_fd = open_dir_nofollow(folder)
    except OSError as exc:
        raise InputError(f"{folder}: cannot open it without following links ({exc.strerror or exc}); "
                         "nothing changed") from None
    try:
        like = os.stat_result((stat.S_IFREG | mode, 0, 0, 1, os.geteuid(), os.getegid(), 0, 0, 0, 0))
        tmp = _create_beside(dir_fd, name, new, like, path)
        try:
            os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        except FileExistsError:
            raise InputError(f"{path} already exists: refusing to replace it (only a free name is written); "
                             "nothing changed") from None
        except OSError as exc:
            raise InputError(f"{path}: cannot create ({exc.strerror or exc}); nothing changed") from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
        with contextlib.suppress(OSError):
            os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def open_dir_nofollow(path: str) -> int:
    """A descriptor of the directory ``path``, reached one component at a time with ``O_NOFOLLOW`` from
    where the path led when it was resolved: a component swapped for a symbolic link since then (or the
    directory itself being a link) fails with ELOOP or ENOTDIR instead of being followed."""
    real = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    parts = [p for p in real.split("/") if p] + [os.path.basename(os.path.abspath(path))]
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _remove_tree_at(dir_fd: int, name: str) -> None:
    """Remove directory ``name`` of the folder ``dir_fd`` and everything in it, each entry relative to its
    folder's descriptor and never through a link (``shutil.rmtree`` takes ``dir_fd`` only from Python 3.11)."""
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        with os.scandir(fd) as entries:
            names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
        for entry, is_dir in names:
            if is_dir:
                _remove_tree_at(fd, entry)
            else:
                os.unlink(entry, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def remove_checked(path: str, kind: str = "file") -> str:
    """Remove ``path`` (a regular file, or with ``kind="dir"`` a directory tree) without following any
    link: its folder is opened with :func:`open_dir_nofollow`, the entry is checked there to be what
    ``kind`` says (a link is refused, never followed) and removed relative to that descriptor (a tree
    entry by entry, each relative to its folder's descriptor). Returns what was done, in words; an
    :class:`InputError` (one line, nothing removed) when the path is not what it was."""
    folder, name = os.path.split(os.path.abspath(path))
    try:
        dir_fd = open_dir_nofollow(folder)
    except OSError as exc:
        why = "a symbolic link is on the way (swapped in since it was looked at)" \
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) else (exc.strerror or str(exc))
        raise InputError(f"{path}: not removed: cannot open {folder} without following links ({why})") from None
    try:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return f"{path} is already gone"
        want = stat.S_ISDIR if kind == "dir" else stat.S_ISREG
        if not want(st.st_mode):

            what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else kind_of(st.st_mode)
            raise InputError(f"{path}: not removed: it is {what}, not the {kind} that was found")
        try:
            if kind == "dir":
                _remove_tree_at(dir_fd, name)
            else:
                os.unlink(name, dir_fd=dir_fd)
        except OSError as exc:
            raise InputError(f"{path}: not removed ({exc.strerror or exc})") from None
        with contextlib.suppress(OSError):
            os.fsync(dir_fd)
        return f"removed {path}"
    finally:
        os.close(dir_fd)
