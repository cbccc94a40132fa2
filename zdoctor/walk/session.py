"""The append-only session log: one JSONL file per session, one fsync'd line per event.

Files live in ``$XDG_STATE_HOME/zdoctor/sessions/<id>.jsonl`` (``~/.local/state/zdoctor`` when the
variable is unset or not absolute). Directories are created 0700 and files 0600, whatever the umask.
Each line is ``{"seq": n, "ts": epoch, "type": ..., ...data}``, redacted before it is written and
flushed to disk before :meth:`SessionLog.record` returns, so a dropped SSH connection loses at most
the event in flight. Session ids sort by time: ``YYYYmmddTHHMMSS-xxxx`` (UTC, 4 random hex digits).

The ``state_dir`` arguments below name the zdoctor state directory (the one :func:`state_dir`
returns); sessions sit in its ``sessions`` folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import re
import secrets
import stat
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from zdoctor import __version__
from zdoctor.core.errors import InputError
from zdoctor.core.plural import noun_for
from zdoctor.core.redact import redact
from zdoctor.core.shape import event_problems
from zdoctor.proc.userfile import open_regular
from zdoctor.walk.events import SessionView, fold

SESSION_ID_RE = re.compile(r"\d{8}T\d{6}-[0-9a-f]{4}")
SUFFIX = ".jsonl"
#: Keys every event carries; ``data`` passed to :meth:`SessionLog.record` may not use them.
ENVELOPE = ("seq", "ts", "type")


def state_dir() -> Path:
    """The zdoctor state directory, per the XDG base directory spec (a relative value is ignored)."""
    base = os.environ.get("XDG_STATE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".local" / "state"
    return root / "zdoctor"


def sessions_dir(state: Path | None = None) -> Path:
    """Where the session files live."""
    return (state if state is not None else state_dir()) / "sessions"


def new_session_id(now: float | None = None) -> str:
    """A fresh id, ``YYYYmmddTHHMMSS-xxxx`` in UTC."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{secrets.token_hex(2)}"


def validate_session_id(session_id: str) -> str:
    """Return ``session_id`` if it has the session id shape; anything else is an :class:`InputError`."""
    if not isinstance(session_id, str) or not SESSION_ID_RE.fullmatch(session_id):
        raise InputError(f"invalid session id {session_id!r} (expected YYYYmmddTHHMMSS-xxxx)")
    return session_id


def _refuse_foreign(path: Path, what: str = "session log directory") -> None:
    """Refuse a state folder that is a symbolic link or belongs to another user: zdoctor (often root)
    would otherwise write its logs, and tighten modes, wherever the link or its owner points."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise InputError(f"cannot create {what} {path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise InputError(f"refusing {what} {path}: it is a symbolic link "
                         f"(to {os.path.realpath(path)}); remove it or set XDG_STATE_HOME")
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"cannot keep session logs in {path}: not a directory")
    if st.st_uid != os.getuid():
        raise InputError(f"refusing {what} {path}: owned by uid {st.st_uid}, not by the "
                         f"current user (uid {os.getuid()})")


def ensure_private_dir(path: Path, what: str = "session log directory") -> None:
    """Create ``path`` and missing parents with mode 0700 (XDG spec); tighten the folder itself.

    The folder and the one above it (``zdoctor/sessions``, ``zdoctor/fixes``) must be real directories
    of the current user: a symbolic link or another user's folder is refused (:func:`_refuse_foreign`),
    never followed. Missing folders are only created below an existing directory of the current user
    that is not ``/``: ``HOME=/nonexistent`` must not make root create ``/nonexistent/.local/...``.
    """
    for own in (path.parent, path):
        _refuse_foreign(own, what)
    missing: list[Path] = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    if missing:
        _refuse_base(path, probe, missing[-1], what)
    try:
        for d in reversed(missing):
            try:
                os.mkdir(d, 0o700)
            except FileExistsError:
                continue
            os.chmod(d, 0o700)
        for own in (path.parent, path):
            _refuse_foreign(own, what)  # again: a link planted between the check and the mkdir
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))
        try:
            st = os.fstat(fd)
            if stat.S_IMODE(st.st_mode) != 0o700:
                os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
    except OSError as exc:
        raise InputError(f"cannot create session log directory {path}: {exc.strerror or exc}") from None


def _refuse_base(path: Path, base: Path, first: Path, what: str) -> None:
    """Refuse to create ``first`` (the topmost missing folder of ``path``) inside ``base`` unless
    ``base`` is a directory of the current user other than ``/``."""
    try:
        st = os.stat(base)
    except OSError as exc:
        raise InputError(f"cannot create {what} {path}: {base}: {exc.strerror or exc}") from None
    if str(base) == "/" or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        why = f"{first} does not exist" if str(base) == "/" else \
            f"{first} does not exist and {base} belongs to uid {st.st_uid}, not the current user"
        raise InputError(f"not creating {what} {path}: {why} (set HOME or XDG_STATE_HOME to a directory "
                         "of yours)")


_ensure_private_dir = ensure_private_dir


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def jsonable(obj: Any) -> Any:
    """Plain JSON data for ``obj``: ``to_dict()`` and dataclasses are used, odd objects become ``str()``."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted((jsonable(v) for v in obj), key=repr)
    if isinstance(obj, PurePath):
        return str(obj)
    if isinstance(obj, bytes):
        return obj.decode("utf-8", errors="replace")
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict):
        try:
            return jsonable(to_dict())
        except Exception:  # noqa: BLE001 - a broken to_dict falls back to str()
            pass
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(dataclasses.asdict(obj))
    try:
        return str(obj)
    except Exception:  # noqa: BLE001
        return f"<unprintable {type(obj).__name__}>"


