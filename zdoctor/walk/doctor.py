"""`zdoctor check` and `zdoctor snapshot` as functions: probe, evaluate, walk playbooks, record."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zdoctor import __version__
from zdoctor.core.answers import WalkEnd, with_answers
from zdoctor.core.errors import UsageError
from zdoctor.core.model import Finding, sort_findings, summarize
from zdoctor.core.nodelayers import layer_status
from zdoctor.core.plural import noun_for
from zdoctor.core.redact import redact
from zdoctor.core.registry import CHECKS, PROBES, load_vocabulary, owner_check
from zdoctor.core.symptom import EXPLAINING
from zdoctor.core.verdicts import FAILING
from zdoctor.host import Host, snapshot_document
from zdoctor.layers import run_checks
from zdoctor.proc.target import target_of
from zdoctor.walk.engine import Walk
from zdoctor.walk.events import FindingRecorded, ProbeRecorded, Recorder, SummaryRecorded, no_record
from zdoctor.walk.ledger import assess, linked
from zdoctor.walk.playbook import load_all

if TYPE_CHECKING:
    from zdoctor.walk.playbook import Playbook



@dataclass
class PlaybookRun:
    """Where a headless walk through one playbook ended."""

    id: str
    title: str
    path: list[str]
    diagnosis: str | None
    reason: str
    diagnosis_title: str = ""
    #: A healthy end's scope: what it examined and what it did not (empty for any other end).
    examined: list[str] = field(default_factory=list)
    not_examined: list[str] = field(default_factory=list)
    healthy: bool = False
    #: Failing findings the walk met on its way that its end does not name: {id, title, status, node}.
    failing_on_path: list[dict[str, str]] = field(default_factory=list)
    #: The ids of the findings stating a problem that the walk met, and of those among them its end names.
    met: list[str] = field(default_factory=list)
    named: list[str] = field(default_factory=list)

    def end(self) -> WalkEnd:
        """How the walk ended, for :func:`zdoctor.core.answers.answering_walk`."""
        return WalkEnd(self.id, self.title, self.diagnosis, self.diagnosis_title, tuple(self.met), tuple(self.named))

    def to_dict(self) -> dict[str, Any]:
        out = {"id": self.id, "title": self.title, "path": self.path, "diagnosis": self.diagnosis,
               "diagnosis_title": self.diagnosis_title, "reason": self.reason, "healthy": self.healthy,
               "failing_on_path": self.failing_on_path}
        if self.healthy:
            out["examined"] = list(self.examined)
            out["not_examined"] = list(self.not_examined)
        return out


#: The findings that say the training environment could not be examined (its interpreter, its torch).
ENVIRONMENT_FINDINGS = ("pyenv.",)


@dataclass
class CheckReport:
    """Everything `zdoctor check` says, ready for the terminal or for JSON."""

    host: dict[str, Any]
    findings: list[Finding]
    playbooks: list[PlaybookRun] = field(default_factory=list)
    session: str | None = None
    #: The symptom ledger: each symptom with the findings that explain it (``explained_by`` empty: unexplained).
    symptoms: list[dict[str, Any]] = field(default_factory=list)
    #: Why the training environment itself could not be examined (exit 3), or None.
    incomplete: str | None = None
    #: Each layer of the node, examined or not and why (see :mod:`zdoctor.core.nodelayers`).
    layers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def summary(self) -> dict[str, int]:
        return summarize(self.findings)

    @property
    def unexplained(self) -> list[dict[str, Any]]:
        return [s for s in self.symptoms if not s.get("explained_by")]

    @property
    def exit_code(self) -> int:
        """1 for a failing finding or an unexplained symptom; 3 instead when the training environment itself
        could not be examined and nothing but that (the interpreter's own findings) failed; else 0."""
        failing = [f for f in self.findings if f.status in FAILING]
        if self.incomplete is not None and not self.unexplained and all(f.id.startswith(ENVIRONMENT_FINDINGS)
                                                                        for f in failing):
            return 3
        return 1 if self.unexplained or failing else 0

    def redacted(self) -> CheckReport:
        """The report as it may be shown or stored: secrets in command lines, environments and outputs
        replaced (see :mod:`zdoctor.core.redact`); the real command line stays only in memory."""

        findings = [Finding.from_dict(redact(f.to_dict())) for f in self.findings]
        return CheckReport(host=redact(self.host), findings=findings, playbooks=self.playbooks, session=self.session,
                           symptoms=redact(self.symptoms), incomplete=self.incomplete, layers=redact(self.layers))

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": __version__,
            "host": self.host,
            "symptoms": [dict(s) for s in self.symptoms],
            "findings": [f.to_dict() for f in self.findings],
            "summary": self.summary,
            "playbooks": [p.to_dict() for p in self.playbooks],
            "session": self.session,
            "incomplete": self.incomplete,
            "layers": [dict(layer) for layer in self.layers],
            "exit_code": self.exit_code,
        }


