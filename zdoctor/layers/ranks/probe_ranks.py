"""Probe ``ranks``: a hung job's ranks, each one's state, wait and Python stack.

The job is named by ``--pid`` (a rank or a launcher: see :mod:`zdoctor.layers.ranks.ranktree`). Each rank is read
from ``/proc`` (:mod:`zdoctor.layers.ranks.rankstate`), and, when py-spy is installed (``zdoctor[hang]``), its
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
- ``source``: ``pid`` (named by --pid) or ``command`` (the hung --command run, read before its time limit).
- ``skipped``: why nothing was examined (no job named, or the --command run did not hang).
"""

from __future__ import annotations

from typing import Any

from zdoctor.core.factstypes import RanksFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import probe
from zdoctor.layers.ranks.rankjob import collect_ranks
from zdoctor.layers.ranks.rankwaits import PYSPY_TIMEOUT
from zdoctor.proc.target import target_of
from zdoctor.readers.stuck import hung_at_limit

NOT_NAMED = "no hung job named (give --pid PID of a rank or its launcher, or --command)"


def ranks_table(ranks: list[dict[str, Any]], how: str) -> Evidence:
    """rank | local | pid | state | wchan | syscall | CPU | threads."""
    rows = []
    for r in ranks:
        cpu = "?" if r.get("cpu_delta_s") is None else f"{r['cpu_delta_s']:g}s in {r.get('cpu_sample_s', 0):g}s"
        rows.append([r["rank"], r["local_rank"], str(r["pid"]), f"{r['state']} ({r['state_words']})",
                     r.get("wchan") or "-", r.get("syscall") or "-", cpu, str(len(r.get("threads") or []))])
    return Evidence.of_table(f"the job's ranks: {how}", ["rank", "local", "pid", "state", "wchan", "syscall",
                                                         "CPU", "threads"], rows, [])


def from_hung_command(host) -> dict[str, Any]:
    """The ranks of the ``--command`` run as read just before its time limit, or ``{skipped}``: why none."""
    res = host.result("livetrace")
    live = res.facts if res.status == "ok" else {}
    if live.get("source") != "command":
        return {"skipped": f"the --command run gave no facts ({res.error or live.get('skipped') or res.status})"}
    if not live.get("timed_out"):
        return {"skipped": "the --command run did not hang (it ended within its time limit): no hung job to read"}
    ranks = live.get("ranks")
    if not isinstance(ranks, dict) or "processes" not in ranks:
        why = (ranks or {}).get("error") if isinstance(ranks, dict) else None
        return {"skipped": "the hung --command run's ranks were not read before its time limit"
                           + (f" ({why})" if why else "")}
    hung = hung_at_limit([str(x) for x in live.get("stuck_states") or []], users_limit=True)
    run = "the hung --command run" if hung else "the still-working --command run"
    return {**ranks, "source": "command", "how": f"{run} ({ranks.get('how')}), read just before its time limit"}


@probe("ranks", title="A hung job's ranks: state, wait and Python stack", timeout=PYSPY_TIMEOUT + 40,
       needs=("livetrace",), facts=RanksFacts)
def ranks_probe(host) -> tuple[dict[str, Any], list[Evidence]]:
    """The ranks of the job ``--pid`` names, or of the hung ``--command`` run: where each one waits."""
    job = target_of(host)
    pid = job.options.get("pid")
    if not pid and not job.command:
        return {"skipped": NOT_NAMED}, []
    facts = {**collect_ranks(int(pid)), "source": "pid"} if pid else from_hung_command(host)
    if "skipped" in facts:
        return facts, []
    return facts, [ranks_table(facts["ranks"], facts["how"])] if facts["ranks"] else []
