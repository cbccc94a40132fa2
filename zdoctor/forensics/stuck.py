"""Where a hung run waits: each process of its tree sampled just before the time limit ends it, with its
state (``S`` sleeping, ``D`` in the kernel uninterruptibly ...), the kernel function it sleeps in (wchan)
and its command name, read from ``/proc``."""

from __future__ import annotations

import threading

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
    its children), less those named in ``skip`` (a tracer)."""

    def __init__(self, delay: float, skip: tuple[str, ...] = ("strace",)) -> None:
        self.delay = delay
        self.skip = skip
        self.states: list[dict[str, str]] = []
        self._timer: threading.Timer | None = None

    def start(self, pid: int) -> None:
        self._timer = threading.Timer(self.delay, self._sample, args=(pid,))
        self._timer.daemon = True
        self._timer.start()

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
        if self._timer is not None:
            self._timer.cancel()

