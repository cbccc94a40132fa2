"""Ctrl-C in the guide leaves as ``q`` does (the session is closed and recorded as ended), on every screen and
over a widget that would otherwise take it for copying; copying a remedy's commands keeps its own key."""

from __future__ import annotations

import asyncio

from conftest import FIXTURES
from test_tui import SCENARIO, make, name, settle, walk_to_diagnosis

from zdoctor.host import ReplayHost
from zdoctor.walk.session import load_events


def leave_with(key: str, tmp_path) -> tuple[int | None, list[dict]]:
    """Open the guide on a recorded healthy node, wait for the first pass, press ``key``: the app's return
    code once it is gone (None while it still runs) and the session's recorded events."""
    seen: dict = {}

    async def scenario() -> None:
        host = ReplayHost.load(str(FIXTURES / "snapshots" / "healthy.json"))
        app = make(host=host, argv=["tui"], export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen" and app.screen.findings is not None,
                         what="the first pass")
            seen["sid"] = app.ctx.log.id
            await pilot.press(key)
            await settle(pilot, lambda: app.return_code is not None, what="the app to leave")
            seen["code"] = app.return_code
    asyncio.run(scenario())
    return seen["code"], load_events(seen["sid"])


def test_ctrl_c_leaves_the_guide_as_q_does(tmp_path):
    code_q, events_q = leave_with("q", tmp_path / "q")
    code_c, events_c = leave_with("ctrl+c", tmp_path / "c")
    assert code_c == code_q
    assert events_q[-1]["type"] == "session_end"
    assert events_c[-1]["type"] == "session_end"
    assert events_c[-1].get("exit_code") == events_q[-1].get("exit_code")


def test_ctrl_c_on_the_remedy_screen_leaves_and_y_still_copies(tmp_path):
    seen: dict = {}

    async def scenario() -> None:
        app = make(demo=SCENARIO, export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await walk_to_diagnosis(pilot, app)
            await pilot.press("r")
            await settle(pilot, lambda: name(app) == "RemedyScreen")
            await pilot.press("y")
            seen["clipboard"] = app.clipboard
            seen["sid"] = app.ctx.log.id
            await pilot.press("ctrl+c")
            await settle(pilot, lambda: app.return_code is not None, what="the app to leave")
    asyncio.run(scenario())
    assert seen["clipboard"] == "unset LD_LIBRARY_PATH\n"
    assert load_events(seen["sid"])[-1]["type"] == "session_end"
