"""A hung job's ranks: where each one waits, and whether they disagree (rank 0 in an all-gather, rank 1 in a
barrier wait for each other forever); the ZeRO-3 patterns behind it (generate() without synced_gpus, ranks that
ran different numbers of steps)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from zdoctor.core.model import Evidence, Finding, Remedy
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.layers.ranks.rankwaits import OP_TYPES, compare, label, rank_wait, said
from zdoctor.symptoms.match import ids_for

CID = "ranks.waits"
TITLE = "A hung job's ranks"
INSTALL_PYSPY = "install zdoctor[hang] (py-spy) on this node to read each rank's Python stack"
NOT_TRIED = "not tried: it changes the training and needs a new launch"
#: Programs a launcher starts the ranks of other nodes through.
REMOTE_STARTERS = ("pdsh", "ssh", "srun", "mpirun", "orted", "prted", "hydra_pmi_proxy")


def wait_table(ranks: list[dict[str, Any]], title: str = "where each rank waits") -> Evidence:
    """rank | pid | state | CPU | waits in, disagreeing rows highlighted by the caller."""
    rows = []
    for r in ranks:
        cpu = "?" if r.get("cpu_delta_s") is None else f"{r['cpu_delta_s']:g} s in {r.get('cpu_sample_s', 0):g} s"
        rows.append([label(r), f"{r.get('state')} ({r.get('state_words')})", cpu, said(r["wait"])])
    return Evidence.of_table(title, ["rank", "state", "CPU", "waits in"], rows, [])


def debug_remedies(ranks: list[dict[str, Any]]) -> list[Remedy]:
    """Have the next hang reported instead of waited out: the collective check and a timeout."""
    envs = [r.get("env") or {} for r in ranks]
    debug = {e.get("TORCH_DISTRIBUTED_DEBUG") for e in envs if e}
    out = []
    if debug != {"DETAIL"}:
        out.append(Remedy(
            title="Launch with TORCH_DISTRIBUTED_DEBUG=DETAIL so torch reports the mismatched collective",
            commands=["export TORCH_DISTRIBUTED_DEBUG=DETAIL"], verified=None, note=NOT_TRIED,
            explanation="With DETAIL, torch checks before every collective that all ranks call the same one with "
                        "the same shapes, and fails with 'Detected mismatch between collectives on ranks' naming "
                        "each rank's call instead of hanging. It slows every collective: use it to find the bug. "
                        "Ranks now: TORCH_DISTRIBUTED_DEBUG="
                        + (", ".join(sorted(str(d) for d in debug if d)) or "not set") + "."))
    out.append(Remedy(
        title="Give the process group a timeout, so a hung collective fails instead of waiting",
        commands=["export TORCH_NCCL_ASYNC_ERROR_HANDLING=1"], verified=None, note=NOT_TRIED,
        explanation="Pass timeout=datetime.timedelta(minutes=10) to torch.distributed.init_process_group (or "
                    "deepspeed.init_distributed); with NCCL, TORCH_NCCL_ASYNC_ERROR_HANDLING=1 lets the watchdog "
                    "abort the job when a collective outlives it, so the ranks exit with the collective's name."))
    return out


@dataclass(frozen=True)
class RankPattern:
    """A ZeRO-3 pattern that leaves the ranks apart: its finding's title, what ZeRO-3 needs that it breaks, and
    the change to the training that fixes it."""

    title: str
    why: str
    fix: str
    how: str


#: The patterns :func:`zdoctor.layers.ranks.rankwaits.compare` recognises, by id.
RANK_PATTERNS = {
    "zero3-generate": RankPattern(
        title="ZeRO-3 generate() without synced_gpus: a rank still gathers parameters after another left",
        why="Under ZeRO-3 every forward pass gathers each layer's parameters from all ranks. generate() "
            "stops on each rank when its own sequences are done, so a rank that finishes early stops "
            "taking part in the all-gathers the others still need; they wait for it forever. With "
            "synced_gpus=True a rank that is done keeps running forward passes until every rank is done. "
            "Pass it explicitly: transformers turns it on by itself only when its own DeepSpeed "
            "integration knows ZeRO-3 is on.",
        fix="Call generate(..., synced_gpus=True) on every rank",
        how="In the evaluation or generation code: model.generate(**inputs, "
            "synced_gpus=True). Every rank must call generate() the same number "
            "of times too (the same number of prompts per rank)."),
    "uneven-steps": RankPattern(
        title="The ranks ran different numbers of steps: one is inside a DeepSpeed step, another has left the loop",
        why="Every ZeRO-3 forward, backward and step is a series of collectives all ranks must call together. A "
            "rank whose data loader gave it fewer batches (a dataset that does not divide by the world size, a "
            "per-rank filter, an early break) leaves the loop while the others wait for it in the next step.",
        fix="Give every rank the same number of steps",
        how="Use DistributedSampler(..., drop_last=True) (or drop_last=True in the "
            "DataLoader) so each rank gets the same number of batches; break out of "
            "the loop on all ranks together (all_reduce a stop flag); give every "
            "rank a dataset of the same length."),
}


def pattern_finding(p: dict[str, Any], by_pid: dict[int, dict[str, Any]], ev: list[Evidence]) -> Finding:
    ranks = [by_pid[pid] for pid in p["ranks"] if pid in by_pid]
    lines = [f"- {label(r)}: {said(r['wait'])}" for r in ranks]
    key = "zero3-generate" if p["id"] == "zero3-generate" else "uneven-steps"
    pattern = RANK_PATTERNS[key]
    return Finding(id=f"{CID}.{key}", status="fail", title=pattern.title,
                   detail="\n".join([p["why"] + ".", "", pattern.why, "", *lines]), evidence=ev,
                   remedies=[Remedy(title=pattern.fix, verified=None, note=NOT_TRIED, explanation=pattern.how)])


def missing_finding(facts: Mapping[str, Any], ranks: list[dict[str, Any]], ev: list[Evidence]) -> Finding | None:
    """A finding when the launcher started more local ranks than run now (one exited, the others wait)."""
    sizes = {(r.get("env") or {}).get("LOCAL_WORLD_SIZE") for r in ranks}
    sizes.discard(None)
    if len(sizes) != 1 or not facts.get("launcher"):
        return None
    size = str(next(iter(sizes)))
    if not size.isdigit():
        return None
    have = {r.get("local_rank") for r in ranks}
    gone = [str(i) for i in range(int(size)) if str(i) not in have]
    if not gone:
        return None
    return Finding(id=f"{CID}.missing", status="fail",
                   title=f"Local rank{'s' if len(gone) > 1 else ''} {', '.join(gone)} of {size} no longer "
                         "run while the others wait",
                   detail=f"The launcher ({facts.get('launcher')}) started {size} ranks on this node "
                          f"(LOCAL_WORLD_SIZE={size}); local rank {', '.join(gone)} is gone. The ranks left wait "
                          "in their next collective for one that will never come: read the launcher's output "
                          "for how it ended (an exception, the OOM killer: see the kernel log).",
                   evidence=ev)


def rank_order(r: dict[str, Any]) -> tuple[Any, ...]:
    """Ranks by number (unknown ones last), then node and pid."""
    rid = str(r.get("rank"))
    return (not rid.isdigit(), int(rid) if rid.isdigit() else 0, str(r.get("host") or ""), r.get("pid") or 0)


def timeouts_explained(facts: Facts, ranks: list[dict[str, Any]]) -> list[str]:
    """The collective-timeout symptoms (a watchdog's OpType) of a collective some rank waits in."""
    ops = {op for r in ranks if r["wait"].get("in_collective") for op in OP_TYPES.get(str(r["wait"]["call"]), ())}
    return sorted({sid for op in ops for sid in ids_for(facts, "collective-timeout", op=op)})


@check(CID, title=TITLE, probes=("ranks",), findings=(f"{CID}.*",), explains=("collective-timeout", "hang"),
       layer="ranks")
def check_ranks(facts: Facts, me: CheckSpec) -> list[Finding]:
    got = me.require(facts.of("ranks"), facts.why_not("ranks"), sub="not-checked")
    if not got.get("processes"):
        return [me.not_checked(got.get("missing") or "no process of the job was found", sub="not-checked")]
    ranks = [dict(r) for r in got.get("ranks") or []]
    if not ranks:
        names = ", ".join(f"{p['pid']} ({p.get('name')})" for p in got["processes"][:10])
        remote = sorted({str(p.get("name")) for p in got["processes"] if p.get("name") in REMOTE_STARTERS})
        hint = (f"It starts its ranks on other nodes ({', '.join(remote)}): `zdoctor fleet --pid HOST=PID` reads "
                "each node's ranks." if remote else "Name a rank or its launcher with --pid.")
        return [me.finding(status="warn", title="The job's tree holds no Python rank on this node",
                           detail=f"The job is {got.get('how')}: {names}. None of them is a Python rank, so there is "
                                  f"no rank whose stack zdoctor could read here. {hint}",
                           evidence=facts.evidence("ranks"))]
    for r in ranks:
        r["wait"] = rank_wait(r)
    ranks.sort(key=rank_order)
    found = judge(ranks, got, facts.evidence("ranks"))
    if found and found[0].id == me.name and found[0].status == "fail":
        # the watchdog's timeout of a collective some rank waits in; the hang of the --command run read here
        found[0].explains = timeouts_explained(facts, ranks) + (ids_for(facts, "hang")
                                                                if got.get("source") == "command" else [])
    return found


def judge(ranks: list[dict[str, Any]], got: Mapping[str, Any], evidence: list[Evidence],
          across_nodes: bool = False) -> list[Finding]:
    """The findings of ranks whose waits are known (``wait`` set): agree, disagree, unknown, the patterns;
    ``across_nodes``: the ranks of several nodes, judged as one job."""
    cmp = compare(ranks)
    by_pid = {r["pid"]: r for r in ranks}
    ev = [wait_table(ranks), *evidence]
    tool = got.get("pyspy") or {}
    lines = [f"The job is {got.get('how')}."] if got.get("how") else []
    for r in ranks:
        lines.append(f"- {label(r)}: {said(r['wait'])}")
        if r.get("tcp_peers"):
            lines.append(f"  TCP peers: {', '.join(r['tcp_peers'])}")
    if cmp["unknown"]:
        why = sorted({by_pid[p]["wait"].get("why_unknown") or "?" for p in cmp["unknown"]})
        lines += ["", f"The Python frame of {count_of(len(cmp['unknown']), 'rank')} is unknown ({'; '.join(why)})"
                  + (f": {INSTALL_PYSPY}." if not tool.get("path") else "."),
                  "From /proc: a rank blocked in futex waits for one of its own threads, and threads in "
                  "epoll_wait/poll on sockets wait for data from a peer (gloo's and NCCL's network threads)."]
    out: list[Finding] = []
    if cmp["verdict"] == "disagree":
        groups = [[by_pid[p] for p in g] for g in cmp["groups"]]
        parts = []
        for i, g in enumerate(groups):
            who = ", ".join(label(r).split(" (pid")[0] for r in g)
            exited = g[0]["wait"]["source"] == "exited"
            verb = "" if exited or (i > 0 and g[0]["wait"]["in_collective"]) else "waits" if len(g) == 1 else "wait"
            parts.append(" ".join(x for x in (who, verb, short_wait(g[0]["wait"])) if x))
        out.append(Finding(
            id=CID, status="fail", title="Ranks disagree: " + "; ".join(parts),
            detail="\n".join([*lines, "", "Each collective completes only when every rank of the group calls "
                              "the same one: ranks in different collectives (or one in a collective while "
                              "another is elsewhere) wait for each other forever, or until the process group's "
                              "timeout."]),
            evidence=ev, remedies=debug_remedies(ranks)))
        out += [pattern_finding(p, by_pid, ev) for p in cmp["patterns"]]
    elif cmp["verdict"] == "agree" and ranks[0]["wait"]["in_collective"]:
        w = ranks[0]["wait"]
        out.append(Finding(
            id=CID, status="warn",
            title=f"All {count_of(len(ranks), 'rank')} {'of these nodes' if across_nodes else 'here'} wait in the "
                  f"same {w['call']} ({w['at']})",
            detail="\n".join([*lines, "", ("The ranks of these nodes agree: they wait for a rank on a node not "
                               "examined, " if across_nodes else
                               "The ranks on this node agree: they wait for a peer that has not joined, on another "
                               "node (run `zdoctor fleet --pid` to see every node's ranks), ")
                              + "or for a network that does not deliver (see the NCCL network layer)."]),
            evidence=ev, remedies=debug_remedies(ranks)))
    elif cmp["verdict"] in ("agree", "single") and ranks[0]["wait"]["source"] in ("py-spy", "exited"):
        w = ranks[0]["wait"]
        what = "exited" if w["source"] == "exited" else f"{w['call']} ({w['at']})" if w["in_collective"] else \
            f"no collective: {w.get('user') or w['top']}"
        out.append(Finding(
            id=CID, status="warn",
            title=f"{count_of(len(ranks), 'rank')} of the job: {what}",
            detail="\n".join([*lines, "", "One rank alone cannot disagree with another: name the launcher with "
                              "--pid to see all of this node's ranks." if len(ranks) == 1 else
                              "No rank waits in a collective: whatever holds the job, it is not a collective "
                              "(see where each rank is)."]),
            evidence=ev))
    else:
        states = sorted({f"{r['wait'].get('syscall') or '?'}" for r in ranks})
        out.append(Finding(
            id=CID, status="warn",
            title=f"{count_of(len(ranks), 'rank')} blocked in {', '.join(states)}: " + (
                "whether they disagree is unknown (the Python frame is unknown)" if len(ranks) > 1 else
                "the Python frame is unknown"),
            detail="\n".join([*lines, "", "Without each rank's Python stack zdoctor cannot tell which collective "
                              "each one waits in, so not whether they disagree."]),
            evidence=ev, remedies=debug_remedies(ranks)))
    gone = missing_finding(got, ranks, ev)
    if gone:
        out.append(gone)
    return out


def short_wait(w: dict[str, Any]) -> str:
    """``in all_gather (train.py:11)``, ``in no collective (train.py:20)``, ``in futex (Python frame unknown)``."""
    if w.get("source") == "exited":
        return "has exited"
    if w.get("source") == "proc":
        return f"in {w.get('syscall') or '?'} (Python frame unknown)"
    if not w.get("in_collective"):
        return f"in no collective ({w.get('user') or w.get('top')})"
    under = " under ZeRO-3" if w.get("zero3") and not str(w["call"]).startswith("ZeRO-3") else ""
    return f"in {w['call']}{under} ({w.get('caller_at') or w['at']})"
