"""What the guided session's app and the fleet app share: the help and quit keys, the help screen, and the
line filter that keeps control characters in shown text off the terminal."""

from __future__ import annotations

from typing import Any

from textual.app import App
from textual.binding import Binding

from .common import NO_CONTROL_CHARACTERS

HELP = Binding("question_mark,f1", "help", "Keys", id="help")
QUIT = Binding("q", "quit", "Quit", id="quit")
#: Ctrl-C does what ``q`` does (the same question while a remedy runs, the same clean-up), before any widget
#: or screen takes it for copying: copying has its own keys (``y`` copies a remedy's commands).
CTRL_C_QUITS = Binding("ctrl+c", "quit", "Quit", show=False, priority=True, id="quit-ctrl-c")


class AppBase(App[int]):
    """A zdoctor app: ``?`` for the keys, and no control character on the terminal.
    Each app lists its keys itself (:data:`HELP` and :data:`QUIT` among them), in the order the key bar
    shows them."""

    def __init__(self, css_path: str | None = None) -> None:
        # each screen reads its own stylesheet (screens.common.START_CSS, SCREENS_CSS); ``css_path``: the
        # first screen's, when it is not the class's own (Textual reads none for an app's default screen)
        super().__init__(css_path=css_path)

    def get_line_filters(self) -> list[Any]:
        """Textual's filters, then one that keeps control characters in shown text off the terminal."""
        return [*super().get_line_filters(), NO_CONTROL_CHARACTERS]

    def action_help(self) -> None:
        from .info import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen))
