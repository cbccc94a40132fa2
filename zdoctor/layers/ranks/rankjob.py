"""A hung job's ranks, read once: the job's tree (:mod:`.ranktree`), each rank from /proc (:mod:`.rankstate`)
with a short CPU sample, and each rank's Python stack through py-spy when it is installed (:mod:`.pyspy`)."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from zdoctor.layers.ranks import rankstate, ranktree
from zdoctor.layers.ranks.pyspy import find_pyspy, pyspy_dump, pyspy_tool
from zdoctor.proc.shim import is_keeper_command

CPU_SAMPLE_S = 0.5
MAX_RANKS = 64


def is_keeper(cmdline: list[str]) -> bool:
    """Whether a command line is zdoctor's keeper of a command it runs (not the job: it only waits for it)."""
    return is_keeper_command(cmdline)


def collect_ranks(pid: int, proc: str = "/proc", exclude: Iterable[int] = ()) -> dict[str, Any]:
    """The ranks facts of the job ``pid`` belongs to (see :mod:`zdoctor.layers.ranks.probe_ranks`); ``exclude``:
    processes
    of the tree that are not the job's (zdoctor's own keeper of a command it runs)."""
    job = ranktree.job_processes(pid)
    skip = set(exclude)
    job["processes"] = [p for p in job["processes"] if p["pid"] not in skip and not is_keeper(p["cmdline"])]
    facts: dict[str, Any] = {**job, "ranks": [], "helpers": []}
    if not job["processes"]:
        facts["pyspy"] = {"path": None}
        return facts
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
        broken = {"error": f"py-spy ({tool['path']}) does not run: {tool.get('error')}"} if tool.get("path") else None
        for r in read:
            r["python"] = broken
    facts.update(ranks=read, helpers=helpers, pyspy=tool)
    return facts
