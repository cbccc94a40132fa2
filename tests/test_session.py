"""The session log: real files, real permissions, crash tolerance, concurrency, resume."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO

from zdoctor import __version__
from zdoctor.core.errors import InputError
from zdoctor.core.model import Evidence, Finding
from zdoctor.walk.session import (
    SESSION_ID_RE,
    SessionLog,
    last_session_id,
    list_sessions,
    load_events,
    state_dir,
    validate_session_id,
)

HOST = {"hostname": "gpu-node-7", "os": "Ubuntu 22.04", "kernel": "5.15", "arch": "x86_64", "kind": "live"}


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_state_dir_honours_absolute_xdg_state_home_only(state_home: Path, monkeypatch: pytest.MonkeyPatch):
    assert state_dir() == state_home / "zdoctor"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")
    monkeypatch.setenv("HOME", str(state_home / "home"))
    assert state_dir() == state_home / "home" / ".local" / "state" / "zdoctor"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert state_dir() == state_home / "home" / ".local" / "state" / "zdoctor"


def test_create_writes_private_files_and_start_event(state_home: Path):
    old = os.umask(0o022)
    try:
        log = SessionLog.create("check", ["check", "--json"], HOST)
    finally:
        os.umask(old)
    assert SESSION_ID_RE.fullmatch(log.id)
    assert log.path == state_home / "zdoctor" / "sessions" / f"{log.id}.jsonl"
    assert mode_of(log.path) == 0o600
    assert mode_of(log.path.parent) == 0o700
    assert mode_of(log.path.parent.parent) == 0o700
    events = lines_of(log.path)
    assert len(events) == 1
    start = events[0]
    assert start["seq"] == 1 and start["type"] == "session_start" and isinstance(start["ts"], float)
    assert start["session_id"] == log.id
    assert start["zdoctor_version"] == __version__
    assert start["mode"] == "check" and start["argv"] == ["check", "--json"]
    assert start["host"] == HOST
    log.close(1)
    end = lines_of(log.path)[-1]
    assert (end["seq"], end["type"], end["exit_code"]) == (2, "session_end", 1)


def test_file_is_0600_even_under_a_permissive_umask(state_home: Path):
    old = os.umask(0)
    try:
        log = SessionLog.create("tui", [], HOST)
    finally:
        os.umask(old)
    assert mode_of(log.path) == 0o600
    assert mode_of(log.path.parent) == 0o700
    log.close()


def test_each_event_is_on_disk_when_record_returns(state_home: Path):
    log = SessionLog.create("check", [], HOST)
    finding = Finding("glibcxx", "fail", "libstdc++ too old",
                      evidence=[Evidence(label="ldd", argv=["ldd", "x.so"], exit_code=1, stdout="not found")])
    log.record("finding", {"finding": finding})  # objects with to_dict() are stored as their dict
    # Read through a separate descriptor, before close(): the line is already there.
    events = lines_of(log.path)
    assert events[-1]["type"] == "finding"
    assert Finding.from_dict(events[-1]["finding"]) == finding
    log.close(0)


def test_odd_objects_fall_back_to_str_and_reserved_keys_are_refused(state_home: Path):
    log = SessionLog.create("check", [], HOST)

    class Odd:
        def __str__(self) -> str:
            return "odd-object"

    log.record("note", {"what": Odd(), "where": Path("/tmp/x"), "tags": {"b", "a"}, "nan": float("nan")})
    ev = lines_of(log.path)[-1]
    assert ev["what"] == "odd-object" and ev["where"] == "/tmp/x" and ev["tags"] == ["a", "b"]
    assert ev["nan"] == "nan"
    with pytest.raises(ValueError, match="reserved"):
        log.record("note", {"seq": 99})
    log.close()
    with pytest.raises(ValueError, match="closed"):
        log.record("note", {})
    log.close()  # closing twice is harmless
    assert [e["type"] for e in lines_of(log.path)] == ["session_start", "note", "session_end"]


def test_secrets_never_reach_the_disk(state_home: Path):
    secret = "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7"
    host = {**HOST, "env": {"HF_TOKEN": secret, "LD_LIBRARY_PATH": "/opt/conda/lib"}}
    log = SessionLog.create("check", ["check", "--command", f"HF_TOKEN={secret} python train.py"], host)
    log.record("probe_result", {"result": {"probe": "env", "status": "ok", "facts": {
        "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567"}, "evidence": [
        {"label": "env", "stdout": f"export HF_TOKEN={secret}\nexport CUDA_HOME=/usr/local/cuda\n"}]}})
    log.close(0)
    raw = log.path.read_text(encoding="utf-8")
    assert secret not in raw
    assert "0123456789abcdef0123456789abcdef01234567" not in raw
    assert "/opt/conda/lib" in raw and "export CUDA_HOME=/usr/local/cuda" in raw
    assert raw.count("<redacted>") >= 4


def test_undecodable_file_names_round_trip(state_home: Path):
    odd = os.fsdecode(b"/data/ckpt-\xff\xfe/model.pt")  # a path that is not valid UTF-8
    log = SessionLog.create("check", [], HOST)
    log.record("note", {"path": odd, "text": "ünïcödé stays readable"})
    log.close()
    raw = log.path.read_bytes()
    raw.decode("utf-8")  # the file itself is valid UTF-8
    assert "ünïcödé".encode() in raw
    assert load_events(log.id)[1]["path"] == odd


def test_concurrent_records_give_valid_lines_and_consecutive_seq(state_home: Path):
    log = SessionLog.create("tui", [], HOST)
    per_thread, threads = 50, 8
    payload = "x" * 5000  # long lines make interleaving visible if writes were not serialised

    def worker(n: int) -> None:
        for i in range(per_thread):
            log.record("tick", {"thread": n, "i": i, "pad": payload})

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    log.close()
    events = lines_of(log.path)  # every line parses
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    ticks = [e for e in events if e["type"] == "tick"]
    assert len(ticks) == per_thread * threads
    assert {(e["thread"], e["i"]) for e in ticks} == {(n, i) for n in range(threads) for i in range(per_thread)}
    assert all(e["pad"] == payload for e in ticks)


def test_torn_last_line_is_skipped_and_flagged(state_home: Path):
    log = SessionLog.create("check", [], HOST)
    log.record("summary", {"ok": 1, "warn": 0, "fail": 0, "skip": 0, "crash": 0, "total": 1})
    with open(log.path, "ab") as fh:
        fh.write(b'{"seq": 3, "ts": 1.0, "type": "fin')  # crash mid-write
    events = load_events(log.id)
    assert [e["type"] for e in events] == ["session_start", "summary"]
    assert events.torn is True
    clean = SessionLog.create("check", [], HOST)
    assert load_events(clean.id).torn is False


def test_malformed_middle_line_is_skipped_and_named(state_home: Path):
    """One bad line never loses a session: it is skipped, and the note says how many and where."""
    log = SessionLog.create("check", [], HOST)
    log.record("note", {"n": 1})
    log.close()
    lines = log.path.read_text().splitlines()
    lines.insert(1, "{not json")
    log.path.write_text("\n".join(lines) + "\n")
    events = load_events(log.id)
    assert [e["type"] for e in events] == ["session_start", "note", "session_end"]
    assert [n for n, _r in events.skipped] == [2]
    assert events.damage_note().startswith(f"{log.path}: 1 unreadable line skipped (line 2: malformed event")
    log.path.write_text(lines[0] + "\n[1, 2]\n")
    events = load_events(log.path)
    assert events.skipped == [(2, "malformed event: not a JSON object")] and len(events) == 1
    log.path.write_text("{not json\n[1]\n")
    with pytest.raises(InputError, match=rf"^{log.path}: no readable event \({log.path}: 2 unreadable lines"):
        load_events(log.path)


@pytest.mark.parametrize("bad", ["../../etc/passwd", "20240101T000000-abcd/../x", "20240101T000000-ABCD",
                                 "20240101T000000-abcd\n", "", "20240101T000000-abc", "/tmp/x.jsonl"])
def test_hostile_session_ids_are_refused(bad: str):
    with pytest.raises(InputError, match="invalid session id"):
        validate_session_id(bad)
    with pytest.raises(InputError, match="invalid session id"):
        load_events(bad)
    with pytest.raises(InputError, match="invalid session id"):
        SessionLog.reopen(bad)


def test_unknown_session_and_empty_state(state_home: Path):
    with pytest.raises(InputError, match="no recorded sessions in"):
        last_session_id()
    assert list_sessions() == []
    with pytest.raises(InputError, match="no session 20240101T000000-abcd in"):
        load_events("20240101T000000-abcd")


def test_list_and_last_session_newest_first(state_home: Path):
    sessions = state_home / "zdoctor" / "sessions"
    sessions.mkdir(parents=True)
    older = {"seq": 1, "ts": 1700000000.0, "type": "session_start", "mode": "check", "started": 1700000000.0,
             "host": HOST}
    (sessions / "20231114T221320-aaaa.jsonl").write_text(
        json.dumps(older) + "\n" + json.dumps({"seq": 2, "ts": 1700000009.0, "type": "session_end",
                                               "exit_code": 1}) + "\n")
    (sessions / "20231114T221320-bbbb.jsonl").write_text("garbage\n{}\n")  # broken: listed, flagged
    (sessions / "notes.txt").write_text("not a session")
    log = SessionLog.create("tui", [], HOST)
    log.record("note", {})
    infos = list_sessions()
    assert [i.id for i in infos][0] == log.id
    assert {i.id for i in infos} == {log.id, "20231114T221320-aaaa", "20231114T221320-bbbb"}
    newest = infos[0]
    assert newest.mode == "tui" and newest.events == 2 and newest.ended is None and newest.hostname == "gpu-node-7"
    old = next(i for i in infos if i.id.endswith("aaaa"))
    assert old.ended == 1700000009.0 and old.exit_code == 1 and old.events == 2 and old.error is None
    broken = next(i for i in infos if i.id.endswith("bbbb"))
    assert broken.error and "malformed event" in broken.error
    assert last_session_id() == log.id


def test_last_session_breaks_ties_within_one_second_by_start_time(state_home: Path):
    sessions = state_home / "zdoctor" / "sessions"
    sessions.mkdir(parents=True)
    for sid, started in (("20240101T000000-ffff", 1704067200.1), ("20240101T000000-0000", 1704067200.9),
                         ("20231231T235959-ffff", 1704067199.5)):
        (sessions / f"{sid}.jsonl").write_text(json.dumps({"seq": 1, "ts": started, "type": "session_start",
                                                           "started": started}) + "\n")
    assert last_session_id() == "20240101T000000-0000"
    assert [i.id for i in list_sessions()] == ["20240101T000000-0000", "20240101T000000-ffff",
                                               "20231231T235959-ffff"]


def test_reopen_appends_continues_seq_and_repairs_a_torn_tail(state_home: Path):
    log = SessionLog.create("tui", ["tui"], HOST)
    log.record("node_enter", {"playbook": "p", "node": "a"})
    # The SSH connection drops: no close(), and the last write was cut short.
    os.close(log._fd)
    log._fd = None
    with open(log.path, "ab") as fh:
        fh.write(b'{"seq": 3, "ts": 1.0, "type": "node_ent')
    resumed = SessionLog.reopen(log.id, argv=["--resume", log.id])
    assert resumed.id == log.id and resumed.path == log.path
    resumed.record("node_enter", {"playbook": "p", "node": "b"})
    resumed.close(0)
    events = load_events(log.id)
    assert events.torn is False
    assert [e["seq"] for e in events] == [1, 2, 3, 4, 5]
    assert [e["type"] for e in events] == ["session_start", "node_enter", "session_resume", "node_enter",
                                           "session_end"]
    resume = events[2]
    assert resume["dropped_torn_bytes"] == len(b'{"seq": 3, "ts": 1.0, "type": "node_ent')
    assert resume["argv"] == ["--resume", log.id]
    assert mode_of(log.path) == 0o600


def test_seq_continues_from_the_last_readable_event_not_an_unreadable_line(state_home: Path):
    """A damaged line that begins like an event with a huge number is not an event: the resumed log numbers
    on from the last event it can read."""
    log = SessionLog.create("tui", ["tui"], HOST)
    log.record("node_enter", {"playbook": "p", "node": "a"})
    os.close(log._fd)
    log._fd = None
    with open(log.path, "ab") as fh:
        fh.write(b'{"seq":999999999,"ts":1.0,"type":\x00\x01 damaged\n')
    resumed = SessionLog.reopen(log.id)
    resumed.close(0)
    events = load_events(log.id)
    assert [e["seq"] for e in events] == [1, 2, 3, 4]
    assert len(events.skipped) == 1


def test_a_whole_last_event_without_its_newline_is_kept_on_resume(state_home: Path):
    log = SessionLog.create("tui", ["tui"], HOST)
    os.close(log._fd)
    log._fd = None
    data = log.path.read_bytes()
    log.path.write_bytes(data.rstrip(b"\n"))
    resumed = SessionLog.reopen(log.id)
    resumed.close(0)
    assert [e["type"] for e in load_events(log.id)] == ["session_start", "session_resume", "session_end"]


def test_resuming_a_log_past_its_cap_reads_only_the_tail_it_repairs(state_home: Path, tmp_path: Path):
    """A 400 MB log (grown past the cap by another writer, its end torn): resuming it repairs the torn tail
    and refuses to write past the cap, in a process whose memory stays far below the log's size, and the
    events at its start are kept."""
    log = SessionLog.create("tui", ["tui"], HOST)
    log.record("node_enter", {"playbook": "p", "node": "a"})
    os.close(log._fd)
    log._fd = None
    size = 400 * 1024 * 1024
    with open(log.path, "r+b") as fh:  # the middle is a hole: no disk is spent on it
        fh.seek(size)
        fh.write(b'\n{"seq": 7, "ts": 1.0, "type": "node_enter"}\n{"seq": 8, "ts": 1.0, "type": "node_ent')
    code = (
        "import sys\n"
        "from zdoctor.core.errors import InputError\n"
        "from zdoctor.walk.session import SessionLog\n"
        "try:\n"
        "    log = SessionLog.reopen(sys.argv[1])\n"
        "    print('not written:', log.failure)\n"
        "    log.close(0)\n"
        "except InputError as exc:\n"
        "    print('refused:', exc)\n"
        "print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')))\n"
        "print(next(int(l.split()[1]) for l in open('/proc/self/io') if l.startswith('rchar:')))\n")
    env = dict(os.environ, XDG_STATE_HOME=str(state_home))
    proc = subprocess.run([sys.executable, "-c", code, log.id], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    said, rss_kib, read_bytes = proc.stdout.strip().splitlines()
    assert said.startswith(("refused:", "not written:")) and "cap" in said, said
    # the log is 400 MB: what the process read (its imports included) is its first 32 MiB (what load_events
    # reads) and a few 4 MiB windows of its tail; read whole, it took 459 MB of memory (89 MB as it is). The
    # peak is the process's own (VmHWM, since its exec): ru_maxrss keeps the forking test worker's size
    # across the exec, so it grew with whatever that worker had run before
    assert int(read_bytes) < 100 * 1024 * 1024, read_bytes
    assert int(rss_kib) < 400 * 1024, rss_kib
    with open(log.path, "rb") as tail:
        tail.seek(-40, os.SEEK_END)
        assert tail.read().endswith(b'"type": "node_enter"}\n')  # the torn line cut, the whole one kept
    first = load_events(log.id)
    assert [e["type"] for e in first[:2]] == ["session_start", "node_enter"]


def test_unwritable_state_dir_is_a_one_line_error(state_home: Path, monkeypatch: pytest.MonkeyPatch):
    blocker = state_home / "blocker"
    blocker.write_text("a file where a directory should be")
    monkeypatch.setenv("XDG_STATE_HOME", str(blocker))
    with pytest.raises(InputError, match="cannot create session log directory") as info:
        SessionLog.create("check", [], HOST)
    assert "\n" not in str(info.value)


def test_unwritable_state_dir_from_a_real_process(state_home: Path):
    """The error reaches a user as a message, not a traceback, even in a fresh interpreter."""
    blocker = state_home / "blocker"
    blocker.write_text("")
    code = ("from zdoctor.walk.session import SessionLog\nfrom zdoctor.core.errors import ZdoctorError\n"
            "try:\n    SessionLog.create('check', [], {})\nexcept ZdoctorError as e:\n    print('ERR', e)\n")
    env = {**os.environ, "XDG_STATE_HOME": str(blocker)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(REPO),
                          env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ERR cannot create session log directory")
    assert "Traceback" not in proc.stderr
