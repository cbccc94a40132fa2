"""Screens that explain: the keys, the glossary, a text view (the playbook graph), and export."""

from __future__ import annotations

from typing import Any

from rich.table import Table as RichTable
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Header, OptionList, Static
from textual.widgets.option_list import Option

from .common import SCREENS_CSS, KeyBar

GENERAL_KEYS = [
    ("Tab / Shift+Tab", "move between the parts of a screen"),
    ("↑ ↓ Enter", "pick in a list and take it"),
    ("PgUp PgDn", "scroll the page"),
    ("Ctrl+P", "command palette: every action below, by name"),
    ("Esc", "back / close"),
]


def keys_table(screen: Screen) -> RichTable:
    """Every key of ``screen`` and of the app, with what it does: the screen's own first, then the
    app's, then the general ones, then the rest."""
    grid = RichTable(expand=False, show_edge=False, pad_edge=False)
    grid.add_column("key", style="bold", no_wrap=True)
    grid.add_column("does")
    grid.add_column("where", style="dim")
    app = screen.app
    where = getattr(screen, "PALETTE_GROUP", "this screen")
    rows: list[tuple[int, str, str, str]] = []
    index: dict[tuple[int, str], int] = {}
    for node, binding, _enabled, _tip in screen.active_bindings.values():
        if not binding.description or node not in (screen, app):
            continue
        key = app.get_key_display(binding)
        ident = (id(node), binding.action)
        if ident in index:  # another key for the same action: one row, keys side by side
            rank, keys, does, place = rows[index[ident]]
            rows[index[ident]] = (rank, f"{keys} / {key}", does, place)
            continue
        index[ident] = len(rows)
        rank = 1 if node is app else (0 if binding.show else 3)
        rows.append((rank, key, binding.description, "everywhere" if node is app else where))
    rows += [(2, key, does, "everywhere") for key, does in GENERAL_KEYS]
    for _rank, key, does, place in sorted(rows, key=lambda r: r[0]):
        grid.add_row(key, does, place)
    return grid


class HelpScreen(ModalScreen[None]):
    """The keys of the screen underneath and of the app."""

    CSS_PATH = SCREENS_CSS

    BINDINGS = [Binding("escape,question_mark,f1,q", "dismiss", "Close", id="close")]

    def __init__(self, under: Screen) -> None:
        super().__init__()
        self.table = keys_table(under)
        self.under = getattr(under, "PALETTE_GROUP", type(under).__name__)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(Text.assemble(("Keys", "bold"), f"  ({self.under}; Esc closes)"))
            yield Static(self.table, id="help-keys")
            yield Static(Text("No action needs a mouse. The command palette (Ctrl+P) finds every action by name, "
                              "including the exports (Markdown, HTML, JSON).", style="dim"))

    async def action_dismiss(self, result: Any = None) -> None:
        self.dismiss(None)


class TextScreen(Screen[None]):
    """A long text to scroll through (the playbook graph)."""

    CSS_PATH = SCREENS_CSS

    PALETTE_GROUP = "View"
    BINDINGS = [
        Binding("escape", "back", "Back", id="back"),
        Binding("pagedown", "scroll_body(1)", "Scroll down", show=False),
        Binding("pageup", "scroll_body(-1)", "Scroll up", show=False),
    ]

    def __init__(self, title: str, text: Text, anchor: str | None = None) -> None:
        super().__init__()
        self.title_text = title
        self.text = text
        self.text.no_wrap = True
        self.anchor = anchor

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(Text(self.title_text, style="bold"), classes="screen-title")
        with VerticalScroll(id="text-body"):
            yield Static(self.text, id="text-content")
        yield KeyBar()

    def on_mount(self) -> None:
        body = self.query_one("#text-body", VerticalScroll)
        body.focus()
        lines = self.text.plain.splitlines()
        at = next((i for i, line in enumerate(lines) if self.anchor and line.startswith(self.anchor)), None)
        if at is not None:
            self.call_after_refresh(body.scroll_to, y=max(0, at - 3), animate=False)

    def action_scroll_body(self, direction: int) -> None:
        body = self.query_one("#text-body", VerticalScroll)
        (body.scroll_page_down if direction > 0 else body.scroll_page_up)(animate=False)

    def action_back(self) -> None:
        self.app.pop_screen()


