"""The fix screen says what applying a fix did: a fix of ``export``/``unset`` lines is written to a file to
source (never "applied"), and the session and its exports record it so."""

from __future__ import annotations

import importlib
from pathlib import Path

from test_tui import SCENARIO, make, name, plain, run, settle

from zdoctor.export import render
from zdoctor.model import Finding, Remedy
from zdoctor.practice import get_scenario
from zdoctor.session import load_events
from zdoctor.tui import _screens_app


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
            assert "nothing else on this machine changes" in plain(app.screen.query_one("#confirm-notes"))
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
