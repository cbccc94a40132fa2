"""The start screen is drawn before the first pass weighs on it, lists each probe while it runs and fills
each one in as its result arrives. The slow probe is real: the training interpreter named with
``--python`` is a wrapper that waits for a file before it starts the real interpreter."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from test_tui import make, name, plain, settle

from zdoctor.host import LiveHost


def held_interpreter(tmp_path: Path) -> tuple[Path, Path]:
    """An interpreter that starts only once the returned release file exists."""
    release = tmp_path / "release"
    python = tmp_path / "bin" / "python3"
    python.parent.mkdir()
    python.write_text(f"#!/bin/sh\nwhile [ ! -e '{release}' ]; do sleep 0.05; done\nexec '{sys.executable}' \"$@\"\n")
    python.chmod(0o755)
    return python, release


def record_frames(app, frames: list[str]) -> None:
    """Append to ``frames`` the screen of every frame the compositor hands over to be written."""
    shown = app._display

    def display(screen, renderable) -> None:
        if renderable is not None and not app._batch_count:
            frames.append(type(screen).__name__)
        shown(screen, renderable)

    app._display = display


def test_the_start_screen_lists_running_probes_and_fills_them_in(tmp_path: Path) -> None:
    python, release = held_interpreter(tmp_path)

    async def scenario() -> None:
        app = make(host=LiveHost(python=str(python)), argv=["tui"], export_dir=tmp_path)
        async with app.run_test(size=(120, 60)) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen", what="the start screen")
            start = app.screen
            panel = start.query_one("#pass-probes")
            # the interpreter is held: the probes that run it stay running while the others finish
            await settle(pilot, lambda: "pyenv" in panel.states and any(
                s.result is not None for s in panel.states.values()), timeout=120, what="a first probe's result")
            assert panel.states["pyenv"].result is None and not panel.finished
            assert start.findings is None
            await pilot.pause(0.3)  # one tick of the panel's clock
            lines = plain(panel).splitlines()
            (pyenv_line,) = [ln for ln in lines if ln.split()[1:2] == ["pyenv"]]
            assert " s of 90 s" in pyenv_line, pyenv_line  # running: its elapsed time against its budget
            done = [st.name for st in panel.states.values() if st.result is not None]
            (done_line,) = [ln for ln in lines if ln.split()[1:2] == [done[0]]]
            assert " s of " not in done_line, done_line  # finished: its recorded duration or what went wrong
            assert "Target: " in plain(start.query_one("#glance")) and "probing…" in plain(start.query_one("#glance"))

            release.write_text("")
            await settle(pilot, lambda: start.findings is not None, timeout=300, what="the first pass's findings")
            assert panel.finished and not panel.running
            assert panel.states["pyenv"].result is not None and panel.states["pyenv"].result.status == "ok"
            glance = plain(start.query_one("#glance"))
            assert f"Python {sys.version.split()[0]}" in glance, glance
            await pilot.press("q")

    asyncio.run(scenario())


def test_the_start_screens_work_waits_for_its_first_frame(tmp_path: Path, monkeypatch) -> None:
    """The first pass, the menu and the session log start once the start screen's first frame has been
    handed to the terminal, not before, and the start screen is that first frame: no blank screen under it
    (a screen pushed over it during the app's start-up gets its after-refresh callbacks before any frame:
    Textual runs them at once while its start-up batch holds the frames back)."""
    from screens.start import StartScreen

    python, release = held_interpreter(tmp_path)
    release.write_text("")
    seen: list[list[str]] = []
    original = StartScreen.after_first_paint

    def after_first_paint(self: StartScreen) -> None:
        seen.append(list(frames))
        original(self)

    monkeypatch.setattr(StartScreen, "after_first_paint", after_first_paint)
    frames: list[str] = []

    async def scenario() -> None:
        app = make(host=LiveHost(python=str(python)), argv=["tui"], export_dir=tmp_path)
        record_frames(app, frames)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, lambda: bool(seen) and app.screen.query("#start-menu"), what="the start-up")
            assert seen == [seen[0]] and seen[0] and set(seen[0]) == {"StartScreen"}, seen
            assert [type(s).__name__ for s in app.screen_stack] == ["StartScreen"]
            # the symptom box and the menu follow the first frame; the menu has the focus
            assert app.focused is app.screen.query_one("#start-menu")
            await pilot.press("q")

    asyncio.run(scenario())


def test_a_practice_walk_is_the_first_frame_and_its_work_follows_it(monkeypatch) -> None:
    """``--demo SCENARIO``: the walk's first step is the app's first screen, styled, with no blank screen
    under it; its session log and its probes (which need every check registered) start once that frame is
    out, and what the walk recorded before the log opened is written to it. Leaving it leads to the list of
    scenarios, which leads nowhere back."""
    from screens.walk import WalkScreen
    from zdoctor.walk.session import load_events

    seen: list[list[str]] = []
    original = WalkScreen._start_step

    async def start_step(self: WalkScreen, visit: int) -> None:
        seen.append(list(frames))
        await original(self, visit)

    monkeypatch.setattr(WalkScreen, "_start_step", start_step)
    frames: list[str] = []

    async def scenario() -> None:
        app = make(demo="conda-ld-library-path")
        record_frames(app, frames)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, lambda: name(app) == "WalkScreen" and app.screen.outcome is not None,
                         what="the first step evaluated")
            walk = app.screen
            assert seen == [seen[0]] and seen[0] and set(seen[0]) == {"WalkScreen"}, seen
            assert app.screen_stack == [walk]
            # styled as when it is pushed (screens.tcss): the verdict under a rule
            assert walk.query_one("#verdict").styles.border_top[0] == "solid"
            events = load_events(app.ctx.log.path)
            kinds = [e["type"] for e in events]
            assert kinds[0] == "session_start" and kinds[1:3] == ["playbook_start", "node_enter"], kinds
            await pilot.press("escape")
            await settle(pilot, lambda: name(app) == "AskScreen", what="the question before leaving")
            await pilot.press("y")
            await settle(pilot, lambda: name(app) == "PracticeScreen", what="the list of scenarios")
            await pilot.press("escape")  # the walk left under it is not gone back to
            await pilot.pause(0.2)
            assert name(app) == "PracticeScreen"
            await pilot.press("q")

    asyncio.run(scenario())


def test_every_screen_names_its_stylesheet() -> None:
    """Each screen class reads its rules when it first opens (the start screen's alone before the first
    frame); a screen that named none would be drawn unstyled."""
    import importlib
    import pkgutil

    from textual.screen import Screen

    import screens
    from screens.common import SCREENS_CSS, START_CSS

    classes = set()
    for info in pkgutil.iter_modules(screens.__path__):
        module = importlib.import_module(f"screens.{info.name}")
        classes |= {c for c in vars(module).values()
                    if isinstance(c, type) and issubclass(c, Screen) and c.__module__.startswith("screens.")}
    assert len(classes) >= 12, sorted(c.__name__ for c in classes)
    for cls in classes:
        assert cls.CSS_PATH in (START_CSS, SCREENS_CSS), cls.__name__
        assert Path(cls.CSS_PATH).is_file(), cls.CSS_PATH
    start_rules = Path(START_CSS).read_text()
    assert "#start-menu" in start_rules and "#walk-body" not in start_rules
    assert "#walk-body" in Path(SCREENS_CSS).read_text()
