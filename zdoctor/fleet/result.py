"""Evaluate every node's snapshot: the node x check matrix, the skew table, findings and exit code."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from zdoctor import __version__
from zdoctor.core.model import Evidence, Finding, Remedy, sort_findings
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CHECKS, load_vocabulary
from zdoctor.core.verdicts import FAILING, STATUS_RANK
from zdoctor.fleet.collect import NodeRun
from zdoctor.fleet.ranks import fleet_rank_findings
from zdoctor.fleet.reach import nccl_facts, reach_finding
from zdoctor.fleet.skew import SkewRow, read_facts, skew_table
from zdoctor.host import ReplayHost
from zdoctor.layers import evaluate_checks, probe_findings, probes_for
from zdoctor.layers.gpu.envreview import visible_devices

#: The matrix column for probes that crashed or timed out on a node.
PROBES_COLUMN = "probes"
#: The matrix column (and finding id) for the hostfile's slots against the GPUs a node shows.
SLOTS_COLUMN = "fleet.slots"
NODE_PROBLEMS = {
    "unreachable": "unreachable",
    "no-zdoctor": "zdoctor is not installed",
    "timeout": "timed out",
    "error": "zdoctor failed",
    "bad-output": "returned no usable snapshot",
}


def worst(statuses: Sequence[str]) -> str:
    """The worst of finding statuses, a skip counting only when nothing else was said (``ok`` for none)."""
    said = [s for s in statuses if s != "skip"]
    if not said:
        return "skip" if statuses else "ok"
    return min(said, key=lambda s: STATUS_RANK[s])


def family(check: str) -> str:
    """A check's family: ``gpu`` for ``gpu.runtime``; ``probes`` stays ``probes``."""
    return check.partition(".")[0]


def families(checks: Sequence[str]) -> dict[str, list[str]]:
    """Check names grouped by family, in the order given (the matrix as a terminal can show it)."""
    out: dict[str, list[str]] = {}
    for check in checks:
        out.setdefault(family(check), []).append(check)
    return out


@dataclass
class NodeResult:
    """One node: how the launcher fared, its findings, its matrix row and its skew facts."""

    run: NodeRun
    findings: list[Finding] = field(default_factory=list)
    cells: dict[str, str] = field(default_factory=dict)
    facts: dict[str, str] = field(default_factory=dict)
    slots: int | None = None  # the hostfile's slots=N: ranks DeepSpeed starts on this node
    visible_gpus: int | None = None  # GPUs the training sees (NVML's list through CUDA_VISIBLE_DEVICES)

    @property
    def host(self) -> str:
        return self.run.host

    @property
    def reached(self) -> bool:
        return self.run.status == "ok"

    def family_status(self, checks: Sequence[str]) -> str | None:
        """The worst cell of ``checks`` (one family) on this node; None for a node that gave no snapshot."""
        if not self.reached:
            return None
        return worst([self.cells[c] for c in checks if c in self.cells])

    @property
    def status(self) -> str:
        """``fail`` for an unreachable or broken node, else the worst finding's status."""
        if not self.reached:
            return "fail"
        status = worst([f.status for f in self.findings])
        return "ok" if status == "skip" else status

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "launch": {k: v for k, v in self.run.to_dict().items() if k != "snapshot"},
                "status": self.status, "slots": self.slots, "visible_gpus": self.visible_gpus,
                "cells": self.cells, "facts": self.facts,
                "findings": [f.to_dict() for f in self.findings]}


def _launch_finding(run: NodeRun, launcher: str) -> Finding:
    what = NODE_PROBLEMS[run.status]
    ev = [Evidence(label=f"{launcher} for {run.host}", argv=run.argv, exit_code=run.exit_code,
                   stderr="\n".join(run.stderr), error=run.error, duration_s=run.duration_s)]
    q = shlex.quote(run.host)
    remedies = {
        "unreachable": [Remedy(f"check that {run.host} answers over {launcher}",
                               [f"ssh -o BatchMode=yes {q} true"] if launcher != "srun" else
                               [f"srun --nodes=1 --nodelist={q} --overlap true"],
                               explanation="a node the launcher cannot reach cannot run its rank either")],
        "no-zdoctor": [Remedy(f"install zdoctor on {run.host} (or name its path with --zdoctor)",
                              [f"ssh {q} python3 -m pip install --user zdoctor"] if launcher != "srun" else [],
                              explanation="the fleet run executes `zdoctor snapshot` on each node")],
    }.get(run.status, [])
    return Finding(id=f"fleet.node.{run.status}", status="fail", title=f"{run.host}: {what}",
                   detail=run.error or "", evidence=ev, remedies=remedies)


