"""Where a hung run waits: each process of its tree sampled just before the time limit ends it, with its
state (``S`` sleeping, ``D`` in the kernel uninterruptibly ...), the kernel function it sleeps in (wchan)
and its command name, read from ``/proc``."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from typing import Any, Callable

#: How many looks :func:`sample_tree` takes at a run, how far apart, and how long they take.
LOOKS, LOOK_GAP = 7, 0.037  # 37 ms: no common poll period (10, 50, 100 ms ...) lines the looks up
SAMPLE_WINDOW = (LOOKS - 1) * LOOK_GAP
#: What a process state letter means.
STATES = {"R": "running", "S": "sleeping", "D": "in the kernel (uninterruptible)", "T": "stopped",
          "t": "stopped by a tracer", "Z": "a zombie", "I": "idle"}


#: Command names (as /proc shows them, cut to 15 characters) of the tools a JIT build runs: a run that hit
#: its time limit while one of them worked was still building, not hung.
BUILD_TOOLS = frozenset({"ninja", "cc1plus", "cc1", "as", "ld", "ld.bfd", "ld.gold", "collect2", "lto1", "nvcc",
                         "cicc", "ptxas", "fatbinary", "nvlink", "cudafe++", "c++", "g++", "gcc", "cc", "clang",
                         "clang++", "x86_64-linux-gn"})
#: File endings of what a build tool works on, to name the file it was compiling.
_SOURCES = (".cpp", ".cc", ".cxx", ".cu", ".c")
_BUILT = (*_SOURCES, ".s", ".S", ".o", ".so", ".ptx", ".cubin", ".fatbin")


def _read(path: str, limit: int = 4096) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _working_on(pid: int) -> str:
    """The source file ``pid``'s command line names (else the last object or assembly file), or ""."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            args = fh.read(64 * 1024).decode("utf-8", "replace").split("\0")
    except OSError:
        return ""
    named = [a for a in args if a.endswith(_BUILT) and not a.startswith("-")
             and not os.path.basename(a).startswith(".")]  # not the bare ".cpp" of -dumpbase-ext
    sources = [a for a in named if a.endswith(_SOURCES)]
    return (sources or named or [""])[-1][-300:]


def _running_for(stat_rest: list[str]) -> str:
    """Seconds since the process started, from its ``/proc/PID/stat`` fields after the state, or ""."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return f"{max(0.0, uptime - int(stat_rest[19]) / ticks):.0f}"
    except (OSError, ValueError, IndexError):
        return ""


def process_state(pid: int) -> dict[str, str] | None:
    """``{pid, comm, state, wchan}`` of ``pid`` from ``/proc``, or None when it is gone; a build tool's also
    carries ``file`` (what it works on) and ``running_s`` (how long it has run)."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat or ")" not in stat:
        return None
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    rest = stat[stat.rindex(")") + 2:].split(" ")
    state = rest[0]
    wchan = _read(f"/proc/{pid}/wchan")
    out = {"pid": str(pid), "comm": comm, "state": state, "wchan": "" if wchan == "0" else wchan}
    if comm in BUILD_TOOLS:
        out.update(file=_working_on(pid), running_s=_running_for(rest))
    return out


def _leaves(pid: int, skip: tuple[str, ...]) -> dict[int, dict[str, str]]:
    """One look: the states of the living processes below ``pid`` with no living child of their own."""
    import psutil

    try:
        tree = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return {}
    states: dict[int, dict[str, str]] = {}
    parents: set[int] = set()
    for proc in tree:
        state = process_state(proc.pid)
        if state is None or state["state"] == "Z":
            continue
        states[proc.pid] = state
        try:
            parents.add(proc.ppid())
        except psutil.Error:
            continue
    return {p: s for p, s in states.items() if p not in parents and s["comm"] not in skip}


def _runnable_ns(pid: int) -> int | None:
    """Nanoseconds ``pid`` has spent on a CPU or waiting in a run queue for one (``/proc/PID/schedstat``), or
    None where the kernel does not say."""
    try:
        with open(f"/proc/{pid}/schedstat") as fh:
            on_cpu, queued = fh.read().split()[:2]
        return int(on_cpu) + int(queued)
    except (OSError, ValueError):
        return None


