"""The subprocess runner every probe uses."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from zdoctor.proc.runner import run, run_streaming, which_all


def test_runs_argv_without_a_shell(tmp_path):
    ev = run(["echo", "a b", "$(touch x)"], cwd=str(tmp_path))
    assert ev.exit_code == 0
    assert ev.stdout == "a b $(touch x)\n"
    assert not (tmp_path / "x").exists()
    assert ev.argv == ["echo", "a b", "$(touch x)"]
    assert ev.duration_s >= 0 and ev.started > 0


def test_explicit_environment_is_the_only_environment():
    ev = run(["env"], env={"ONLY": "this", "PATH": os.environ["PATH"]})
    lines = set(ev.stdout.splitlines())
    assert "ONLY=this" in lines
    assert not any(line.startswith("HOME=") for line in lines)


def test_missing_executable_is_reported_not_raised():
    ev = run(["/nonexistent/zdoctor-no-such-tool", "--version"])
    assert ev.exit_code is None
    assert ev.error == "/nonexistent/zdoctor-no-such-tool: executable not found"


def test_non_executable_file(tmp_path):
    f = tmp_path / "script"
    f.write_text("#!/bin/sh\necho hi\n")
    ev = run([str(f)])
    assert ev.exit_code is None and "permission denied" in ev.error


def test_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = f"sleep 60 & echo $! > {pidfile}; echo started; wait"
    t0 = time.monotonic()
    ev = run(["sh", "-c", script], timeout=1.0)
    assert time.monotonic() - t0 < 10
    assert ev.error and ev.error.startswith("timed out after 1s")
    assert ev.exit_code is None
    assert "started" in ev.stdout
    child = int(pidfile.read_text())
    time.sleep(0.2)
    try:
        os.kill(child, 0)
        with open(f"/proc/{child}/stat") as fh:
            alive = fh.read().split()[2] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        alive = False
    assert not alive, "the grandchild survived the timeout"


def test_output_is_capped_with_head_and_tail():
    ev = run(["python3", "-c", "print('A' * 5000 + 'B' * 5000)"], cap=1000)
    assert ev.truncated
    assert len(ev.stdout) < 1100
    assert ev.stdout.startswith("AAAA") and ev.stdout.rstrip().endswith("BBBB")
    assert "characters cut" in ev.stdout or "bytes cut" in ev.stdout


def test_nonzero_exit_code_and_stderr():
    ev = run(["sh", "-c", "echo oops >&2; exit 3"])
    assert ev.exit_code == 3 and ev.stderr == "oops\n" and ev.error is None


def test_which_all_lists_every_match_in_order(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        tool = d / "tool"
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o755)
    (tmp_path / "c").mkdir()
    path = os.pathsep.join([str(a), str(tmp_path / "c"), str(b), str(a)])
    assert which_all("tool", path) == [str(a / "tool"), str(b / "tool")]


def test_streaming_sees_each_line_as_it_comes(tmp_path):
    seen: list[tuple[float, str]] = []
    t0 = time.monotonic()
    script = "echo first; echo oops >&2; sleep 1.5; printf 'second\\nthird'"
    ev = run_streaming(["sh", "-c", script], lambda line: seen.append((time.monotonic() - t0, line)), timeout=10)
    assert [line for _, line in seen] == ["first", "second", "third"]
    assert seen[0][0] < 1.2 < seen[1][0]  # the first line arrived while the program still ran
    assert (ev.exit_code, ev.stdout, ev.stderr, ev.error) == (0, "first\nsecond\nthird", "oops\n", None)


def test_streaming_timeout_kills_the_group_and_keeps_the_output(tmp_path):
    marker = tmp_path / "child-alive"
    script = f"echo started; (sleep 3; touch {marker}) & sleep 30"
    t0 = time.monotonic()
    ev = run_streaming(["sh", "-c", script], lambda _line: None, timeout=1)
    assert time.monotonic() - t0 < 8
    assert ev.exit_code is None and ev.error.startswith("timed out after 1s") and ev.stdout == "started\n"
    time.sleep(3)
    assert not marker.exists()  # the background grandchild died with the group
    missing = run_streaming(["/nonexistent/zd-launcher"], lambda _line: None)
    assert missing.error == "/nonexistent/zd-launcher: executable not found" and missing.exit_code is None


def test_streaming_callback_errors_do_not_lose_lines():
    def boom(_line: str) -> None:
        raise RuntimeError("callback failed")

    ev = run_streaming(["sh", "-c", "echo a; echo b"], boom, timeout=10)
    assert ev.stdout == "a\nb\n" and ev.exit_code == 0


def test_only_the_childs_exit_or_the_time_limit_ends_the_wait(monkeypatch):
    """A poll that wakes before the child exits (a signal; a descriptor that went bad, as when another thread
    closed its number) waits again for the time left: a 2 s limit is not a time-out at the first wake-up."""
    import select as select_module

    from zdoctor.proc.runner import wait_exit

    real_poll = select_module.poll
    wakes: list[int] = []

    class Spurious:
        def __init__(self) -> None:
            self.inner = real_poll()

        def register(self, fd: int, mask: int) -> None:
            self.inner.register(fd, mask)
            self.fd = fd

        def poll(self, timeout_ms: float) -> list[tuple[int, int]]:
            wakes.append(1)
            if len(wakes) == 1:
                return [(self.fd, select_module.POLLNVAL)]  # an early wake-up: the child still runs
            return self.inner.poll(timeout_ms)

    monkeypatch.setattr(select_module, "poll", Spurious)
    proc = subprocess.Popen(["sleep", "0.5"])
    t0 = time.monotonic()
    assert wait_exit(proc, 2.0) == 0
    assert 0.4 < time.monotonic() - t0 < 2.0 and wakes
    slow = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            wait_exit(slow, 0.3)  # the limit itself still ends it
    finally:
        slow.kill()
        slow.wait()