def evaluate_node(run: NodeRun, launcher: str) -> NodeResult:
    """Evaluate one node's snapshot with every registered check, exactly as ``check --replay`` would."""
    if run.status != "ok" or run.snapshot is None:
        return NodeResult(run, [_launch_finding(run, launcher)])

    load_vocabulary()
    host = ReplayHost(run.snapshot, source=run.host)
    facts = host.results(list(dict.fromkeys([*probes_for(CHECKS), *run.snapshot.get("probes", {})])))
    cells: dict[str, str] = {}
    merged: dict[str, Finding] = {}
    crashed = probe_findings(facts)
    if crashed:
        cells[PROBES_COLUMN] = "crash"
    for f in crashed:
        merged.setdefault(f.id, f)
    for name, found in evaluate_checks(CHECKS, facts).items():
        cells[name] = worst([f.status for f in found])
        for f in found:
            merged.setdefault(f.id, f)
    probes = {n: r.facts for n, r in facts.items() if r.status in ("ok", "skip")}
    return NodeResult(run, sort_findings(list(merged.values())), cells, read_facts(probes),
                      visible_gpus=visible_gpus(probes))


def visible_gpus(probes: dict[str, dict[str, Any]]) -> int | None:
    """How many GPUs the training sees: NVML's list as CUDA_VISIBLE_DEVICES filters it (None: unknown)."""

    nv = probes.get("nvml") or {}
    if not isinstance(nv.get("count"), int):
        return None
    gpus = list(nv.get("gpus") or [])
    env = (probes.get("gpu_env") or {}).get("vars") or {}
    vd = visible_devices(env.get("CUDA_VISIBLE_DEVICES"), gpus)
    return len(vd["visible"]) if vd["visible"] is not None else len(gpus)


def slots_finding(node: NodeResult, hostfile: str | None) -> Finding | None:
    """A failing finding when the hostfile asks for more ranks on a node than it has GPUs to give them."""
    if node.slots is None or node.visible_gpus is None or node.visible_gpus >= node.slots:
        return None
    return Finding(
        id=SLOTS_COLUMN, status="fail",
        title=f"{node.host}: the hostfile gives it {node.slots} slots but the training sees "
              f"{count_of(node.visible_gpus, 'GPU')}",
        detail=(f"DeepSpeed's launcher starts one rank per slot and each rank takes the GPU of its local rank; "
                f"ranks {node.visible_gpus} to {node.slots - 1} on {node.host} have no GPU and fail at "
                "torch.cuda.set_device ('CUDA error: invalid device ordinal'). Either the hostfile is wrong for "
                "this node, or CUDA_VISIBLE_DEVICES hides GPUs, or GPUs have fallen off the bus "
                "(compare `nvidia-smi -L` with the node's hardware)."),
        evidence=[Evidence.of_table(f"slots vs GPUs on {node.host}", ["", "count"],
                                    [["slots in the hostfile", str(node.slots)],
                                     ["GPUs the training sees", str(node.visible_gpus)]], [1])],
        remedies=[Remedy(f"give {node.host} as many slots as it has GPUs",
                         [f"sed -i.bak {shlex.quote(_slots_sed(node.host, node.visible_gpus))} "
                          f"{shlex.quote(hostfile)}"] if node.visible_gpus and hostfile else [],
                         undo=[f"mv {shlex.quote(hostfile + '.bak')} {shlex.quote(hostfile)}"] if hostfile else [],
                         explanation="or bring the missing GPUs back and keep the hostfile as it is")])


def _slots_sed(host: str, slots: int) -> str:
    """A sed expression setting ``slots=`` on the hostfile line of ``host`` (a validated name)."""
    pattern = host.replace(".", "[.]")
    return f"s/^\\([[:space:]]*{pattern}\\)[[:space:]].*$/\\1 slots={slots}/"


