"""Every piece of evidence behind a step's findings: tables side by side, commands with their output."""

from __future__ import annotations

import io

from rich.cells import cell_len
from rich.console import Console
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Header, Static

from zdoctor.core.plural import count_of
from zdoctor.report.reportdoc import Evidence, EvidenceTable, ReportDoc

from .common import HOT, SCREENS_CSS, KeyBar
from .docview import evidence_key, evidence_text, finding_line, padded

CELL_PADDING = 2  # a DataTable cell's padding, one column each side
MIN_COLUMN = 8


def fit_widths(natural: list[int], room: int, least: int = MIN_COLUMN) -> list[int]:
    """Column widths that fit ``room`` columns: the widest columns give way first (never below ``least``
    or their own width), so that every column, the deciding one too, is on screen without scrolling."""
    widths = list(natural)
    while sum(widths) > room:
        widest = max(range(len(widths)), key=lambda i: widths[i])
        if widths[widest] <= least:
            break
        widths[widest] -= 1
    return widths


def _natural(text: str) -> int:
    return max((cell_len(line) for line in text.splitlines()), default=0)


def wrapped(text: str, width: int, style: str) -> Text:
    """``text`` broken into lines of at most ``width`` cells (at spaces where it can, else mid-word)."""
    lines = Text(text or " ", style=style).wrap(_MEASURE, width, overflow="fold")
    return Text("\n", style=style).join(lines) if lines else Text(" ", style=style)


_MEASURE = Console(width=200, file=io.StringIO(), color_system=None, legacy_windows=False)


def table_widget(table: EvidenceTable, room: int = 0) -> DataTable:
    """A focusable table fitted to ``room`` columns (0: as wide as its content): long cells wrap onto more
    lines instead of pushing the later columns off screen; highlighted rows carry ⚠ and bold."""
    grid: DataTable = DataTable(cursor_type="row", zebra_stripes=False, show_cursor=True, classes="ev-table")
    width = len(table.columns)
    rows = padded(table)
    natural = [max([_natural(col)] + [_natural(r[i]) for r in rows]) for i, col in enumerate(table.columns)]
    widths = natural
    if room:
        budget = room - (width + 1) * CELL_PADDING - cell_len(HOT)
        widths = fit_widths(natural, budget)
    grid.add_column("", key="hot")
    labels = [wrapped(col, widths[i], "bold") if room else Text(col) for i, col in enumerate(table.columns)]
    grid.header_height = max([len(label.plain.splitlines()) for label in labels] + [1])
    for i, label in enumerate(labels):
        grid.add_column(label, key=f"c{i}", width=widths[i] if room else None)
    for i, cells in enumerate(rows):
        hot = i in table.highlight
        style = "bold red" if hot else ""
        # an empty cell is one blank line: a row of auto height measures every cell's first line
        body = [wrapped(c, widths[j], style) if room else Text(c, style=style) for j, c in enumerate(cells)]
        grid.add_row(Text(HOT if hot else " ", style=style), *body, height=None if room else 1)
    return grid


TABLE_INSET = 8  # the page's padding and scroll bar, the table's margin and its own scroll bar


class EvidenceScreen(Screen[None]):
    """The evidence of one step's report document, finding by finding; evidence shared by several findings is
    shown once (a table where the document shows it first)."""

    CSS_PATH = SCREENS_CSS

    PALETTE_GROUP = "Evidence"
    BINDINGS = [
        Binding("escape", "back", "Back", id="back"),
        Binding("pagedown", "scroll_body(1)", "Scroll down", show=False),
        Binding("pageup", "scroll_body(-1)", "Scroll up", show=False),
    ]

    def __init__(self, title: str, doc: ReportDoc) -> None:
        super().__init__()
        self.step_title = title
        self.doc = doc

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(Text.assemble(("Evidence: ", "bold"), self.step_title, ("  Tab moves between tables, "
                                   "PgUp/PgDn the page", "dim")), id="ev-title")
        with VerticalScroll(id="ev-body"):
            seen: dict[tuple, str] = {}  # a piece of evidence as shown -> the finding it was shown under
            for f in self.doc.findings:
                yield Static(finding_line(f), classes="ev-finding")
                # the finding's tables first (the evidence itself), then what it says of them, then outputs
                tables_first: list[Evidence | None] = sorted(f.evidence, key=lambda e: e.table is None)
                if f.detail:
                    at = next((i for i, e in enumerate(tables_first) if e is not None and e.table is None),
                              len(tables_first))
                    tables_first.insert(at, None)
                for ev in tables_first:
                    if ev is None:
                        yield Static(Text(f.detail.rstrip()), classes="ev-detail")
                        continue
                    key = (ev.table.id,) if ev.table is not None else evidence_key(ev)
                    if key in seen:
                        yield Static(Text(f"  {ev.label}: shown above, under {seen[key]}", style="dim"),
                                     classes="ev-ref")
                        continue
                    seen[key] = f.id
                    if ev.table is not None:
                        table = ev.table
                        hot = f"; {len(table.highlight)} marked {HOT}" if table.highlight else ""
                        rows = count_of(len(table.rows), "row")
                        yield Static(Text.assemble((ev.label, "bold"), (f"  ({rows}{hot})", "dim")),
                                     classes="ev-label")
                        yield table_widget(table, self.app.size.width - TABLE_INSET)
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
