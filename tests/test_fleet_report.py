"""The fleet report on H200 nodes built from the real capture: matrix, skew, exit codes, the terminal report,
the session record and its replay; and the command line's one-line errors."""

from __future__ import annotations

import io
import json
import os

from fleetkit import conda_path, h200_fleet, h200_node, h200_report, older_driver

from zdoctor.fleet.collect import NodeRun
from zdoctor.fleet.record import record_report, runs_from_events
from zdoctor.fleet.result import FleetReport
from zdoctor.fleet.skew import majority
from zdoctor.report.fleettext import print_fleet


def test_the_skew_table_names_the_odd_node_and_its_value():
    rep = h200_report()
    diff = {r.fact.id: r for r in rep.differing}
    assert set(diff) == {"driver", "cuda-driver", "ld-library-path"}
    assert diff["driver"].majority == "580.159.04" and diff["driver"].differing == ["gpu-2"]
    assert diff["driver"].values["gpu-2"] == "570.124.06"
    assert diff["ld-library-path"].differing == ["gpu-3"]
    assert "gpu-5" not in diff["driver"].values  # an unreached node has no facts to compare
    same = {r.fact.id: r for r in rep.skew if not r.differs}
    assert same["gpu-model"].majority == "1 x NVIDIA H200" and same["nccl"].majority == "2.28.9"
    assert same["shm"].majority == "128.0 GiB" and same["memlock"].majority == "unlimited"


def test_the_matrix_and_node_statuses():
    rep = h200_report()
    nodes = {n.host: n for n in rep.nodes}
    assert nodes["gpu-2"].cells["gpu.runtime"] == "fail" and nodes["gpu-1"].cells["gpu.runtime"] == "ok"
    assert [n.status for n in rep.nodes] == ["ok", "fail", "ok", "ok", "fail"]
    assert nodes["gpu-5"].cells == {} and [f.id for f in nodes["gpu-5"].findings] == ["fleet.node.unreachable"]
    assert "gpu.runtime" in rep.checks and rep.checks == sorted(rep.checks)
    assert rep.summary == {"nodes": 5, "reached": 4, "failing": 2, "warning": 0, "differing_facts": 3,
                           "unreachable": 1, "no-zdoctor": 0, "timeout": 0, "error": 0, "bad-output": 0}
    assert rep.exit_code == 1


def test_a_consistent_healthy_fleet_exits_zero_and_one_odd_fact_exits_one():
    same = FleetReport.build([h200_node("a"), h200_node("b"), h200_node("c")], "pdsh", "hf")
    assert same.differing == [] and same.exit_code == 0
    odd = FleetReport.build([h200_node("a"), h200_node("b", conda_path), h200_node("c")], "pdsh", "hf")
    assert [r.fact.id for r in odd.differing] == ["ld-library-path"] and odd.exit_code == 1
    (f,) = odd.fleet_findings
    assert f.id == "fleet.skew.ld-library-path" and f.status == "fail" and "differs on b" in f.title
    table = f.evidence[0].table
    assert table.rows == [["a", "(none)"], ["b", "/opt/conda/lib"], ["c", "(none)"]] and table.highlight == [1]


def test_more_slots_than_gpus_fails_with_a_hostfile_edit_that_works(tmp_path):
    import subprocess

    from zdoctor.layers.launch.hosts import read_hostfile

    hf = tmp_path / "hostfile"
    hf.write_text("# job\ngpu-1 slots=1\n  gpu-2 slots=8  # eight?\ngpu-20 slots=8\n")
    nodes = {n.name: n.slots for n in read_hostfile(str(hf))}
    runs = [h200_node("gpu-1"), h200_node("gpu-2"), h200_node("gpu-20", lambda p: p["gpu_env"]["vars"].update(
        CUDA_VISIBLE_DEVICES=""))]
    rep = FleetReport.build(runs, "pdsh", str(hf), nodes)
    assert [n.visible_gpus for n in rep.nodes] == [1, 1, 0]
    found = {n.host: n.findings[0] for n in rep.nodes}
    assert [n.cells["fleet.slots"] for n in rep.nodes] == ["ok", "fail", "fail"]
    assert [n.status for n in rep.nodes] == ["ok", "fail", "fail"] and rep.exit_code == 1
    assert "fleet.slots" in rep.checks and rep.fleet_findings == []
    f = found["gpu-2"]
    assert f.id == "fleet.slots"
    assert f.title == "gpu-2: the hostfile gives it 8 slots but the training sees 1 GPU"
    assert "invalid device ordinal" in f.detail
    assert found["gpu-20"].remedies[0].commands == []  # no GPU visible: nothing to set slots to
    (cmd,) = f.remedies[0].commands
    subprocess.run(["bash", "-c", cmd], check=True)
    assert {n.name: n.slots for n in read_hostfile(str(hf))} == {"gpu-1": 1, "gpu-2": 1, "gpu-20": 8}
    subprocess.run(["bash", "-c", f.remedies[0].undo[0]], check=True)
    assert {n.name: n.slots for n in read_hostfile(str(hf))} == nodes
    assert [n["slots"] for n in rep.to_dict()["nodes"]] == [1, 8, 8]
    assert FleetReport.build(runs[:1], "pdsh", str(hf), nodes).exit_code == 0


