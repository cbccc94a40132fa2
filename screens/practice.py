"""Learn mode: pick a practice scenario (a recorded broken node) and walk it."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Header, OptionList, Static
from textual.widgets.option_list import Option

from .common import SCREENS_CSS, KeyBar


class PracticeScreen(Screen[None]):
    """The practice scenarios and the story of the highlighted one."""

    CSS_PATH = SCREENS_CSS

    PALETTE_GROUP = "Practice"
    BINDINGS = [
        Binding("enter", "start", "Start", id="start"),
        Binding("escape", "back", "Back", id="back"),
    ]

    def __init__(self, selected: str | None = None) -> None:
        super().__init__()
        self.selected = selected
        self.scenarios: list[Any] = []

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(Text.assemble(("Practice (learn mode)", "bold"), ("  recorded broken nodes, replayed: nothing "
                                   "runs on this machine", "dim")), classes="screen-title")
        yield OptionList(id="scenarios")
        with VerticalScroll(id="story-body"):
            yield Static("", id="story")
        yield KeyBar()

    def on_mount(self) -> None:
        from zdoctor.core.errors import ZdoctorError
        from zdoctor.walk.practice import load_scenarios

        try:
            self.scenarios = load_scenarios()
        except ZdoctorError as exc:
            self.query_one("#story", Static).update(Text(str(exc), style="red"))
        menu = self.query_one("#scenarios", OptionList)
        for s in self.scenarios:
            part = f"part {s.part}: " if s.part is not None else ""
            menu.add_option(Option(Text.assemble((s.id, "bold cyan"), f"  {part}{s.title}"), id=s.id))
        ids = [s.id for s in self.scenarios]
        if ids:
            menu.highlighted = ids.index(self.selected) if self.selected in ids else 0
        menu.focus()

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        s = next((s for s in self.scenarios if s.id == event.option.id), None)
        if s is None:
            return
        text = Text.assemble((s.title, "bold"), "\n", (s.summary, "italic"), "\n\n", s.story, "\n\n",
                             (f"Playbook: {s.playbook}", "dim"))
        if s.terms:
            text.append(f"\nTerms to look up (t): {', '.join(s.terms)}", style="dim")
        self.query_one("#story", Static).update(text)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.begin(event.option.id)

    def action_start(self) -> None:
        menu = self.query_one("#scenarios", OptionList)
        if menu.highlighted_option is not None:
            self.begin(menu.highlighted_option.id)

    def begin(self, sid: str | None) -> None:
        s = next((s for s in self.scenarios if s.id == sid), None)
        if s is not None:
            self.app.start_practice(s)  # type: ignore[attr-defined]

    def action_back(self) -> None:
        if self.app.can_go_back():  # type: ignore[attr-defined]
            self.app.pop_screen()
        else:
            self.notify("This is the first screen: q quits.", timeout=3)
