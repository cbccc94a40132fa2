"""Every piece of evidence behind a step's findings: tables side by side, commands with their output."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Header, Static

from zdoctor.model import Evidence, Finding, sort_findings
from zdoctor.plural import count_of

from .common import HOT, KeyBar, evidence_key, evidence_text, finding_line, shown


def table_widget(ev: Evidence) -> DataTable:
    """A focusable table (scrolls sideways for long paths); highlighted rows carry ⚠ and bold."""
    assert ev.table is not None
    grid: DataTable = DataTable(cursor_type="row", zebra_stripes=False, show_cursor=True, classes="ev-table")
    grid.add_column("", key="hot")
    for i, col in enumerate(ev.table.columns):
        grid.add_column(col, key=f"c{i}")
    width = len(ev.table.columns)
    for i, row in enumerate(ev.table.rows):
        hot = i in ev.table.highlight
        style = "bold red" if hot else ""
        cells = [shown(str(c)) for c in row] + [""] * (width - len(row))
        grid.add_row(Text(HOT if hot else "", style=style), *(Text(c, style=style) for c in cells[:width]))
    return grid


class EvidenceScreen(Screen[None]):
    """The evidence of one step, finding by finding; evidence shared by several findings is shown once."""

    PALETTE_GROUP = "Evidence"
    BINDINGS = [
        Binding("escape", "back", "Back", id="back"),
        Binding("pagedown", "scroll_body(1)", "Scroll down", show=False),
        Binding("pageup", "scroll_body(-1)", "Scroll up", show=False),
    ]

    def __init__(self, title: str, findings: list[Finding]) -> None:
        super().__init__()
        self.step_title = title
        self.findings = sort_findings(list(findings))

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(Text.assemble(("Evidence: ", "bold"), self.step_title, ("  Tab moves between tables, "
                                   "←→ scrolls a wide one, PgUp/PgDn the page", "dim")), id="ev-title")
        with VerticalScroll(id="ev-body"):
            seen: dict[tuple, str] = {}
            for f in self.findings:
                head = finding_line(f)
                if f.detail:
                    head.append("\n")
                    head.append(shown(f.detail).rstrip(), style="")
                yield Static(head, classes="ev-finding")
                for ev in f.evidence:
                    key = evidence_key(ev)
                    if key in seen:
                        yield Static(Text(f"  {ev.label}: shown above, under {seen[key]}", style="dim"),
                                     classes="ev-ref")
                        continue
                    seen[key] = f.id
                    if ev.table is not None:
                        hot = f"; {len(ev.table.highlight)} marked {HOT}" if ev.table.highlight else ""
                        rows = count_of(len(ev.table.rows), "row")
                        yield Static(Text.assemble((ev.label, "bold"), (f"  ({rows}{hot})", "dim")),
                                     classes="ev-label")
                        yield table_widget(ev)
                    else:
                        yield Static(evidence_text(ev), classes="ev-item")
        yield KeyBar()

    def on_mount(self) -> None:
        self.query_one("#ev-body", VerticalScroll).focus()

    def action_scroll_body(self, direction: int) -> None:
        body = self.query_one("#ev-body", VerticalScroll)
        (body.scroll_page_down if direction > 0 else body.scroll_page_up)(animate=False)

    def action_back(self) -> None:
        self.app.pop_screen()
