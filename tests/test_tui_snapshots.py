"""Screens as a terminal shows them, compared with stored text renders at 80x24 and 120x40.

The data is fixed (the bundled practice scenario, replayed) and nothing in a captured frame comes from a
clock: probe times are the recorded ones and no spinner runs once a step is evaluated. When a change to
a screen is intended, regenerate the stored renders and review the diff:

    ZDOCTOR_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_tui_snapshots.py
"""

from __future__ import annotations

import asyncio
import difflib
import json
import os

import pytest
from conftest import FIXTURES
from test_tui import SCENARIO, make, name, screen_text, settle, step_ready

from zdoctor.core import registry
from zdoctor.walk import playbook
from zdoctor.walk.practice import get_scenario

STORE = FIXTURES / "tui"
SIZES = [(80, 24), (120, 40)]
UPDATE = bool(os.environ.get("ZDOCTOR_UPDATE_SNAPSHOTS"))


def compare(label: str, size: tuple[int, int], text: str) -> None:
    path = STORE / f"{label}-{size[0]}x{size[1]}.txt"
    text = "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
    if UPDATE or not path.exists():
        STORE.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if not UPDATE:
            pytest.fail(f"{path.name} did not exist and was written; review it and run again")
        return
    stored = path.read_text(encoding="utf-8")
    if stored != text:
        diff = "\n".join(difflib.unified_diff(stored.splitlines(), text.splitlines(), f"stored {path.name}",
                                              "now", lineterm=""))
        pytest.fail(f"{label} at {size[0]}x{size[1]} changed (ZDOCTOR_UPDATE_SNAPSHOTS=1 rewrites it):\n{diff}")


async def quiet(pilot, app) -> None:
    """No toasts and no pending refresh in the captured frame."""
    app.clear_notifications()
    await pilot.pause(0.2)


@pytest.fixture
def stable_vocabulary(monkeypatch):
    """The start screen lists every bundled playbook and runs every registered check; keep the ones the
    scenario was recorded for, so that new playbooks and checks of other subjects do not change it."""
    registry.load_vocabulary()
    recorded = set(json.loads(get_scenario(SCENARIO).snapshot.read_text())["probes"])
    for name_, spec in list(registry.CHECKS.items()):
        if not set(spec.probes) <= recorded:
            monkeypatch.delitem(registry.CHECKS, name_)
    for name_ in list(registry.PROBES):
        if name_ not in recorded:
            monkeypatch.delitem(registry.PROBES, name_)
    books = {k: v for k, v in playbook.load_all().items() if k in ("zero3-launch", "toolchain")}
    monkeypatch.setattr(playbook, "load_all", lambda *a, **k: dict(books))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_start_screen(tmp_path, size, stable_vocabulary):
    async def scenario() -> None:
        app = make(host=get_scenario(SCENARIO).host(), argv=["tui"], export_dir=tmp_path)
        async with app.run_test(size=size) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen" and app.screen.findings is not None
                         and app.screen.sessions is not None)
            await quiet(pilot, app)
            compare("start", size, screen_text(app))

    asyncio.run(scenario())


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_walk_evidence_and_remedy_screens(tmp_path, size):
    async def scenario() -> None:
        app = make(demo=SCENARIO, export_dir=tmp_path)
        async with app.run_test(size=size) as pilot:
            for _ in range(2):
                await step_ready(pilot, app)
                await pilot.press("n")
            await step_ready(pilot, app)
            assert app.screen.walk.current == "needs"
            await quiet(pilot, app)
            compare("walk", size, screen_text(app))
            await pilot.press("e")
            await settle(pilot, lambda: name(app) == "EvidenceScreen")
            await quiet(pilot, app)
            compare("evidence", size, screen_text(app))
            await pilot.press("escape")
            for _ in range(5):
                await step_ready(pilot, app)
                await pilot.press("n")
            await step_ready(pilot, app)
            assert app.screen.walk.current == "diag-ld-library-path"
            await pilot.press("r")
            await settle(pilot, lambda: name(app) == "RemedyScreen")
            await quiet(pilot, app)
            compare("remedy", size, screen_text(app))

    asyncio.run(scenario())


def test_screenshots_export_as_svg(tmp_path):
    async def scenario() -> None:
        app = make(demo=SCENARIO, export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await step_ready(pilot, app)
            svg = app.export_screenshot()
            assert svg.startswith("<svg") and "symptom" in svg

    asyncio.run(scenario())


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_fleet_node_and_fact_screens(size):
    """Five H200 nodes from the real capture: one on an older driver, one with a conda LD_LIBRARY_PATH, one
    unreachable."""
    from fleetkit import h200_report

    from zdoctor.front import tui

    async def scenario() -> None:
        app = tui._screens_fleet().make_fleet_app(h200_report())
        async with app.run_test(size=size) as pilot:
            await settle(pilot, lambda: name(app) == "FleetScreen")
            await quiet(pilot, app)
            compare("fleet", size, screen_text(app))
            await pilot.press("down", "enter")
            await settle(pilot, lambda: name(app) == "FleetNodeScreen")
            await quiet(pilot, app)
            compare("fleet-node", size, screen_text(app))
            await pilot.press("escape", "f", "enter")
            await settle(pilot, lambda: name(app) == "FleetFactScreen")
            await quiet(pilot, app)
            compare("fleet-fact", size, screen_text(app))

    asyncio.run(scenario())
