"""The fleet screen, driven through Textual's Pilot on fleets built from the real H200 capture: the node x
check-family matrix, the skew table, a node's findings and a finding's remedies, one fact on every node,
export, an empty fleet and one where no node answered, and the exit code on quit. Then a live fleet
collected through a stand-in ssh on this machine: each node as it answers, the matrix once all have, and
quitting mid-collection."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from fleetkit import h200_report
from prockit import dead, wait_for
from test_tui import name, plain, run, screen_text, settle
from textual.app import App
from textual.widgets import DataTable

from zdoctor.fleet.collect import NodeRun
from zdoctor.fleet.launch import FleetOptions
from zdoctor.fleet.live import LiveFleet
from zdoctor.fleet.result import FleetReport
from zdoctor.fleet.skew import skew_table
from zdoctor.front import tui

HOSTS = ["gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"]


def make(report: FleetReport, **kw):
    return tui._screens_fleet().make_fleet_app(report, **kw)


def table(app, table_id: str) -> DataTable:
    return app.screen.query_one(f"#{table_id}", DataTable)


def rows(grid: DataTable) -> dict[str, dict[str, str]]:
    """Every row of a table as ``{row key: {column key: cell text}}``, in display order."""
    columns = [c.key.value for c in grid.ordered_columns]
    rows = {r.key.value: [str(c) for c in grid.get_row(r.key)] for r in grid.ordered_rows}
    assert all(len(cells) == len(columns) for cells in rows.values())
    return {key: dict(zip(columns, cells)) for key, cells in rows.items()}


async def on_screen(pilot, app, screen: str) -> None:
    await settle(pilot, lambda: name(app) == screen, what=screen)
    await pilot.pause()


async def select(pilot, grid: DataTable, key: str) -> None:
    """Move the cursor to the row ``key`` with the arrow keys and press Enter."""
    grid.focus()
    await pilot.pause()
    target = grid.get_row_index(key)
    while grid.cursor_row != target:
        await pilot.press("down" if grid.cursor_row < target else "up")
    await pilot.press("enter")


def empty_report() -> FleetReport:
    return FleetReport("ssh", "hostfile", [], skew_table({}, []), [])


def nobody_report() -> FleetReport:
    runs = [NodeRun("gpu-7", "timeout", "no answer in 60 s", None, 60.0, ["ssh", "gpu-7"]),
            NodeRun("gpu-8", "no-zdoctor", "zdoctor: command not found", 127, 0.4, ["ssh", "gpu-8"],
                    ["bash: line 1: zdoctor: command not found"])]
    return FleetReport.build(runs, "ssh", "hostfile")


# --- the fleet screen --------------------------------------------------------------------------------

def test_matrix_and_skew_table_of_the_h200_fleet():
    async def scenario() -> None:
        app = make(h200_report())
        async with app.run_test(size=(120, 40)) as pilot:
            await on_screen(pilot, app, "FleetScreen")
            head = plain(app.screen.query_one("#fleet-head"))
            assert "ssh · hostfile" in head and "4 of 5 nodes reached" in head
            assert "✗ 2 failing" in head and "3 facts differ" in head and "1 unreachable" in head

            matrix = rows(table(app, "fleet-matrix"))
            assert list(matrix) == HOSTS
            families = [c.key.value for c in table(app, "fleet-matrix").ordered_columns]
            assert families == ["mark", "node", "launch", "fam:container", "fam:cores", "fam:cuda", "fam:gpu",
                                "fam:hangs", "fam:jit", "fam:kernel", "fam:launcher", "fam:libs", "fam:nccl",
                                "fam:offload", "fam:pyenv", "fam:ranks", "fam:storage", "fam:toolchain"]
            assert [matrix[h]["mark"] for h in HOSTS] == ["✓", "✗", "✓", "✓", "✗"]
            assert matrix["gpu-2"]["fam:gpu"] == "✗" and matrix["gpu-1"]["fam:gpu"] == "✓"
            assert matrix["gpu-2"]["fam:libs"] == "✓" and matrix["gpu-2"]["fam:storage"] == "-"
            assert matrix["gpu-2"]["launch"] == "ok"
            gone = matrix["gpu-5"]
            assert gone["launch"].startswith("unreachable: ssh: conne")  # cut in the middle
            assert gone["launch"].endswith("Connection refused") and len(gone["launch"]) <= 48
            assert all(gone[k] == "" for k in gone if k.startswith("fam:"))

            skew = rows(table(app, "fleet-skew"))
            assert list(skew)[:3] == ["driver", "cuda-driver", "ld-library-path"]
            assert skew["driver"] == {"mark": "✗", "fact": "NVIDIA driver", "differing": "gpu-2",
                                      "majority": "580.159.04"}
            assert skew["ld-library-path"]["mark"] == "✗" and skew["ld-library-path"]["differing"] == "gpu-3"
            assert skew["ld-library-path"]["majority"] == "(none)"
            assert skew["torch"] == {"mark": "✓", "fact": "torch", "differing": "", "majority": "2.11.0+cu130"}
            assert "…" in skew["nccl-library"]["majority"]

            keys = screen_text(app).splitlines()[-1]
            assert "n Nodes" in keys and "f Facts" in keys and "q Quit" in keys and "Export" not in keys

    run(scenario())


def test_fits_an_80_by_24_terminal():
    async def scenario() -> None:
        app = make(h200_report())
        async with app.run_test(size=(80, 24)) as pilot:
            await on_screen(pilot, app, "FleetScreen")
            text = screen_text(app)
            for host in HOSTS:
                assert host in text
            assert "launch" in text and "gpu" in text and "NVIDIA driver" in text and "LD_LIBRARY_PATH" in text
            # the matrix is wider than 80 columns: its last families scroll into view
            assert "fam:toolchain" in [c.key.value for c in table(app, "fleet-matrix").ordered_columns]
            assert "q Quit" in text.splitlines()[-1]
            await pilot.press("question_mark")
            await on_screen(pilot, app, "HelpScreen")
            keys = plain(app.screen.query_one("#help-keys"))
            assert "Nodes" in keys and "Facts" in keys and "Quit" in keys
            await pilot.press("escape")
            await on_screen(pilot, app, "FleetScreen")

    run(scenario())


def test_a_node_opens_its_findings_and_a_finding_its_evidence_and_remedies():
    async def scenario() -> None:
        app = make(h200_report())
        async with app.run_test(size=(120, 40)) as pilot:
            await on_screen(pilot, app, "FleetScreen")
            fleet = app.screen
            await select(pilot, table(app, "fleet-matrix"), "gpu-2")
            await on_screen(pilot, app, "FleetNodeScreen")
            assert app.screen.node.host == "gpu-2"
            title = plain(app.screen.query_one(".screen-title"))
            assert "✗ gpu-2" in title and "fail" in title
            assert "reached" in plain(app.screen.query_one("#fleet-node-launch"))
            findings = rows(table(app, "fleet-node-findings"))
            first = next(iter(findings))
            assert first == "gpu.runtime" and findings[first]["mark"] == "✗"
            assert "driver 570.124.06" in findings[first]["title"]
            marks = [r["mark"] for r in findings.values()]
            order = {"‼": 0, "✗": 1, "!": 2, "-": 3, "✓": 4}
            assert marks == sorted(marks, key=order.__getitem__)  # worst first
            cells = plain(app.screen.query_one("#fleet-node-cells"))
            assert "✗ runtime" in cells and "✓ driver" in cells and "- glibcxx" in cells  # nothing to check: skip
            assert cells.lstrip().startswith("container")  # families in name order

            await pilot.press("enter")  # the cursor starts on the worst finding
            await on_screen(pilot, app, "FleetFindingScreen")
            text = screen_text(app)
            assert "gpu-2 · gpu.runtime" in text and "torch needs CUDA 13.0" in text
            body = "\n".join(plain(w) for w in app.screen.query("#ev-body Static"))
            evidence = [str(c) for g in app.screen.query("#ev-body DataTable").results(DataTable)
                        for r in g.ordered_rows for c in g.get_row(r.key)]
            assert "CUDA the driver supports" in evidence and "12.8" in evidence
            assert "Remedies (run them on gpu-2)" in body and "Install a torch built for CUDA 12.8" in body

            await pilot.press("escape")
            await on_screen(pilot, app, "FleetNodeScreen")
            await pilot.press("escape")
            await on_screen(pilot, app, "FleetScreen")
            assert app.screen is fleet

    run(scenario())


def test_an_unreached_node_shows_what_the_launcher_said():
    async def scenario() -> None:
        app = make(h200_report())
        async with app.run_test(size=(120, 40)) as pilot:
            await on_screen(pilot, app, "FleetScreen")
            await select(pilot, table(app, "fleet-matrix"), "gpu-5")
            await on_screen(pilot, app, "FleetNodeScreen")
            launch = plain(app.screen.query_one("#fleet-node-launch"))
            assert "unreachable: ssh: connect to host gpu-5 port 22: Connection refused" in launch
            assert "$ ssh gpu-5" in launch and "exit code 255" in launch and "stderr:" in launch
            assert list(rows(table(app, "fleet-node-findings"))) == ["fleet.node.unreachable"]
            assert "no checks ran on this node" in plain(app.screen.query_one("#fleet-node-cells"))

            await pilot.press("enter")
            await on_screen(pilot, app, "FleetFindingScreen")
            body = "\n".join(plain(w) for w in app.screen.query("#ev-body Static"))
            assert "gpu-5: unreachable" in body and "ssh -o BatchMode=yes gpu-5 true" in body

    run(scenario())


def test_a_fact_shows_its_value_on_every_node():
    async def scenario() -> None:
        app = make(h200_report())
        async with app.run_test(size=(120, 40)) as pilot:
            await on_screen(pilot, app, "FleetScreen")
            await pilot.press("f")
            assert app.screen.focused is table(app, "fleet-skew")
            await pilot.press("enter")  # the facts that differ come first: the driver
            await on_screen(pilot, app, "FleetFactScreen")
            values = rows(table(app, "fleet-fact-values"))
            assert list(values) == HOSTS
            reached = {h: v["value"] for h, v in values.items() if v["mark"] != "-"}
            assert reached == {"gpu-1": "580.159.04", "gpu-2": "570.124.06", "gpu-3": "580.159.04",
                               "gpu-4": "580.159.04"}
            assert [values[h]["mark"] for h in HOSTS[:4]] == ["✓", "✗", "✓", "✓"]
            assert values["gpu-5"]["value"] == "(not reached: unreachable)"
            summary = plain(app.screen.query_one("#fleet-fact-summary"))
            assert "NVIDIA driver differs on gpu-2" in summary and "Most nodes: 580.159.04" in summary
            assert "570.124.06: gpu-2" in summary and "580.159.04: gpu-1, gpu-3, gpu-4" in summary
            assert "Why it matters: NCCL and the CUDA runtime" in summary

            await pilot.press("escape")
            await on_screen(pilot, app, "FleetScreen")
            await select(pilot, table(app, "fleet-skew"), "ld-library-path")
            await on_screen(pilot, app, "FleetFactScreen")
            values = rows(table(app, "fleet-fact-values"))
            assert values["gpu-3"] == {"mark": "✗", "node": "gpu-3", "value": "/opt/conda/lib"}
            assert values["gpu-1"]["value"] == "(none)"

            await select(pilot, table(app, "fleet-fact-values"), "gpu-3")  # a node from its fact
            await on_screen(pilot, app, "FleetNodeScreen")
            assert app.screen.node.host == "gpu-3"
            await pilot.press("escape", "escape")
            await on_screen(pilot, app, "FleetScreen")

    run(scenario())


def test_q_exits_with_the_report_exit_code():
    async def scenario() -> None:
        app = make(h200_report())
        async with app.run_test(size=(80, 24)) as pilot:
            await on_screen(pilot, app, "FleetScreen")
            await pilot.press("f", "enter")
            await on_screen(pilot, app, "FleetFactScreen")
            await pilot.press("q")
        assert app.return_value == 1

    run(scenario())


def test_export_writes_through_the_callback(tmp_path: Path):
    written: list[str] = []

    def exporter(fmt: str) -> Path:
        path = tmp_path / f"fleet.{fmt}"
        path.write_text(fmt)
        written.append(fmt)
        return path

    async def scenario() -> None:
        app = make(h200_report(), exporter=exporter)
        async with app.run_test(size=(100, 30)) as pilot:
            await on_screen(pilot, app, "FleetScreen")
            assert "x Export" in screen_text(app).splitlines()[-1]
            await pilot.press("x")
            await on_screen(pilot, app, "ExportScreen")
            await pilot.press("j")
            await settle(pilot, lambda: "Written" in plain(app.screen.query_one("#export-result")))
            assert str(tmp_path / "fleet.json") in plain(app.screen.query_one("#export-result"))
            await pilot.press("escape")
            await on_screen(pilot, app, "FleetScreen")

    run(scenario())
    assert written == ["json"] and (tmp_path / "fleet.json").read_text() == "json"


# --- fleets with nothing to show ---------------------------------------------------------------------

def test_an_empty_fleet_renders():
    async def scenario() -> None:
        app = make(empty_report())
        async with app.run_test(size=(80, 24)) as pilot:
            await on_screen(pilot, app, "FleetScreen")
            assert "no nodes" in plain(app.screen.query_one("#fleet-head"))
            assert table(app, "fleet-matrix").row_count == 0
            skew = rows(table(app, "fleet-skew"))
            assert skew["driver"]["majority"] == "no node reached" and skew["driver"]["mark"] == "-"
            await pilot.press("enter")  # nothing to open
            await pilot.press("f", "enter")
            await on_screen(pilot, app, "FleetFactScreen")
            assert table(app, "fleet-fact-values").row_count == 0
            assert "no node was reached" in plain(app.screen.query_one("#fleet-fact-summary"))
            await pilot.press("escape", "q")
        assert app.return_value == 0

    run(scenario())


def test_a_fleet_where_no_node_answered_renders():
    async def scenario() -> None:
        app = make(nobody_report())
        async with app.run_test(size=(80, 24)) as pilot:
            await on_screen(pilot, app, "FleetScreen")
            head = plain(app.screen.query_one("#fleet-head"))
            assert "0 of 2 nodes reached" in head and "no facts to compare" in head
            assert "1 timeout" in head and "1 no-zdoctor" in head
            matrix = rows(table(app, "fleet-matrix"))
            assert matrix["gpu-7"]["launch"] == "timeout: no answer in 60 s"
            assert matrix["gpu-8"]["launch"] == "no-zdoctor: zdoctor: command not found"
            await select(pilot, table(app, "fleet-matrix"), "gpu-8")
            await on_screen(pilot, app, "FleetNodeScreen")
            launch = plain(app.screen.query_one("#fleet-node-launch"))
            assert "zdoctor is not installed" in launch and "bash: line 1: zdoctor: command not found" in launch
            await pilot.press("escape", "q")
        assert app.return_value == 1

    run(scenario())


def test_run_fleet_tui_returns_the_exit_code(monkeypatch):
    fleet = tui._screens_fleet()

    async def quit_at_once(pilot) -> None:
        await settle(pilot, lambda: name(pilot.app) == "FleetScreen")
        await pilot.press("q")

    monkeypatch.setattr(fleet.FleetApp, "run",
                        lambda self: App.run(self, headless=True, size=(80, 24), auto_pilot=quit_at_once))
    assert tui.run_fleet_tui(h200_report()) == 1
    assert tui.run_fleet_tui(empty_report()) == 0


# --- a live fleet ------------------------------------------------------------------------------------

# ssh as the launcher calls it (ssh -n -o ... -- HOST 'COMMAND'): good-* run the command here once the test
# creates the file "go", hung-* never answer, and any other host refuses the connection.
STAND_IN_SSH = """#!/bin/sh
while [ "$1" != "--" ]; do shift; done
host=$2
case "$host" in
  good-*) while [ ! -e "{dir}/go" ]; do sleep 0.05; done; exec sh -c "$3" ;;
  hung-*) echo $$ > "{dir}/$host.pid"; exec sleep 300 ;;
  *) while [ ! -e "{dir}/go" ]; do sleep 0.05; done
     echo "ssh: connect to host $host port 22: Connection refused" >&2; exit 255 ;;