def select_playbooks(only: list[str] | None = None) -> dict[str, Playbook]:
    """The bundled playbooks to walk: all of them, or the named ones (an unknown id is a UsageError)."""

    books = load_all()
    if only is None:
        return books
    unknown = sorted(set(only) - set(books))
    if unknown:
        raise UsageError(f"zdoctor check: unknown {noun_for(len(unknown), 'playbook')}: {', '.join(unknown)}")
    return {pid: books[pid] for pid in dict.fromkeys(only)}


def walk_playbooks(host: Host, record: Recorder | None, books: dict[str, Playbook]) -> list[PlaybookRun]:
    """Drive each playbook to its end, headless (recording each step where ``record`` is given)."""

    runs: list[PlaybookRun] = []
    for pid, book in books.items():
        result = Walk(book, host, record=record).run()
        problems = {f.id for f in result.findings if f.status in EXPLAINING}
        diag = book.nodes.get(result.diagnosis) if result.diagnosis else None
        healthy = diag is not None and diag.healthy and result.stopped is None
        runs.append(PlaybookRun(pid, book.title, list(result.path), result.diagnosis, result.reason,
                                diag.title if diag is not None else "",
                                examined=list(diag.examined) if healthy and diag else [],
                                not_examined=list(diag.not_examined) if healthy and diag else [], healthy=healthy,
                                failing_on_path=list(result.failing_on_path),
                                met=[f.id for f in result.findings if f.status in EXPLAINING],
                                named=[fid for fid in result.named if fid in problems]))
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
    entries, unexplained = assess(facts, list(merged.values()))
    for f in unexplained:
        merged.setdefault(f.id, f)
    ledger = [e.to_dict() for e in entries]
    ordered = sort_findings(linked(merged.values(), entries), ledger)
    for f in ordered:
        FindingRecorded(finding=f.to_dict()).record(record)
    runs = walk_playbooks(host, record, books)
    report = CheckReport(host=host.info, findings=ordered, playbooks=runs,
                         symptoms=with_answers(ledger, [r.end() for r in runs]),
                         incomplete=incomplete_reason(facts, target_of(host).command, target_of(host).ext),
                         layers=layers_examined(ordered))
    SummaryRecorded(counts=report.summary).record(record)
    return report


def layers_examined(findings: list[Finding]) -> list[dict[str, Any]]:
    """Each layer of the node with whether this run's findings show it examined (:func:`layers.layer_status`)."""

    return layer_status({name: spec.layer for name, spec in CHECKS.items() if spec.layer}, findings,
                        lambda fid: owner_check(fid, CHECKS))


def incomplete_reason(facts: Any, command: str | None = None, ext: Any = ()) -> str | None:
    """Why the training environment itself could not be examined, or None when it was. With a ``--command``
    the command is the training: incomplete only when it could not be run; with ``--ext`` the extensions the
    training imports were loaded and read. Without either, the training interpreter is examined: its probe
    crashed or timed out, it is not usable, or it has no torch."""
    if command or ext:
        live = facts.get("livetrace") if hasattr(facts, "get") else None
        if live is not None and live.status in ("crash", "timeout"):
            return f"the --command run could not be traced: {live.error or live.status}"
        return None
    res = facts.get("pyenv") if hasattr(facts, "get") else None
    if res is None:
        return None
    if res.status in ("crash", "timeout"):
        return f"the training interpreter's probe {'crashed' if res.status == 'crash' else 'timed out'}: " \
               f"{res.error or 'no answer'}"
    if res.status != "ok":
        return f"the training interpreter was not probed: {res.error or (res.facts or {}).get('skipped') or res.status}"
    py = res.facts or {}
    error = py.get("error")
    if error:
        return f"the training interpreter could not be probed: {error}"
    torch = py.get("torch")
    if isinstance(torch, dict) and torch.get("installed") is False:
        target = (py.get("target") or {}).get("resolved") or "the probed interpreter"
        return f"torch is not installed in {target}: name the training interpreter with --python"
    return None


def snapshot(host: Host) -> dict[str, Any]:
    """Run every registered probe and return the snapshot document, secrets redacted."""

    load_vocabulary()
    host.results(PROBES)
    return redact(snapshot_document(host))
