"""A snapshot can be asked: the senior who receives a broken node's snapshot pastes the error they were sent
(`check --replay SNAP --symptom TEXT`, or `--log FILE`), and the recorded findings explain it as on the node
itself. The snapshot is taken for real of a broken state: an extension that needs GLIBCXX_3.4.30 under an
older libstdc++ from LD_LIBRARY_PATH."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
from conftest import run_cli
from envkit import build_extension, make_old_libstdcxx
from test_forensics_e2e import PY, bash, env_with, import_cmd


@pytest.fixture(scope="module")
def snap(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("asked")
    old = make_old_libstdcxx(root / "old").parent
    exts = root / "exts"
    ext = build_extension(exts, "needsnew")
    env = env_with(LD_LIBRARY_PATH=str(old), XDG_STATE_HOME=str(root / "state"))
    real = bash(import_cmd(PY, exts, "needsnew"), env)
    assert real.returncode == 1 and "GLIBCXX_3.4.30' not found" in real.stderr
    line = real.stderr.strip().splitlines()[-1]  # what the user was sent
    out = root / "node.json"
    proc = run_cli(["snapshot", "--python", PY, "--ext", str(ext), "-o", str(out)], env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return {"snap": str(out), "line": line, "root": str(root), "ext": str(ext), "old": str(old)}


def replay(*args: str) -> tuple[int, dict]:
    env = dict(os.environ, NO_COLOR="1")
    proc = run_cli(["check", "--json", "--no-log", "--playbook", "zero3-launch", *args], env=env, timeout=300)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_a_pasted_error_is_explained_by_the_snapshots_finding(snap):
    rc, doc = replay("--replay", snap["snap"], "--symptom", snap["line"])
    assert rc == 1
    (s,) = doc["symptoms"]
    assert s["source"] == "user" and s["signature"] == "loader.glibcxx-version"
    assert any(fid.startswith("libs.glibcxx") for fid in s["explained_by"]), s
    assert not [f for f in doc["findings"] if f["id"].startswith("symptom.unexplained.")]


def test_a_log_the_user_sent_is_read_here_and_explained_the_same_way(snap, tmp_path: Path):
    log = tmp_path / "rank0.log"
    log.write_text("[rank0] loading extensions\nTraceback (most recent call last):\n  File \"train.py\", line 3\n"
                   f"{snap['line']}\n")
    rc, doc = replay("--replay", snap["snap"], "--log", str(log))
    (s,) = doc["symptoms"]
    assert s["source"] == "log" and any(fid.startswith("libs.glibcxx") for fid in s["explained_by"])


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_log_that_is_no_regular_file_is_one_line_naming_it_never_a_traceback(snap, tmp_path: Path, kind):
    log = tmp_path / f"{kind}.log"
    os.mkfifo(log) if kind == "fifo" else log.mkdir()
    proc = run_cli(["check", "--json", "--no-log", "--replay", snap["snap"], "--log", str(log)], timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)  # the report, whole (its evidence holds the node's own tracebacks)
    (unread,) = [f for f in doc["findings"] if f["id"].startswith("symptom.unread.")]
    assert unread["status"] == "fail" and "\n" not in unread["title"]
    said = "is a FIFO (named pipe), not a regular file" if kind == "fifo" else "is a directory"
    assert said in unread["title"] and str(log) in unread["title"], unread["title"]
    assert proc.returncode == 1  # a log nobody read is never a healthy ending


def test_a_replay_still_refuses_the_options_that_describe_another_job(snap):
    proc = run_cli(["check", "--json", "--no-log", "--replay", snap["snap"], "--command",
                    shlex.join([PY, "-c", "0"])], timeout=120)
    assert proc.returncode == 2 and "--replay excludes" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not proc.stdout.strip()


@pytest.fixture(scope="module")
def snap_with_log(snap) -> dict[str, str]:
    """The same broken node, its snapshot taken with the log its user had (the loader error at its end)."""
    root = Path(snap["root"])
    log = root / "node-rank0.log"
    log.write_text(f"[rank0] loading extensions\n{snap['line']}\n")
    env = env_with(LD_LIBRARY_PATH=snap["old"], XDG_STATE_HOME=str(root / "state"))
    out = root / "node-with-log.json"
    proc = run_cli(["snapshot", "--python", PY, "--ext", snap["ext"], "--log", str(log), "-o", str(out)], env=env,
                   timeout=600)
    assert proc.returncode == 0, proc.stderr
    return {**snap, "snap": str(out)}


def test_what_the_nodes_user_gave_stays_when_the_snapshot_is_asked(snap_with_log):
    """Asking adds to what the node recorded: the pasted message first, then the node's own log line, still
    explained by the recorded finding; the same line pasted again is one symptom."""
    rc, doc = replay("--replay", snap_with_log["snap"], "--symptom", "RuntimeError: rank 3 stopped at step 0")
    assert rc == 1
    asked, node = doc["symptoms"]
    assert (asked["id"], asked["source"], node["id"], node["source"]) == ("S1", "user", "S2", "log")
    assert node["text"] == snap_with_log["line"].strip()
    assert any(fid.startswith("libs.glibcxx") for fid in node["explained_by"]), node
    rc, doc = replay("--replay", snap_with_log["snap"], "--symptom", snap_with_log["line"])
    (one,) = doc["symptoms"]
    assert one["source"] == "user" and any(fid.startswith("libs.glibcxx") for fid in one["explained_by"])
