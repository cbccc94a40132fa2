"""Running training processes, seen from outside: state, what they wait in, what they map and hold open.

Each process is read on its own; a process that vanishes, turns zombie or denies access is recorded
with what could be read and why the rest could not, never raised. zdoctor's own process and its
children (probe subprocesses) are left out.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from zdoctor.core.model import known_fields
from zdoctor.proc import children
from zdoctor.readers.jitcache import JitOp, cache_base

DEFAULT_MATCH = ("python", "deepspeed", "torchrun", "accelerate", "ninja", "c++", "g++", "cc1plus")
#: The builders and compilers torch's JIT build runs in the op dir.
BUILD_TOOLS = ("ninja", "c++", "g++", "cc1plus", "gcc", "clang", "clang++", "nvcc", "cicc", "ld", "collect2")
#: Environment variables kept from /proc/PID/environ.
ENV_KEYS = ("LD_LIBRARY_PATH", "LD_PRELOAD", "TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME", "HOME", "CXX")
#: Kernel wait channels of a process sleeping in nanosleep (torch's FileBaton polls with time.sleep).
#: Where a process sleeping in ``time.sleep`` waits: clock_nanosleep from Python 3.11 on, select() before
#: (so a poll loop under Python 3.8 to 3.10 shows poll_schedule_timeout). The kernel may add a compiler
#: suffix (``poll_schedule_timeout.constprop.0``): compare with :func:`sleeping_wchan`.
SLEEP_WCHANS = frozenset({"hrtimer_nanosleep", "do_nanosleep", "clock_nanosleep", "common_nsleep",
                          "__x64_sys_clock_nanosleep", "__x64_sys_nanosleep", "poll_schedule_timeout",
                          "do_select", "core_sys_select"})


def sleeping_wchan(wchan: str | None) -> bool:
    """Whether ``wchan`` (from /proc/PID/wchan) is a timed sleep, as a poll loop's ``time.sleep`` makes."""
    return bool(wchan) and wchan.split(".", 1)[0] in SLEEP_WCHANS
MAX_PROCS = 256
MAX_SCAN = 20000
MAX_OPEN_FILES = 128
MAX_FDS = 4096
MAX_ARGS = 64
MAX_ARG_LEN = 2048
MAX_ENV_BYTES = 1 << 20


@dataclass
class ProcInfo:
    """One process as read from psutil and /proc (fields it could not read stay None/empty)."""

    pid: int
    ppid: int | None = None
    name: str | None = None
    cmdline: list[str] = field(default_factory=list)
    username: str | None = None
    state: str | None = None  # psutil status: running, sleeping, disk-sleep, zombie ...
    state_letter: str | None = None  # the letter of /proc/PID/stat: R S D Z T ...
    wchan: str | None = None
    elapsed_s: float | None = None
    cpu_s: float | None = None  # user + system seconds so far
    cpu_delta_s: float | None = None  # growth over a sample, when one was taken
    children: list[int] = field(default_factory=list)
    open_files: list[str] = field(default_factory=list)
    open_files_truncated: bool = False
    cwd: str | None = None
    libstdcxx: list[dict[str, Any]] = field(default_factory=list)  # [{path, dev, inode, deleted}]
    libgcc_s: list[dict[str, Any]] = field(default_factory=list)
    environ: dict[str, str] | None = None  # ENV_KEYS present; None when /proc/PID/environ is unreadable
    matched: str | None = None  # the name pattern that selected it; None when found by what it holds
    errors: dict[str, str] = field(default_factory=dict)  # field -> "AccessDenied" / "NoSuchProcess" ...

    @property
    def ld_library_path(self) -> str | None:
        return (self.environ or {}).get("LD_LIBRARY_PATH")

    @property
    def ld_preload(self) -> str | None:
        return (self.environ or {}).get("LD_PRELOAD")

    @property
    def gone(self) -> bool:
        return "process" in self.errors

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProcInfo:
        return cls(**known_fields(cls, d))


def _why(exc: BaseException) -> str:
    if isinstance(exc, psutil.ZombieProcess):
        return "ZombieProcess"
    if isinstance(exc, psutil.NoSuchProcess):
        return "NoSuchProcess"
    if isinstance(exc, psutil.AccessDenied):
        return "AccessDenied"
    if isinstance(exc, PermissionError):
        return "AccessDenied"
    if isinstance(exc, (FileNotFoundError, ProcessLookupError)):
        return "NoSuchProcess"
    return f"{type(exc).__name__}: {exc}"


class _Gone(Exception):
    """The process exited while it was being read."""


def _field(info: ProcInfo, key: str, func: Callable[[], Any], default: Any = None) -> Any:
    try:
        return func()
    except psutil.ZombieProcess as exc:
        info.errors[key] = _why(exc)
        return default
    except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError) as exc:
        raise _Gone from exc
    except (psutil.Error, OSError, ValueError) as exc:
        info.errors[key] = _why(exc)
        return default


