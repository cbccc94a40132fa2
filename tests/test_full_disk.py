"""A full disk under the session log costs the record, never the check: the report is printed, the
exit code is the findings', and stderr says the session could not be recorded."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostilekit import run_measured

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@contextlib.contextmanager
def small_tmpfs(size_kib: int) -> Iterator[Path]:
    """A real tmpfs of ``size_kib`` KiB, unmounted afterwards."""
    point = Path(tempfile.mkdtemp(prefix="zdoctor-h8-tmpfs-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0700", "zdoctor-h8", str(point)],
                   check=True, capture_output=True)
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)
        with contextlib.suppress(OSError):
            point.rmdir()


def fill(point: Path, leave: int) -> None:
    """Fill the file system, then give back ``leave`` bytes."""
    filler = point / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\1" * 4096)
    finally:
        os.close(fd)
    os.truncate(filler, max(0, filler.stat().st_size - leave))


@pytest.mark.parametrize("leave", [8192, 0])
def test_a_full_disk_under_the_session_log_still_prints_the_report(leave: int):
    with small_tmpfs(256) as point:
        (point / "zdoctor" / "sessions").mkdir(parents=True, mode=0o700)
        fill(point, leave)
        env = {**os.environ, "XDG_STATE_HOME": str(point)}
        m = run_measured(["check", "--json", "--playbook", "gpu-stack"], env=env, wall_limit=120)
        assert m.returncode in (0, 1, 3), m.stderr
        doc = json.loads(m.stdout)
        assert doc["findings"] and doc["session"] is None
        assert "the session could not be recorded" in m.stderr or "session not recorded" in m.stderr
        assert "No space left on device" in m.stderr
        assert "Traceback" not in m.stderr
        assert m.returncode == doc["exit_code"]  # as the findings say, whatever became of the record
        for log in (point / "zdoctor" / "sessions").glob("*.jsonl"):  # what was written stays readable
            for line in log.read_bytes().splitlines():
                json.loads(line)


def _big_session(state: Path, megabytes: int) -> str:
    """A session log of ``megabytes`` MiB of finding events, as an earlier zdoctor without a cap left it."""
    folder = state / "zdoctor" / "sessions"
    folder.mkdir(parents=True, mode=0o700)
    sid = "20261201T120000-b8aa"
    blob = "x" * 60000
    with open(folder / f"{sid}.jsonl", "w") as fh:
        fh.write(json.dumps({"seq": 1, "ts": 1.0, "type": "session_start", "session_id": sid, "mode": "check",
                             "argv": ["check"], "host": {"hostname": "n"}, "started": 1.0}) + "\n")
        seq = 2
        while fh.tell() < megabytes << 20:
            fh.write(json.dumps({"seq": seq, "ts": 1.0, "type": "finding", "finding": {
                "id": f"f{seq}", "status": "warn", "title": f"t{seq}", "detail": blob}}) + "\n")
            seq += 1
    return sid


def test_exporting_a_200_mb_session_log_stays_small(tmp_path: Path):
    sid = _big_session(tmp_path, 200)
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    out = tmp_path / "out.md"
    m = run_measured(["export", "--session", sid, "--format", "md", "-o", str(out)], env=env, wall_limit=120)
    assert m.returncode == 0, m.stderr
    assert "only the first 32 MiB were read" in m.stderr
    assert m.peak_rss_mb < 300, f"{m.peak_rss_mb:.0f} MB"
    assert out.stat().st_size < 64 << 20


def test_a_session_log_is_not_written_past_its_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from zdoctor.walk import session

    monkeypatch.setattr(session, "MAX_LOG_BYTES", 64 * 1024)
    log = session.SessionLog.create("check", ["check"], {"hostname": "n"}, state_dir=tmp_path)
    for i in range(100):
        log.record("note", {"text": "y" * 2000, "i": i})
    log.close(0)
    assert log.failure is not None and "cap; later events were not recorded" in log.failure
    assert log.path.stat().st_size <= 64 * 1024
    assert len(session.load_events(log.path)) < 100
