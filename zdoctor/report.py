"""The terminal report of `zdoctor check`: a mark and one line per finding, remedies, a final count."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from .doctor import CheckReport

MARKS = {"ok": "✓", "warn": "!", "fail": "✗", "skip": "-", "crash": "‼"}
ASCII_MARKS = {"ok": "ok", "warn": "!!", "fail": "XX", "skip": "--", "crash": "!!!"}
STYLES = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim", "crash": "bold magenta"}


def inert(text: object) -> str:
    """Text from the machine as rich markup that prints literally: control characters made visible,
    markup escaped."""
    from rich.markup import escape

    from .model import visible_controls

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
    from rich.padding import Padding
    from rich.syntax import Syntax

    stream = stream or sys.stdout
    console = Console(file=stream, highlight=False, soft_wrap=True)
    marks = _marks_for(stream)
    host = report.host
    where = host.get("hostname", "?")
    if host.get("kind") == "replay":
        where += f" (replayed from {host.get('source', '?')})"
    console.print(f"[bold]zdoctor check[/] on {inert(where)} — {inert(str(host.get('os', '')))}")
    for f in report.findings:
        style = STYLES[f.status]
        console.print(f"[{style}]{marks[f.status]:>3}[/] {inert(f.title)}  [dim]({inert(f.id)})[/]")
        if f.detail and (f.status in ("fail", "crash", "warn") or verbose):
            for line in f.detail.splitlines():
                console.print(f"      {inert(line)}", style="dim" if f.status == "warn" else None)
        if f.status in ("fail", "crash") or (verbose and f.remedies):
            for r in f.remedies:
                flags = []
                flags.append("verified" if r.verified else "not verified" if r.verified is False
                             else "unverified")
                if r.requires_root:
                    flags.append("needs root")
                console.print(f"      [bold]fix:[/] {inert(r.title)} [dim]({', '.join(flags)})[/]")
                if r.commands:
                    console.print(Padding(Syntax("\n".join(r.commands), "bash", theme="ansi_dark",
                                                 background_color="default", word_wrap=True),
                                          (0, 0, 0, 8)))
    for run in report.playbooks:
        end = run.diagnosis or "no diagnosis"
        console.print(f"[dim]  playbook {inert(run.id)}: {inert(' -> '.join(run.path))} => "
                      f"{inert(end)}[/]")
    s = report.summary
    parts = [f"{s[k]} {k}" for k in ("fail", "crash", "warn", "ok", "skip") if s[k]]
    console.print(f"[bold]{s['total']} findings:[/] " + ", ".join(parts))
    if report.session:
        console.print(f"[dim]session {report.session} — `zdoctor export --last --format md` for a ticket[/]")
