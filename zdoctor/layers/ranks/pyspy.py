"""py-spy, the optional reader of a running Python process's stack (``zdoctor[hang]``): where it is, whether it
runs, and one rank's stack from ``py-spy dump --json --nonblocking`` (read without pausing the process), bounded
in time; what it cannot read is one line."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

from zdoctor.layers.ranks.rankwaits import PYSPY_TIMEOUT, parse_pyspy
from zdoctor.proc.runner import run


def find_pyspy(path: str | None = None) -> str | None:
    """py-spy on PATH, else beside this interpreter (a virtual environment zdoctor[hang] was installed into)."""
    found = shutil.which("py-spy", path=path if path is not None else os.environ.get("PATH", ""))
    if found:
        return found
    beside = os.path.join(sys.prefix, "bin", "py-spy")
    return beside if os.path.isfile(beside) and os.access(beside, os.X_OK) else None


def pyspy_tool(path: str | None) -> dict[str, Any]:
    """``{path, version}`` when ``py-spy --version`` runs, ``{path, error}`` when it does not."""
    if path is None:
        return {"path": None}
    ev = run([path, "--version"], timeout=10.0, label="py-spy --version")
    words = (ev.stdout or "").split()
    if ev.exit_code == 0 and len(words) >= 2:
        return {"path": path, "version": words[1]}
    return {"path": path, "error": ev.error or (ev.stderr or ev.stdout or "").strip()[-300:]
            or f"exited with {ev.exit_code}"}


def pyspy_dump(path: str, pid: int) -> dict[str, Any]:
    """``{threads}`` of one rank, or ``{error}`` in one line (ptrace refused, not a Python process ...)."""
    ev = run([path, "dump", "--pid", str(pid), "--json", "--nonblocking"], timeout=PYSPY_TIMEOUT,
             label=f"py-spy dump --pid {pid}")
    if ev.exit_code == 0:
        try:
            return {"threads": parse_pyspy(ev.stdout)}
        except ValueError as exc:
            return {"error": f"py-spy's output could not be read: {exc}"}
    said = " ".join((ev.stderr or ev.stdout or "").split())[-300:]
    if ev.error:
        return {"error": f"py-spy dump: {ev.error}"}
    if "ermission" in said or "not permitted" in said:
        return {"error": f"py-spy may not read pid {pid} (ptrace refused: run zdoctor as root, or allow ptrace "
                         f"with kernel.yama.ptrace_scope=0): {said}"}
    return {"error": f"py-spy dump exited with {ev.exit_code}: {said or 'no output'}"}
