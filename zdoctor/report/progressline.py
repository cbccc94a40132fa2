"""A live line on a terminal's stderr while `zdoctor check` works: which probes run, for how long, which
is the slowest and what it is doing ("re-running the command with fix 2 of 3"). Nothing is written
when stderr is not a terminal, and the line is erased before the report is printed."""

from __future__ import annotations

import os
import shutil
import sys
import threading
from typing import TextIO

from zdoctor.core import progress

#: Seconds between two redraws.
INTERVAL_S = 0.25
#: Seconds before the first line: a check that ends sooner shows nothing.
DELAY_S = 0.5


def line(rows: list[progress.Running], done: int, width: int) -> str:
    """The progress line for ``rows`` (longest-running first), at most ``width`` characters."""
    if not rows:
        return f"zdoctor: {done} probes done, judging the findings"[:width]
    slowest = rows[0]
    head = f"zdoctor: {len(rows)} running, {done} done; slowest {slowest.name} {slowest.elapsed_s:.1f}s"
    if slowest.doing:
        head += f" ({slowest.doing})"
    others = ", ".join(f"{r.name} {r.elapsed_s:.0f}s" + (f" ({r.doing})" if r.doing else "") for r in rows[1:])
    text = f"{head}; also {others}" if others else head
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


class ProgressLine:
    """Draws :func:`line` on ``stream`` every :data:`INTERVAL_S` while in a ``with`` block, when it is a TTY."""

    def __init__(self, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled and _is_tty(self.stream) and os.environ.get("TERM") != "dumb"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._drawn = False

    def __enter__(self) -> ProgressLine:
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="zdoctor-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._drawn:
            self._write("\r\x1b[K")

    def _run(self) -> None:
        if self._stop.wait(DELAY_S):
            return
        while not self._stop.is_set():
            rows, done = progress.snapshot()
            width = max(shutil.get_terminal_size((80, 24)).columns - 1, 20)
            self._write("\r\x1b[K" + line(rows, done, width))
            self._drawn = True
            self._stop.wait(INTERVAL_S)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self._stop.set()


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