def sample_tree(pid: int, skip: tuple[str, ...] = ("strace",), most: int = 16, looks: int = LOOKS,
                gap: float = LOOK_GAP) -> list[dict[str, str]]:
    """The states of the living processes below ``pid`` that have no living child of their own (a parent only
    waits for its children), less those named in ``skip``; at most ``most``, none when ``pid`` is gone. A
    zombie is left out: it waits for nothing, and its parent, working or waiting, is what tells.

    ``looks`` looks, ``gap`` seconds apart. One look can catch a process that polls (sleeps, wakes, checks,
    sleeps) just as it woke, above all on a busy node, where a woken process waits its turn for a CPU as
    runnable. A process is running when it was runnable (on a CPU, or queued for one) for most of the time
    between its first and last look, as the kernel's scheduler counts it; where the kernel does not count
    it, when it was running in most looks. Otherwise it is in the state it was most often in."""
    seen: dict[int, list[dict[str, str]]] = {}
    runnable: dict[int, list[tuple[float, int | None]]] = {}
    for i in range(max(1, looks)):
        if i:
            time.sleep(gap)
        for p, state in _leaves(pid, skip).items():
            seen.setdefault(p, []).append(state)
            runnable.setdefault(p, []).append((time.monotonic(), _runnable_ns(p)))
    out = []
    for p, states in seen.items():
        (t0, first), (t1, last) = runnable[p][0], runnable[p][-1]
        if first is not None and last is not None and t1 - t0 >= gap:
            working = (last - first) / 1e9 > (t1 - t0) / 2
        else:
            working = sum(s["state"] == "R" for s in states) * 2 > len(states)
        if working:
            out.append({**states[-1], "state": "R", "wchan": ""})
            continue
        waiting = [s for s in states if s["state"] != "R"] or states
        common = Counter(s["state"] for s in waiting).most_common(1)[0][0]
        out.append([s for s in waiting if s["state"] == common][-1])
    return out[:most]


def shows_wait(described: list[str]) -> bool:
    """Whether a sample (each process as :func:`describe` words it) shows a wait: a process sleeping, stuck in
    the kernel or stopped. Processes that are all running on a CPU are progress (a slow run on a busy node),
    not a hang."""
    return any(not str(x).endswith(f": {STATES['R']}") for x in described)


def hung_at_limit(described: list[str], users_limit: bool) -> bool:
    """Whether a run that reached its time limit hung: a sample shows a wait (:func:`shows_wait`); with no
    sample, only a limit the user gave counts (their ``--command`` run did not end within it), never
    zdoctor's own."""
    return shows_wait(described) if described else users_limit


def building(states: list[dict[str, str]]) -> list[dict[str, str]]:
    """The sampled processes that are build tools at work (not stopped, not zombies)."""
    return [s for s in states if s.get("comm") in BUILD_TOOLS and s.get("state") not in ("T", "t", "Z")]


def describe(s: dict[str, str]) -> str:
    """``pid 42 (python): sleeping in pipe_read``."""
    where = f" in {s['wchan']}" if s.get("wchan") else ""
    return f"pid {s['pid']} ({s['comm']}): {STATES.get(s['state'], s['state'])}{where}"


class StuckSampler:
    """Sample the states of a process tree (:func:`sample_tree`'s looks, ending ``delay`` seconds after
    :meth:`start`, just before the run's time limit): the processes below ``pid`` that have no child of
    their own (a parent only waits for its children), less those named in ``skip`` (a tracer). With
    ``inspect``, ``inspect(pid)`` runs once too, ``inspect_delay`` seconds after the start (earlier: it takes
    longer), its answer kept in ``inspected``."""

    def __init__(self, delay: float, skip: tuple[str, ...] = ("strace",),
                 inspect: Callable[[int], Any] | None = None, inspect_delay: float | None = None) -> None:
        self.delay = delay
        self.skip = skip
        self.states: list[dict[str, str]] = []
        self.inspect = inspect
        self.inspect_delay = delay if inspect_delay is None else inspect_delay
        self.inspected: Any = None
        self._timer: threading.Timer | None = None
        self._inspector: threading.Timer | None = None

    def start(self, pid: int) -> None:
        # its looks end at ``delay``, before the limit (:func:`sample_tree`)
        self._timer = threading.Timer(max(0.0, self.delay - SAMPLE_WINDOW), self._sample, args=(pid,))
        self._timer.daemon = True
        self._timer.start()
        if self.inspect is not None:
            self._inspector = threading.Timer(self.inspect_delay, self._inspect, args=(pid,))
            self._inspector.daemon = True
            self._inspector.start()

    def _inspect(self, pid: int) -> None:
        try:
            self.inspected = self.inspect(pid) if self.inspect is not None else None
        except Exception as exc:  # noqa: BLE001 - a failed look is a fact of the run, not its end
            self.inspected = {"error": f"{type(exc).__name__}: {exc}"}

    def _sample(self, pid: int) -> None:
        self.states = sample_tree(pid, self.skip)

    def stop(self) -> None:
        """Cancel what has not run yet, and wait for an inspection already under way to finish."""
        for timer in (self._timer, self._inspector):
            if timer is not None:
                timer.cancel()
        if self._inspector is not None and self._inspector.is_alive():
            self._inspector.join(timeout=30)

