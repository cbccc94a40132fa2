"""A fleet run in the session log: every node's raw result (snapshot included), then the evaluation.

Events: ``fleet_start`` (launcher, source, hosts, the remote command), one ``fleet_node`` per node,
one ``finding`` per fleet-level or failing node finding (ids carry ``@host``), ``fleet_result`` (the
report without snapshots) and ``summary``. :func:`runs_from_events` reads the nodes back for a replay.
"""

from __future__ import annotations

from typing import Any

from zdoctor.core.errors import InputError
from zdoctor.core.model import summarize
from zdoctor.fleet.collect import NodeRun
from zdoctor.fleet.result import FleetReport
from zdoctor.walk.events import FindingRecorded, FleetResult, Recorder, SummaryRecorded


def record_report(report: FleetReport, record: Recorder) -> None:
    """Findings worth a ticket, the report, and the counts."""
    shown = list(report.fleet_findings)
    for node in report.nodes:
        for f in node.findings:
            if f.status in ("fail", "crash", "warn"):
                d = f.to_dict()
                if not f.id.startswith("fleet.node."):
                    d["title"] = f"{node.host}: {f.title}"
                d["id"] = f"{f.id}@{node.host}"
                FindingRecorded(finding=d, node=node.host).record(record)
    for f in shown:
        FindingRecorded(finding=f.to_dict()).record(record)
    FleetResult(report=report.to_dict()).record(record)
    counts = summarize(shown + [f for n in report.nodes for f in n.findings if f.status in ("fail", "crash", "warn")])
    SummaryRecorded(counts=counts).record(record)


def runs_from_events(events: list[dict[str, Any]], source: str) -> tuple[list[NodeRun], str, str,
                                                                       dict[str, int | None]]:
    """The node results, launcher, host source and hostfile slots of the fleet run recorded in ``events``."""
    start = next((e for e in events if isinstance(e, dict) and e.get("type") == "fleet_start"), None)
    if start is None:
        raise InputError(f"{source}: not a fleet session (no fleet_start event)")
    runs: dict[str, NodeRun] = {}
    for ev in events:
        if isinstance(ev, dict) and ev.get("type") == "fleet_node":
            try:
                node = NodeRun.from_dict(ev.get("node"))
            except (ValueError, TypeError) as exc:
                raise InputError(f"{source}: event {ev.get('seq', '?')}: {exc}") from None
            runs[node.host] = node
    hosts = [h for h in start.get("hosts") or [] if isinstance(h, str)]
    order = [h for h in hosts if h in runs] + [h for h in runs if h not in hosts]
    if not order:
        raise InputError(f"{source}: the fleet session recorded no node")
    raw = start.get("slots") if isinstance(start.get("slots"), dict) else {}
    slots = {str(h): v for h, v in raw.items() if isinstance(v, int) and not isinstance(v, bool)}
    return ([runs[h] for h in order], str(start.get("launcher") or "?"), str(start.get("source") or "?"),
            slots)