class EventList(list):
    """Events read from a log; ``torn`` is true when a half-written last line was skipped.

    ``skipped`` lists the lines that could not be read, as (line number, reason); ``nul_bytes`` counts
    NUL bytes dropped in front of events (logrotate's ``copytruncate`` leaves a run of them).
    """

    torn: bool = False
    path: Path | None = None
    skipped: list[tuple[int, str]] = []
    nul_bytes: int = 0
    cut_bytes: int = 0

    def damage_note(self) -> str | None:
        """One line saying what was skipped, or None when every line was read."""
        parts = []
        if self.skipped:
            where = ", ".join(str(n) for n, _r in self.skipped[:10]) + (", ..." if len(self.skipped) > 10 else "")
            parts.append(f"{len(self.skipped)} unreadable line{'s' if len(self.skipped) != 1 else ''} skipped "
                         f"(line{'s' if len(self.skipped) != 1 else ''} {where}: {self.skipped[0][1]})")
        if self.nul_bytes:
            parts.append(f"{self.nul_bytes} NUL bytes skipped (a log truncated while it was written)")
        if self.cut_bytes:
            parts.append(f"only the first {MAX_LOG_BYTES >> 20} MiB were read ({self.cut_bytes} bytes after them "
                         "were not)")
        return f"{self.path}: " + "; ".join(parts) if parts else None


#: A session log is never written past this size, and only this much of a larger one is read.
MAX_LOG_BYTES = 32 * 1024 * 1024


def _read_lines(path: Path, events: EventList) -> Iterator[tuple[int, bytes, bool]]:
    """(number from 1, line, complete) for each line of the log, read as a stream (a regular file only) up
    to :data:`MAX_LOG_BYTES`; what lies past that is counted in ``events.cut_bytes``."""
    try:
        fh = open_regular(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such session log") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read session log: {exc.strerror or exc}") from None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        read, number = 0, 0
        try:
            while True:
                raw = fh.readline(MAX_LOG_BYTES - read + 1)
                if not raw:
                    return
                number += 1
                read += len(raw)
                if read > MAX_LOG_BYTES:
                    events.cut_bytes = max(0, size - (read - len(raw)))
                    return
                complete = raw.endswith(b"\n")
                yield number, raw[:-1] if complete else raw, complete
        except OSError as exc:
            raise InputError(f"{path}: cannot read session log: {exc.strerror or exc}") from None


def _parse(raw: bytes) -> dict[str, Any]:
    event = json.loads(raw.decode("utf-8"))
    if not isinstance(event, dict):
        raise ValueError("not a JSON object")
    if not isinstance(event.get("type"), str):
        raise ValueError('no "type"')
    problems = event_problems(event)
    if problems:
        raise ValueError(f"{event['type']} event of the wrong shape: {problems[0]}")
    return event


def _resolve(session_id_or_path: str | os.PathLike[str], state: Path | None) -> Path:
    if isinstance(session_id_or_path, PurePath):
        return Path(session_id_or_path)
    sid = validate_session_id(str(session_id_or_path))
    path = sessions_dir(state) / f"{sid}{SUFFIX}"
    if not path.exists():
        raise InputError(f"no session {sid} in {sessions_dir(state)}")
    return path


