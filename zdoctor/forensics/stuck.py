"""Where a hung run waits: each process of its tree sampled just before the time limit ends it, with its
state (``S`` sleeping, ``D`` in the kernel uninterruptibly ...), the kernel function it sleeps in (wchan)
and its command name, read from ``/proc``."""

from __future__ import annotations

import threading
from typing import Any, Callable

#: What a process state letter means.
STATES = {"R": "running", "S": "sleeping", "D": "in the kernel (uninterruptible)", "T": "stopped",
          "t": "stopped by a tracer", "Z": "a zombie", "I": "idle"}


def _read(path: str, limit: int = 4096) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace").strip()
    except OSError:
        return ""


def process_state(pid: int) -> dict[str, str] | None:
    """``{pid, comm, state, wchan}`` of ``pid`` from ``/proc``, or None when it is gone."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat or ")" not in stat:
        return None
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    state = stat[stat.rindex(")") + 2:].split(" ", 1)[0]
    wchan = _read(f"/proc/{pid}/wchan")
    return {"pid": str(pid), "comm": comm, "state": state, "wchan": "" if wchan == "0" else wchan}


def describe(s: dict[str, str]) -> str:
    """``pid 42 (python): sleeping in pipe_read``."""
    where = f" in {s['wchan']}" if s.get("wchan") else ""
    return f"pid {s['pid']} ({s['comm']}): {STATES.get(s['state'], s['state'])}{where}"


class StuckSampler:
    """Sample the states of a process tree once, ``delay`` seconds after :meth:`start` (just before the
    run's time limit): the processes below ``pid`` that have no child of their own (a parent only waits for
    its children), less those named in ``skip`` (a tracer). With ``inspect``, ``inspect(pid)`` runs once too,
    ``inspect_delay`` seconds after the start (earlier: it takes longer), its answer kept in ``inspected``."""

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
        self._timer = threading.Timer(self.delay, self._sample, args=(pid,))
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
        import psutil

        try:
            tree = psutil.Process(pid).children(recursive=True)
            # the processes that wait on something themselves: parents only wait for their children
            leaves = [c.pid for c in tree if not c.children()]
        except psutil.Error:
            return
        found = [s for s in map(process_state, leaves) if s is not None and s["comm"] not in self.skip]
        self.states = found[:16]

    def stop(self) -> None:
        """Cancel what has not run yet, and wait for an inspection already under way to finish."""
        for timer in (self._timer, self._inspector):
            if timer is not None:
                timer.cancel()
        if self._inspector is not None and self._inspector.is_alive():
            self._inspector.join(timeout=30)

