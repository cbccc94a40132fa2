"""Parse ``strace -f -tt -e trace=openat,open,execve`` output into file events.

Handles the three layouts strace writes: ``-o FILE`` with ``-f`` (``PID HH:MM:SS.us call(...)``), output
on stderr with ``-f`` (``[pid N] HH:MM:SS.us call(...)``, the first process unprefixed) and ``-ff -o
FILE`` (one file per pid, no pid on the lines); calls split by another thread into ``<unfinished ...>``
and ``<... call resumed>`` halves are joined; C escapes in strings are decoded.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from typing import Any

from zdoctor.proc.userfile import open_regular_text

SYSCALLS = ("openat", "open", "execve", "openat2", "creat", "stat", "lstat", "newfstatat", "statx", "access",
            "faccessat", "faccessat2")
#: Calls whose path is the second argument (the first is a directory fd such as AT_FDCWD).
_AT_CALLS = ("openat", "openat2", "newfstatat", "statx", "faccessat", "faccessat2")

_PREFIX = re.compile(
    r"^(?:\[pid\s+(?P<bpid>\d+)\]\s+|(?P<pid>\d+)\s+)?"
    r"(?:(?P<ts>\d\d:\d\d:\d\d(?:\.\d+)?|\d+\.\d+)\s+)?(?P<rest>[A-Za-z_<].*)$"
)
_UNFINISHED = re.compile(r"^(?P<call>\w+)\((?P<args>.*?)\s*<unfinished \.\.\.>$")
_RESUMED = re.compile(r"^<\.\.\. (?P<call>\w+) resumed>(?P<tail>.*)$")
_CALL = re.compile(r"^(?P<call>\w+)\((?P<args>.*)\)\s+=\s+(?P<res>.*)$")
_STARTED = re.compile(r"^(?P<call>\w+)\((?P<args>.*?)\s*$")  # cut off: the tracer died mid-line
_RESULT = re.compile(r"^(?P<val>-?\d+|0x[0-9a-fA-F]+|\?)(?:\s+(?P<errno>E[A-Z0-9]+))?(?:\s+\((?P<msg>[^)]*)\))?")
_ESCAPES = {"n": b"\n", "t": b"\t", "r": b"\r", "v": b"\v", "f": b"\f", "a": b"\a", "b": b"\b",
            "\\": b"\\", '"': b'"', "'": b"'"}


@dataclass
class FileEvent:
    """One traced call: ``result`` is the return value (None when unknown), ``errno`` its error name."""

    pid: int
    ts: str
    syscall: str
    path: str
    result: int | None
    errno: str | None = None
    flags: str = ""
    path_truncated: bool = False  # strace cut the string at its -s limit

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result >= 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decode_c_string(s: str, start: int) -> tuple[str, int, bool] | None:
    """Decode the strace string literal starting at ``s[start] == '"'``.

    Returns (text, index after the literal and any ``...`` marker, truncated) or None when malformed.
    Bytes that are not UTF-8 survive as surrogate escapes, like ``os.fsdecode``.
    """
    if start >= len(s) or s[start] != '"':
        return None
    out = bytearray()
    i = start + 1
    while i < len(s):
        c = s[i]
        if c == '"':
            i += 1
            truncated = s.startswith("...", i)
            return out.decode("utf-8", "surrogateescape"), i + (3 if truncated else 0), truncated
        if c == "\\" and i + 1 < len(s):
            n = s[i + 1]
            if n in _ESCAPES:
                out += _ESCAPES[n]
                i += 2
            elif n == "x" and re.match(r"[0-9a-fA-F]{2}", s[i + 2:i + 4]):
                out.append(int(s[i + 2:i + 4], 16))
                i += 4
            elif n in "01234567":
                m = re.match(r"[0-7]{1,3}", s[i + 1:i + 4])
                assert m is not None
                out.append(int(m.group(0), 8) & 0xFF)
                i += 1 + len(m.group(0))
            else:
                out += n.encode()
                i += 2
        else:
            out += c.encode("utf-8", "surrogateescape")
            i += 1
    return None


def _event(pid: int, ts: str, call: str, args: str, res: str) -> FileEvent | None:
    if call not in SYSCALLS:
        return None
    # openat/newfstatat/statx/faccessat: the path is the second argument; open/creat/execve/stat: the first.
    pos = 0
    if call in _AT_CALLS:
        comma = args.find(", ")
        if comma < 0:
            return None
        pos = comma + 2
    lit = decode_c_string(args, pos)
    if lit is None:
        return None
    path, end, cut = lit
    flags = ""
    if call.startswith(("open", "creat")):
        tail = args[end:].lstrip(", ")
        flags = tail.split(",", 1)[0].strip()
    m = _RESULT.match(res.strip())
    result: int | None = None
    err: str | None = None
    if m:
        val = m["val"]
        if val != "?":
            result = int(val, 0)
        err = m["errno"]
    return FileEvent(pid=pid, ts=ts, syscall=call, path=path, result=result, errno=err, flags=flags,
                     path_truncated=cut)


def parse_strace(text: str, default_pid: int = 0) -> list[FileEvent]:
    """File events of ``text`` in output order (``default_pid`` for lines that name no pid).

    A call left ``<unfinished ...>`` (or cut off mid-line) at the end of the text is appended last with
    ``result`` None and ``errno`` "unfinished": the process was inside it when tracing stopped.
    """
    events: list[FileEvent] = []
    pending: dict[tuple[int, str], tuple[str, str]] = {}  # (pid, call) -> (ts, args so far)
    for line in text.splitlines():
        m = _PREFIX.match(line.strip())
        if not m:
            continue
        pid = int(m["pid"] or m["bpid"] or default_pid)
        ts, rest = m["ts"] or "", m["rest"]
        u = _UNFINISHED.match(rest)
        if u:
            pending[(pid, u["call"])] = (ts, u["args"])
            continue
        r = _RESUMED.match(rest)
        if r:
            start = pending.pop((pid, r["call"]), None)
            if start is None:
                continue
            ts, head = start
            # "<... openat resumed>) = 3" or "<... openat resumed>, 0666) = 3": the rest of the call
            rest = f"{r['call']}({head}{r['tail']}"
        c = _CALL.match(rest)
        if not c:
            cut = _STARTED.match(rest)
            if cut and cut["call"] in SYSCALLS:
                pending[(pid, cut["call"])] = (ts, cut["args"])
            continue
        ev = _event(pid, ts, c["call"], c["args"], c["res"])
        if ev is not None:
            events.append(ev)
    # Calls still unfinished at the end: the process was inside them when it stopped (or hangs there).
    for (pid, call), (ts, args) in pending.items():
        ev = _event(pid, ts, call, args, "?")
        if ev is not None:
            ev.errno = "unfinished"
            events.append(ev)
    return events


def per_pid_files(directory: str, prefix: str) -> list[tuple[str, int]]:
    """The files ``<directory>/<prefix>.<pid>`` a tracer writes, one per process (``strace -ff -o``,
    ``LD_DEBUG_OUTPUT``), with their pids, in name order; none when the directory cannot be listed."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    out = []
    for name in names:
        head, dot, suffix = name.rpartition(".")
        if dot and head == prefix and suffix.isdigit():
            out.append((os.path.join(directory, name), int(suffix)))
    return out


