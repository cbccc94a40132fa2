"""The one walk over a report document for the exports: :func:`write_document` says what comes in what order,
once, and a small per-format :class:`Writer` (Markdown in :mod:`zdoctor.report.export`, HTML in
:mod:`zdoctor.report.htmlreport`) says how each piece looks. A section is written here once for every format.

Inline methods return text in the writer's format (escaped); block methods add to the document. An evidence
table is written in full at its first use and referred to wherever it is used again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from zdoctor.core.present import (
    ALSO_FOUND,
    FROM_THE_SOURCE,
    NO_SYMPTOMS,
    STOPS_NOTE,
    SYMPTOMS_HEADING,
    mark,
    pasted_script,
    script_label,
    undo_label,
    written_text,
)
from zdoctor.report.reportdoc import TORN_NOTE

if TYPE_CHECKING:
    from zdoctor.report.reportdoc import AppliedFix, Evidence, FindingItem, RemedyItem, ReportDoc, WalkRun

#: The label of a block of captured text, by the kind of its evidence.
OUTPUT_LABELS = {"file": "Content", "traceback": "Traceback", "note": "Note"}
#: The label of the text a command wrote to its standard error.
STDERR_LABEL = "Errors (stderr)"


class Writer(Protocol):
    """How one format draws the pieces of a report."""

    #: The path of a walk as a line of its own, and the diagnosis's node beside its title (a format whose
    #: step headings carry them leaves both out).
    spells_path: bool
    #: A path section that says no playbook was walked, rather than no section.
    shows_empty_path: bool

    # inline
    def text(self, text: str) -> str: ...
    def code(self, text: str) -> str: ...
    def strong(self, inline: str) -> str: ...
    def aside(self, text: str) -> str: ...
    def mark(self, symbol: str, status: str) -> str: ...
    def status_text(self, text: str, status: str, emphasis: bool) -> str: ...
    def link(self, inline: str, anchor: str) -> str: ...
    def exit_code(self, code: object, duration_s: float | None) -> str: ...

    # blocks
    def heading(self, level: int, inline: str, anchor: str = "") -> None: ...
    def label(self, level: int, inline: str, note: str, apart: bool = False) -> None: ...
    def para(self, inline: str, cls: str = "", anchor: str = "") -> None: ...
    def prose(self, text: str, breaks: bool = True, cls: str = "") -> None: ...
    def note(self, text: str) -> None: ...
    def items(self, items: list[tuple[str, str]], tight: bool = False) -> None: ...
    def meta(self, rows: list[tuple[str, list[tuple[str, bool]]]]) -> None: ...
    def table(self, columns: list[str], rows: list[list[str]], highlight: list[int]) -> None: ...
    def grid(self, columns: list[str], rows: list[list[str]]) -> None: ...
    def output(self, label: str, text: str, quote: bool = False) -> None: ...
    def script(self, label: str, commands: list[str]) -> None: ...
    def step(self, number: int, inline: str, anchor: str) -> None: ...
    def edge(self, number: int, inline: str) -> None: ...
    def steps_end(self, any_steps: bool) -> None: ...
    def summary(self, doc: ReportDoc) -> None: ...
    def open_section(self, anchor: str, title: str) -> None: ...
    def close_section(self) -> None: ...
    def open_group(self, anchor: str, cls: str) -> None: ...
    def close_group(self) -> None: ...


def write_document(doc: ReportDoc, w: Writer) -> None:
    """Write every section of ``doc`` through ``w``, in the one order of every export."""
    w.heading(1, w.text("zdoctor session ") + w.code(doc.session_id or "unknown"))
    w.meta(doc.meta)
    if doc.torn:
        w.note(TORN_NOTE)
    write_symptoms(doc, w)
    w.summary(doc)
    if doc.fleet is not None:
        w.open_section("fleet", "Fleet")
        w.prose(doc.fleet.line, breaks=False)
        for title, columns, rows, hot in doc.fleet.tables:
            w.label(3, w.text(title), "")
            w.table(columns, rows, hot)
        w.close_section()
    if doc.runs or w.shows_empty_path:
        w.open_section("path", "Path through the playbooks")
        for run in doc.runs:
            write_run(run, w)
        if not doc.runs:
            w.para(w.text("No playbook was walked."), cls="muted")
        w.close_section()
    w.open_section("findings", "Findings")
    if not doc.findings:
        w.para(w.text("No findings were recorded."), cls="muted")
    referenced = doc.referenced()
    for f in doc.answers:
        write_finding(f, w, referenced)
    if doc.symptoms and doc.rest:  # what explains the symptoms first, the rest under its own heading
        w.close_section()
        w.open_section("also-found", ALSO_FOUND)
    for f in doc.rest:
        write_finding(f, w, referenced)
    w.close_section()
    w.open_section("applied", doc.applied_heading)
    if not doc.applied:
        w.para(w.text("Nothing was applied in this session."), cls="muted")
    for fix in doc.applied:
        write_applied(fix, w)
    w.close_section()
    if doc.probes:
        w.open_section("probes", "Probes")
        w.grid(["Probe", "Status", "Time", "Step", "Error"],
               [[p.probe, p.status, p.time, p.step, p.error] for p in doc.probes])
        w.close_section()
    if doc.others:
        w.open_section("other", "Other events")
        w.items([("#" + w.text(o.seq) + " " + w.code(o.type) + " at " + w.text(o.when) + ": " + w.code(o.body), "")
                 for o in doc.others])
        w.close_section()


def write_symptoms(doc: ReportDoc, w: Writer) -> None:
    """The symptom ledger, first: each thing the user saw, quoted, and what explains it or UNEXPLAINED."""
    w.open_section("symptoms", SYMPTOMS_HEADING)
    if not doc.symptoms:
        w.prose(NO_SYMPTOMS.capitalize() + ".", breaks=False, cls="muted")
    else:
        if doc.unexplained:
            w.para(w.strong(w.text(doc.unexplained + ".")), cls="fail")
        w.items([(w.strong(w.text(s.id)) + " (" + w.text(s.place) + "): " + w.code(s.text) + " — "
                  + w.status_text(s.verdict, "ok" if s.explained_by else "fail", not s.explained_by)
                  + (f"; {w.text(s.answer)}" if s.answer else "")
                  + (f"; {w.text(FROM_THE_SOURCE)}: {w.text(s.origin)}" if s.origin else ""), "")
                 for s in doc.symptoms])
    w.close_section()


def write_run(run: WalkRun, w: Writer) -> None:
    """One walk: its steps and the edges taken, its diagnosis and why it ended there."""
    w.heading(3, w.text("Playbook ") + w.code(run.playbook or "unnamed")
              + (": " + w.text(run.title) if run.title else ""), run.anchor)
    if w.spells_path and run.path:
        w.para("Path: " + " → ".join(w.code(p) for p in run.path))
    for step in run.steps:
        if step.edge:
            w.edge(step.number, "→ " + w.code(step.to) + " from " + w.code(step.origin) + ": " + w.text(step.why))
        else:
            w.step(step.number, w.code(step.node) + (" " + w.aside(step.kind) if step.kind else "")
                   + (": " + w.text(step.title) if step.title else ""), step.anchor)
    w.steps_end(bool(run.steps))
    if run.diagnosis_title:
        node = f" (node {w.code(run.diagnosis)})" if w.spells_path and run.diagnosis else ""
        w.para(w.strong(w.text("Diagnosis:")) + " " + w.text(run.diagnosis_title) + node)
    if run.reason:
        w.para(w.strong(w.text("Why:")) + " " + w.text(run.reason))
    if run.open_note:
        w.para(w.text(run.open_note), cls="muted")


def write_finding(f: FindingItem, w: Writer, referenced: set[str]) -> None:
    """One finding: its verdict, detail, evidence and remedies."""
    w.open_group(f.anchor, "finding")
    w.heading(3, w.mark(mark(f.status), f.status) + " " + w.text(f"{f.status.upper()}: {f.title}"))
    w.para(w.text("Finding ") + w.code(f.id), cls="muted")
    if f.detail:
        w.prose(f.detail)
    if f.evidence:
        w.heading(4, w.text("Evidence"))
        for ev in f.evidence:
            write_evidence(ev, w, referenced)
    if f.remedies:
        w.heading(4, w.text(f.options_heading))
        if f.recommendation:
            w.para(w.text(f.recommendation))
        for rem in f.remedies:
            write_remedy(rem, w)
    w.close_group()


def write_evidence(ev: Evidence, w: Writer, referenced: set[str]) -> None:
    """One piece of evidence; its table in full where the document first shows it (with the anchor the later
    uses in ``referenced`` point to), else a reference to it."""
    w.label(5, w.text(ev.label), ev.kind)
    facts = []
    if ev.command:
        facts.append((w.text("Command: ") + w.code(ev.command), ""))
    if ev.has_exit:
        facts.append((w.text("Exit code: ") + w.exit_code(ev.exit_code, ev.duration_s), ""))
    if ev.paths:
        facts.append((w.text("Files: ") + ", ".join(w.code(p) for p in ev.paths), ""))
    if ev.error:
        facts.append((w.text("Error: ") + w.text(ev.error), "fail"))
    if ev.truncated:
        facts.append((w.text("The output was cut when it was captured."), ""))
    if facts:
        w.items(facts, tight=True)
    table = ev.table
    if table is not None:
        if not ev.table_first:
            w.para(w.text(f"The “{table.label}” table: see ") + w.link(w.text(f"Evidence {table.id}"), table.anchor)
                   + w.text(" (shown in full above)."), cls="muted")
        else:
            if table.id in referenced:
                w.para(w.text(f"Evidence {table.id}:"), cls="muted", anchor=table.anchor)
            w.table(table.columns, table.rows, table.highlight)
    if ev.stdout:
        w.output(OUTPUT_LABELS.get(ev.kind, "Output"), ev.stdout, quote=ev.kind == "note")
    if ev.stderr:
        w.output(STDERR_LABEL, ev.stderr)


def write_remedy(rem: RemedyItem, w: Writer) -> None:
    """One remedy: its label, trial state and flags, what comes first, why, its script and its undo."""
    w.label(5, w.text(f"{rem.label}: {rem.title or 'Remedy'}"), "; ".join(rem.flags), apart=True)
    if rem.first:
        w.para(w.strong(w.text(rem.first)))
    if rem.explanation:
        w.prose(rem.explanation, breaks=False)
    if rem.commands:
        w.script(script_label(rem.commands), pasted_script(rem.commands))
    if rem.undo:
        w.script(undo_label(rem.undo), pasted_script(rem.undo))


def write_applied(fix: AppliedFix, w: Writer) -> None:
    """What was done with one remedy, the commands it ran and what they printed."""
    w.heading(3, w.mark(fix.mark, fix.status) + " " + w.text(f"{fix.title} ({fix.outcome})"))
    facts = [(w.text("For finding ") + w.code(fix.finding_id) + w.text(f", at {fix.when}"), "")]
    if fix.ran:
        facts.append((w.text("Exit code: ") + w.exit_code(fix.exit_code, None), ""))
    if fix.env_file:
        facts.append((w.text("Environment changes ") + written_text(w.code(fix.env_file)), ""))
    if fix.changed:
        facts.append((w.text("Changed: ") + ", ".join(w.code(p) for p in fix.changed), ""))
    if fix.backup:
        facts.append((w.text("Backup: ") + w.code(fix.backup), ""))
    w.items(facts)
    if fix.commands:
        w.script(f"Commands ({STOPS_NOTE})" if len(fix.commands) > 1 else "Commands", pasted_script(fix.commands))
    if fix.undo:
        w.script(undo_label(fix.undo), pasted_script(fix.undo))
    if fix.output:
        w.output("Output", fix.output)