class GlossaryScreen(Screen[None]):
    """The glossary: pick a term, read it."""

    CSS_PATH = SCREENS_CSS

    PALETTE_GROUP = "Glossary"
    BINDINGS = [Binding("escape", "back", "Back", id="back")]

    def __init__(self, term: str | None = None) -> None:
        super().__init__()
        self.start_term = term

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(Text.assemble(("Glossary", "bold"), ("  ↑↓ picks a term", "dim")), classes="screen-title")
        yield OptionList(id="terms")
        with VerticalScroll(id="term-body"):
            yield Static("", id="term-text")
        yield KeyBar()

    def on_mount(self) -> None:
        from zdoctor.core.errors import ZdoctorError
        from zdoctor.core.glossary import load_glossary

        try:
            self.terms = load_glossary()
        except ZdoctorError as exc:
            self.terms = []
            self.query_one("#term-text", Static).update(Text(str(exc), style="red"))
        menu = self.query_one("#terms", OptionList)
        for i, t in enumerate(self.terms):
            menu.add_option(Option(Text.assemble((t.term, "bold"), "  ", (t.short, "dim")), id=f"term:{i}"))
        start = 0
        if self.start_term:
            start = next((i for i, t in enumerate(self.terms) if t.term.lower() == self.start_term.lower()), 0)
        if self.terms:
            menu.highlighted = start
            self.show(start)
        menu.focus()

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        if event.option.id:
            self.show(int(event.option.id.partition(":")[2]))

    def show(self, i: int) -> None:
        t = self.terms[i]
        text = Text.assemble((t.term, "bold underline"), "\n", (t.short, "italic"), "\n\n", t.text)
        if t.see:
            text.append(f"\n\nSee also: {', '.join(t.see)}", style="dim")
        self.query_one("#term-text", Static).update(text)

    def action_back(self) -> None:
        self.app.pop_screen()


class ExportScreen(ModalScreen[None]):
    """Export the session (or, given ``exporter``, whatever it writes); the path written is shown here and
    in a notification."""

    CSS_PATH = SCREENS_CSS

    BINDINGS = [
        Binding("m", "export('md')", "Markdown", id="md"),
        Binding("h", "export('html')", "HTML", id="html"),
        Binding("j", "export('json')", "JSON", id="json"),
        Binding("escape", "close", "Close", id="close"),
    ]

    def __init__(self, exporter: Any = None, subject: str = "this session", note: str | None = None) -> None:
        super().__init__()
        self.exporter = exporter  # fmt -> path written; None: the app's own session export
        self.subject = subject
        self.note = note

    def compose(self) -> ComposeResult:
        from pathlib import Path

        app: Any = self.app
        note = self.note
        if note is None:
            folder = getattr(app, "export_dir", None) or Path.cwd()
            ctx = getattr(app, "ctx", None)
            sid = ctx.log.id if ctx is not None and ctx.log is not None else None
            note = (f"Session {sid}; written to {folder}" if sid else
                    "This session is not recorded: nothing to export.")
        with Vertical(id="export-box"):
            yield Static(Text(f"Export {self.subject}", style="bold"))
            yield Static(Text(note, style="dim"), id="export-where")
            yield OptionList(Option("m  Markdown (for a ticket)", id="md"),
                             Option("h  HTML (standalone page)", id="html"),
                             Option("j  JSON (every event, loss-free)", id="json"), id="export-formats")
            yield Static("", id="export-result")
            yield Static(Text("m / h / j or Enter exports · Esc closes", style="dim"))

    def on_mount(self) -> None:
        menu = self.query_one("#export-formats", OptionList)
        menu.highlighted = 0
        menu.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id:
            self.action_export(event.option.id)

    def action_export(self, fmt: str) -> None:
        from zdoctor.core.errors import ZdoctorError

        app: Any = self.app
        result = self.query_one("#export-result", Static)
        try:
            path = self.exporter(fmt) if self.exporter is not None else app.export(fmt)
        except (ZdoctorError, OSError) as exc:
            result.update(Text(str(exc), style="bold red"))
            return
        result.update(Text.assemble(("Written: ", "bold"), (str(path), "bold green")))
        app.notify(f"exported to {path}", title="Export", timeout=8)

    def action_close(self) -> None:
        self.dismiss(None)
