"""The guided session, driven through Textual's Pilot on a replayed snapshot."""

from __future__ import annotations

import asyncio

from conftest import FIXTURES
from textual.widgets import OptionList, Static

from zdoctor.host import ReplayHost
from zdoctor.session import load_events
from zdoctor.tui import _screens_app


def make(tmp_path):
    host = ReplayHost.load(str(FIXTURES / "snapshots" / "healthy.json"))
    return _screens_app().make_app(host=host, argv=["tui"])


async def settle(pilot, app, predicate, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        assert loop.time() < end, "the UI did not reach the expected state"
        await pilot.pause(0.05)


def text_of(screen, selector: str) -> str:
    return str(screen.query_one(selector, Static).render())


def test_start_screen_then_walk_to_the_diagnosis(tmp_path):
    async def scenario() -> None:
        app = make(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, app, lambda: "✓" in text_of(app.screen, "#first-pass"))
            assert "torch 2.13.0+cpu imports" in text_of(app.screen, "#first-pass")
            options = app.screen.query_one("#playbooks", OptionList)
            assert options.option_count >= 1
            await pilot.press("enter")
            await settle(pilot, app, lambda: app.screen.__class__.__name__ == "WalkScreen")
            walk_screen = app.screen
            for _ in range(12):
                await settle(pilot, app, lambda: walk_screen.outcome is not None
                             and walk_screen.outcome.node.id == walk_screen.walk.current)
                if walk_screen.outcome.chosen is None:
                    break
                await pilot.press("n")
            assert walk_screen.walk.current == "diag-layers"
            assert "diagnosis" in text_of(walk_screen, "#next")
            assert not walk_screen.query_one("#explain").display
            await pilot.press("l")
            assert walk_screen.query_one("#explain").display
            sid = app.log_file.id
            await pilot.press("q")
        events = load_events(sid)
        types = [e["type"] for e in events]
        assert types[0] == "session_start" and types[-1] == "session_end"
        assert "edge" in types and "node_enter" in types

    asyncio.run(scenario())
