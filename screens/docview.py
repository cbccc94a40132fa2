"""The guide's view of the report document: a step's findings (or the first pass's) folded into the same
:class:`~zdoctor.report.reportdoc.ReportDoc` the exports read, and the Rich renderables of its parts — a
finding's line, the symptom ledger, the summary, a piece of evidence, an evidence table, a remedy's trial
state and flags. The screens show these; none formats a finding, a table or a trial state by itself."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rich.table import Table as RichTable
from rich.text import Text

from zdoctor.core.model import Finding, cap_text
from zdoctor.core.plural import count_of
from zdoctor.core.present import (
    NO_SYMPTOMS,
    SUMMARY_ORDER,
    SYMPTOMS_HEADING,
    UNEXPLAINED_WORD,
    VERIFICATION_MARKS,
)
from zdoctor.report.docwriter import OUTPUT_LABELS, STDERR_LABEL
from zdoctor.report.reportdoc import (
    Evidence,
    EvidenceTable,
    FindingItem,
    RemedyItem,
    ReportDoc,
    SymptomItem,
    from_check,
)
from zdoctor.walk.doctor import CheckReport

from .common import HOT, mark

PROBLEMS = ("fail", "warn", "crash")


# --- the document -------------------------------------------------------------------------------

def check_doc(report: CheckReport) -> ReportDoc:
    """The document of a `check` run as it may be shown (redacted), built as `check` builds its own."""
    return from_check(report.redacted())


def step_doc(findings: Iterable[Finding], symptoms: Iterable[Mapping[str, Any]] = (),
             host: Mapping[str, Any] | None = None) -> ReportDoc:
    """The document of one step's findings with the symptom ledger they answer (``host``: the node's info;
    a replayed one says its remedies were tried on the recorded node)."""
    return check_doc(CheckReport(host=dict(host or {}), findings=list(findings),
                                 symptoms=[dict(s) for s in symptoms]))


def shown_host(ctx: Any) -> dict[str, Any]:
    """The host a context's documents name: a practice scenario's evidence came from the recorded node."""
    info = dict(ctx.host.info)
    if getattr(ctx, "practice", False):
        info["kind"] = "replay"
    return info


def finding_item(doc: ReportDoc, finding_id: str) -> FindingItem | None:
    return next((f for f in doc.findings if f.id == finding_id), None)


def remedy_item(doc: ReportDoc, finding: Finding, index: int) -> RemedyItem | None:
    """The document's item for the ``index``-th remedy of ``finding`` (None: the document does not hold it)."""
    item = finding_item(doc, finding.id)
    return item.remedies[index] if item is not None and 0 <= index < len(item.remedies) else None


# --- findings -----------------------------------------------------------------------------------

def finding_line(f: FindingItem) -> Text:
    return Text.assemble(" ", mark(f.status), " ", (f.title, "bold" if f.status in ("fail", "crash") else ""))


def findings_text(findings: Iterable[FindingItem], detail_lines: int = 0, every_detail: bool = False) -> Text:
    """One line per finding, in the document's order; ``detail_lines`` of detail under each failing or
    warning one (under every one with ``every_detail``)."""
    out = Text()
    for f in findings:
        out.append_text(finding_line(f))
        out.append("\n")
        if detail_lines and (every_detail or f.status in PROBLEMS) and f.detail:
            lines = f.detail.splitlines()
            for line in lines[:detail_lines]:
                out.append(f"   {line}\n", style="dim")
            if len(lines) > detail_lines:
                out.append(f"   … {len(lines) - detail_lines} more lines: e shows the evidence\n", style="dim")
    out.rstrip()
    return out


def summary_text(counts: Mapping[str, Any]) -> Text:
    """The count per status (none: ``no findings``)."""
    out = Text()
    for status in SUMMARY_ORDER:
        if counts.get(status):
            if out:
                out.append(" · ")
            out.append_text(mark(status))
            out.append(f" {counts[status]} {status}")
    return out or Text("no findings", style="dim")


# --- the symptom ledger -------------------------------------------------------------------------

def symptoms_text(doc: ReportDoc) -> Text:
    """The symptom ledger in a few lines: each thing the user saw, quoted, and what explains it or UNEXPLAINED."""
    out = Text()
    if not doc.symptoms:
        out.append(f"{SYMPTOMS_HEADING}: {NO_SYMPTOMS}", style="dim")
        return out
    out.append(f"{SYMPTOMS_HEADING}:", style="bold")
    if doc.unexplained:
        out.append(f" {doc.unexplained}", style="bold red")
    for s in doc.symptoms:
        out.append(f"\n  {s.id} ", style="bold")
        out.append(f"({s.place}) ", style="dim")
        out.append(s.text)
        out.append(f"\n      {s.verdict}", style="green" if s.explained_by else "bold red")
    return out


