"""`zdoctor check` on a terminal shows a live line of what runs; piped or with --json it shows nothing."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import time

import pytest
from conftest import REPO
from test_tui_tmux import Tmux

from zdoctor.core import progress
from zdoctor.report.progressline import ProgressLine, line


def test_the_line_names_the_slowest_probe_first_with_what_it_is_doing_and_fits_the_width():
    rows = [progress.Running("libfix", 7.25, "re-running the command with each of 3 fixes, 1 of 3 done"),
            progress.Running("storage", 1.0)]
    text = line(rows, 12, 200)
    assert text.startswith("zdoctor: 2 running, 12 done; slowest libfix 7.2s (re-running the command with")
    assert "also storage 1s" in text
    assert len(line(rows, 12, 40)) == 40 and line(rows, 12, 40).endswith("…")
    assert "judging the findings" in line([], 30, 80)


def test_the_board_shows_a_probe_while_it_runs_and_what_it_said_then_forgets_it():
    progress.started("demo-probe")
    with progress.doing("demo-probe", "re-running the command with fix 2 of 3"):
        rows, _done = progress.snapshot()
        mine = [r for r in rows if r.name == "demo-probe"]
        assert mine and mine[0].doing == "re-running the command with fix 2 of 3"
    progress.ended("demo-probe")
    assert all(r.name != "demo-probe" for r in progress.snapshot()[0])


def test_nothing_is_drawn_on_a_stream_that_is_not_a_terminal():
    sink = io.StringIO()
    progress.started("slow-demo")
    try:
        with ProgressLine(sink):
            time.sleep(1.0)
    finally:
        progress.ended("slow-demo")
    assert sink.getvalue() == ""


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_a_terminal_shows_the_running_probes_and_a_pipe_gets_none(tmp_path, state_home):
    args = ["check", "--no-log", "--command", "sleep 4", "--playbook", "zero3-launch"]
    term = Tmux(tmp_path, state_home)
    try:
        term.start(args, (160, 30), "xterm-256color", no_color=True)
        seen = term.wait("zdoctor:", "running", "done; slowest", timeout=60)
        assert "livetrace" in seen  # the --command run is the slowest probe while it runs
        term.wait_dead(timeout=120)
        final = term.screen()
        assert "findings:" in final and "done; slowest" not in final  # erased before the report
    finally:
        term.close()
    piped = subprocess.run([sys.executable, "-m", "zdoctor", *args], capture_output=True, text=True, timeout=180,
                           cwd=str(REPO))
    assert "findings:" in piped.stdout
    assert "slowest" not in piped.stderr and "\r" not in piped.stderr


def test_the_guides_probe_line_shows_what_a_running_probe_is_doing():
    from screens.common import ProbeState, probe_line

    st = ProbeState("libfix", "Remedies, each re-run to prove it", 60.0, started=0.0)
    progress.started("libfix")
    try:
        with progress.doing("libfix", "re-running the command with each of 3 fixes, 2 of 3 done"):
            text = probe_line(st, now=5.0).plain
    finally:
        progress.ended("libfix")
    assert "libfix" in text and "5.0 s of 60 s" in text
    assert "re-running the command with each of 3 fixes, 2 of 3 done" in text
    assert "re-running" not in probe_line(st, now=5.0).plain
