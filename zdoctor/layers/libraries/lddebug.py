"""Parse glibc ``LD_DEBUG`` output (``libs``, ``files``, ``versions``): what the loader really did.

Every debug line is ``<pid right-aligned>:\\t<message>``; anything else in the text (program output
mixed in when ``LD_DEBUG_OUTPUT`` is unset) is ignored. The result is one :class:`PidTrace` per process.

How the file a search settled on is found: ld.so prints ``trying file=P`` for each candidate and moves
on to the next directory, the next ``search path=`` or ``search cache=`` when P fails. So the last
``trying`` that is not followed by another search line is the candidate. With the ``files`` category
the following ``file=NAME [ns];  generating link map`` confirms it (no link map: nothing was found).
Without ``files`` (``libs`` only) a candidate is taken as found when the search stopped before the end
of the system search path, or when the path shows up later as a loaded object (an init, a version
check, ``calling fini``); otherwise the search may simply have run out, and ``found`` stays None.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from zdoctor.layers.libraries.strace import per_pid_files
from zdoctor.proc.userfile import read_prefix

#: Upper bound on what is read from one ``LD_DEBUG_OUTPUT`` file.
MAX_FILE_BYTES = 20 * 1024 * 1024

LINE = re.compile(r"^\s*(\d+):\t(.*)$")
# Messages may span lines (a path holding a newline): ``.`` matches one too.
_FILE_NEEDED = re.compile(r"^file=(?P<name>.+?) \[\d+\];\s+needed by (?P<by>.+?) \[\d+\]$", re.DOTALL)
_FILE_DLOPEN = re.compile(r"^file=(?P<name>.+?) \[\d+\];\s+dynamically loaded by (?P<by>.+?) \[\d+\]$", re.DOTALL)
_LINK_MAP = re.compile(r"^file=(?P<name>.+?) \[\d+\];\s+generating link map$", re.DOTALL)
_FIND = re.compile(r"^find library=(?P<name>.+?) \[\d+\]; searching$", re.DOTALL)
_SEARCH_PATH = re.compile(r"^ search path=(?P<dirs>.*?)(?:\t\t\((?P<src>[^\t]+)\))?$", re.DOTALL)
_SEARCH_CACHE = re.compile(r"^ search cache=(?P<cache>.*)$", re.DOTALL)
_TRYING = re.compile(r"^  trying file=(?P<path>.+)$", re.DOTALL)
_TRY_NOTE = re.compile(r"^\s+\((?P<why>[^()]+)\)$", re.DOTALL)
_CHECK = re.compile(
    r"^checking for version `(?P<ver>[^']+)' in file (?P<prov>.+?) \[\d+\] required by file (?P<req>.+?) \[\d+\]$",
    re.DOTALL)
_ERROR = re.compile(r"^(?P<obj>.*?): error: (?P<occ>[^:]+): (?P<msg>.*) \((?P<kind>fatal|continued)\)$")
_VERSION_MSG = re.compile(r"^(?P<weak>weak )?version `(?P<ver>[^']+)' not found \(required by (?P<req>.+)\)$")
_INIT = re.compile(r"^calling init: (?P<path>.+)$", re.DOTALL)
_FINI = re.compile(r"^calling fini: (?P<path>.*?)(?: \[\d+\])?$", re.DOTALL)
_OPENING = re.compile(r"^opening file=(?P<path>.+?) \[\d+\]; direct_opencount=(?P<n>\d+)$", re.DOTALL)

#: Search-step sources as ld.so labels them (plus "cache" for ``search cache=``).
LD_LIBRARY_PATH = "LD_LIBRARY_PATH"
SYSTEM = "system search path"
CACHE = "cache"


@dataclass
class SearchStep:
    """One ``search path=`` (or ``search cache=``) line: where ld.so looked, and why."""

    source: str  # "RPATH from file X" | "RUNPATH from file X" | "LD_LIBRARY_PATH" | "system search path" | "cache"
    dirs: list[str] = field(default_factory=list)


@dataclass
class Lookup:
    """One library the loader had to find (a ``DT_NEEDED`` entry, a preload, or a ``dlopen``)."""

    name: str
    needed_by: str | None = None
    dynamically_loaded: bool = False
    search_steps: list[SearchStep] = field(default_factory=list)
    tried: list[str] = field(default_factory=list)
    found: str | None = None
    found_via: str | None = None  # the SearchStep.source that found it; None for a name with a '/'
    #: The last file tried before the search ended, whether or not it turned out to be found.
    candidate: str | None = None
    #: True when ``needed_by`` was not printed (no ``files`` category) and was taken from the first
    #: object whose version needs were checked against the copy found.
    needed_by_inferred: bool = False


@dataclass
class VersionError:
    """``PROVIDER: error: version lookup error: version `V' not found (required by R) (fatal)``."""

    provider: str
    version: str
    required_by: str
    fatal: bool
    message: str
    weak: bool = False
    pid: int = 0


@dataclass
class PidTrace:
    """Everything one process's loader reported."""

    pid: int
    lookups: list[Lookup] = field(default_factory=list)
    loaded: dict[str, str] = field(default_factory=dict)  # requested name -> path of the object loaded
    version_checks: list[tuple[str, str, str]] = field(default_factory=list)  # (version, provider, required_by)
    version_errors: list[VersionError] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    inits: list[str] = field(default_factory=list)
    #: Objects ``dlopen``-ed again while already loaded (no search happened): ``opening file=`` lines.
    reopened: list[str] = field(default_factory=list)
    files_category: bool = False  # whether ``file=`` lines (LD_DEBUG=files) were present
    truncated: bool = False
    lines: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Parser:
    """Line-at-a-time state machine for one pid."""

    def __init__(self, pid: int) -> None:
        self.t = PidTrace(pid)
        self.cur: Lookup | None = None  # lookup announced or being searched
        self.searching = False
        self.candidate: str | None = None
        self.candidate_via: str | None = None
        self.step_source: str | None = None
        self.fresh: set[str] = set()  # objects loaded since the last ``opening file=`` line
        # Version checks of one load come as a batch after its searches and before its inits: per
        # lookup, the [start, end) range of ``version_checks`` that belongs to its load.
        self.batch: list[list[int]] = []  # aligned with self.t.lookups
        self.open_batch: list[int] = []  # indexes of lookups whose batch has not ended yet
        self.seen_paths: set[str] = set()  # paths that later lines show as loaded objects

    def _end_search(self) -> None:
        if self.cur is not None and self.searching:
            self.cur.candidate = self.candidate
            if self.candidate is not None:
                self.cur.found_via = self.candidate_via
        self.searching = False
        self.candidate = None

    def _new_lookup(self, name: str, needed_by: str | None, dlopen: bool) -> Lookup:
        lk = Lookup(name=name, needed_by=needed_by, dynamically_loaded=dlopen)
        self.open_batch.append(len(self.t.lookups))
        self.t.lookups.append(lk)
        self.batch.append([len(self.t.version_checks), -1])
        self.cur = lk
        return lk

    def _loaded(self, lk: Lookup, path: str) -> None:
        lk.found = path
        self.t.loaded.setdefault(lk.name, path)
        self.fresh.add(path)

    def feed(self, msg: str) -> None:
        """Take one debug message (the text after ``pid:\\t``)."""
        self.t.lines += 1
        if self.searching:
            m = _TRYING.match(msg)
            if m:
                assert self.cur is not None
                self.cur.tried.append(m["path"])
                self.candidate, self.candidate_via = m["path"], self.step_source
                return
            m = _SEARCH_PATH.match(msg)
            if m:
                self._step(m["src"] or "unknown", [d for d in m["dirs"].split(":") if d])
                return
            m = _SEARCH_CACHE.match(msg)
            if m:
                self._step(CACHE, [])
                return
            if self.candidate is not None and _TRY_NOTE.match(msg):
                self.candidate = None  # e.g. "(incompatible ELF class)": that file was skipped
                return
            self._end_search()
        if not msg.strip():
            return
        m = _FILE_NEEDED.match(msg) or _FILE_DLOPEN.match(msg)
        if m:
            self.t.files_category = True
            self._new_lookup(m["name"], m["by"], dlopen=m.re is _FILE_DLOPEN)
            return
        m = _FIND.match(msg)
        if m:
            lk = self.cur
            if lk is None or lk.name != m["name"] or lk.search_steps or lk.found or lk.candidate:
                lk = self._new_lookup(m["name"], None, dlopen=False)
            self.searching = True
            self.candidate = self.step_source = self.candidate_via = None
            return
        m = _LINK_MAP.match(msg)
        if m:
            self.t.files_category = True
            name = m["name"]
            lk = self.cur if self.cur is not None and self.cur.name == name and not self.cur.found else None
            if lk is None:  # a name with '/' is opened directly: no "find library" step
                lk = self._new_lookup(name, None, dlopen=False)
            path = lk.candidate or name
            self._loaded(lk, path)
            self.cur = None
            return
        m = _CHECK.match(msg)
        if m:
            self.t.version_checks.append((m["ver"], m["prov"], m["req"]))
            self.seen_paths.update((m["prov"], m["req"]))
            return
        m = _ERROR.match(msg)
        if m:
            vm = _VERSION_MSG.match(m["msg"]) if m["occ"] == "version lookup error" else None
            if vm:
                self.t.version_errors.append(VersionError(
                    provider=m["obj"], version=vm["ver"], required_by=vm["req"], fatal=m["kind"] == "fatal",
                    message=msg, weak=bool(vm["weak"]), pid=self.t.pid))
            else:
                self.t.errors.append(msg)
            return
        m = _INIT.match(msg)
        if m:
            self._close_batch()
            self.t.inits.append(m["path"])
            self.seen_paths.add(m["path"])
            return
        m = _OPENING.match(msg)
        if m:
            self._close_batch()
            path = m["path"]
            if path not in self.fresh:
                self.t.reopened.append(path)
            self.fresh = set()
            self.seen_paths.add(path)
            return
        m = _FINI.match(msg)
        if m:
            self.seen_paths.add(m["path"])
            return
        if "cannot open shared object file" in msg or msg.startswith("ERROR:"):
            self.t.errors.append(msg)

    def _close_batch(self) -> None:
        for key in self.open_batch:
            self.batch[key][1] = len(self.t.version_checks)
        self.open_batch = []

    def _step(self, source: str, dirs: list[str]) -> None:
        assert self.cur is not None
        self.cur.search_steps.append(SearchStep(source, dirs))
        self.step_source = source
        self.candidate = None

    def finish(self) -> PidTrace:
        self._end_search()
        self._close_batch()
        t = self.t
        for i, lk in enumerate(t.lookups):
            if lk.found is None and lk.candidate is not None and not t.files_category \
                    and self._confirmed(lk):
                self._loaded(lk, lk.candidate)
            if lk.found is None:
                lk.found_via = None
            if lk.found and lk.needed_by is None and not lk.dynamically_loaded:
                start, end = self.batch[i]
                for _ver, prov, req in t.version_checks[start:end]:
                    if prov == lk.found and req != lk.found:
                        lk.needed_by, lk.needed_by_inferred = req, True
                        break
        return t

    def _confirmed(self, lk: Lookup) -> bool:
        """libs-only traces: was the last candidate really found, or did the search run out?"""
        if lk.candidate in self.seen_paths:
            return True
        last = lk.search_steps[-1] if lk.search_steps else None
        if last is None or last.source != SYSTEM or not last.dirs:
            return True  # ld.so stops searching only once a file opened
        return lk.candidate != os.path.join(last.dirs[-1], os.path.basename(lk.name))


def parse_ld_debug(text: str, *, truncated: bool = False, loader_only: bool = False) -> dict[int, PidTrace]:
    """Parse ``LD_DEBUG`` output (one or many pids interleaved) into one :class:`PidTrace` per pid.

    ``loader_only``: ``text`` holds nothing but the loader's lines (an ``LD_DEBUG_OUTPUT`` file), so a
    line without the ``PID:`` prefix continues the one before it (a path holding a newline); in mixed
    output such a line is the program's own and is skipped.
    """
    parsers: dict[int, _Parser] = {}
    pending: tuple[int, str] | None = None

    def flush() -> None:
        if pending is not None:
            pid, msg = pending
            p = parsers.get(pid)
            if p is None:
                p = parsers[pid] = _Parser(pid)
            p.feed(msg)

    # Only "\n" ends a line (``splitlines`` would also cut at \x0b, \x1c, \u2028 ... inside a path). A line
    # without the ``PID:\t`` prefix continues the message before it: a path that holds a newline.
    for line in text.split("\n"):
        m = LINE.match(line)
        if m:
            flush()
            pending = (int(m[1]), m[2])
        elif loader_only and pending is not None and line:
            pending = (pending[0], f"{pending[1]}\n{line}")
    flush()
    out = {pid: p.finish() for pid, p in parsers.items()}
    if truncated:
        for t in out.values():
            t.truncated = True
    return out


def read_bounded(path: str, limit: int = MAX_FILE_BYTES) -> tuple[str, bool]:
    """Read at most ``limit`` bytes of the regular file ``path`` (cut at the last newline; a link is not
    followed: the folder may belong to the traced user); return (text, truncated)."""
    data, truncated = read_prefix(path, limit, nofollow=True)
    if truncated:
        cut = data.rfind(b"\n")
        if cut >= 0:
            data = data[: cut + 1]
    return data.decode("utf-8", "replace"), truncated


def parse_ld_debug_dir(directory: str, prefix: str, *, limit: int = MAX_FILE_BYTES) -> dict[int, PidTrace]:
    """Parse every ``<prefix>.<pid>`` file that ``LD_DEBUG_OUTPUT=<directory>/<prefix>`` produced.

    Each file is read up to ``limit`` bytes; a cut file gives traces marked ``truncated``. Unreadable
    files are skipped.
    """
    traces: dict[int, PidTrace] = {}
    for path, _pid in per_pid_files(directory, prefix):
        try:
            text, cut = read_bounded(path, limit)
        except OSError:
            continue
        for pid, t in parse_ld_debug(text, truncated=cut, loader_only=True).items():
            if pid in traces:  # one file per pid, but be safe: keep the first
                continue
            traces[pid] = t
    return traces


def via_label(lookup: Lookup) -> str:
    """zdoctor's label for how ``lookup`` was found: ``[LD_LIBRARY_PATH]``, ``[rpath of X]`` ..."""
    via = lookup.found_via
    if via is None:
        return "[path]" if "/" in lookup.name else "[unknown]"
    if via == LD_LIBRARY_PATH:
        return "[LD_LIBRARY_PATH]"
    if via == CACHE:
        return "[ld.so.cache]"
    if via == SYSTEM:
        return "[default]"
    for kind, label in (("RPATH from file ", "rpath"), ("RUNPATH from file ", "runpath")):
        if via.startswith(kind):
            return f"[{label} of {via[len(kind):]}]"
    return f"[{via}]"


def which_loaded(
    traces: Mapping[int, PidTrace],
    soname_prefix: str = "libstdc++.so.6",
    *,
    preload: Iterable[str] = (),
    system_preload: Iterable[str] = (),
) -> list[tuple[int, str, str, str | None]]:
    """Every copy of ``soname_prefix*`` each process loaded: ``(pid, path, via_label, needed_by)``.

    ``preload`` / ``system_preload`` are the entries of ``LD_PRELOAD`` and ``/etc/ld.so.preload`` the
    process ran with: a startup lookup of such a name is labelled ``[LD_PRELOAD]`` /
    ``[/etc/ld.so.preload]`` (the trace alone cannot tell a preload from the program's own need).
    A ``dlopen`` of an object that was already loaded is listed as ``[already loaded]``.
    """
    pre, sys_pre = set(preload), set(system_preload)
    out: list[tuple[int, str, str, str | None]] = []
    for pid in sorted(traces):
        t = traces[pid]
        used_preloads: set[str] = set()
        for lk in t.lookups:
            if not lk.found or not _matches(lk, soname_prefix):
                continue
            label = via_label(lk)
            if not lk.dynamically_loaded and lk.name not in used_preloads:
                if lk.name in pre:
                    label = "[LD_PRELOAD]"
                elif lk.name in sys_pre:
                    label = "[/etc/ld.so.preload]"
                if label in ("[LD_PRELOAD]", "[/etc/ld.so.preload]"):
                    used_preloads.add(lk.name)
            out.append((pid, lk.found, label, lk.needed_by))
        for path in t.reopened:
            if os.path.basename(path).startswith(soname_prefix):
                out.append((pid, path, "[already loaded]", None))
    return out


def _matches(lk: Lookup, prefix: str) -> bool:
    return os.path.basename(lk.name).startswith(prefix) or os.path.basename(lk.found or "").startswith(prefix)


def all_version_errors(traces: Mapping[int, PidTrace]) -> list[VersionError]:
    """Every version error of every pid, in pid order."""
    return [e for pid in sorted(traces) for e in traces[pid].version_errors]


def summarize(traces: Mapping[int, PidTrace]) -> dict[str, Any]:
    """A compact JSON view: per pid, what was loaded from where, and every error."""
    return {
        str(pid): {
            "loaded": [{"name": lk.name, "path": lk.found, "via": via_label(lk), "needed_by": lk.needed_by}
                       for lk in t.lookups if lk.found],
            "not_found": [lk.name for lk in t.lookups if not lk.found],
            "version_errors": [asdict(e) for e in t.version_errors],
            "errors": list(t.errors),
            "truncated": t.truncated,
        }
        for pid, t in sorted(traces.items())
    }