def parse_strace_files(directory: str, prefix: str) -> list[FileEvent]:
    """Events of ``strace -ff -o <directory>/<prefix>`` (files ``<prefix>.<pid>``), per pid in order."""
    events: list[FileEvent] = []
    for path, pid in per_pid_files(directory, prefix):
        try:
            with open_regular_text(path, encoding="utf-8", errors="surrogateescape") as fh:
                events.extend(parse_strace(fh.read(), default_pid=pid))
        except OSError:
            continue
    return events


def last_files(events: list[FileEvent], n: int = 10) -> dict[int, list[FileEvent]]:
    """Per pid, the last ``n`` files opened successfully (oldest first): what a hung process touched last."""
    out: dict[int, list[FileEvent]] = {}
    for ev in events:
        if ev.syscall != "execve" and ev.ok:
            lst = out.setdefault(ev.pid, [])
            lst.append(ev)
            if len(lst) > n:
                del lst[0]
    return out


def refused_creates(events: list[FileEvent]) -> list[str]:
    """The paths of exclusive creates refused because the file exists (``O_EXCL``, ``EEXIST``), once each:
    how a process finds a lock taken (torch's FileBaton.try_acquire), before it waits for it to go."""
    return list(dict.fromkeys(e.path for e in events if e.syscall.startswith(("open", "creat"))
                              and "O_EXCL" in e.flags and e.errno == "EEXIST"))


def unfinished(events: list[FileEvent]) -> list[FileEvent]:
    """Calls a process was still inside when tracing stopped (a hang in ``open`` of a FIFO, NFS, ...)."""
    return [ev for ev in events if ev.errno == "unfinished"]


_OPENED = re.compile(r"\b(?:open|openat|openat2)\(.*\)\s+=\s+\d+")
_RETURNED = re.compile(r"\)\s+=\s+\S")


def _pid_of_line(line: str) -> int | None:
    m = _PREFIX.match(line.strip())
    if not m or not (m["pid"] or m["bpid"]):
        return None
    return int(m["pid"] or m["bpid"])


def lines_that_matter(text: str, names: tuple[str, ...], pending: list[FileEvent], cap: int = 8) -> list[str]:
    """The trace's own lines a reader needs, as strace wrote them: each successful open of a file whose path
    holds one of ``names`` (the copy the loader really opened), then, for each call still unfinished when
    tracing stopped, the line of that call (the call a hung process waits in)."""
    out: list[str] = []
    lines = [line.strip() for line in text.splitlines()]
    for line in lines:
        if _OPENED.search(line) and any(n in line for n in names) and line not in out:
            out.append(line)
    waits: list[str] = []
    for ev in pending:
        for line in reversed(lines):
            if f"{ev.syscall}(" in line and ("<unfinished" in line or not _RETURNED.search(line))\
                    and _pid_of_line(line) in (ev.pid, None):
                if line not in waits:
                    waits.append(line)
                break
    return out[:max(1, cap - len(waits))] + waits[:cap]
