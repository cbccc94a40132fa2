"""How zdoctor's own process ends once its command has returned.

The interpreter's own shutdown takes about 40 ms after a ``check`` (it tears down some 700 modules one by
one), paid on every run of a CI gate and every run across a fleet. zdoctor's command has already ended
everything it started (its children, its session log, written through unbuffered descriptors); what is
left is Python's own: the exit handlers (the run's scratch folders) and the standard streams' buffers. Those
run and are flushed here, then the process ends at once.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn


def finish(code: int | None) -> NoReturn:
    """Run the exit handlers, flush stdout and stderr, and end the process with ``code``."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # the reader went away (`zdoctor check | head`) or the stream is closed
            pass
    os._exit(code if isinstance(code, int) else 0)