def test_majority_and_ties():
    assert majority({"a": "1", "b": "2", "c": "2"}, ["a", "b", "c"]) == ("2", ["a"], False)
    assert majority({"a": "1", "b": "2"}, ["a", "b"]) == ("1", ["b"], True)
    two = FleetReport.build([h200_node("a"), h200_node("b", older_driver)], "ssh", "hf")
    row = next(r for r in two.skew if r.fact.id == "driver")
    assert row.tie and row.differing == ["b"]
    assert "split between nodes" in next(f for f in two.fleet_findings if f.id == "fleet.skew.driver").title


def test_terminal_report():
    buf = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    print_fleet(h200_report(), buf)
    buf.seek(0)
    text = buf.read()
    assert "5 nodes from hostfile via ssh: 4 reached, 2 failing, 3 facts differ" in text
    assert "gpu-2: 570.124.06" in text and "gpu-3: /opt/conda/lib" in text
    assert "ssh: connect to host gpu-5 port 22: Connection refused" in text
    assert "(gpu.runtime)" in text and text.rstrip().endswith("fleet is not ready")
    matrix_line = next(line for line in text.splitlines() if "gpu-5" in line and "unreachable" in line)
    assert matrix_line.startswith("✗ gpu-5")


def test_json_document_shape():
    doc = json.loads(json.dumps(h200_report().to_dict()))
    assert set(doc) == {"version", "launcher", "source", "summary", "checks", "nodes", "skew", "findings", "reach",
                        "session"}
    node = doc["nodes"][1]
    assert set(node) == {"host", "launch", "status", "slots", "visible_gpus", "cells", "facts", "findings"}
    assert "snapshot" not in node["launch"]
    assert node["facts"]["driver"] == "570.124.06"


def test_recorded_events_replay_to_the_same_report():
    events: list[dict] = []
    rep = h200_report()
    events.append({"type": "fleet_start", "launcher": "ssh", "source": "hostfile",
                   "hosts": [n.host for n in rep.nodes]})
    events += [{"type": "fleet_node", "seq": i, "node": json.loads(json.dumps(r.to_dict()))}
               for i, r in enumerate(h200_fleet())]
    record_report(rep, lambda t, d: events.append({"type": t, **d}))
    ids = [e["finding"]["id"] for e in events if e["type"] == "finding"]
    assert "gpu.runtime@gpu-2" in ids and "fleet.node.unreachable@gpu-5" in ids and "fleet.skew.driver" in ids
    runs, launcher, source, slots = runs_from_events(events, "s")
    assert slots == {}
    again = FleetReport.build(runs, launcher, source)

    def strip(obj):  # evidence carries the moment it was built
        if isinstance(obj, dict):
            return {k: strip(v) for k, v in obj.items() if k != "started"}
        if isinstance(obj, list):
            return [strip(v) for v in obj]
        return obj

    assert strip(again.to_dict()) == strip(rep.to_dict())


def test_bad_fleet_records_are_input_errors():
    import pytest

    from zdoctor.core.errors import InputError

    with pytest.raises(InputError, match="not a fleet session"):
        runs_from_events([{"type": "session_start"}], "s")
    with pytest.raises(InputError, match="event 3: not a fleet node record"):
        runs_from_events([{"type": "fleet_start", "hosts": []}, {"type": "fleet_node", "seq": 3, "node": {}}], "s")
    with pytest.raises(InputError, match="recorded no node"):
        runs_from_events([{"type": "fleet_start", "hosts": ["a"]}], "s")
    assert NodeRun.from_dict({"host": "a", "status": "ok", "snapshot": "junk"}).snapshot is None


def test_command_line_errors_are_one_line_and_exit_2(cli, tmp_path):
    hf = tmp_path / "hf"
    hf.write_text("good-1 slots=8\n$(reboot) slots=8\n")
    cases = [
        (["fleet", "--hostfile", str(tmp_path / "nope")], "nope: no such hostfile"),
        (["fleet", "--hostfile", str(hf)], "host '$(reboot)': contains '$' '(' ')'"),
        (["fleet"], "name the nodes with --hostfile FILE"),
        (["fleet", "--hostfile", str(hf), "--parallel", "0"], None),
        (["fleet", "--replay", "last", "--hostfile", str(hf)], "--replay takes none of the options"),
        (["fleet", "--replay", "last", "--model-params", "7B"], "--replay takes none of the options"),
        (["fleet", "--replay", "last"], "no recorded sessions"),
        (["fleet", "--hostfile", str(hf), "--tui"], "--tui needs a terminal"),
        (["fleet", "--hostfile", str(hf), "--launcher", "rsh"], "invalid choice"),
    ]
    for args, message in cases:
        r = cli(args)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
        if message:
            assert message in r.stderr, (args, r.stderr)
    hf.write_text("good-1 slots=8\n")
    for args, message in (([], "--parallel must be between 1 and 1024"),
                          (["--timeout", "0"], "--timeout must be between 1 and 3600 seconds"),
                          (["--model-params", "many"], "many"),
                          (["--io-size", "huge"], "huge"),
                          (["--gpu-sample", "-1"], "--gpu-sample must be between 0 and 600 seconds"),
                          (["--ssh-config", str(tmp_path / "x")], "no such file")):
        r = cli(["fleet", "--hostfile", str(hf), *args, "--parallel", "0" if not args else "4"])
        assert r.returncode == 2 and (message is None or message in r.stderr), r.stderr


