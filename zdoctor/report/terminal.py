"""The terminal report of `zdoctor check`: a mark and one line per finding, remedies, a final count."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TextIO

from zdoctor.core.model import visible_controls

if TYPE_CHECKING:
    from zdoctor.report.reportdoc import FindingItem, RemedyItem, ReportDoc
    from zdoctor.walk.doctor import CheckReport

from zdoctor.core.present import (
    ALSO_FOUND,
    ASCII_MARKS,
    FROM_THE_SOURCE,
    MARKS,
    NO_SYMPTOMS,
    STYLES,
    SYMPTOMS_HEADING,
    layer_lines,
    pasted_script,
    scope_lines,
    summary_parts,
)
from zdoctor.report.console import report_console
from zdoctor.report.reportdoc import ReportDoc, from_check


def inert(text: object) -> str:
    """Text from the machine as rich markup that prints literally: control characters made visible,
    markup escaped."""
    from rich.markup import escape

    return escape(visible_controls(str(text)))


def check_json(doc: ReportDoc) -> str:
    """`check --json`: the run's record as the document carries it (see :meth:`CheckReport.to_dict`)."""
    import json

    return json.dumps(doc.data, indent=2) + "\n"


def _marks_for(stream: TextIO) -> dict[str, str]:
    """Unicode marks where the stream can encode them, ASCII otherwise."""
    enc = getattr(stream, "encoding", None) or "ascii"
    try:
        "".join(MARKS.values()).encode(enc)
    except (UnicodeEncodeError, LookupError):
        return ASCII_MARKS
    return MARKS


def print_report(report: CheckReport | ReportDoc, stream: TextIO | None = None, verbose: bool = False) -> None:
    """Render ``report`` (its document: see :func:`zdoctor.report.reportdoc.from_check`) for a person; honours NO_COLOR
    and plain (non-tty) output through rich."""
    doc = report if isinstance(report, ReportDoc) else from_check(report)
    stream = stream or sys.stdout
    console = report_console(stream)
    marks = _marks_for(stream)
    host = doc.host
    where = host.get("hostname", "?")
    if host.get("kind") == "replay":
        where += f" (replayed from {host.get('source', '?')})"
    console.print(f"[bold]zdoctor check[/] on {inert(where)} — {inert(str(host.get('os', '')))}")
    _print_symptoms(console, doc)
    for f in doc.answers:
        _print_finding(console, f, marks, verbose)
    if doc.symptoms and doc.rest:  # what explains the symptoms above, then the rest under its own heading
        console.print(f"[bold]{ALSO_FOUND}:[/]")
    for f in doc.rest:
        _print_finding(console, f, marks, verbose)
    for run in doc.runs:
        # The diagnosis in words (its node id after it, for the JSON and the playbook files).
        if run.diagnosis:
            end = f"{run.diagnosis_title} ({run.diagnosis})" if run.diagnosis_title else run.diagnosis
        else:
            end = f"no diagnosis: {run.reason}" if run.reason else "no diagnosis"
        console.print(f"[dim]  playbook {inert(run.playbook)}: {inert(' -> '.join(run.path))} => "
                      f"{inert(end)}[/]")
        if run.healthy:
            for line in scope_lines(run.examined, run.not_examined):
                console.print(f"[dim]      {inert(line)}[/]")
        for x in run.failing_on_path:
            console.print(f"    also failing on the way (step {inert(x['node'])}): {inert(x['title'])} "
                          f"[dim]({inert(x['id'])})[/]")
    for line in layer_lines(doc.layers, verbose=verbose):
        console.print(f"[dim]{inert(line)}[/]")
    s = doc.counts
    if doc.unexplained:
        console.print(f"[bold red]{inert(doc.unexplained)}[/]")
    if doc.incomplete:
        console.print(f"[bold yellow]Incomplete: {inert(doc.incomplete)}[/]")
    parts = [text for text, _status in summary_parts(s, marks=False, skip_zero=True)]
    console.print(f"[bold]{s['total']} findings:[/] " + ", ".join(parts))
    if doc.session_id:
        console.print(f"[dim]session {doc.session_id} — `zdoctor export --last --format md` for a ticket[/]")


def _print_finding(console: Any, f: FindingItem, marks: dict[str, str], verbose: bool) -> None:
    """One finding: its mark and title, the detail of a problem, the remedies of a failure."""
    console.print(f"[{STYLES[f.status]}]{marks[f.status]:>3}[/] {inert(f.title)}  [dim]({inert(f.id)})[/]")
    if f.detail and (f.status in ("fail", "crash", "warn") or verbose):
        for line in f.detail.splitlines():
            console.print(f"      {inert(line)}", style="dim" if f.status == "warn" else None)
    if f.status in ("fail", "crash") or (verbose and f.remedies):
        _print_remedies(console, f)


def _print_symptoms(console: Any, doc: ReportDoc) -> None:
    """The symptom ledger first: each thing the user saw, quoted, with what explains it or UNEXPLAINED."""
    if not doc.symptoms:
        console.print(f"[dim]{SYMPTOMS_HEADING}: {NO_SYMPTOMS}[/]")
        return
    headline = doc.unexplained
    console.print(f"[bold]{SYMPTOMS_HEADING}:[/]" + (f" [bold red]{inert(headline)}[/]" if headline else ""))
    for e in doc.symptoms:
        style = "green" if e.explained_by else "bold red"
        console.print(f"  {inert(e.id)} [dim]({inert(e.place)})[/] {inert(e.text)}")
        console.print(f"      [{style}]{inert(e.verdict)}[/]")
        if e.answer:
            console.print(f"      [dim]{inert(e.answer)}[/]")
        if e.origin:
            console.print(f"      [dim]{FROM_THE_SOURCE}: {inert(e.origin)}[/]")


def _print_remedies(console: Any, f: FindingItem) -> None:
    """A finding's remedies as alternatives (``Option 1 (recommended)``, ``Option 2`` …), each with its own
    script, after what must come first when it depends on another finding's fix; every line made inert
    (a path from the machine cannot send an escape sequence)."""
    from rich.text import Text

    remedies: list[RemedyItem] = f.remedies
    if len(remedies) > 1:
        console.print(f"      [bold]{f.options_heading}[/]")
        if f.recommendation:
            console.print(f"      [dim]{inert(f.recommendation)}[/]")
    for r in remedies:
        label = "fix" if len(remedies) == 1 and r.recommended else r.label
        console.print(f"      [bold]{label}:[/] {inert(r.title)} [dim]({inert('; '.join(r.flags))})[/]")
        if r.first:
            console.print(f"        [bold]{inert(r.first)}[/]")
        for command in pasted_script(r.commands):
            # Each line whole and unpadded, whatever the width: a shell line cut at the edge (or one that
            # gained trailing blanks) is a different command when copied.
            console.print(Text("        " + visible_controls(command), style="cyan"), soft_wrap=True, crop=False)