def skew_finding(row: SkewRow) -> Finding:
    """One finding for a fact that is not the same on every node: every node's value, side by side."""
    order = list(row.values)
    rows = [[h, row.values[h]] for h in order]
    hl = [i for i, h in enumerate(order) if h in row.differing]
    title = (f"{row.fact.title} differs on {', '.join(row.differing)}" if not row.tie
             else f"{row.fact.title} is split between nodes (no majority)")
    detail = (f"Most nodes have {row.majority!r}; {', '.join(row.differing)} "
              f"{'has' if len(row.differing) == 1 else 'have'} something else. Why it matters: {row.fact.why}.")
    return Finding(id=f"fleet.skew.{row.fact.id}", status="fail", title=title, detail=detail,
                   evidence=[Evidence.of_table(f"{row.fact.title} on every node", ["node", row.fact.title],
                                               rows, hl)])


@dataclass
class FleetReport:
    """Everything `zdoctor fleet` says: per-node results, the matrix columns, the skew table."""

    launcher: str
    source: str
    nodes: list[NodeResult]
    skew: list[SkewRow]
    checks: list[str]
    session: str | None = None
    #: The job's ranks judged across the nodes (``fleet --pid``): which rank on which node is out of step.
    ranks: list[Finding] = field(default_factory=list)

    @classmethod
    def build(cls, runs: Sequence[NodeRun], launcher: str, source: str,
              slots: dict[str, int | None] | None = None) -> FleetReport:
        nodes = [evaluate_node(r, launcher) for r in runs]
        hostfile = source if slots and any(v is not None for v in slots.values()) else None
        for n in nodes:
            n.slots = (slots or {}).get(n.host)
            found = slots_finding(n, hostfile)
            if n.slots is not None and n.visible_gpus is not None:
                n.cells[SLOTS_COLUMN] = "fail" if found else "ok"
            if found:
                n.findings = sort_findings([found, *n.findings])
        reached = {n.host: n.facts for n in nodes if n.reached}
        columns: list[str] = []
        for n in nodes:
            columns += [c for c in n.cells if c not in columns]
        columns.sort(key=lambda c: (c != PROBES_COLUMN, c))
        return cls(launcher, source, nodes, skew_table(reached, [n.host for n in nodes]), columns,
                   ranks=fleet_rank_findings(runs))

    def node(self, host: str) -> NodeResult:
        return next(n for n in self.nodes if n.host == host)

    @property
    def differing(self) -> list[SkewRow]:
        return [r for r in self.skew if r.differs]

    @cached_property
    def reach(self) -> Finding:
        """Whether each node's NCCL interface routes to every other node's NCCL address (from the facts)."""
        return reach_finding([(n.host, nccl_facts(n.run.snapshot) if n.reached else None) for n in self.nodes])

    @property
    def fleet_findings(self) -> list[Finding]:
        """Findings about the fleet as a whole: one per fact that differs, the ranks across the nodes, and the
        NCCL reach between nodes when it was judged (``to_dict``'s ``reach`` says why not otherwise)."""
        reach = self.reach
        return [skew_finding(r) for r in self.differing] + list(self.ranks) + \
            ([reach] if reach.status != "skip" else [])

    @property
    def summary(self) -> dict[str, int]:
        counts = {"nodes": len(self.nodes), "reached": sum(n.reached for n in self.nodes),
                  "failing": sum(n.status in FAILING for n in self.nodes),
                  "warning": sum(n.status == "warn" for n in self.nodes),
                  "differing_facts": len(self.differing)}
        for status in NODE_PROBLEMS:
            counts[status] = sum(n.run.status == status for n in self.nodes)
        return counts

    @property
    def exit_code(self) -> int:
        return 1 if any(n.status in FAILING for n in self.nodes) or self.differing \
            or any(f.status in FAILING for f in self.ranks) or self.reach.status in FAILING else 0

    def to_dict(self) -> dict[str, Any]:
        return {"version": __version__, "launcher": self.launcher, "source": self.source,
                "summary": self.summary, "checks": self.checks,
                "nodes": [n.to_dict() for n in self.nodes],
                "skew": [r.to_dict() for r in self.skew],
                "findings": [f.to_dict() for f in self.fleet_findings],
                "reach": self.reach.to_dict(),
                "session": self.session}
