"""The terminal report of `zdoctor fleet`: the node x check matrix by family, the skew table, the problems."""

from __future__ import annotations

import sys
from typing import TextIO

from zdoctor.core.plural import count_of, noun_for
from zdoctor.core.present import STYLES, pasted_script
from zdoctor.fleet.result import FleetReport, families
from zdoctor.fleet.skew import MISSING
from zdoctor.report.console import report_console
from zdoctor.report.terminal import _marks_for, inert


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def print_fleet(report: FleetReport, stream: TextIO | None = None, verbose: bool = False) -> None:
    """Render ``report`` for a person; honours NO_COLOR and plain output through rich."""
    from rich.table import Table

    stream = stream or sys.stdout
    console = report_console(stream)
    if not console.is_terminal:  # a pipe or a file: lay the tables out whole rather than wrap them at 80
        console.width = 160
    marks = _marks_for(stream)
    s = report.summary
    console.print(f"[bold]zdoctor fleet[/]: {count_of(s['nodes'], 'node')} from {inert(report.source)} via "
                  f"{inert(report.launcher)}: {s['reached']} reached, {s['failing']} failing, "
                  f"{count_of(s['differing_facts'], 'fact')} {noun_for(s['differing_facts'], 'differs', 'differ')}")
    fams = families(report.checks)
    matrix = Table(title="Nodes x checks", title_justify="left", box=None, pad_edge=False)
    matrix.add_column("node", no_wrap=True)
    matrix.add_column("launch", no_wrap=True)
    for fam in fams:
        matrix.add_column(fam, justify="center", no_wrap=True)
    for node in report.nodes:
        row = [f"[{STYLES[node.status]}]{marks[node.status]}[/] {inert(node.host)}",
               "ok" if node.reached else f"[red]{inert(node.run.status)}[/]"]
        for fam in fams:
            st = node.family_status(fams[fam])
            row.append("" if st is None else f"[{STYLES[st]}]{marks[st]}[/]")
        matrix.add_row(*row)
    console.print(matrix)

    skew = Table(title="Facts that should be equal on every reached node", title_justify="left", box=None,
                 pad_edge=False)
    for col in ("", "fact", "majority", "differs on"):
        skew.add_column(col)
    for r in report.skew:
        st = "fail" if r.differs else "ok" if r.fact.judged else "skip"
        others = "; ".join(f"{h}: {r.values[h]}" for h in (r.differing if r.fact.judged else r.values))
        skew.add_row(f"[{STYLES[st]}]{marks[st]}[/]", inert(r.fact.title),
                     inert(_clip(r.majority or MISSING, 60)) + (" [dim](tie)[/]" if r.tie else ""),
                     inert(_clip(others, 100)) if others else f"[dim]same on all {len(r.values)}[/]")
    if report.skew and any(r.values for r in report.skew):
        console.print(skew)

    reach = report.reach
    console.print(f"[{STYLES[reach.status]}]{marks[reach.status]}[/] {inert(reach.title)}  [dim]({inert(reach.id)})[/]")
    if reach.status != "ok":
        for line in reach.detail.splitlines()[:8]:
            console.print(f"    {inert(line)}", style="dim")

    for node in report.nodes:
        shown = [f for f in node.findings if f.status in ("fail", "crash") or (verbose and f.status == "warn")]
        if not shown:
            continue
        console.print(f"[bold]{inert(node.host)}[/]")
        for f in shown:
            console.print(f"  [{STYLES[f.status]}]{marks[f.status]:>3}[/] {inert(f.title)}  [dim]({inert(f.id)})[/]")
            if f.detail and (verbose or f.id.startswith("fleet.node.")):
                for line in f.detail.splitlines():
                    console.print(f"        {inert(line)}", style="dim")
            for rem in f.remedies if verbose else []:
                console.print(f"        [bold]fix:[/] {inert(rem.title)}")
                for cmd in pasted_script(rem.commands):
                    console.print(f"          {inert(cmd)}")
    if report.ranks:  # fleet --pid: the job's ranks of every node, judged as one job
        console.print("[bold]The job's ranks across the nodes[/]")
        for f in report.ranks:
            console.print(f"  [{STYLES[f.status]}]{marks[f.status]:>3}[/] {inert(f.title)}  [dim]({inert(f.id)})[/]")
            for line in f.detail.splitlines() if f.status in ("fail", "crash") or verbose else []:
                console.print(f"        {inert(line)}", style="dim")
    verdict = "[bold red]fleet is not ready[/]" if report.exit_code else "[bold green]fleet is consistent[/]"
    console.print(verdict + (f"  [dim]session {report.session} — `zdoctor export --last --format md`[/]"
                             if report.session else ""))
