"""A multi-node hang across the fleet: every node's ranks (``fleet --pid``) side by side, each labelled with
its node, judged as one job: which rank on which node waits somewhere else than the others."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zdoctor.core.model import Finding
from zdoctor.fleet.collect import NodeRun
from zdoctor.layers.ranks.check_ranks import judge, rank_order
from zdoctor.layers.ranks.rankwaits import rank_wait

FLEET_ID = "fleet.ranks"


def node_ranks(run: NodeRun) -> list[dict[str, Any]]:
    """The ranks a node's snapshot recorded, each with its node and its wait; none when it recorded none."""
    rec = ((run.snapshot or {}).get("probes") or {}).get("ranks")
    facts = rec.get("facts") if isinstance(rec, dict) and rec.get("status", "ok") == "ok" else None
    out = []
    for r in (facts or {}).get("ranks") or []:
        if isinstance(r, dict) and isinstance(r.get("pid"), int):
            r = {**r, "host": run.host}
            r["wait"] = rank_wait(r)
            out.append(r)
    return out


def fleet_rank_findings(runs: Sequence[NodeRun]) -> list[Finding]:
    """The job's ranks judged across the nodes that recorded some (two nodes at least), ids ``fleet.ranks*``."""
    per_node = {run.host: node_ranks(run) for run in runs if run.status == "ok"}
    per_node = {h: rs for h, rs in per_node.items() if rs}
    if len(per_node) < 2:
        return []
    ranks = sorted((r for rs in per_node.values() for r in rs), key=rank_order)
    how = f"the ranks of {len(per_node)} nodes: " + ", ".join(f"{h} ({len(rs)})" for h, rs in per_node.items())
    # py-spy was there on a node when it gave a rank's stack or said why it could not
    tool = {"path": "on the nodes" if any(r.get("python") is not None for r in ranks) else None}
    found = judge(ranks, {"how": how, "pyspy": tool}, [], across_nodes=True)
    out = []
    for f in found:
        f.id = FLEET_ID + f.id[len("ranks.waits"):]
        if f.id == FLEET_ID:
            f.title = f.title.replace("Ranks disagree", "Ranks disagree across nodes", 1)
        out.append(f)
    return out
