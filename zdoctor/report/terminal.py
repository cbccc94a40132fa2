"""The terminal report of `zdoctor check`: a mark and one line per finding, remedies, a final count."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TextIO

from zdoctor.core.model import visible_controls

if TYPE_CHECKING:
    from zdoctor.core.model import Finding, Remedy
    from zdoctor.walk.doctor import CheckReport

from zdoctor.core.present import (
    ALSO_FOUND,
    ASCII_MARKS,
    MARKS,
    NO_SYMPTOMS,
    STYLES,
    SYMPTOMS_HEADING,
    answer_line,
    are_steps,
    first_line,
    is_recommended,
    layer_lines,
    option_label,
    options_heading,
    pasted_script,
    recommendation,
    remedy_flags,
    requires_of,
    scope_lines,
    summary_parts,
    symptom_place,
    symptom_verdict,
    unexplained_headline,
)
from zdoctor.core.verdicts import split_answers
from zdoctor.walk.walkwords import in_words


def inert(text: object) -> str:
    """Text from the machine as rich markup that prints literally: control characters made visible,
    markup escaped."""
    from rich.markup import escape

    return escape(visible_controls(str(text)))


def _marks_for(stream: TextIO) -> dict[str, str]:
    """Unicode marks where the stream can encode them, ASCII otherwise."""
    enc = getattr(stream, "encoding", None) or "ascii"
    try:
        "".join(MARKS.values()).encode(enc)
    except (UnicodeEncodeError, LookupError):
        return ASCII_MARKS
    return MARKS


def print_report(report: CheckReport, stream: TextIO | None = None, verbose: bool = False) -> None:
    """Render ``report`` for a person; honours NO_COLOR and plain (non-tty) output through rich."""
    from rich.console import Console

    stream = stream or sys.stdout
    console = Console(file=stream, highlight=False, soft_wrap=True)
    marks = _marks_for(stream)
    host = report.host
    where = host.get("hostname", "?")
    if host.get("kind") == "replay":
        where += f" (replayed from {host.get('source', '?')})"
    console.print(f"[bold]zdoctor check[/] on {inert(where)} — {inert(str(host.get('os', '')))}")
    _print_symptoms(console, report)
    titles = {f.id: f.title for f in report.findings}
    answers, rest = split_answers(report.findings, report.symptoms)
    for f in answers:
        _print_finding(console, f, marks, verbose, replayed=host.get("kind") == "replay", titles=titles)
    if report.symptoms and rest:  # what explains the symptoms above, then the rest under its own heading
        console.print(f"[bold]{ALSO_FOUND}:[/]")
    for f in rest:
        _print_finding(console, f, marks, verbose, replayed=host.get("kind") == "replay", titles=titles)
    for run in report.playbooks:
        # The diagnosis in words (its node id after it, for the JSON and the playbook files).
        if run.diagnosis:
            end = f"{run.diagnosis_title} ({run.diagnosis})" if run.diagnosis_title else run.diagnosis
        else:
            end = f"no diagnosis: {in_words(run.reason)}" if run.reason else "no diagnosis"
        console.print(f"[dim]  playbook {inert(run.id)}: {inert(' -> '.join(run.path))} => "
                      f"{inert(end)}[/]")
        if run.healthy:
            for line in scope_lines(run.examined, run.not_examined):
                console.print(f"[dim]      {inert(line)}[/]")
        for x in run.failing_on_path:
            console.print(f"    also failing on the way (step {inert(x['node'])}): {inert(x['title'])} "
                          f"[dim]({inert(x['id'])})[/]")
    for line in layer_lines(report.layers, verbose=verbose):
        console.print(f"[dim]{inert(line)}[/]")
    s = report.summary
    headline = unexplained_headline(report.symptoms)
    if headline:
        console.print(f"[bold red]{inert(headline)}[/]")
    if report.incomplete:
        console.print(f"[bold yellow]Incomplete: {inert(report.incomplete)}[/]")
    parts = [text for text, _status in summary_parts(s, marks=False, skip_zero=True)]
    console.print(f"[bold]{s['total']} findings:[/] " + ", ".join(parts))
    if report.session:
        console.print(f"[dim]session {report.session} — `zdoctor export --last --format md` for a ticket[/]")


def _print_finding(console: Any, f: Finding, marks: dict[str, str], verbose: bool, replayed: bool,
                   titles: dict[str, str]) -> None:
    """One finding: its mark and title, the detail of a problem, the remedies of a failure."""
    console.print(f"[{STYLES[f.status]}]{marks[f.status]:>3}[/] {inert(f.title)}  [dim]({inert(f.id)})[/]")
    if f.detail and (f.status in ("fail", "crash", "warn") or verbose):
        for line in f.detail.splitlines():
            console.print(f"      {inert(line)}", style="dim" if f.status == "warn" else None)
    if f.status in ("fail", "crash") or (verbose and f.remedies):
        _print_remedies(console, f.remedies, replayed=replayed, titles=titles)


def _print_symptoms(console: Any, report: CheckReport) -> None:
    """The symptom ledger first: each thing the user saw, quoted, with what explains it or UNEXPLAINED."""
    headline = unexplained_headline(report.symptoms)
    if not report.symptoms:
        console.print(f"[dim]{SYMPTOMS_HEADING}: {NO_SYMPTOMS}[/]")
        return
    console.print(f"[bold]{SYMPTOMS_HEADING}:[/]" + (f" [bold red]{inert(headline)}[/]" if headline else ""))
    for e in report.symptoms:
        verdict = symptom_verdict(e)
        style = "green" if e.get("explained_by") else "bold red"
        console.print(f"  {inert(e.get('id'))} [dim]({inert(symptom_place(e))})[/] {inert(e.get('text'))}")
        console.print(f"      [{style}]{inert(verdict)}[/]")
        answer = answer_line(e)
        if answer:
            console.print(f"      [dim]{inert(answer)}[/]")


def _print_remedies(console: Any, remedies: list[Remedy], replayed: bool, titles: dict[str, str] | None = None) -> None:
    """A finding's remedies as alternatives (``Option 1 (recommended)``, ``Option 2`` …), each with its own
    script, after what must come first when it depends on another finding's fix; every line made inert
    (a path from the machine cannot send an escape sequence)."""
    from rich.text import Text

    steps = are_steps(remedies)
    if len(remedies) > 1:
        console.print(f"      [bold]{options_heading(len(remedies), steps)}[/]")
        if recommendation(remedies):
            console.print(f"      [dim]{inert(recommendation(remedies))}[/]")
    for i, r in enumerate(remedies, 1):
        label = "fix" if len(remedies) == 1 and is_recommended(r) else option_label(i, len(remedies), steps, r)
        flags = "; ".join(remedy_flags(r, recorded_elsewhere=replayed))
        console.print(f"      [bold]{label}:[/] {inert(r.title)} [dim]({inert(flags)})[/]")
        if requires_of(r):
            console.print(f"        [bold]{inert(first_line(requires_of(r), titles))}[/]")
        for command in pasted_script(r.commands):
            # Each line whole and unpadded, whatever the width: a shell line cut at the edge (or one that
            # gained trailing blanks) is a different command when copied.
            console.print(Text("        " + visible_controls(command), style="cyan"), soft_wrap=True, crop=False)
