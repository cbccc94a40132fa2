"""What an earlier zdoctor left behind: the entries of a folder named after the process that made them (a
cgroup, a trace folder, a run folder), and whether a process is gone."""

from __future__ import annotations

import os
import re


def named_entries(folder: str, pattern: re.Pattern[str]) -> list[tuple[str, re.Match[str]]]:
    """The names in ``folder`` that ``pattern`` matches, each with its match; none when it cannot be listed."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [(name, m) for name in names for m in [pattern.match(name)] if m]


def process_gone(pid: int, *, group: bool = False) -> bool:
    """Whether no process has ``pid`` now, or with ``group`` no process is in the group ``pid`` (a live one of
    another user, which cannot be signalled, is there)."""
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False
