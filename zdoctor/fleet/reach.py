"""Whether every node's NCCL interface reaches every other node's NCCL address, judged from the facts each
node recorded (its interfaces, the interface NCCL chooses, its main routing tables); no traffic is sent.

Node A reaches node B's address when the route A's kernel would pick for it (longest prefix, then metric, of
A's main tables) leaves through the interface NCCL uses on A. A route through another interface, or none, is
the hang in the bootstrap (or the 'Connect to ... failed') a multi-node job meets first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from zdoctor.core.model import Evidence, Finding
from zdoctor.core.plural import count_of
from zdoctor.layers.nccl_network.ncclnet import route_for

FINDING = "fleet.nccl-reach"


def nccl_facts(snapshot: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The ``nccl_net`` facts of a node's snapshot (None when it has none)."""
    rec = ((snapshot or {}).get("probes") or {}).get("nccl_net")
    if not isinstance(rec, Mapping) or rec.get("status") != "ok" or not isinstance(rec.get("facts"), Mapping):
        return None
    facts = dict(rec["facts"])
    return None if facts.get("skipped") else facts


def chosen(facts: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The interface NCCL bootstraps on, per the node's facts: ``{ifname, address, prefixlen, family}``."""
    items = ((facts or {}).get("choice") or {}).get("chosen") or []
    return dict(items[0]) if items and isinstance(items[0], Mapping) else None


def reach_finding(nodes: Sequence[tuple[str, Mapping[str, Any] | None]]) -> Finding:
    """One finding over every ordered pair of nodes that recorded NCCL's network facts."""
    have = [(h, f) for h, f in nodes if f is not None]
    missing = [h for h, f in nodes if f is None]
    if len(have) < 2:
        why = ("fewer than two nodes recorded NCCL's network facts"
               + (f" (none from {', '.join(missing)})" if missing else ""))
        return Finding(id=FINDING, status="skip", title="NCCL's interfaces across nodes: not checked", detail=why)
    rows: list[list[str]] = []
    hl: list[int] = []
    bad: list[str] = []
    for a, fa in have:
        mine = chosen(fa)
        for b, fb in have:
            if a == b:
                continue
            theirs = chosen(fb)
            if mine is None or theirs is None:
                verdict = f"{a if mine is None else b} has no interface NCCL can use"
                route = None
            else:
                route = route_for(fa.get("routes") or [], theirs["address"])
                if route is None:
                    verdict = f"{a} has no route to {theirs['address']}"
                elif route.get("dev") != mine["ifname"]:
                    verdict = f"{a} routes it through {route.get('dev')}, not {mine['ifname']}"
                else:
                    verdict = "reaches"
            if verdict != "reaches":
                hl.append(len(rows))
                bad.append(f"{a} -> {b}: {verdict}")
            rows.append([a, mine["ifname"] if mine else "(none)", b, theirs["address"] if theirs else "(none)",
                         (route or {}).get("dev") or "-", (route or {}).get("dst") or "-", verdict])
    ev = [Evidence.of_table("NCCL's interface on each node against every other node's NCCL address",
                            ["from", "NCCL interface", "to", "their NCCL address", "route via", "route", "verdict"],
                            rows, hl)]
    tail = [f"Not examined: {', '.join(missing)} (no NCCL network facts recorded)."] if missing else []
    if not bad:
        return Finding(id=FINDING, status="ok",
                       title=f"Every node's NCCL interface routes to the other {count_of(len(have) - 1, 'node')}",
                       detail="\n".join(["Judged from each node's routing table; no traffic sent.", *tail]),
                       evidence=ev)
    return Finding(id=FINDING, status="fail",
                   title=f"NCCL's interfaces do not reach each other on {count_of(len(bad), 'path')}",
                   detail="\n".join([*bad[:20], "Ranks bootstrap and exchange data on these interfaces: a path that "
                                     "leaves through another interface (or none) hangs the bootstrap or fails with "
                                     "'Connect to ... failed'. Set NCCL_SOCKET_IFNAME on every node to the "
                                     "interface whose network the other nodes' addresses are in.", *tail]),
                   evidence=ev)