def test_the_job_options_reach_every_node_as_absolute_paths(tmp_path, monkeypatch):
    from zdoctor.fleet.launch import remote_argv
    from zdoctor.front.cli import build_parser
    from zdoctor.front.fleet_command import options_from

    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["fleet", "--hostfile", "hf", "--python", "/opt/env/bin/python", "--ext", "e.so",
                                      "--ds-config", "ds.json", "--model-params", "7B", "--model-config", "c.json",
                                      "--offload-path", "/nvme", "--io-size", "256M", "--gpu-sample", "2",
                                      "--timeout", "300"])
    argv = remote_argv(options_from(args, "ssh"))
    assert argv == ["zdoctor", "snapshot", "-o", "-", "--armor", "--timeout", "100", "--python",
                    "/opt/env/bin/python", "--ext", str(tmp_path / "e.so"), "--ds-config", str(tmp_path / "ds.json"),
                    "--model-config", str(tmp_path / "c.json"), "--offload-path", "/nvme", "--model-params", "7B",
                    "--io-size", "256M", "--gpu-sample", "2"]


def test_a_missing_launcher_is_named_before_anything_runs(cli, tmp_path):
    hf = tmp_path / "hf"
    hf.write_text("gpu-1\n")
    env = dict(os.environ, PATH=str(tmp_path))  # no pdsh, no ssh, no srun
    for launcher, other in (("pdsh", "ssh"), ("ssh", "pdsh"), ("srun", "pdsh or ssh")):
        r = cli(["fleet", "--hostfile", str(hf), "--launcher", launcher], env=env)
        assert r.returncode == 2
        assert r.stderr.strip() == (f"zdoctor fleet: {launcher} is not installed or not on PATH "
                                    f"(install it, or use --launcher {other})")


def test_a_replayed_session_that_is_not_a_fleet(cli):
    r = cli(["check", "--replay", str(__import__("conftest").FIXTURES / "snapshots" / "healthy.json")])
    assert r.returncode in (0, 1)
    r = cli(["fleet", "--replay", "last"])
    assert r.returncode == 2 and "not a fleet session (no fleet_start event)" in r.stderr


def test_export_tables_from_the_recorded_report():
    from zdoctor.report.reportdoc import fleet_tables

    (m_title, m_cols, m_rows, m_hot), (s_title, s_cols, s_rows, s_hot) = fleet_tables(
        json.loads(json.dumps(h200_report().to_dict())))
    assert m_cols[:5] == ["node", "launch", "container", "cores", "cuda"]
    gpu = m_cols.index("gpu")
    assert [r[gpu] for r in m_rows] == ["✓", "✗", "✓", "✓", ""]
    assert m_rows[4][:2] == ["✗ gpu-5", "unreachable"] and m_hot == [1, 4]
    assert s_rows[0] == ["NVIDIA driver", "580.159.04", "gpu-2: 570.124.06"] and 0 in s_hot
    assert fleet_tables({"nodes": [{"host": 1, "cells": "junk"}, "junk"], "skew": [None]})[0][2] == [["? 1", ""]]


def test_hostile_values_from_a_node_stay_inert():
    """A node's facts are its own to make up: markup, escape sequences and table pipes are shown as text."""
    from zdoctor.report.export import render

    evil = "[red]x[/red]\x1b[31m|pipe`tick"
    rep = FleetReport.build([h200_node("a"), h200_node("b", lambda p: p["libs"]["env"].update(
        LD_LIBRARY_PATH=evil)), h200_node("c")], "ssh", "hf")
    buf = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    print_fleet(rep, buf)
    buf.seek(0)
    text = buf.read()
    assert "\x1b" not in text and "b: [red]x[/red]\\x1b[31m|pipe`tick" in text
    events: list[dict] = [{"type": "session_start", "session_id": "s"}]
    record_report(rep, lambda t, d: events.append({"type": t, **d}))
    md = render(events, "md")
    assert "\x1b" not in md and "b: \\[red\\]x\\[/red\\]" in md and "\\|pipe" in md
