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
