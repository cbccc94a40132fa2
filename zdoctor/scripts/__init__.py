"""Files zdoctor runs in another interpreter (the training environment's, or its own with ``-I -S``), never
imports itself: each is stdlib-only Python 3.8+."""

from __future__ import annotations

from pathlib import Path

from zdoctor.core.resources import data_dir

#: What starts each record line ``probe_script.py`` prints (the script holds its own copy: it imports nothing).
RECORD_SENTINEL = "@@zdoctor@@ "


def script_path(name: str) -> Path:
    """Script ``name`` as a file an interpreter can run by path: here, beside this module (a wheel, a source
    checkout), or the copy the one-file bundle extracted (its modules are inside a zip)."""
    here = Path(__file__).resolve().parent / name
    if here.is_file():
        return here

    return data_dir("scripts") / name
