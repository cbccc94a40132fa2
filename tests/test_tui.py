"""The guided session, driven through Textual's Pilot on replayed snapshots: start screen, the walk of
the practice scenario to its diagnosis, another branch, evidence, remedies applied through the confirm
modal (and declined), export, a slow probe cancelled, the keys, the palette, and resume."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES
from rich.console import Console

from zdoctor.core.errors import InputError, UsageError
from zdoctor.core.model import ProbeResult
from zdoctor.core.registry import load_vocabulary
from zdoctor.front.tui import _screens_app
from zdoctor.host import LiveHost, ReplayHost, snapshot_document
from zdoctor.report.export import render
from zdoctor.walk.practice import get_scenario
from zdoctor.walk.session import load_events

SCENARIO = "conda-ld-library-path"
STORY_PATH = ["symptom", "loaded", "needs", "layers", "verify", "source", "fix-ld-library-path",
              "diag-ld-library-path"]


def make(**kw):
    return _screens_app().make_app(**kw)


def run(coro) -> None:
    asyncio.run(coro)


async def settle(pilot, predicate, timeout: float = 15.0, what: str = "the expected state") -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if loop.time() >= end:
            raise AssertionError(f"the UI did not reach {what}; the screen shows:\n{screen_text(pilot.app)}")
        await pilot.pause(0.05)


def screen_text(app) -> str:
    """The screen as plain text, the way a terminal shows it (no colour)."""
    w, h = app.size
    console = Console(width=w, height=h, file=io.StringIO(), record=True, color_system=None, force_terminal=True,
                      legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


def plain(widget, width: int = 200) -> str:
    """What a Static shows, as plain text (rich renderables included)."""
    content = widget.content
    if isinstance(content, str):
        return content
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None, legacy_windows=False)
    console.print(content)
    return console.export_text()


def name(app) -> str:
    return type(app.screen).__name__


async def step_ready(pilot, app) -> None:
    """Wait until the walk screen has evaluated its current node."""
    await settle(pilot, lambda: name(app) == "WalkScreen" and (app.screen.outcome is not None or app.screen.walk.done)
                 and app.screen.outcome is not None and app.screen.outcome.node.id == app.screen.walk.current,
                 what="an evaluated step")


async def walk_to_diagnosis(pilot, app, limit: int = 12) -> list[str]:
    for _ in range(limit):
        await step_ready(pilot, app)
        if app.screen.walk.node.kind == "diagnosis":
            return list(app.screen.walk.path)
        await pilot.press("n")
    raise AssertionError(f"no diagnosis after {limit} steps: {app.screen.walk.path}")


def stale_lock_snapshot(tmp_path: Path) -> tuple[dict, Path]:
    """A snapshot recorded for real from this machine: a JIT op dir with a `lock` nobody holds."""
    ext = tmp_path / "ext"
    lock = ext / "cpu_adam" / "lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    load_vocabulary()
    host = LiveHost(python=sys.executable, env={**os.environ, "TORCH_EXTENSIONS_DIR": str(ext)})
    host.results(["jitcache", "processes"])
    return snapshot_document(host), lock


# --- start screen --------------------------------------------------------------------------------

def test_start_screen_then_walk_a_playbook_to_its_diagnosis(tmp_path):
    async def scenario() -> None:
        host = ReplayHost.load(str(FIXTURES / "snapshots" / "healthy.json"))
        app = make(host=host, argv=["tui"], export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen" and app.screen.findings is not None,
                         what="the first pass")
            start = app.screen
            glance = plain(start.query_one("#glance"))
            assert "vm" in glance and "Debian GNU/Linux 12" in glance
            assert "Target: /opt/train-env/bin/python" in glance and "torch 2.13.0+cpu" in glance
            first = plain(start.query_one("#pass-findings")) + plain(start.query_one("#pass-rest"))
            assert "✓" in first and "torch 2.13.0+cpu imports" in first
            menu = start.query_one("#start-menu")
            ids = [menu.get_option_at_index(i).id for i in range(menu.option_count)]
            assert "pb:zero3-launch" in ids and "pb:toolchain" in ids and f"demo:{SCENARIO}" in ids
            assert ids[menu.highlighted] == "pb:zero3-launch"
            while ids[menu.highlighted] != "pb:toolchain":
                await pilot.press("down")
            await pilot.press("enter")
            path = await walk_to_diagnosis(pilot, app)
            walk_screen = app.screen
            # healthy.json records every probe the steps declare (jitprereq included, for the target
            # interpreter): the healthy end is reached from what was checked (the same snapshot without
            # jitprereq ends not checked: test_no_false_allclear)
            assert path[-2:] == ["layers", "diag-layers"], path
            assert walk_screen.walk.playbook.nodes[path[-1]].healthy
            assert "Diagnosis:" in plain(walk_screen.query_one("#verdict"))
            assert not walk_screen.query_one("#explain").display
            await pilot.press("l")
            assert walk_screen.query_one("#explain").display
            await pilot.press("n")  # finish the walk
            await settle(pilot, lambda: walk_screen.walk.done, what="the end of the walk")
            sid = app.ctx.log.id
            await pilot.press("escape")
            # back to the same start screen, its first pass kept (not a new one over it)
            assert app.screen is start and len(app.screen_stack) == 1
            await pilot.press("q")
        events = load_events(sid)
        types = [e["type"] for e in events]
        assert types[0] == "session_start" and types[-1] == "session_end"
        assert "edge" in types and "node_enter" in types and "playbook_end" in types
        probes = [e["result"]["probe"] for e in events if e["type"] == "probe_result"]
        assert probes and len(probes) == len(set(probes))  # the first pass and the walk share results

    run(scenario())


# --- the practice scenario -----------------------------------------------------------------------

def test_practice_walk_reaches_the_diagnosis_with_its_evidence(tmp_path):
    async def scenario() -> None:
        app = make(demo=SCENARIO, argv=["--demo", SCENARIO], export_dir=tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await step_ready(pilot, app)
            ws = app.screen
            assert ws.ctx.practice and "practice: conda-ld-library-path" in screen_text(app)
            assert "Why this step:" in plain(ws.query_one("#why"))
            probes = plain(ws.query_one("#node-probes"))
            assert "Probes read: livetrace 9.91 s" in probes and "✓" not in probes  # the recorded duration
            for _ in range(2):
                await pilot.press("n")
                await step_ready(pilot, app)
            assert ws.walk.current == "needs"
            inline = plain(ws.query_one("#node-table"))
            assert "needed vs provided" in inline and "⚠" in inline and "GLIBCXX_3.4.30" in inline
            await pilot.press("e")
            await settle(pilot, lambda: name(app) == "EvidenceScreen", what="the evidence screen")
            tables = list(app.screen.query("DataTable"))
            assert tables and any(t.row_count >= 20 for t in tables)
            needed = next(t for t in tables if t.row_count >= 20)
            hot = [i for i in range(needed.row_count) if str(needed.get_row_at(i)[0]) == "⚠"]
            assert hot and "GLIBCXX_3.4.30" in " ".join(str(c) for c in needed.get_row_at(hot[0]))
            await pilot.press("escape")
            await pilot.press("g")
            await settle(pilot, lambda: name(app) == "TextScreen", what="the graph")
            graph = plain(app.screen.query_one("#text-content"))
            assert "● needs" in graph and "✓ symptom" in graph and "⇒ loaded" in graph
            await pilot.press("escape")
            path = await walk_to_diagnosis(pilot, app)
            assert path == STORY_PATH
            assert "An LD_LIBRARY_PATH entry loads an old libstdc++" in plain(ws.query_one("#verdict"))
            await pilot.press("l")
            assert "The story" not in plain(ws.query_one("#explain"))  # the story sits at the start
            await pilot.press("n")
            await settle(pilot, lambda: ws.walk.done, what="the end of the walk")
            sid = app.ctx.log.id
        events = load_events(sid)
        assert events[0]["mode"] == "demo" and events[0]["host"]["scenario"] == SCENARIO
        end = next(e for e in events if e["type"] == "playbook_end")
        assert end["path"] == STORY_PATH and end["diagnosis"] == "diag-ld-library-path"

    run(scenario())


def test_taking_another_branch_is_recorded_as_the_users_choice(tmp_path):
    async def scenario() -> None:
        app = make(demo=SCENARIO, export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await step_ready(pilot, app)
            ws = app.screen
            branches = ws.query_one("#branches")
            targets = [c.edge.to for c in ws.outcome.candidates]
            assert targets[branches.highlighted] == "loaded"  # the suggested step is preselected
            await pilot.press("b")
            assert "build-log" in targets  # the hang branch reads the JIT build logs first
            while targets[branches.highlighted] != "build-log":
                await pilot.press("up")
            await pilot.press("enter")
            await step_ready(pilot, app)
            assert ws.walk.path == ["symptom", "build-log"]
            sid = app.ctx.log.id
        edge = next(e for e in load_events(sid) if e["type"] == "edge")
        assert edge["to"] == "build-log" and edge["override"] is True
        assert edge["reason"].startswith("user chose build-log over loaded")

    run(scenario())


# --- remedies ------------------------------------------------------------------------------------

def test_remedy_is_applied_only_after_yes_and_recorded(tmp_path):
    doc, lock = stale_lock_snapshot(tmp_path)

    async def scenario() -> None:
        app = make(host=ReplayHost(doc, source="stale-lock"), argv=["tui"], export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen")
            await pilot.press("o")  # zero3-launch is highlighted first
            path = await walk_to_diagnosis(pilot, app)
            assert path == ["symptom", "diag-stale-lock"]
            await pilot.press("r")
            await settle(pilot, lambda: name(app) == "RemedyScreen", what="the remedy screen")
            rs = app.screen
            commands = plain(rs.query_one("#rem-commands"))
            assert f"cd -- {lock.parent.name} && test ! -L lock && rm -f -- lock)" in commands
            await pilot.press("a")
            await settle(pilot, lambda: name(app) == "ConfirmApply", what="the confirmation")
            assert app.focused is not None and app.focused.id == "no"  # the default answer is No
            assert "Runs here, on" in plain(app.screen.query_one("#confirm-notes"))
            await pilot.press("enter")
            await settle(pilot, lambda: name(app) == "RemedyScreen")
            assert lock.exists()
            assert "Declined" in plain(rs.query_one("#rem-result"))
            await pilot.press("a")
            await settle(pilot, lambda: name(app) == "ConfirmApply")
            await pilot.press("y")
            await settle(pilot, lambda: "applied: exit code 0" in plain(rs.query_one("#rem-result")),
                         what="the remedy to finish")
            assert not lock.exists()
            result = plain(rs.query_one("#rem-result"))
            assert f"What changed: removed {lock}" in result
            assert f"removed {lock}" in rs.query_one("#rem-log").lines  # by the core, not by the line
            await pilot.press("x")
            await settle(pilot, lambda: name(app) == "ExportScreen")
            await pilot.press("m")
            await settle(pilot, lambda: "Written:" in plain(app.screen.query_one("#export-result")))
            sid = app.ctx.log.id
        events = load_events(sid)
        declined = [e for e in events if e["type"] == "remedy_declined"]
        applied = [e for e in events if e["type"] == "remedy_applied"]
        assert [d["how"] for d in declined] == ["answered No in the confirmation"]
        (ev,) = applied
        assert ev["ok"] is True and ev["exit_code"] == 0 and ev["changed"] == [f"removed {lock}"]
        assert ev["finding_id"].startswith("hangs.stale-lock") and ev["node"] == "diag-stale-lock"
        md = (tmp_path / f"zdoctor-{sid}.md").read_text()
        # One fix declined, one applied: the heading says what was done with them, not "applied" of both.
        assert "## What was done with the fixes" in md and "Remove the stale lock of op cpu\\_adam (applied)" in md
        assert "removed" in md

    run(scenario())


def test_decline_and_copy_keys(tmp_path):
    async def scenario() -> None:
        app = make(demo=SCENARIO, export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await walk_to_diagnosis(pilot, app)
            await pilot.press("r")
            await settle(pilot, lambda: name(app) == "RemedyScreen")
            rs = app.screen
            effect = plain(rs.query_one("#rem-effect"))
            assert "LD_LIBRARY_PATH" in effect and "/opt/conda/lib" in effect and "(unset)" in effect
            await pilot.press("y")
            assert app.clipboard == "unset LD_LIBRARY_PATH\n"
            await pilot.press("d")
            await pilot.press("down", "a")
            await settle(pilot, lambda: name(app) == "ConfirmApply")
            assert "Practice: nothing is run" in plain(app.screen.query_one("#confirm-notes"))
            await pilot.press("y")
            await settle(pilot, lambda: "Practice" in plain(rs.query_one("#rem-result")))
            sid = app.ctx.log.id
        events = load_events(sid)
        (declined,) = [e for e in events if e["type"] == "remedy_declined"]
        assert declined["how"] == "declined" and declined["remedy"]["commands"] == ["unset LD_LIBRARY_PATH"]
        (practised,) = [e for e in events if e["type"] == "remedy_practised"]
        assert practised["remedy"]["title"].startswith("Preload")
        assert not [e for e in events if e["type"] == "remedy_applied"]  # practice never runs anything

    run(scenario())


# --- export --------------------------------------------------------------------------------------

def test_export_from_the_palette_and_the_key(tmp_path):
    async def scenario() -> None:
        app = make(demo=SCENARIO, export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await step_ready(pilot, app)
            sid = app.ctx.log.id
            await pilot.press("ctrl+p")
            await settle(pilot, lambda: name(app) == "CommandPalette", what="the palette")
            await pilot.press(*"Export: JSON")
            await pilot.pause(0.4)
            await pilot.press("enter")
            await settle(pilot, lambda: (tmp_path / f"zdoctor-{sid}.json").exists(), what="the JSON export")
            await settle(pilot, lambda: any(str(tmp_path) in str(n.message) for n in app._notifications),
                         what="the path in a notification")
            await pilot.press("x")
            await settle(pilot, lambda: name(app) == "ExportScreen")
            await pilot.press("h")
            await settle(pilot, lambda: "Written:" in plain(app.screen.query_one("#export-result")))
            shown = plain(app.screen.query_one("#export-result"))
            assert str(tmp_path / f"zdoctor-{sid}.html") in shown
        doc = json.loads((tmp_path / f"zdoctor-{sid}.json").read_text())
        assert doc["format"] == "zdoctor-session" and doc["mode"] == "demo"
        assert (tmp_path / f"zdoctor-{sid}.html").read_text().startswith("<!DOCTYPE html>")

    run(scenario())


# --- probes that take their time -----------------------------------------------------------------

class SlowTrace(ReplayHost):
    """The practice scenario, except that the live trace never comes back."""

    def _compute(self, name: str) -> ProbeResult:
        if name == "livetrace":
            self.hold.wait(60)
        return super()._compute(name)


def test_a_slow_probe_shows_its_time_and_can_be_cancelled(tmp_path):
    import threading

    host = SlowTrace(json.loads(get_scenario(SCENARIO).snapshot.read_text()))
    host.hold = threading.Event()

    async def scenario() -> None:
        app = make(host=host, argv=["tui"], export_dir=tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen")
            await pilot.press("o")
            await settle(pilot, lambda: name(app) == "WalkScreen")
            ws = app.screen
            panel = ws.query_one("#node-probes")
            await settle(pilot, lambda: "livetrace" in plain(panel) and "s of" in plain(panel),
                         what="a running probe with its elapsed time")
            running = plain(panel)
            assert "What the real loader does (LD_DEBUG)" in running and "of 150 s" in running
            await pilot.press("n")  # nothing to follow yet: the UI says so and stays live
            await settle(pilot, lambda: any("Still probing" in str(n.message) for n in app._notifications))
            await pilot.press("c")
            await step_ready(pilot, app)
            assert "livetrace cancelled" in plain(panel)
            crash = [f for f in ws.findings if f.id == "probe.livetrace"]
            assert crash and "cancelled by the user" in crash[0].detail
            host.hold.set()

    run(scenario())


def test_probe_line_says_when_a_probe_is_past_its_budget():
    import importlib

    common = importlib.import_module(_screens_app().__package__ + ".common")
    ProbeState, probe_line = common.ProbeState, common.probe_line

    st = ProbeState("pyenv", "Target Python interpreter", 2.0, started=100.0)
    assert "1.0 s of 2 s" in str(probe_line(st, 101.0))
    late = str(probe_line(st, 103.5))
    assert "3.5 s of 2 s" in late and "past its 2 s budget: c cancels it" in late


# --- keys, help, palette, glossary, sizes --------------------------------------------------------

def test_every_key_is_shown_and_found(tmp_path):
    async def scenario() -> None:
        app = make(demo=SCENARIO, export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await step_ready(pilot, app)
            ws = app.screen
            for size in ((80, 24), (60, 20), (120, 40)):
                await pilot.resize_terminal(*size)
                await pilot.pause(0.2)
                bar = plain(ws.query_one("KeyBar"))
                for key, desc in (("n", "Next step"), ("b", "Other branch"), ("p", "Previous step"),
                                  ("e", "Evidence"), ("r", "Fixes"),
                                  ("l", "Learn more"), ("g", "Graph"), ("c", "Cancel probes"), ("esc", "Back"),
                                  ("?", "Keys"), ("t", "Terms"), ("x", "Export"), ("q", "Quit")):
                    assert f"{key} {desc}" in bar, (size, key, bar)
                assert all(len(line) <= size[0] for line in screen_text(app).splitlines())
            await pilot.press("question_mark")
            await settle(pilot, lambda: name(app) == "HelpScreen")
            keys = screen_text(app)
            assert "Next step" in keys and "Export" in keys and "Ctrl+P" in keys
            await pilot.press("escape")
            await pilot.press("t")
            await settle(pilot, lambda: name(app) == "GlossaryScreen")
            terms = app.screen.query_one("#terms")
            labels = [str(terms.get_option_at_index(i).prompt) for i in range(terms.option_count)]
            assert any(label.startswith("symbol versioning") for label in labels)
            while not str(terms.get_option_at_index(terms.highlighted).prompt).startswith("symbol versioning"):
                await pilot.press("down")
            assert "name@@VERSION" in plain(app.screen.query_one("#term-text"))
            await pilot.press("escape")
            assert app.screen is ws
            titles = [c.title for c in app.get_system_commands(ws)]
            for title in ("Walk: Next step", "Walk: Evidence", "Walk: Fixes", "Walk: Graph", "Export: Markdown",
                          "Export: HTML", "Export: JSON", "Help: keys", "Learn: glossary"):
                assert title in titles
            await pilot.press("ctrl+p")
            await settle(pilot, lambda: name(app) == "CommandPalette")
            await pilot.press(*"Walk: Next step")
            await pilot.pause(0.4)
            await pilot.press("enter")
            await settle(pilot, lambda: ws.walk.current == "loaded", what="the palette to take the step")

    run(scenario())


# --- resume --------------------------------------------------------------------------------------

def test_resume_picks_up_where_the_walk_stopped(tmp_path):
    from test_tui_core import record_partial_walk

    sid, path = record_partial_walk(2)

    async def scenario() -> None:
        app = make(resume="", argv=["--resume"], export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await step_ready(pilot, app)
            ws = app.screen
            assert ws.walk.path == path and ws.walk.current == "needs"
            assert "1 symptom › 2 loaded › 3 needs" in plain(ws.query_one("#crumbs"))
            assert " libs 4.13 s" in plain(ws.query_one("#node-probes"))  # the evidence gathered before
            assert [type(s).__name__ for s in app.screen_stack[1:]] == ["WalkScreen"]
            assert await walk_to_diagnosis(pilot, app) == STORY_PATH
            await pilot.press("x", "m")
            await settle(pilot, lambda: (tmp_path / f"zdoctor-{sid}.md").exists())
            await pilot.press("escape", "escape")  # the export, then the walk: it asks before leaving
            await settle(pilot, lambda: name(app) == "AskScreen", what="the question before leaving")
            await pilot.press("y")
            await settle(pilot, lambda: name(app) == "PracticeScreen", what="the practice list")
        md = (tmp_path / f"zdoctor-{sid}.md").read_text()
        assert "- **Resumed:**" in md and "8. `diag-ld-library-path` (diagnosis)" in md

    run(scenario())


def test_bad_demo_or_resume_fails_before_drawing(state_home):
    with pytest.raises(UsageError, match="no practice scenario 'nope'"):
        make(demo="nope")
    with pytest.raises(InputError, match="no guided session to resume"):
        make(resume="")
    with pytest.raises(InputError, match="invalid session id"):
        make(resume="../../etc/passwd")


def test_glance_shows_the_gpus_of_a_real_h200_node():
    """The node at a glance, with the GPUs NVML reported on a real H200 node."""
    import importlib

    from zdoctor.core.model import ProbeResult
    from zdoctor.layers.gpu.nvml import from_capture

    start = importlib.import_module(_screens_app().__package__ + ".start")
    doc = json.loads(get_scenario(SCENARIO).snapshot.read_text())
    facts = from_capture(json.loads((FIXTURES / "gpu-node-h200" / "nvml.json").read_text()))
    doc["probes"]["nvml"] = ProbeResult(probe="nvml", facts=facts).to_dict()
    host = ReplayHost(doc)
    host.results(["system", "pyenv", "nvml"])
    text = start.glance_text(host).plain
    assert "GPUs: 1 × NVIDIA H200 (140.4 GiB) · driver 580.159.04" in text
    assert "train-node-01" in text and "DeepSpeed 0.19.8" in text
    doc["probes"]["nvml"] = ProbeResult(probe="nvml", status="skip", error="no usable NVIDIA driver").to_dict()
    host = ReplayHost(doc)
    host.results(["nvml"])
    assert "GPUs: none usable (no usable NVIDIA driver)" in start.glance_text(host).plain


def test_a_step_that_needs_the_terminal_falls_back_when_it_cannot_have_it(tmp_path):
    """A sudo line wants the terminal (for a password); where the app cannot hand it over, the step runs
    without it, says so, and the failure is recorded like any other."""
    import importlib

    from zdoctor.core.model import Finding, Remedy

    remedy_mod = importlib.import_module(_screens_app().__package__ + ".remedy")
    marker = tmp_path / "never"
    finding = Finding(id="demo.root", status="fail", title="needs root")
    remedy = Remedy("Needs a password", [f"sudo -n touch {marker}"], verified=None)

    async def scenario() -> None:
        app = make(host=get_scenario(SCENARIO).host(), argv=["tui"], export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen")
            app.push_screen(remedy_mod.RemedyScreen(app.ctx, "zero3-launch", "symptom", [(finding, remedy)]))
            await settle(pilot, lambda: name(app) == "RemedyScreen")
            rs = app.screen
            await pilot.press("a")
            await settle(pilot, lambda: name(app) == "ConfirmApply")
            assert "Runs in the terminal: a line runs sudo" in plain(app.screen.query_one("#confirm-notes"))
            await pilot.press("y")
            await settle(pilot, lambda: "failed" in plain(rs.query_one("#rem-result")), what="the failed step")
            assert "cannot be handed over" in "\n".join(rs.query_one("#rem-log").lines)
            sid = app.ctx.log.id
        (ev,) = [e for e in load_events(sid) if e["type"] == "remedy_applied"]
        assert ev["ok"] is False and ev["exit_code"] != 0 and ev["interactive"] is False
        assert not marker.exists()

    run(scenario())


def test_part_two_of_the_story_walks_to_the_nvme_fix(tmp_path):
    """The offload playbook in the guide: the slow-SSD practice scenario, step by step to its diagnosis."""
    async def scenario() -> None:
        app = make(demo="slow-ssd-offload", argv=["--demo", "slow-ssd-offload"], export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            path = await walk_to_diagnosis(pilot, app)
            assert path == ["config", "time", "ram", "device", "speed", "spare-nvme", "fix-mount", "fix-config",
                            "diag-nvme-offload"]
            assert "Offload to a fast NVMe mount" in plain(app.screen.query_one("#verdict"))

    run(scenario())


def test_the_gpu_stack_playbook_walks_on_a_recorded_h200(tmp_path):
    """The GPU playbook in the guide, on the real H200 node's recorded facts."""
    from test_gpu_facts import h200_all

    load_vocabulary()
    probes = {name: ProbeResult(probe=name, facts=facts).to_dict() for name, facts in h200_all().items()}
    doc = {"format": "zdoctor-snapshot", "version": 1, "zdoctor": "test", "created": 0.0,
           "host": {"hostname": "h200-node"}, "probes": probes}

    async def scenario() -> None:
        app = make(host=ReplayHost(doc), argv=["tui"], export_dir=tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen" and app.screen.findings is not None,
                         what="the first pass")
            assert "H200" in plain(app.screen.query_one("#glance"))
            menu = app.screen.query_one("#start-menu")
            ids = [menu.get_option_at_index(i).id for i in range(menu.option_count)]
            while ids[menu.highlighted] != "pb:gpu-stack":
                await pilot.press("down")
            await pilot.press("enter")
            path = await walk_to_diagnosis(pilot, app, limit=16)
            assert path[-1] == "diag-healthy" and len(path) > 5

    run(scenario())


