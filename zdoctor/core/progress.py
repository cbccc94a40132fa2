"""What zdoctor is doing right now: the probes running, for how long, and what each is busy with.

One board for the process. A host marks each probe it computes as started and ended; long work inside a
probe (the re-runs of a failing command with each fix) says what it is doing with :func:`note`. A
terminal line (:mod:`zdoctor.report.progressline`) and the guide read :func:`snapshot`; nothing here prints.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator


@dataclass(frozen=True)
class Running:
    """A probe still running: its name, seconds since it started, and what it said it is doing."""

    name: str
    elapsed_s: float
    doing: str = ""


@dataclass
class _Board:
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: dict[str, float] = field(default_factory=dict)
    doing: dict[str, str] = field(default_factory=dict)
    done: int = 0


_BOARD = _Board()


def started(name: str) -> None:
    """Probe ``name`` began."""
    with _BOARD.lock:
        _BOARD.started[name] = time.monotonic()


def ended(name: str) -> None:
    """Probe ``name`` ended (with any result)."""
    with _BOARD.lock:
        if _BOARD.started.pop(name, None) is not None:
            _BOARD.done += 1
        _BOARD.doing.pop(name, None)


def note(name: str, doing: str) -> None:
    """Probe ``name`` is now busy with ``doing`` (``""`` clears it)."""
    with _BOARD.lock:
        if doing:
            _BOARD.doing[name] = doing
        else:
            _BOARD.doing.pop(name, None)


@contextmanager
def doing(name: str, what: str) -> Iterator[None]:
    """Say ``what`` probe ``name`` is busy with while the block runs."""
    note(name, what)
    try:
        yield
    finally:
        note(name, "")


def doing_now(name: str) -> str:
    """What probe ``name`` said it is busy with, or ``""``."""
    with _BOARD.lock:
        return _BOARD.doing.get(name, "")


def snapshot() -> tuple[list[Running], int]:
    """The probes running now (the longest-running first) and how many have ended."""
    now = time.monotonic()
    with _BOARD.lock:
        rows = [Running(n, now - t, _BOARD.doing.get(n, "")) for n, t in _BOARD.started.items()]
        done = _BOARD.done
    rows.sort(key=lambda r: -r.elapsed_s)
    return rows, done
