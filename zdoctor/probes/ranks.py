"""Probe ``ranks``: a hung job's ranks, each one's state, wait and Python stack.

The job is named by ``--pid`` (a rank or a launcher: see :mod:`zdoctor.forensics.ranktree`). Each rank is read
from ``/proc`` (:mod:`zdoctor.forensics.rankstate`), and, when py-spy is installed (``zdoctor[hang]``), its
Python stack comes from ``py-spy dump --json --nonblocking`` (read without pausing the rank; bounded).

Facts (plain JSON):

- ``named``: the pid given; ``root``, ``launcher``, ``how``: the job's tree and how it was chosen;
  ``processes``: [{pid, ppid, name, cmdline, launcher, python}] of that tree; ``missing``: why there is none.
- ``ranks``: [{pid, comm, state, state_words, wchan, syscall, rank, local_rank, env (RANK_KEYS and the timeout
  variables; None when unreadable), env_readable, threads [{tid, comm, state, wchan, syscall}], kernel_stack
  (None unless root), tcp_peers, cpu_s, cpu_delta_s, cpu_sample_s, python: {threads: [{tid, name, active,
  owns_gil, frames: [{name, file, path, line}]}]} | {error} | None}].
- ``helpers``: pids of the ranks' own children (data-loader workers ...).
- ``pyspy``: {path, version} when it runs, {path, error} when it does not, {path: None} when not installed.
- ``skipped``: why nothing was examined (no job named).
"""

from __future__ import annotations

import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..forensics import rankstate, ranktree
from ..forensics.rankwaits import PYSPY_TIMEOUT, parse_pyspy
from ..model import Evidence
from ..registry import probe
from ..runner import run
from ..target import target_of

NOT_NAMED = "no hung job named (give --pid PID of a rank or its launcher, or --command)"
CPU_SAMPLE_S = 0.5
MAX_RANKS = 64


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


def collect_ranks(pid: int, proc: str = "/proc") -> tuple[dict[str, Any], list[Evidence]]:
    """The ranks facts of the job ``pid`` belongs to."""
    job = ranktree.job_processes(pid)
    facts: dict[str, Any] = {**job, "ranks": [], "helpers": []}
    if not job["processes"]:
        facts["pyspy"] = {"path": None}
        return facts, []
    env_of = {p["pid"]: rankstate.read_env(p["pid"], proc=proc) for p in job["processes"] if p["python"]}
    ranks, helpers = ranktree.rank_pids(job["processes"], env_of)
    read = [r for r in (rankstate.read_rank(p, proc) for p in ranks[:MAX_RANKS]) if r is not None]
    rankstate.sample_cpu(read, CPU_SAMPLE_S, proc)
    tool = pyspy_tool(find_pyspy())
    if tool.get("version"):
        with ThreadPoolExecutor(max_workers=min(8, max(1, len(read)))) as pool:
            dumps = list(pool.map(lambda r: pyspy_dump(tool["path"], r["pid"]), read))
        for r, d in zip(read, dumps):
            r["python"] = d
    else:
        for r in read:
            r["python"] = None
    facts.update(ranks=read, helpers=helpers, pyspy=tool)
    return facts, [ranks_table(read, job["how"])]


def ranks_table(ranks: list[dict[str, Any]], how: str) -> Evidence:
    """rank | local | pid | state | wchan | syscall | CPU | threads."""
    rows = []
    for r in ranks:
        cpu = "?" if r.get("cpu_delta_s") is None else f"{r['cpu_delta_s']:g}s in {r.get('cpu_sample_s', 0):g}s"
        rows.append([r["rank"], r["local_rank"], str(r["pid"]), f"{r['state']} ({r['state_words']})",
                     r.get("wchan") or "-", r.get("syscall") or "-", cpu, str(len(r.get("threads") or []))])
    return Evidence.of_table(f"the job's ranks: {how}", ["rank", "local", "pid", "state", "wchan", "syscall",
                                                         "CPU", "threads"], rows, [])


@probe("ranks", title="A hung job's ranks: state, wait and Python stack", timeout=PYSPY_TIMEOUT + 40)
def ranks_probe(host) -> tuple[dict[str, Any], list[Evidence]]:
    """The ranks of the job ``--pid`` names: where each one waits."""
    pid = target_of(host).options.get("pid")
    if not pid:
        return {"skipped": NOT_NAMED}, []
    return collect_ranks(int(pid))