def read_stat_letter(pid: int) -> str:
    """The state letter of /proc/PID/stat (after the last ``)``: the comm may contain anything)."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        data = fh.read(4096)
    return data[data.rindex(b")") + 1:].split()[0].decode("ascii", "replace")


def read_wchan(pid: int) -> str:
    with open(f"/proc/{pid}/wchan", "rb") as fh:
        return fh.read(256).decode("ascii", "replace").strip()


def read_maps_libs(pid: int, stems: Sequence[str] = ("libstdc++.so", "libgcc_s.so")
                   ) -> dict[str, list[dict[str, Any]]]:
    """The mapped files whose basename starts with each stem: [{path, dev, inode, deleted}], deduplicated."""
    out: dict[str, list[dict[str, Any]]] = {s: [] for s in stems}
    seen: set[str] = set()
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="surrogateescape") as fh:
        for line in fh:
            parts = line.rstrip("\n").split(None, 5)
            if len(parts) < 6 or not parts[5].startswith("/"):
                continue
            path = parts[5]
            deleted = path.endswith(" (deleted)")
            if deleted:
                path = path[: -len(" (deleted)")]
            base = os.path.basename(path)
            for stem in stems:
                if base.startswith(stem) and path not in seen:
                    seen.add(path)
                    out[stem].append({"path": path, "dev": parts[3], "inode": int(parts[4]) if
                                      parts[4].isdigit() else None, "deleted": deleted})
    return out


def read_environ(pid: int, keys: Iterable[str] = ENV_KEYS) -> dict[str, str]:
    """The chosen variables of the environment a process started with (/proc/PID/environ)."""
    with open(f"/proc/{pid}/environ", "rb") as fh:
        data = fh.read(MAX_ENV_BYTES)
    wanted = set(keys)
    out: dict[str, str] = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        k = key.decode("utf-8", "replace")
        if sep and k in wanted:
            out[k] = value.decode("utf-8", "surrogateescape")
    return out


def _matches(name: str | None, cmdline: Sequence[str], match: Sequence[str]) -> str | None:
    """The first pattern found in the process name or the basenames of argv[0] and argv[1]."""
    words = [name or ""] + [os.path.basename(a) for a in list(cmdline)[:2]]
    for pat in match:
        if any(pat in w for w in words if w):
            return pat
    return None


def _own_tree() -> set[int]:
    """zdoctor itself and what it runs: each command's keeper (a registered group) with everything below it,
    and whatever of its descendants is in its own session or a keeper's. An orphan zdoctor adopted as a
    subreaper from someone else (it set up a session of its own) is not zdoctor's."""
    me = psutil.Process()
    pids = {me.pid}
    keepers = set(children.running())
    sessions = keepers | {os.getsid(0)}
    for keeper in keepers:
        with contextlib.suppress(psutil.Error):
            pids.add(keeper)
            pids.update(c.pid for c in psutil.Process(keeper).children(recursive=True))
    with contextlib.suppress(psutil.Error):
        for c in me.children(recursive=True):
            try:
                if os.getsid(c.pid) in sessions:
                    pids.add(c.pid)
            except OSError:
                continue
    return pids


