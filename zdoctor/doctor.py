"""`zdoctor check` and `zdoctor snapshot` as functions: probe, evaluate, walk playbooks, record."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import __version__
from .checks import run_checks
from .host import Host
from .model import FAILING, Finding, sort_findings, summarize
from .registry import PROBES, load_vocabulary

Recorder = Callable[[str, dict[str, Any]], None]


def _no_record(_type: str, _data: dict[str, Any]) -> None:
    return None


@dataclass
class PlaybookRun:
    """Where a headless walk through one playbook ended."""

    id: str
    title: str
    path: list[str]
    diagnosis: str | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "path": self.path, "diagnosis": self.diagnosis,
                "reason": self.reason}


@dataclass
class CheckReport:
    """Everything `zdoctor check` says, ready for the terminal or for JSON."""

    host: dict[str, Any]
    findings: list[Finding]
    playbooks: list[PlaybookRun] = field(default_factory=list)
    session: str | None = None

    @property
    def summary(self) -> dict[str, int]:
        return summarize(self.findings)

    @property
    def exit_code(self) -> int:
        return 1 if any(f.status in FAILING for f in self.findings) else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": __version__,
            "host": self.host,
            "findings": [f.to_dict() for f in self.findings],
            "summary": self.summary,
            "playbooks": [p.to_dict() for p in self.playbooks],
            "session": self.session,
        }


def walk_playbooks(host: Host, record: Recorder, only: list[str] | None = None) -> list[PlaybookRun]:
    """Drive every bundled playbook (or the named ones) to its end, headless."""
    from .engine import Walk
    from .playbook import load_all

    books = load_all()
    runs: list[PlaybookRun] = []
    for pid in only if only is not None else sorted(books):
        book = books[pid]
        result = Walk(book, host, record=record).run()
        runs.append(PlaybookRun(pid, book.title, list(result.path), result.diagnosis, result.reason))
    return runs


def check(host: Host, record: Recorder = _no_record, playbooks: list[str] | None = None,
          walk: bool = True) -> CheckReport:
    """Run every check against ``host`` (probes run concurrently), record it, and walk the playbooks."""
    facts, findings = run_checks(host)
    for res in facts.values():
        record("probe_result", {"result": res.to_dict()})
    merged: dict[str, Finding] = {}
    for f in findings:
        merged.setdefault(f.id, f)
    ordered = sort_findings(list(merged.values()))
    for f in ordered:
        record("finding", {"finding": f.to_dict()})
    runs = walk_playbooks(host, record, playbooks) if walk else []
    report = CheckReport(host=host.info, findings=ordered, playbooks=runs)
    record("summary", report.summary)
    return report


def snapshot(host: Host) -> dict[str, Any]:
    """Run every registered probe and return the snapshot document, secrets redacted."""
    from .host import snapshot_document
    from .redact import redact

    load_vocabulary()
    host.results(PROBES)
    return redact(snapshot_document(host))
