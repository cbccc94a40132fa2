"""The fix screen says what applying a fix did: a fix of ``export``/``unset`` lines is written to a file to
source (never "applied"), and the session and its exports record it so."""

from __future__ import annotations

import importlib
from pathlib import Path

from test_tui import SCENARIO, make, name, plain, run, settle

from zdoctor.core.model import Finding, Remedy
from zdoctor.front.tui import _screens_app
from zdoctor.report.export import render
from zdoctor.walk.practice import get_scenario
from zdoctor.walk.session import load_events


def remedy_screen():
    return importlib.import_module(_screens_app().__package__ + ".remedy").RemedyScreen


def test_a_fix_of_unset_lines_is_written_to_a_file_not_applied(tmp_path: Path):
    finding = Finding(id="loader.glibcxx", status="fail", title="the old libstdc++ is loaded")
    remedy = Remedy("Take /opt/conda/lib off LD_LIBRARY_PATH", ["unset LD_LIBRARY_PATH"], verified=None)

    async def scenario() -> None:
        app = make(host=get_scenario(SCENARIO).host(), argv=["tui"], export_dir=tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen")
            app.push_screen(remedy_screen()(app.ctx, "zero3-launch", "fix-ld-library-path", [(finding, remedy)]))
            await settle(pilot, lambda: name(app) == "RemedyScreen")
            rs = app.screen
            await pilot.press("a")
            await settle(pilot, lambda: name(app) == "ConfirmApply")
            notes = plain(app.screen.query_one("#confirm-notes"), width=1000)
            assert "nothing else on this machine changes" in notes
            # one message: a file to source is written; nothing "runs here" or "in the terminal"
            assert "source in that shell" in notes and "Nothing runs here" in notes
            assert "Runs here" not in notes and "Runs in the terminal" not in notes
            assert "Write to a file to source" in plain(app.screen.query_one("#confirm-question"), width=1000)
            await pilot.press("y")
            await settle(pilot, lambda: "written to" in plain(rs.query_one("#rem-result")), what="the outcome")
            result = plain(rs.query_one("#rem-result"))
            assert "applied" not in result and "exit code" not in result
            assert ": source it in the launching shell" in result
            option = rs.option_text(0, finding, remedy).plain
            assert "[written]" in option and "[applied]" not in option
            sid = app.ctx.log.id
        events = load_events(sid)
        assert not [e for e in events if e["type"] == "remedy_applied"]
        (ev,) = [e for e in events if e["type"] == "remedy_written"]
        env_file = Path(ev["env_file"])
        assert "unset LD_LIBRARY_PATH" in env_file.read_text()
        for fmt in ("md", "html"):
            text = render(events, fmt)
            assert f"written to {env_file}: source it in the launching shell" in text, fmt
            assert "What was applied" not in text and "What was done with the fixes" in text, fmt

    run(scenario())


# --- fixes grouped by finding; a fix that depends on another comes after it, never beside it -------------

MOUNT = "Put offload on the unused NVMe nvme1n1 (fstab by UUID)"
FIRST = f"First: the fix of “{MOUNT}” (storage.fstab); then this one"


def test_the_config_step_lists_the_mount_steps_first_and_the_config_change_after_them(tmp_path: Path):
    """Practice part 2 at its config step: the NVMe mount's three steps under their own finding, then the
    config change under its own, saying it comes after them; nowhere one "pick one" list of all four. The
    session's exports say the same."""
    from test_tui import screen_text, step_ready

    async def scenario() -> None:
        app = make(demo="slow-ssd-offload", argv=["--demo", "slow-ssd-offload"], export_dir=tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(12):
                await step_ready(pilot, app)
                if app.screen.walk.current == "fix-config":
                    break
                await pilot.press("n")
            assert app.screen.walk.current == "fix-config"
            await pilot.press("r")
            await settle(pilot, lambda: name(app) == "RemedyScreen", what="the fix screen")
            await pilot.pause(0.2)
            text = " ".join(screen_text(app).split())
            assert "pick one" not in text and "recommended" not in text.lower()
            assert f"{MOUNT} — Steps: do them in order" in text
            at = [text.index(s) for s in ("Step 1: ? Format /dev/nvme1n1", "Step 2: ? Mount UUID=",
                                          "Step 3: ? Create the offload directory", "ds_config: move nvme_path",
                                          FIRST)]
            assert at == sorted(at)
            rs = app.screen
            patch = next(i for i, (_f, r) in enumerate(rs.pairs) if r.title.startswith("Move offload to NVMe"))
            while rs.index != patch:
                await pilot.press("down")
            assert FIRST in " ".join(plain(rs.query_one("#rem-commands")).split())
            sid = app.ctx.log.id
        events = load_events(sid)
        for fmt in ("md", "html"):
            shown = " ".join(render(events, fmt).replace("\\", "").split())
            assert FIRST in shown, fmt
    run(scenario())


def test_prerequisites_of_two_findings_are_two_fixes_not_a_choice():
    """Installing libaio-dev and creating the offload directory are both needed: grouped by finding, each
    is its finding's one fix, and no list offers them as alternatives."""
    from zdoctor.core.present import ONE_OPTION_HEADING, fix_groups
    from zdoctor.layers.offload.fstab import offload_dir_remedy

    libaio = Finding("storage.libaio", "fail", "libaio development files missing")
    mount = Finding("storage.mount", "warn", "Offload path /mnt/nvme/off does not exist yet")
    pairs = [(libaio, Remedy("Install libaio-dev", ["apt-get install -y libaio-dev"], requires_root=True)),
             (mount, offload_dir_remedy("/mnt/nvme/off", "alice", "alice"))]
    groups = fix_groups(pairs)
    assert [g.finding.id for g in groups] == ["storage.libaio", "storage.mount"]
    assert [g.heading for g in groups] == [ONE_OPTION_HEADING, ONE_OPTION_HEADING]


def test_a_fix_that_depends_on_another_comes_after_it_and_a_shared_remedy_is_listed_once():
    from zdoctor.core.present import fix_groups

    fstab = Finding("storage.fstab", "warn", MOUNT)
    patch = Finding("offload.patch", "warn", "ds_config: move nvme_path")
    capacity = Finding("offload.capacity", "fail", "host memory is short")
    change = Remedy("Move offload to NVMe", ["cp a b"], requires=["storage.fstab"])
    steps = [Remedy(t, [c], step=True) for t, c in (("Mount", "mount /mnt/nvme"), ("Create", "mkdir /mnt/nvme/o"))]
    pairs = [(capacity, change), (patch, Remedy("Move offload to NVMe", ["cp a b"], requires=["storage.fstab"])),
             *[(fstab, s) for s in steps]]
    groups = fix_groups(pairs)
    assert [g.finding.id for g in groups] == ["storage.fstab", "offload.capacity"]
    assert groups[0].steps and groups[1].after == ["storage.fstab"]
    assert [f.id for f in groups[1].also_for] == ["offload.patch"]


def test_the_terminal_report_says_what_comes_first():
    import io

    from zdoctor.layers import run_checks
    from zdoctor.report.terminal import print_report
    from zdoctor.walk.doctor import CheckReport

    _facts, findings = run_checks(get_scenario("slow-ssd-offload").host())
    buf = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    print_report(CheckReport(host={"hostname": "train-node-01", "kind": "replay"}, findings=findings), buf,
                 verbose=True)
    buf.seek(0)
    assert FIRST in " ".join(buf.read().split())