def load_events(session_id_or_path: str | os.PathLike[str], state_dir: Path | None = None) -> EventList:
    """Every readable event of a session, in file order.

    A string must be a session id (anything else is refused); a :class:`~pathlib.Path` is read as is.
    A torn last line (a crash mid-write) is skipped and flagged as ``result.torn``; a malformed line
    elsewhere is skipped and listed in ``result.skipped`` (one bad line never loses a session); NUL
    bytes in front of an event are dropped and counted in ``result.nul_bytes``.
    """
    path = _resolve(session_id_or_path, state_dir)
    events = EventList()
    events.path = path
    events.skipped = []
    for number, raw, complete in _read_lines(path, events):
        stripped = raw.lstrip(b"\0")
        events.nul_bytes += len(raw) - len(stripped)
        if not stripped.strip():
            continue
        try:
            events.append(_parse(stripped))
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            if not complete:  # a half-written last line
                events.torn = True
                continue
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else (str(exc) or type(exc).__name__)
            events.skipped.append((number, f"malformed event: {reason}"[:200]))
    if not events and events.skipped:
        raise InputError(f"{path}: no readable event ({events.damage_note()})")
    return events


@dataclass
class SessionInfo:
    """One recorded session, as listed by :func:`list_sessions`."""

    id: str
    path: Path
    mode: str | None = None
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    events: int = 0
    hostname: str | None = None
    torn: bool = False
    error: str | None = None


def _info(path: Path) -> SessionInfo:
    info = SessionInfo(id=path.name[: -len(SUFFIX)], path=path)
    try:
        events = load_events(path)
    except InputError as exc:
        info.error = str(exc)
        return info

    view = fold(events)
    info.events, info.torn = len(events), events.torn
    info.mode, info.hostname = view.mode, view.host.get("hostname")
    info.started = view.start.get("started", view.start.get("ts")) if view.start else None
    if view.end is not None:
        info.ended, info.exit_code = view.end.get("ts"), view.end.get("exit_code")
    return info


def _session_files(state: Path | None) -> list[Path]:
    folder = sessions_dir(state)
    try:
        entries = list(folder.iterdir())
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise InputError(f"cannot list sessions in {folder}: {exc.strerror or exc}") from None
    return [p for p in entries if p.name.endswith(SUFFIX) and SESSION_ID_RE.fullmatch(p.name[: -len(SUFFIX)])
            and p.is_file()]


def list_sessions(state_dir: Path | None = None) -> list[SessionInfo]:
    """Every recorded session, newest first; an unreadable one is listed with ``error`` set."""
    infos = [_info(p) for p in _session_files(state_dir)]
    return sorted(infos, key=lambda i: (i.id[:15], i.started or 0.0, i.id), reverse=True)


def _started(path: Path) -> float:
    """The start time in a session's first line (0 when unreadable)."""
    try:
        with open(path, "rb") as fh:
            first = json.loads(fh.readline().decode("utf-8"))
        value = first.get("started", first.get("ts", 0.0))
        return float(value) if isinstance(value, (int, float)) else 0.0
    except (OSError, ValueError, AttributeError):
        return 0.0


def last_session_id(state_dir: Path | None = None) -> str:
    """The newest session's id (only the newest files are opened, to break ties within a second)."""
    files = sorted(_session_files(state_dir), key=lambda p: p.name, reverse=True)
    if not files:
        raise InputError(f"no recorded sessions in {sessions_dir(state_dir)}")
    same_second = [p for p in files if p.name[:15] == files[0].name[:15]]
    newest = max(same_second, key=lambda p: (_started(p), p.name))
    return newest.name[: -len(SUFFIX)]


#: How much of a log's end is read for the number of its last event, and each step back when looking for
#: its last whole line: a log past its cap is never read whole.
TAIL_BYTES = 4 * 1024 * 1024


def _open_log_read(path: Path) -> int:
    return os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))