# --- leaving, going back, and a healthy branch against a failing finding ---------------------------

def test_esc_asks_before_leaving_a_walk_and_previous_step_goes_back(tmp_path):
    async def scenario() -> None:
        app = make(demo=SCENARIO, export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await step_ready(pilot, app)
            ws = app.screen
            for _ in range(2):
                await pilot.press("n")
                await step_ready(pilot, app)
            assert ws.walk.path == ["symptom", "loaded", "needs"]
            await pilot.press("escape")
            await settle(pilot, lambda: name(app) == "AskScreen", what="the question before leaving")
            text = screen_text(app)
            assert "Leave the walk of zero3-launch at step 3?" in text and "Previous step (p)" in text
            await pilot.press("enter")  # the default: stay
            await settle(pilot, lambda: app.screen is ws, what="the walk again")
            assert ws.walk.path == ["symptom", "loaded", "needs"]
            await pilot.press("escape")
            await settle(pilot, lambda: name(app) == "AskScreen")
            await pilot.press("p")  # previous step, from the question
            await step_ready(pilot, app)
            assert app.screen is ws and ws.walk.path == ["symptom", "loaded"] and ws.walk.current == "loaded"
            await pilot.press("p")  # previous step, from the walk
            await step_ready(pilot, app)
            assert ws.walk.path == ["symptom"]
            assert "1 symptom" in plain(ws.query_one("#crumbs")) and "loaded" not in plain(ws.query_one("#crumbs"))
            await pilot.press("n")
            await step_ready(pilot, app)
            assert ws.walk.path == ["symptom", "loaded"]
            await pilot.press("escape")
            await settle(pilot, lambda: name(app) == "AskScreen")
            await pilot.press("y")
            await settle(pilot, lambda: name(app) not in ("AskScreen", "WalkScreen"), what="the walk left")
            sid = app.ctx.log.id
        events = load_events(sid)
        backs = [(e["from"], e["to"]) for e in events if e["type"] == "step_back"]
        assert backs == [("needs", "loaded"), ("loaded", "symptom")]
        from zdoctor.walk.resume import read_point

        assert read_point(sid).nodes == ["symptom", "loaded"]

    run(scenario())


def test_a_healthy_branch_against_a_failing_finding_asks_first(tmp_path):
    async def scenario() -> None:
        app = make(demo=SCENARIO, export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await step_ready(pilot, app)
            ws = app.screen
            for _ in range(2):
                await pilot.press("n")
                await step_ready(pilot, app)
            assert ws.walk.current == "needs" and any(f.status == "fail" for f in ws.findings)
            branches = ws.query_one("#branches")
            targets = [c.edge.to for c in ws.outcome.candidates]
            assert ws.walk.playbook.nodes["diag-healthy"].healthy
            await pilot.press("b")
            while targets[branches.highlighted] != "diag-healthy":
                await pilot.press("down")
            await pilot.press("enter")
            await settle(pilot, lambda: name(app) == "AskScreen", what="the warning")
            text = screen_text(app)
            assert "anyway?" in text and " of this walk fail" in text and "(libs." in text
            await pilot.press("enter")  # the default keeps the suggested step
            await settle(pilot, lambda: app.screen is ws)
            assert ws.walk.path == ["symptom", "loaded", "needs"]
            await pilot.press("b")
            while targets[branches.highlighted] != "diag-healthy":
                await pilot.press("down")
            await pilot.press("enter")
            await settle(pilot, lambda: name(app) == "AskScreen")
            await pilot.press("y")
            await step_ready(pilot, app)
            assert ws.walk.path[-1] == "diag-healthy"
            # A branch that is not a healthy diagnosis is taken without a question.
            sid = app.ctx.log.id
        edge = [e for e in load_events(sid) if e["type"] == "edge"][-1]
        assert edge["to"] == "diag-healthy" and edge["override"] is True

    run(scenario())


def test_start_screen_at_80x24_without_torch_says_what_to_do_next(tmp_path):
    """A python3 without torch: the warning is on the first screen, names the path of the Target line, and
    the start ends with one "what to do next" line."""
    import subprocess

    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python3")  # the first python3 on PATH, as a new user runs zdoctor
    env = dict(os.environ, PATH=f"{venv / 'bin'}:{os.environ['PATH']}")

    async def scenario() -> None:
        app = make(host=LiveHost(env=env), argv=["tui"], export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen" and app.screen.findings is not None,
                         timeout=120, what="the first pass")
            app.clear_notifications()
            await pilot.pause(0.3)
            text = screen_text(app)
            lines = text.splitlines()
            flat = "".join("".join(lines).split())  # long paths wrap: compare without any white space
            assert f"Target:{python}Python" in flat and "notorch" in flat
            assert f"!torchisnotinstalledin{python}:" in flat
            torch_finding = next(f for f in app.screen.findings if f.id == "pyenv.torch-import")
            assert torch_finding.title == f"torch is not installed in {python}"
            nexts = [x.strip() for x in lines if x.strip().startswith("Next:")]
            assert nexts == ["Next: name the training interpreter: zdoctor --python /path/to/env/bin/python"]
            menu_top = next(i for i, x in enumerate(lines) if "Playbooks: walk one step" in x)
            between = [x for x in lines[lines.index(next(x for x in lines if x.strip().startswith("Next:"))) + 1:
                                         menu_top] if x.strip().strip("─")]
            # the Next line ends the start: only the box for the error you saw stands between it and the menu
            assert [x.strip() for x in between] == ["s: paste the error you saw (optional), then Enter"]

    run(scenario())


def test_the_next_step_is_explained_in_words_not_predicate_names(tmp_path):
    """The verdict line says why in the edge's own words; the engine's ``predicate NAME is true`` record
    belongs to the JSON log, not to the sentence under "Next →"."""
    async def scenario() -> None:
        app = make(demo=SCENARIO, export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            verdicts = {}
            for _ in range(len(STORY_PATH) - 1):
                await step_ready(pilot, app)
                verdicts[app.screen.walk.current] = plain(app.screen.query_one("#verdict"))
                await pilot.press("n")
            assert "because a needed version is missing\n" in verdicts["needs"]
            assert "because an LD_LIBRARY_PATH entry supplies the old copy\n" in verdicts["source"]
            for node, text in verdicts.items():
                assert "predicate" not in text and "glibcxx_missing" not in text, (node, text)

    run(scenario())


def test_the_nvme_fix_is_shown_as_steps_in_order_not_alternatives(tmp_path):
    """Format, mount by UUID, create the directory: one fix in three steps. The fix screen and the
    exports say "Step 1/2/3 ... in order", never "pick one" nor "recommended" (formatting alone fixes
    nothing)."""
    async def scenario() -> None:
        app = make(demo="slow-ssd-offload", argv=["--demo", "slow-ssd-offload"], export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            for _ in range(6):
                await step_ready(pilot, app)
                await pilot.press("n")
            await step_ready(pilot, app)
            assert app.screen.walk.current == "fix-mount"
            await pilot.press("r")
            await settle(pilot, lambda: name(app) == "RemedyScreen", what="the fix screen")
            text = screen_text(app)
            assert "Steps: do them in order" in text and "Step 1: ? Format /dev/nvme1n1" in text
            assert "Step 2: ? Mount UUID=" in text and "Step 3: ? Create the offload directory" in text
            assert "pick one" not in text and "recommended" not in text.lower()
            sid = app.ctx.log.id
        md = render(load_events(sid), "md")
        fix = md.split("Put offload on the unused NVMe nvme1n1", 1)[1].split("\n### ", 1)[0]
        assert "#### Steps: do them in order (together they are the fix)" in fix
        assert "**Step 1: Format /dev/nvme1n1" in fix and "**Step 3: Create the offload directory" in fix
        assert "pick one" not in fix and "Recommended" not in fix and "(recommended)" not in fix

    run(scenario())


def test_a_secret_in_the_launch_command_never_reaches_the_screen(tmp_path):
    """The training's --command line carries a password and a token: the guide shows the command, with the
    secrets replaced, on the start screen, every step of the walk, the evidence and the fixes."""
    from zdoctor.walk.practice import scenarios_dir

    doc = json.loads((scenarios_dir() / f"{SCENARIO}.json").read_text())
    live = doc["probes"]["livetrace"]
    secret_cmd = live["facts"]["command"] + " --password hunter2pass --token=tok3nvalue"
    live["facts"]["command"] = secret_cmd
    live["facts"]["argv"] = ["/bin/sh", "-c", secret_cmd]
    for ev in live["evidence"]:
        ev["label"] = f"live trace: /bin/sh -c {secret_cmd}"
        if ev.get("argv"):
            ev["argv"] = [*ev["argv"][:-1], secret_cmd]
        ev["stdout"] = (ev.get("stdout") or "") + f"\nrunning {secret_cmd}\n"
    seen: list[str] = []

    async def scenario() -> None:
        app = make(host=ReplayHost(doc, source="secret"), argv=["tui"], export_dir=tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen" and app.screen.findings is not None,
                         what="the first pass")
            seen.append(screen_text(app))
            await pilot.press("enter")  # zero3-launch, the first playbook
            for _ in range(12):
                await step_ready(pilot, app)
                seen.append(screen_text(app))
                await pilot.press("e")
                await pilot.pause(0.2)
                seen.append(screen_text(app))
                await pilot.press("escape")
                await step_ready(pilot, app)
                if app.screen.walk.node.kind == "diagnosis":
                    await pilot.press("r")
                    await pilot.pause(0.3)
                    seen.append(screen_text(app))
                    break
                await pilot.press("n")
            await pilot.press("q")

    run(scenario())
    text = "\n".join(seen)
    assert "Evidence" in text and "--password" in text  # the command was on screen
    assert "hunter2pass" not in text and "tok3nvalue" not in text


def test_practice_confirmation_promises_no_file_and_no_terminal_run(tmp_path):
    """In practice nothing runs and nothing is written: the confirmation of an `unset` fix must not say
    that its lines "are also written to a file for you to source"."""
    async def scenario() -> None:
        app = make(demo=SCENARIO, export_dir=tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await walk_to_diagnosis(pilot, app)
            await pilot.press("r")
            await settle(pilot, lambda: name(app) == "RemedyScreen", what="the fix screen")
            await pilot.press("a")
            await settle(pilot, lambda: name(app) == "ConfirmApply", what="the confirmation")
            notes = plain(app.screen.query_one("#confirm-notes"))
            assert "Practice: nothing is run" in notes and "unset LD_LIBRARY_PATH" in plain(
                app.screen.query_one("#confirm-commands"))
            assert "written to a file" not in notes and "Runs in the terminal" not in notes
            assert "tried on the recorded node: fixed" in notes

    run(scenario())


def test_at_80x24_the_start_screen_shows_its_failing_findings_and_unbroken_phrases(tmp_path):
    """"✗ 2 fail" over a findings list zero rows high: every failing finding's title is on the first screen
    at 80x24, and the node's description breaks between its phrases, never inside one ("kernel ..." whole)."""
    from zdoctor.walk.practice import get_scenario

    async def scenario() -> None:
        app = make(host=get_scenario(SCENARIO).host(), argv=["tui"], export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen" and app.screen.findings is not None,
                         what="the first pass")
            app.clear_notifications()
            await pilot.pause(0.3)
            flat = " ".join(screen_text(app).split())
            failing = [f for f in app.screen.findings if f.status == "fail"]
            assert failing
            for f in failing:
                assert " ".join(f.title.split()) in flat, f.title
            glance = plain(app.screen.query_one("#glance")).splitlines()
            kernel = next(line for line in glance if "kernel" in line)
            assert re.search(r"kernel \S+", kernel) and not kernel.rstrip().endswith(("kernel", "·"))
            for line in glance:
                assert not line.rstrip().endswith("·") and not line.lstrip().startswith("·"), line

    run(scenario())


def test_wide_evidence_tables_fit_80_columns_with_their_deciding_column(tmp_path):
    """At 80x24 every evidence table of both practice parts fits the window: long cells wrap instead of
    pushing the deciding columns (the toolchain layers' version, the NVMe drives' state and why) off
    screen, and nothing is cut."""
    from textual.widgets import DataTable

    def squash(cell) -> str:
        return "".join(str(cell).split())

    async def walk(demo: str, wanted: dict[str, list[str]]) -> set[str]:
        seen: set[str] = set()
        app = make(demo=demo, argv=["--demo", demo], export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            for _ in range(12):
                await step_ready(pilot, app)
                ws = app.screen
                if ws.findings:
                    cells = {squash(c) for f in ws.findings for e in f.evidence if e.table
                             for row in e.table.rows for c in row} | {""}
                    await pilot.press("e")
                    await settle(pilot, lambda: name(app) == "EvidenceScreen", what="the evidence screen")
                    await pilot.pause(0.1)
                    for grid in app.screen.query(DataTable):
                        assert grid.virtual_size.width <= grid.scrollable_content_region.width <= 80, (
                            demo, ws.walk.current, grid.virtual_size, grid.scrollable_content_region)
                        labels = [" ".join(str(c.label).split()) for c in grid.ordered_columns]
                        for title, columns in wanted.items():
                            if all(c in labels for c in columns):
                                seen.add(title)
                                # every cell's whole text is still in the table, only wrapped
                                for r in range(grid.row_count):
                                    for cell in grid.get_row_at(r)[1:]:
                                        assert squash(cell) in cells, (title, str(cell))
                    await pilot.press("escape")
                    await settle(pilot, lambda: name(app) == "WalkScreen", what="the walk again")
                if ws.walk.node.kind == "diagnosis":
                    break
                await pilot.press("n")
        return seen

    async def scenario() -> None:
        layers = await walk(SCENARIO, {"layers": ["layer", "compiler", "version", "source"]})
        nvme = await walk("slow-ssd-offload", {"nvme": ["drive", "state", "why"]})
        assert layers == {"layers"} and nvme == {"nvme"}

    run(scenario())


def test_each_practice_step_shows_its_own_evidence_first(tmp_path):
    """At 80x24 each step of part 1 opens with what that step found; a finding an earlier step showed is one
    line naming that step; "Verify the hypothesis" shows the verifying re-runs themselves."""
    async def scenario() -> None:
        app = make(demo=SCENARIO, argv=["--demo", SCENARIO], export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            texts: dict[str, str] = {}
            for _ in range(len(STORY_PATH)):
                await step_ready(pilot, app)
                ws = app.screen
                texts[ws.walk.current] = plain(ws.query_one("#node-findings"), 78)
                needle = {"verify": "tried: fixed", "source": "is set in /home/alice/.bashrc"}.get(ws.walk.current)
                if needle:  # on screen at 80x24 without scrolling, once the step has shown its evidence
                    await settle(pilot, lambda n=needle: n in screen_text(app), what=f"{needle!r} on screen")
                if ws.walk.node.kind == "diagnosis":
                    break
                await pilot.press("n")
        layers = texts["layers"]
        assert layers.lstrip().startswith("! Built by a newer GCC")
        assert "Needed: GLIBCXX_3.4.30 (by" not in layers  # step 3's finding, not again in full
        assert re.search(r"cpu_adam.so needs GLIBCXX_3.4.30.*\n?.*\(step 3\)", layers)
        verify = texts["verify"]
        assert verify.lstrip().startswith("✓ Hypothesis confirmed")
        assert "Drop /opt/conda/lib from LD_LIBRARY_PATH: tried: fixed" in verify and "exit 0 in 7.9 s" in verify
        source = texts["source"]
        assert source.lstrip().startswith("! LD_LIBRARY_PATH entry /opt/conda/lib is set in /home/alice/.bashrc")

    run(scenario())


def test_the_symptom_step_shows_the_strace_line_of_the_old_copy(tmp_path):
    """Step 1 of part 1 shows strace's own line of the open of the old libstdc++ (from the recorded run),
    not only the command line strace ran."""
    async def scenario() -> None:
        app = make(demo=SCENARIO, argv=["--demo", SCENARIO], export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await step_ready(pilot, app)
            text = plain(app.screen.query_one("#node-findings"), 200)
            assert "strace saw the copy opened:" in text
            assert re.search(r'32753 \d\d:\d\d:\d\d\.\d+ openat\(AT_FDCWD, "/opt/conda/lib/libstdc\+\+\.so\.6", '
                             r"O_RDONLY\|O_CLOEXEC\) = \d+", text)

    run(scenario())


def test_the_bashrc_line_found_at_step_six_is_offered_as_an_edit(tmp_path):
    """Step 6 of part 1 finds the ~/.bashrc line; its fixes include commenting that line out through the safe
    core, with the backup and the undo, and no root for alice's own file."""
    async def scenario() -> None:
        app = make(demo=SCENARIO, argv=["--demo", SCENARIO], export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            for _ in range(len(STORY_PATH)):
                await step_ready(pilot, app)
                if app.screen.walk.current == "source":
                    break
                await pilot.press("n")
            await pilot.press("r")
            await settle(pilot, lambda: name(app) == "RemedyScreen", what="the fixes")
            rs = app.screen
            titles = [r.title for _f, r in rs.pairs]
            want = "Comment out line 23 of /home/alice/.bashrc"
            assert want in titles, titles
            while rs.pairs[rs.index][1].title != want:
                await pilot.press("down")
            fix = rs.pairs[rs.index][1]
            assert fix.action["kind"] == "file-replace" and not fix.requires_root
            commands = plain(rs.query_one("#rem-commands"), 200)
            assert "sha256sum" in commands and "ln -- .bashrc .bashrc.bak.zdoctor-" in commands
            assert "mv -f -- /home/alice/.bashrc.bak.zdoctor-" in plain(rs.query_one("#rem-undo"), 200)
            explain = plain(rs.query_one("#rem-explain"), 200)
            assert "+ # export LD_LIBRARY_PATH=/opt/conda/lib  # commented out by zdoctor" in explain

    run(scenario())
