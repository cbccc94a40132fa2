"""`zdoctor check` and `zdoctor snapshot` as functions: probe, evaluate, walk playbooks, record."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import __version__
from .checks import run_checks
from .errors import UsageError
from .events import FindingRecorded, ProbeRecorded, Recorder, SummaryRecorded, no_record
from .host import Host
from .model import FAILING, Finding, sort_findings, summarize
from .registry import PROBES, load_vocabulary

if TYPE_CHECKING:
    from .playbook import Playbook



@dataclass
class PlaybookRun:
    """Where a headless walk through one playbook ended."""

    id: str
    title: str
    path: list[str]
    diagnosis: str | None
    reason: str
    diagnosis_title: str = ""
    #: Failing findings the walk met on its way that its end does not name: {id, title, status, node}.
    failing_on_path: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "path": self.path, "diagnosis": self.diagnosis,
                "diagnosis_title": self.diagnosis_title, "reason": self.reason,
                "failing_on_path": self.failing_on_path}


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

    def redacted(self) -> CheckReport:
        """The report as it may be shown or stored: secrets in command lines, environments and outputs
        replaced (see :mod:`zdoctor.redact`); the real command line stays only in memory."""
        from .redact import redact

        findings = [Finding.from_dict(redact(f.to_dict())) for f in self.findings]
        return CheckReport(host=redact(self.host), findings=findings, playbooks=self.playbooks, session=self.session)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": __version__,
            "host": self.host,
            "findings": [f.to_dict() for f in self.findings],
            "summary": self.summary,
            "playbooks": [p.to_dict() for p in self.playbooks],
            "session": self.session,
        }


def select_playbooks(only: list[str] | None = None) -> dict[str, Playbook]:
    """The bundled playbooks to walk: all of them, or the named ones (an unknown id is a UsageError)."""
    from .playbook import load_all

    books = load_all()
    if only is None:
        return books
    unknown = sorted(set(only) - set(books))
    if unknown:
        raise UsageError(f"zdoctor check: unknown playbook(s): {', '.join(unknown)}")
    return {pid: books[pid] for pid in dict.fromkeys(only)}


def walk_playbooks(host: Host, record: Recorder, books: dict[str, Playbook]) -> list[PlaybookRun]:
    """Drive each playbook to its end, headless."""
    from .engine import Walk

    runs: list[PlaybookRun] = []
    for pid, book in books.items():
        result = Walk(book, host, record=record).run()
        diag = book.nodes.get(result.diagnosis) if result.diagnosis else None
        runs.append(PlaybookRun(pid, book.title, list(result.path), result.diagnosis, result.reason,
                                diag.title if diag is not None else "", list(result.failing_on_path)))
    return runs


def check(host: Host, record: Recorder = no_record, playbooks: dict[str, Playbook] | None = None,
          walk: bool = True) -> CheckReport:
    """Run every check against ``host`` (probes run concurrently), record it, and walk the playbooks
    (default: every bundled one; see :func:`select_playbooks`)."""
    books = (select_playbooks() if playbooks is None else playbooks) if walk else {}
    facts, findings = run_checks(host)
    for res in facts.values():
        ProbeRecorded(result=res.to_dict()).record(record)
    merged: dict[str, Finding] = {}
    for f in findings:
        merged.setdefault(f.id, f)
    ordered = sort_findings(list(merged.values()))
    for f in ordered:
        FindingRecorded(finding=f.to_dict()).record(record)
    runs = walk_playbooks(host, record, books)
    report = CheckReport(host=host.info, findings=ordered, playbooks=runs)
    SummaryRecorded(counts=report.summary).record(record)
    return report


def snapshot(host: Host) -> dict[str, Any]:
    """Run every registered probe and return the snapshot document, secrets redacted."""
    from .host import snapshot_document
    from .redact import redact

    load_vocabulary()
    host.results(PROBES)
    return redact(snapshot_document(host))