def _under(path: str, dirs: Iterable[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def _holds_watched(pid: int, watch: Sequence[str]) -> bool:
    """Whether ``pid``'s cwd or any open fd lies in a watched dir (readlink only; False when unreadable)."""
    try:
        if _under(os.readlink(f"/proc/{pid}/cwd"), watch):
            return True
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds[:MAX_FDS]:
        try:
            if _under(os.readlink(f"/proc/{pid}/fd/{fd}"), watch):
                return True
        except OSError:
            continue
    return False


def read_process(proc: psutil.Process, matched: str | None = None, watch: Sequence[str] = ()) -> ProcInfo:
    """Everything zdoctor reads about one process; each field fails on its own."""
    info = ProcInfo(pid=proc.pid, matched=matched)
    try:
        _read_into(info, proc, watch)
    except _Gone:
        info.errors["process"] = "NoSuchProcess"
    return info


def _read_into(info: ProcInfo, proc: psutil.Process, watch: Sequence[str]) -> None:
    now = time.time()
    with proc.oneshot():
        info.name = _field(info, "name", proc.name)
        info.ppid = _field(info, "ppid", proc.ppid)
        info.state = _field(info, "state", proc.status)
        cmd = _field(info, "cmdline", proc.cmdline, []) or []
        info.cmdline = [a[:MAX_ARG_LEN] for a in cmd[:MAX_ARGS]]
        info.username = _field(info, "username", proc.username)
        created = _field(info, "elapsed_s", proc.create_time)
        info.elapsed_s = round(max(0.0, now - created), 1) if created else None
        times = _field(info, "cpu_s", proc.cpu_times)
        info.cpu_s = round(times.user + times.system, 2) if times is not None else None
    info.state_letter = _field(info, "state_letter", lambda: read_stat_letter(proc.pid))
    if info.state == psutil.STATUS_ZOMBIE or info.state_letter == "Z":
        # Exited: no memory, files or cwd left to read, only the entry its parent has not reaped.
        info.errors["zombie"] = "the process has exited and was not reaped by its parent"
        return
    info.wchan = _field(info, "wchan", lambda: read_wchan(proc.pid))
    info.children = [c.pid for c in _field(info, "children", proc.children, []) or []]
    files = _field(info, "open_files", proc.open_files, []) or []
    paths = [f.path for f in files]
    keep = paths[:MAX_OPEN_FILES]
    if len(paths) > MAX_OPEN_FILES:
        info.open_files_truncated = True
        keep += [p for p in paths[MAX_OPEN_FILES:] if _under(p, watch)]
    info.open_files = keep
    info.cwd = _field(info, "cwd", proc.cwd)
    libs = _field(info, "maps", lambda: read_maps_libs(proc.pid))
    if libs is not None:
        info.libstdcxx = libs["libstdc++.so"]
        info.libgcc_s = libs["libgcc_s.so"]
    info.environ = _field(info, "environ", lambda: read_environ(proc.pid))


def process_tree(roots: Iterable[int]) -> set[int]:
    """``roots`` and all their descendants that are alive now."""
    out: set[int] = set()
    for pid in roots:
        try:
            proc = psutil.Process(pid)
            out.add(pid)
            out.update(c.pid for c in proc.children(recursive=True))
        except psutil.Error:
            continue
    return out


#: Programs zdoctor wraps a traced command in: they carry the command line but are not the job.
WRAPPERS = ("strace", "ltrace", "timeout", "setpriv")


def runs_command(cmdline: Sequence[str], command: str) -> bool:
    """Whether ``cmdline`` is ``command``: ``sh -c COMMAND``, the command's own words, or its first word's
    script run by an interpreter (``python /usr/bin/deepspeed train.py`` for ``deepspeed train.py``)."""
    import shlex

    if not cmdline or os.path.basename(cmdline[0]) in WRAPPERS:
        return False
    if len(cmdline) >= 3 and os.path.basename(cmdline[0]) in ("sh", "bash", "dash") and cmdline[1] == "-c":
        return cmdline[2] == command
    try:
        words = shlex.split(command)
    except ValueError:
        return False
    if not words:
        return False
    base = os.path.basename
    if list(cmdline) == words or (base(cmdline[0]) == base(words[0]) and list(cmdline[1:]) == words[1:]):
        return True
    return len(cmdline) >= 2 and base(cmdline[1]) == base(words[0]) and list(cmdline[2:]) == words[1:]


def command_roots(command: str, limit: int = MAX_SCAN) -> list[int]:
    """The pids that run ``command`` (see :func:`runs_command`) and whose parent does not, sorted."""
    found: dict[int, int | None] = {}
    for n, proc in enumerate(psutil.process_iter()):
        if n >= limit:
            break
        try:
            if runs_command(proc.cmdline(), command):
                found[proc.pid] = proc.ppid()
        except psutil.Error:
            continue
    return sorted(pid for pid, ppid in found.items() if ppid not in found)


def training_processes(match: Sequence[str] = DEFAULT_MATCH, *, watch: Sequence[str] = (),
                       exclude: Iterable[int] | None = None, limit: int = MAX_PROCS,
                       include: Iterable[int] = ()) -> list[ProcInfo]:
    """Processes whose name, argv[0] or argv[1] contains a ``match`` pattern, sorted by pid.

    Processes with their cwd or an open file inside a ``watch`` dir (op dirs) are included whatever
    their name, and so are the pids in ``include`` (the job's own tree) even when zdoctor started them.
    ``exclude`` defaults to zdoctor's own process and its descendants.
    """
    wanted = set(include)
    skip = (_own_tree() if exclude is None else set(exclude)) - wanted
    out: list[ProcInfo] = []
    for pid in sorted(wanted)[:limit]:  # the job's own processes first: the cap never cuts them off
        try:
            info = read_process(psutil.Process(pid), None, watch)
        except psutil.Error:
            continue
        if not info.gone:
            info.matched = _matches(info.name, info.cmdline, match)
            out.append(info)
    skip |= wanted
    for n, proc in enumerate(psutil.process_iter()):
        if n >= MAX_SCAN or len(out) >= limit:
            break
        if proc.pid in skip:
            continue
        try:
            name = proc.name()
        except psutil.NoSuchProcess:
            continue
        except psutil.Error:
            name = None
        try:
            cmdline = proc.cmdline()
        except psutil.Error:
            cmdline = []
        pat = _matches(name, cmdline, match)
        if pat is None and not (watch and _holds_watched(proc.pid, watch)):
            continue
        if exclude is None and proc.pid in _own_tree():  # a command zdoctor started after the scan began
            continue
        info = read_process(proc, pat, watch)
        if not info.gone:
            out.append(info)
    return sorted(out, key=lambda p: p.pid)


def sample_cpu(procs: Sequence[ProcInfo], seconds: float = 0.5) -> None:
    """Fill ``cpu_delta_s``: CPU seconds each process used over ``seconds`` (skipped when unreadable)."""
    if not procs:
        return
    time.sleep(seconds)
    for info in procs:
        if info.cpu_s is None:
            continue
        try:
            t = psutil.Process(info.pid).cpu_times()
        except (psutil.Error, OSError):
            continue
        info.cpu_delta_s = round(max(0.0, t.user + t.system - info.cpu_s), 3)


def lock_holders(lock_path: str, procs: Sequence[ProcInfo]) -> list[ProcInfo]:
    """Live processes that could be building the op whose lock is ``lock_path``.

    A candidate has the lock (or any file of the op dir) open, or its cwd inside the op dir (torch runs
    ninja there, and the compilers inherit it), or is a build tool whose command line names the op dir.
    """
    dirs, locks = _op_paths(lock_path)
    return [p for p in procs if not p.gone and p.state_letter != "Z" and _holds(p, locks, dirs)]


def lock_owners(lock_path: str, procs: Sequence[ProcInfo]) -> list[ProcInfo]:
    """Live processes with the lock file itself open: torch's FileBaton keeps the descriptor it created
    the lock with open until it deletes the lock, so only these can ever release it."""
    _dirs, locks = _op_paths(lock_path)
    return [p for p in procs if not p.gone and p.state_letter != "Z" and any(f in locks for f in p.open_files)]


def is_build_process(p: ProcInfo) -> bool:
    """A compiler, ninja, or the ``sh -c`` ninja runs each command through."""
    argv0 = os.path.basename(p.cmdline[0]) if p.cmdline else ""
    if p.name in BUILD_TOOLS or argv0 in BUILD_TOOLS:
        return True
    return argv0 in ("sh", "bash", "dash") and len(p.cmdline) > 2 and p.cmdline[1] == "-c" \
        and os.path.basename(p.cmdline[2].split(" ", 1)[0]) in BUILD_TOOLS


def _op_paths(lock_path: str) -> tuple[set[str], set[str]]:
    op_dir = os.path.dirname(lock_path)
    return {op_dir, os.path.realpath(op_dir)}, {lock_path, os.path.realpath(lock_path)}


def _holds(p: ProcInfo, locks: set[str], dirs: set[str]) -> bool:
    if any(f in locks or _under(f, dirs) for f in p.open_files):
        return True
    if p.cwd and _under(p.cwd, dirs):
        return True
    tool = p.name in BUILD_TOOLS or (bool(p.cmdline) and os.path.basename(p.cmdline[0]) in BUILD_TOOLS)
    return tool and any(d in a for a in p.cmdline for d in dirs)


def uncertain_for(procs: Sequence[ProcInfo]) -> list[ProcInfo]:
    """Live matched processes whose open files or cwd could not be read: they might hold a lock."""
    return [p for p in procs if not p.gone and p.state_letter != "Z"
            and ("open_files" in p.errors or "cwd" in p.errors)]


def stale_locks(ops: Sequence[JitOp], procs: Sequence[ProcInfo]) -> list[JitOp]:
    """The ops whose lock file exists with no live owner among ``procs``.

    Compilers still working in the op dir do not keep a lock alive: ninja starts each command in its
    own process group, so killing a launcher's group leaves them running as orphans, and when they
    finish nobody deletes the lock. :func:`lock_holders` lists them.
    """
    return [op for op in ops if op.lock_path and not lock_owners(op.lock_path, procs)]


def likely_waiters(procs: Sequence[ProcInfo], roots: Iterable[str] | None = None) -> list[ProcInfo]:
    """Python processes sleeping in nanosleep, as torch's FileBaton.wait does while it polls a lock.

    With ``roots`` (extension roots holding stale locks), a process whose environment points its
    extension cache elsewhere is left out; one whose environment could not be read stays in.
    """

    roots = [r for r in roots or []]
    out = []
    for p in procs:
        if p.gone or p.state_letter not in ("S", None) or not sleeping_wchan(p.wchan):
            continue
        if "python" not in (p.name or "") and not any("python" in os.path.basename(a) for a in p.cmdline[:1]):
            continue
        if roots and p.environ is not None:
            base, _src = cache_base({**p.environ})
            if not any(_under(r, [base]) or _under(base, [r]) for r in roots):
                continue
        out.append(p)
    return out
