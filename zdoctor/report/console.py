"""The rich console zdoctor prints its reports through.

Rich ends the process with ``SystemExit(1)`` when the reader of its output goes away (``zdoctor check |
head``): exit code 1 says "a check failed", which was not what happened. This console raises
``BrokenPipeError`` instead, so the command that printed decides its exit code: a check's or a fleet's
verdict stands whether or not anyone read all of it (:func:`print_whatever_is_read`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TextIO


def report_console(stream: TextIO) -> Any:
    """A rich Console writing to ``stream`` (no highlighting, soft wrap), raising ``BrokenPipeError`` when
    the reader has gone away."""
    from rich.console import Console

    class ReportConsole(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError("the reader of zdoctor's output went away")

    return ReportConsole(file=stream, highlight=False, soft_wrap=True)


def print_whatever_is_read(write: Callable[[], object]) -> None:
    """Run ``write`` (a report printed to stdout) and flush it; a reader that went away ends the printing,
    never the command, whose exit code (a verdict) stays its own."""
    try:
        write()
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_gone()


def stdout_gone() -> None:
    """The reader of stdout went away: send what is still written there (the buffer's flush at exit too) to
    /dev/null instead of failing again."""
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), sys.stdout.fileno())