def folded_symptoms(symptoms: list[SymptomItem]) -> Text:
    """The symptom ledger in one line: how many are explained, which are not, and the key that opens it."""
    open_ = [s.id for s in symptoms if not s.explained_by]
    out = Text.assemble((f"{SYMPTOMS_HEADING}: ", "bold"), f"{len(symptoms) - len(open_)} explained")
    if open_:
        out.append(f", {len(open_)} {UNEXPLAINED_WORD} ({', '.join(open_)})", style="bold red")
    out.append(" · s shows them", style="dim")
    return out


# --- evidence -----------------------------------------------------------------------------------

def tables_of(findings: Iterable[FindingItem]) -> list[EvidenceTable]:
    """Every table among the findings' evidence, once each, highlighted tables first, each in the findings'
    order."""
    seen: dict[str, EvidenceTable] = {}
    for f in findings:
        for e in f.evidence:
            if e.table is not None:
                seen.setdefault(e.table.id, e.table)
    return sorted(seen.values(), key=lambda t: 0 if t.highlight else 1)


def padded(table: EvidenceTable) -> list[list[str]]:
    """The table's rows, each cut or padded to its columns."""
    width = len(table.columns)
    return [row[:width] + [""] * (width - len(row)) for row in table.rows]


def rich_table(table: EvidenceTable, only_hot: bool = False, title: str | None = None) -> RichTable:
    """A side-by-side evidence table; highlighted rows carry ⚠ and bold (colour is optional)."""
    grid = RichTable(title=title, title_justify="left", expand=False, show_lines=False, pad_edge=False)
    grid.add_column("", no_wrap=True, width=1)
    for col in table.columns:
        grid.add_column(col, overflow="fold")
    for i, cells in enumerate(padded(table)):
        hot = i in table.highlight
        if only_hot and not hot:
            continue
        grid.add_row(HOT if hot else "", *cells, style="bold red" if hot else None)
    return grid


def evidence_key(e: Evidence) -> tuple[Any, ...]:
    """A piece of evidence as shown: the same one under several findings is shown once."""
    return (e.label, e.kind, e.command, len(e.stdout), len(e.stderr), e.table is not None)


def evidence_text(e: Evidence, cap: int = 3000) -> Text:
    """A command, file or note as plain text (the output cut to ``cap`` characters, head and tail)."""
    out = Text()
    out.append(e.label, style="bold")
    out.append(f"  ({e.kind})\n", style="dim")
    if e.command:
        out.append(e.command + "\n", style="bold")
    if e.has_exit:
        out.append(f"exit code {e.exit_code}\n", style="red" if e.exit_code else "dim")
    if e.paths:
        out.append("files: " + ", ".join(e.paths) + "\n", style="dim")
    if e.error:
        out.append(f"error: {e.error}\n", style="red")
    for label, body in ((OUTPUT_LABELS.get(e.kind, "Output"), e.stdout), (STDERR_LABEL, e.stderr)):
        if body:
            head_tail, cut = cap_text(body, cap)
            out.append(f"{label}{' (cut; the JSON export has all of it)' if cut else ''}:\n", style="dim")
            out.append(head_tail.rstrip("\n") + "\n")
    out.rstrip()
    return out


# --- remedies -----------------------------------------------------------------------------------

def trial_mark(rem: RemedyItem) -> tuple[str, str]:
    """``(mark, style)`` of a remedy's trial state."""
    return VERIFICATION_MARKS.get(rem.verification, ("?", ""))


def trial_text(rem: RemedyItem) -> Text:
    """The remedy's trial state with its mark, in the document's words (``tried: fixed`` …)."""
    sym, style = trial_mark(rem)
    return Text(f"{sym} {rem.trial}", style=style)


def flags_text(rem: RemedyItem) -> Text:
    """The trial state, whether it needs root, its undo, and each tool it needs that the node lacks."""
    out = trial_text(rem)
    out.append("\n")
    out.append("needs root: " + ("yes (runs under sudo unless you are root)" if rem.requires_root else "no"))
    out.append("\n")
    undo = f"{count_of(len(rem.undo), 'line')}, below" if rem.undo else "none recorded"
    out.append("undo: " + undo, style="" if rem.undo else "dim")
    for said in rem.missing:
        out.append(f"\n✗ {said}", style="bold red")
    return out