esac
"""


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory whose ``ssh`` is :data:`STAND_IN_SSH`, first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(STAND_IN_SSH.format(dir=tmp_path))
    ssh.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return tmp_path


def live_fleet(hosts: list[str], timeout: float) -> LiveFleet:
    opts = FleetOptions(launcher="ssh", zdoctor=f"{sys.executable} -m zdoctor", timeout=timeout)
    return LiveFleet(hosts, opts, "hostfile")


def test_a_live_fleet_shows_each_node_as_it_answers_then_the_matrix(stand_in: Path):
    hosts = ["good-1", "hung-1", "down-1"]

    async def scenario() -> None:
        app = make(None, live=live_fleet(hosts, 5))
        async with app.run_test(size=(120, 30)) as pilot:
            await on_screen(pilot, app, "FleetCollectScreen")
            nodes = rows(table(app, "fleet-collect-nodes"))
            assert list(nodes) == hosts
            assert all(n["launch"] == "waiting…" and n["time"].endswith(" s") for n in nodes.values())
            head = plain(app.screen.query_one("#fleet-collect-head"))
            assert "ssh · hostfile" in head and "0 of 3 nodes answered" in head

            (stand_in / "go").touch()
            await settle(pilot, lambda: len(app.screen.arrived) == 2, what="two nodes answered")
            nodes = rows(table(app, "fleet-collect-nodes"))
            assert nodes["good-1"]["mark"] == "✓" and nodes["good-1"]["launch"] == "ok"
            assert nodes["down-1"]["mark"] == "✗"
            down = nodes["down-1"]["launch"]
            assert down.startswith("unreachable: ssh: conne") and down.endswith("Connection refused")
            assert nodes["hung-1"]["launch"] == "waiting…"
            assert "2 of 3 nodes answered" in plain(app.screen.query_one("#fleet-collect-head"))

            await settle(pilot, lambda: name(app) == "FleetScreen", timeout=15, what="the fleet screen")
            await pilot.pause()
            matrix = rows(table(app, "fleet-matrix"))
            assert list(matrix) == hosts
            assert matrix["good-1"]["launch"] == "ok"
            assert matrix["hung-1"]["launch"] == "timeout: no snapshot within 5 s"
            assert matrix["down-1"]["launch"] == down
            assert "1 of 3 nodes reached" in plain(app.screen.query_one("#fleet-head"))
            assert app.report is not None and app.report.node("good-1").reached
            await pilot.press("q")
        assert app.return_value == 1

    run(scenario())


@pytest.mark.parametrize("key", ["q", "ctrl+c"])
def test_quitting_mid_collection_kills_the_launchers_and_exits_130(stand_in: Path, monkeypatch, key: str):
    fleet = tui._screens_fleet()
    pid_file = stand_in / "hung-1.pid"
    pressed: list[float] = []

    async def quit_while_waiting(pilot) -> None:
        await settle(pilot, lambda: name(pilot.app) == "FleetCollectScreen" and pid_file.exists()
                     and pid_file.read_text().strip() != "", what="the hung node running")
        assert rows(table(pilot.app, "fleet-collect-nodes"))["hung-1"]["launch"] == "waiting…"
        pressed.append(time.monotonic())
        await pilot.press(key)

    monkeypatch.setattr(fleet.FleetApp, "run",
                        lambda self: App.run(self, headless=True, size=(80, 24), auto_pilot=quit_while_waiting))
    live = live_fleet(["hung-1", "down-1"], 60)
    assert tui.run_fleet_tui(live=live) == 130
    assert time.monotonic() - pressed[0] < 10  # the launchers were killed, not waited for
    assert live.cancelled
    pid = int(pid_file.read_text())
    assert wait_for(lambda: dead(pid), 5), "the hung node's sleep survived"


def test_a_collection_that_fails_says_why_and_exits_2():
    live = LiveFleet(["node-1"], FleetOptions(launcher="telnet"), "hostfile")

    async def scenario() -> None:
        app = make(None, live=live)
        async with app.run_test(size=(80, 24)) as pilot:
            await on_screen(pilot, app, "FleetCollectScreen")
            await settle(pilot, lambda: app.screen.failure is not None, what="the failure")
            await pilot.pause()
            assert "unknown launcher 'telnet'" in plain(app.screen.query_one("#fleet-collect-error"))
            assert "collection failed" in plain(app.screen.query_one("#fleet-collect-head"))
            await pilot.press("q")
        assert app.return_value == 2

    run(scenario())


def test_run_fleet_tui_takes_a_report_or_a_live_fleet():
    live = live_fleet(["good-1"], 5)
    with pytest.raises(TypeError, match="not both or neither"):
        tui.run_fleet_tui()
    with pytest.raises(TypeError, match="not both or neither"):
        tui.run_fleet_tui(h200_report(), live=live)