def _last_seq(path: Path, start: int, end: int) -> int:
    """The highest ``seq`` of the readable events among the lines between byte ``start`` and ``end`` of
    ``path``, reading at most :data:`TAIL_BYTES` before ``end`` (0 if none): an unreadable line's number is
    not taken."""
    lo = max(start, end - TAIL_BYTES)
    try:
        fd = _open_log_read(path)
    except OSError:
        return 0
    try:
        data = os.pread(fd, max(0, end - lo), lo)
    except OSError:
        return 0
    finally:
        os.close(fd)
    lines = data.split(b"\n")
    if lo > start:  # the window starts inside a line
        lines = lines[1:]
    best = 0
    for raw in lines:
        raw = raw.lstrip(b"\0")
        if not raw.startswith(b'{"seq":'):
            continue
        try:
            event = _parse(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            continue
        if isinstance(event.get("seq"), int) and event["seq"] >= 0:
            best = max(best, event["seq"])
    return best


def _whole_lines_end(path: Path) -> tuple[int, int]:
    """(size, offset just past the last newline) of ``path``, read backward :data:`TAIL_BYTES` at a time."""
    fd = _open_log_read(path)
    try:
        size = pos = os.fstat(fd).st_size
        while pos > 0:
            lo = max(0, pos - TAIL_BYTES)
            cut = os.pread(fd, pos - lo, lo).rfind(b"\n")
            if cut >= 0:
                return size, lo + cut + 1
            pos = lo
        return size, 0
    finally:
        os.close(fd)


#: Logs open in this process, so that an interrupt can still close them with a ``session_end``.
_OPEN: weakref.WeakSet[SessionLog] = weakref.WeakSet()


def close_open_logs(exit_code: int | None) -> None:
    """Record ``session_end`` with ``exit_code`` in every log this process still has open (SIGINT)."""
    for log in list(_OPEN):
        with contextlib.suppress(Exception):
            log.close(exit_code)


def _result_key(type: Any, data: Any) -> tuple[Any, Any] | None:
    """What makes a probe result the same one: its probe and when it started (None for other events)."""
    if type != "probe_result" or not isinstance(data, Mapping) or not isinstance(data.get("result"), Mapping):
        return None
    result = data["result"]
    return (result.get("probe"), result.get("started"))


class SessionLog:
    """An open session file that events are appended to. Use :meth:`create` or :meth:`reopen`."""

    def __init__(self, session_id: str, path: Path, fd: int, next_seq: int, end: int = 0) -> None:
        self.id = session_id
        self.path = path
        self._fd: int | None = fd
        self._seq = next_seq
        self._end = end  # the file's size after this log's last write: anything past it another process wrote
        self._lock = threading.Lock()
        #: Why events stopped being written (a full disk, an I/O error); None while the log is whole.
        self.failure: str | None = None
        #: The failure is the size cap: what came before it is recorded and readable.
        self.capped = False
        _OPEN.add(self)
        self._results: set[tuple[Any, Any]] = set()  # (probe, started) of the probe results written

    # -- opening -----------------------------------------------------------------------------------
    @classmethod
    def create(cls, mode: str, argv: list[str], host_info: dict[str, Any],
               state_dir: Path | None = None) -> SessionLog:
        """Start a new session file and record ``session_start``."""
        folder = sessions_dir(state_dir)
        _ensure_private_dir(folder)
        flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        for _ in range(64):
            started = time.time()
            sid = new_session_id(started)
            path = folder / f"{sid}{SUFFIX}"
            try:
                fd = os.open(path, flags, 0o600)
            except FileExistsError:
                continue
            except OSError as exc:
                raise InputError(f"cannot create session log {path}: {exc.strerror or exc}") from None
            break
        else:  # pragma: no cover - 64 collisions in one second
            raise InputError(f"cannot create a unique session log in {folder}")
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o600)
        _fsync_dir(folder)
        log = cls(sid, path, fd, 1)
        log.record("session_start", {
            "session_id": sid, "zdoctor_version": __version__, "mode": mode, "argv": list(argv),
            "host": host_info, "started": started,
        })
        if log.failure is not None:  # not even the start fits: no session at all
            log.close()
            with contextlib.suppress(OSError):
                path.unlink()
            raise InputError(log.failure)
        return log

    @classmethod
    def reopen(cls, session_id: str, state_dir: Path | None = None,
               argv: list[str] | None = None) -> SessionLog:
        """Append to an existing session (resume) and record ``session_resume``.

        A half-written last line left by a crash is cut off first, so the file stays valid.
        """
        path = _resolve(validate_session_id(session_id), state_dir)
        events = load_events(path)
        dropped = 0
        try:  # a half-written last line, also past the part that was read: cut it off, reading only the tail
            size, keep = _whole_lines_end(path)
            if keep < size and _last_seq(path, keep, size) and size - keep <= TAIL_BYTES:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
                             | getattr(os, "O_CLOEXEC", 0))
                try:  # a whole event that lacks only its newline: kept
                    os.write(fd, b"\n")
                finally:
                    os.close(fd)
            elif keep < size:
                dropped = size - keep
                os.truncate(path, keep)
        except OSError as exc:
            raise InputError(f"cannot repair session log {path}: {exc.strerror or exc}") from None
        seqs = [e["seq"] for e in events if isinstance(e.get("seq"), int)]
        flags = os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            raise InputError(f"cannot append to session log {path}: {exc.strerror or exc}") from None
        # end 0: the first append reads every seq under the lock, including lines another writer added
        # after load_events above (taking the file's size here would skip those and reuse their numbers)
        log = cls(session_id, path, fd, max(seqs, default=0) + 1, 0)
        log._results = {k for k in (_result_key(e.get("type"), e) for e in events) if k is not None}
        data: dict[str, Any] = {"session_id": session_id, "zdoctor_version": __version__,
                                "resumed": time.time(), "dropped_torn_bytes": dropped}
        if events.damage_note():
            data["skipped_lines"] = [n for n, _r in events.skipped]
            data["skipped_nul_bytes"] = events.nul_bytes
        if argv is not None:
            data["argv"] = list(argv)
        log.record("session_resume", data)
        return log

    # -- writing -----------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._fd is None

    def record(self, type: str, data: Mapping[str, Any] | None = None) -> None:
        """Append one event (redacted) and fsync it; safe to call from several threads.

        A probe result is written once per session: the check and every walk read the same cached
        results, and a resumed session already holds the ones recorded before. Once a write failed (a
        full disk), the line it left is cut off, :attr:`failure` says why and later events are dropped:
        the work goes on unrecorded instead of failing.
        """
        if self.failure is not None:
            return
        key = _result_key(type, data)
        payload = self._prepare(type, data)
        with self._lock:
            if self.failure is not None:
                return
            if key is not None:
                if key in self._results:
                    return
                self._results.add(key)
            self._append(type, payload)

    def close(self, exit_code: int | None = None) -> None:
        """Record ``session_end`` and close the file; closing twice does nothing."""
        payload = self._prepare("session_end", {"exit_code": exit_code})
        with self._lock:
            if self._fd is None:
                return
            try:
                if self.failure is None:
                    self._append("session_end", payload)
            finally:
                fd, self._fd = self._fd, None
                os.close(fd)
                _OPEN.discard(self)

    @staticmethod
    def _prepare(type: str, data: Mapping[str, Any] | None) -> dict[str, Any]:
        if not isinstance(type, str) or not type:
            raise ValueError("event type must be a non-empty string")
        payload = jsonable(dict(data or {}))
        clash = [k for k in ENVELOPE if k in payload]
        if clash:
            raise ValueError(f"event data may not use the reserved {noun_for(len(clash), 'key')} {', '.join(clash)}")
        return redact(payload)

    def _append(self, type: str, payload: dict[str, Any]) -> None:
        """Write one line and fsync it; the caller holds the lock.

        An advisory lock (``flock``) on the file serialises writers in other processes (a session
        resumed twice): under it, lines another process appended since this one last wrote move the
        next ``seq`` past theirs, so every event keeps a distinct number.
        """
        if self._fd is None:
            raise ValueError(f"session log {self.path} is closed")
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except OSError as exc:
            raise InputError(f"cannot lock session log {self.path}: {exc.strerror or exc}") from None
        try:
            size = os.fstat(self._fd).st_size
            if size != self._end:
                self._seq = max(self._seq, _last_seq(self.path, self._end, size) + 1)
            event = {"seq": self._seq, "ts": time.time(), "type": type, **payload}
            # Lone surrogates (undecodable file names) become \udcXX escapes inside the JSON strings,
            # which read back as the same text.
            line = (json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n").encode(
                "utf-8", errors="backslashreplace")
            if size + len(line) > MAX_LOG_BYTES:
                self.capped = True
                self.failure = (f"session log {self.path} reached its {MAX_LOG_BYTES >> 20} MiB cap; later events "
                                "were not recorded")
                return
            view = memoryview(line)
            try:
                while view:
                    written = os.write(self._fd, view)
                    view = view[written:]
                os.fsync(self._fd)
            except OSError as exc:  # a full disk or an I/O error: keep the log whole, stop writing
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, size)
                self.failure = f"cannot write session log {self.path}: {exc.strerror or exc}"
                return
            self._end = os.fstat(self._fd).st_size
        except OSError as exc:
            raise InputError(f"cannot write session log {self.path}: {exc.strerror or exc}") from None
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._seq += 1

    def __enter__(self) -> SessionLog:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

    def __del__(self) -> None:  # an abandoned log still releases its descriptor
        fd = getattr(self, "_fd", None)
        if fd is not None and not sys.is_finalizing():
            with contextlib.suppress(OSError):
                os.close(fd)


def read_session(session_id_or_path: Any, state_dir: Any = None) -> SessionView:
    """Read a session's log (see :func:`load_events`) and fold it."""
    return fold(load_events(session_id_or_path, state_dir))
