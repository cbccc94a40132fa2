"""The guide as a new user meets it, at 80x24 and 120x40: a walk step shows its title and findings before a
one-line symptom ledger; a fix of export lines only writes a file (nothing runs); a diagnosis states what
was measured; an applied fix is undone with a key; the pasted error hands focus to the playbook list; the
apply output carries no internal record; ``--help`` lists the exit codes."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest
from test_tui import make, name, plain, run, screen_text, settle, step_ready

from zdoctor.core.model import Finding, Remedy
from zdoctor.edit.filefix import replace_remedy
from zdoctor.front.tui import _screens_app
from zdoctor.walk.apply import run_remedy
from zdoctor.walk.practice import get_scenario

SIZES = [(80, 24), (120, 40)]
PART_TWO = "slow-ssd-offload"
UNEXPLAINED = "RuntimeError: the frobnicator is misaligned"
ROOT = str(Path(__file__).resolve().parent.parent)


def remedy_screen():
    return importlib.import_module(_screens_app().__package__ + ".remedy").RemedyScreen


def test_help_lists_the_four_exit_codes(cli):
    for args in (["--help"], ["check", "--help"]):
        proc = cli(args)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        at = lines.index("exit codes:")
        codes = [line.split()[0] for line in lines[at + 1:at + 5]]
        assert codes == ["0", "1", "2", "3"], proc.stdout
        text = " ".join(lines[at:])
        assert "usage or input error" in text and "incomplete" in text and "symptom" in text
    # the 2 it lists is the one a bad option gives
    assert cli(["check", "--no-such-option"]).returncode == 2


@pytest.mark.parametrize("size", SIZES)
def test_a_walk_step_shows_its_title_and_findings_before_a_one_line_symptom_ledger(tmp_path, size):
    async def scenario() -> None:
        host = get_scenario(PART_TWO).host()
        host.ask({"symptom": [UNEXPLAINED]})
        app = make(host=host, argv=["tui"], export_dir=tmp_path)
        async with app.run_test(size=size) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen" and app.screen.findings is not None,
                         what="the first pass")
            menu = app.screen.query_one("#start-menu")
            ids = [menu.get_option_at_index(i).id for i in range(menu.option_count)]
            menu.focus()
            menu.highlighted = ids.index("pb:offload-bottleneck")
            await pilot.press("enter")
            await step_ready(pilot, app)
            await pilot.press("n")
            await step_ready(pilot, app)
            ws = app.screen
            await settle(pilot, lambda: bool(ws.symptoms), what="the symptom ledger")
            await pilot.pause(0.2)
            shown = screen_text(app)
            title = ws.walk.node.title
            folded = plain(ws.query_one("#walk-symptoms"), width=1000).strip()
            assert len(folded.splitlines()) == 1, folded
            assert "1 UNEXPLAINED (S1)" in folded and "s shows them" in folded
            assert UNEXPLAINED not in shown  # the symptom's own text waits behind s
            first = next(f for f in ws.findings if f.status != "ok")
            assert shown.index(title) < shown.index(first.title[:30]), shown
            if "What you saw:" in shown:  # the folded line, when the step leaves room for it on screen
                assert shown.index(first.title[:30]) < shown.index("What you saw:")
            await pilot.press("s")
            assert UNEXPLAINED in plain(ws.query_one("#walk-symptoms"), width=1000)
            await pilot.press("s")
            assert UNEXPLAINED not in plain(ws.query_one("#walk-symptoms"), width=1000)

    run(scenario())


@pytest.mark.parametrize("size", SIZES)
def test_part_two_ends_on_what_was_measured_with_the_same_mark_as_the_start_screen(tmp_path, size):
    async def scenario() -> None:
        app = make(host=get_scenario(PART_TWO).host(), argv=["tui"], export_dir=tmp_path)
        async with app.run_test(size=size) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen" and app.screen.findings is not None,
                         what="the first pass")
            at_start = {f.id: f.status for f in app.screen.findings}
        assert at_start["storage.throughput"] == "fail"
        app = make(demo=PART_TWO, argv=["--demo", PART_TWO], export_dir=tmp_path)
        async with app.run_test(size=size) as pilot:
            seen: dict[str, str] = {}
            for _ in range(12):
                await step_ready(pilot, app)
                seen.update({f.id: f.status for f in app.screen.findings})
                if app.screen.walk.node.id == "speed":
                    await pilot.pause(0.2)
                    # the storage probe whose facts give the ✗ is not marked ✓ beside it
                    probes = plain(app.screen.query_one("#node-probes"), width=1000)
                    assert "storage" in probes and "✓" not in probes, probes
                    assert "✗ Offload disk is the bottleneck" in screen_text(app)
                if app.screen.walk.node.kind == "diagnosis":
                    break
                await pilot.press("n")
            verdict = plain(app.screen.query_one("#verdict"), width=1000)
        # one verdict: the offload disk's throughput is ✗ at the start and ✗ in the walk
        assert seen["storage.throughput"] == at_start["storage.throughput"]
        for fid, status in seen.items():
            if fid in at_start:
                assert at_start[fid] == status, fid
        # the diagnosis states the measurement, not only the goal
        assert "Found: ✗ Offload disk is the bottleneck: write 526 MB/s, read 563 MB/s" in verdict
        assert verdict.index("Found:") < verdict.index("Diagnosis:")

    run(scenario())


@pytest.mark.parametrize("size", SIZES)
def test_after_the_symptom_box_the_focus_is_on_the_playbook_list(tmp_path, size):
    async def scenario() -> None:
        app = make(host=get_scenario(PART_TWO).host(), argv=["tui"], export_dir=tmp_path)
        async with app.run_test(size=size) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen" and app.screen.findings is not None,
                         what="the first pass")
            await pilot.press("s")
            assert app.focused is app.screen.query_one("#symptom-box")
            await pilot.press(*"OSError: boom")
            await pilot.press("enter")
            await pilot.pause(0.3)
            assert app.focused is app.screen.query_one("#start-menu")
            await pilot.press("down")  # the arrows move in the list, not in a text box
            assert app.screen.query_one("#symptom-box").value == ""

    run(scenario())


def test_a_fix_of_export_lines_runs_nothing_here(tmp_path: Path):
    """`export A="$(touch F)"` would create F if bash ran it: applied, it is only written to the file."""
    marker = tmp_path / "ran"
    remedy = Remedy("Set A", [f'export A="$(touch {marker})"'], verified=None)
    outcome = run_remedy(remedy, dict(os.environ), env_file=(tmp_path / "fixes", "fix.sh"))
    assert outcome.ok and not marker.exists()
    assert f'export A="$(touch {marker})"' in Path(outcome.env_file or "").read_text()


@pytest.mark.parametrize("size", SIZES)
def test_an_applied_edit_is_undone_with_u_and_its_output_has_no_record(tmp_path, size):
    cfg = tmp_path / "ds_config.json"
    old = '{"zero_optimization": {"stage": 3}}\n'
    cfg.write_text(old)
    remedy = replace_remedy(str(cfg), old, '{"zero_optimization": {"stage": 2}}\n', title="Use stage 2",
                            explanation="", uid=os.getuid())
    finding = Finding(id="offload.config", status="fail", title="the config asks for stage 3")

    async def scenario() -> None:
        app = make(host=get_scenario(PART_TWO).host(), argv=["tui"], export_dir=tmp_path)
        async with app.run_test(size=size) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen")
            app.push_screen(remedy_screen()(app.ctx, "offload-bottleneck", "fix-config", [(finding, remedy)]))
            await settle(pilot, lambda: name(app) == "RemedyScreen")
            rs = app.screen
            await pilot.press("u")  # nothing applied yet: nothing to undo
            await pilot.pause(0.1)
            assert cfg.read_text() == old
            await pilot.press("a")
            await settle(pilot, lambda: name(app) == "ConfirmApply")
            await pilot.press("y")
            await settle(pilot, lambda: "[applied]" in rs.option_text(0, finding, remedy).plain, what="applied")
            assert '"stage": 2' in cfg.read_text()
            lines = list(rs.query_one("#rem-log").lines)
            assert lines and not [x for x in lines if '{"' in x or "-record:" in x], lines
            assert "u undoes it" in plain(rs.query_one("#rem-result"), width=1000)
            await pilot.press("u")
            await settle(pilot, lambda: name(app) == "ConfirmApply", what="the undo's confirmation")
            assert "Undo: Use stage 2" in plain(app.screen.query_one("#confirm-question"), width=1000)
            await pilot.press("n")  # No: nothing changes
            await settle(pilot, lambda: name(app) == "RemedyScreen")
            assert '"stage": 2' in cfg.read_text()
            await pilot.press("u")
            await settle(pilot, lambda: name(app) == "ConfirmApply")
            await pilot.press("y")
            await settle(pilot, lambda: "[undone]" in rs.option_text(0, finding, remedy).plain, what="undone")
        assert cfg.read_bytes() == old.encode()

    run(scenario())


def test_the_core_prints_no_record_to_a_terminal(tmp_path: Path):
    """Under sudo the guide hands the terminal to the core: the person there reads its steps, no JSON record;
    piped (as the guide streams it), the record is still the last line."""
    import pty
    import subprocess
    import sys

    for tty in (True, False):
        target = tmp_path / f"stale-{tty}"
        target.write_text("")
        argv = [sys.executable, "-m", "zdoctor.edit.core_apply", "--remove", str(target)]
        if tty:
            main, sub = pty.openpty()
            proc = subprocess.run(argv, stdout=sub, stderr=sub, stdin=subprocess.DEVNULL, timeout=120,
                                  cwd=ROOT)
            os.close(sub)
            out = b""
            while True:
                try:
                    chunk = os.read(main, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
            os.close(main)
            text = out.decode()
        else:
            proc = subprocess.run(argv, capture_output=True, timeout=120, cwd=ROOT)
            text = proc.stdout.decode()
        assert proc.returncode == 0 and not target.exists(), text
        assert ("zdoctor-replace-record: {" in text) is not tty, text
