"""strace parsing: captured -f/-ff/stderr layouts, threads racing on opens, a hung process, and a live run."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from zdoctor.layers.libraries.strace import decode_c_string, last_files, parse_strace, parse_strace_files, unfinished

LD = Path(__file__).resolve().parent / "fixtures" / "lddebug"
NAMES = ["/tmp/zdemo/files/plain.txt", '/tmp/zdemo/files/we"ird\nname \u00e9.txt',
         "/tmp/zdemo/files/sp ace $(touch x).txt"]


@pytest.fixture(scope="module")
def threads():
    text = (LD / "strace-threads.txt").read_text()
    return text, parse_strace(text)


def test_unfinished_and_resumed_halves_are_joined(threads):
    text, events = threads
    lines = text.splitlines()
    resumed = sum("resumed>" in line for line in lines)
    assert resumed > 0
    calls = sum(bool(re.search(r"\b(openat|execve)\(", line)) for line in lines)
    assert len(events) == calls  # one event per call, however it was split
    # The first split call keeps its start time and gets the result of its resumed half.
    first = next(line for line in lines if "<unfinished ...>" in line)
    pid, ts = first.split()[:2]
    path = re.search(r'"([^"]+)"', first)[1]
    ev = next(e for e in events if e.pid == int(pid) and e.ts == ts)
    assert ev.path == path and ev.result is not None


def test_every_worker_thread_is_accounted_for(threads):
    _, events = threads
    main = events[0].pid
    workers = [p for p, n in Counter(e.pid for e in events).items() if n == 80]
    assert len(workers) == 4 and main not in workers
    for tid in workers:
        evs = [e for e in events if e.pid == tid]
        bad = [e for e in evs if not e.ok]
        assert len(bad) == 40 and {e.errno for e in bad} == {"ENOENT"}
        assert len({e.path for e in bad}) == 1 and bad[0].path.startswith("/tmp/zdemo/files/missing-")
        assert {e.path for e in evs if e.ok} == set(NAMES)
    assert [e.path for e in events if e.syscall == "execve"] == [
        "/root/.pyenv/versions/3.11.7/bin/python3", "/bin/sh"]


def test_escaped_names_are_decoded_exactly(threads):
    _, events = threads
    created = [e for e in events if "O_CREAT" in e.flags]
    assert [e.path for e in created] == NAMES
    assert all(e.result == 3 and e.flags == "O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC" for e in created)


def test_last_files_per_pid(threads):
    _, events = threads
    last = last_files(events, n=3)
    for tid, evs in last.items():
        assert len(evs) <= 3 and all(e.ok and e.syscall != "execve" for e in evs)
        assert evs == [e for e in events if e.pid == tid and e.ok and e.syscall != "execve"][-3:]
    child = max(last)  # the shell started by os.system opened only the cache and libc
    assert [e.path for e in last[child]] == ["/etc/ld.so.cache", "/lib/x86_64-linux-gnu/libc.so.6"]


def test_stderr_layout_with_pid_brackets():
    events = parse_strace((LD / "strace-stderr.txt").read_text(), default_pid=1)
    execs = [(e.pid, e.path) for e in events if e.syscall == "execve"]
    assert execs[0] == (1, "/root/.pyenv/versions/3.11.7/bin/python3")
    assert [p for _, p in execs[1:]] == ["/bin/sh", "/usr/bin/cat"]
    assert len({pid for pid, _ in execs}) == 3
    assert any(e.pid == 1 and e.path == "/etc/hostname" and e.ok for e in events)
    cat = execs[2][0]
    assert any(e.pid == cat and e.path == "/etc/hostname" for e in events)


def test_one_file_per_pid_layout():
    events = parse_strace_files(str(LD / "strace-ff"), "trace")
    pids = sorted({int(p.name.split(".")[1]) for p in (LD / "strace-ff").iterdir()})
    assert sorted({e.pid for e in events}) == pids
    assert [e.path for e in events if e.syscall == "execve"] == [
        "/root/.pyenv/versions/3.11.7/bin/python3", "/bin/sh", "/usr/bin/cat"]
    assert parse_strace_files(str(LD / "nowhere"), "trace") == []


def test_hung_process_shows_the_call_it_is_stuck_in():
    events = parse_strace((LD / "strace-hung.txt").read_text())
    (stuck,) = unfinished(events)
    assert stuck.path == "/tmp/zdemo/fifo" and stuck.result is None and stuck.syscall == "openat"
    assert last_files(events)[stuck.pid][-1].path == "/tmp/zdemo/files/plain.txt"


def test_c_string_decoding_and_truncation():
    assert decode_c_string(r'"a\"b\\c\n\t\303\251\x41\0"', 0) == ('a"b\\c\n\té\x41\x00', 27, False)
    text, end, cut = decode_c_string('"/very/long/pa"..., O_RDONLY', 0)
    assert (text, cut) == ("/very/long/pa", True) and end == len('"/very/long/pa"...')
    assert decode_c_string('"unterminated', 0) is None
    assert decode_c_string("x", 0) is None
    # bytes that are not UTF-8 survive as surrogate escapes
    assert decode_c_string(r'"\377"', 0)[0].encode("utf-8", "surrogateescape") == b"\xff"


def test_garbage_and_other_lines_are_ignored():
    text = "\n".join([
        "strace: Process 12 attached",
        "12 10:00:00.000001 --- SIGCHLD {si_signo=SIGCHLD} ---",
        "12 10:00:00.000002 +++ exited with 0 +++",
        "12 10:00:00.000003 read(3, \"x\", 1) = 1",
        "\x00\xff nonsense (",
        "12 10:00:00.000004 <... openat resumed>) = 3",  # resumed with no start: dropped
        '12 10:00:00.000005 open("/etc/x", O_RDONLY) = -1 EACCES (Permission denied)',
        '1700000000.123456 openat(AT_FDCWD, "/y", O_RDONLY) = 4',
    ])
    events = parse_strace(text, default_pid=99)
    assert [(e.pid, e.syscall, e.path, e.result, e.errno) for e in events] == [
        (12, "open", "/etc/x", -1, "EACCES"), (99, "openat", "/y", 4, None)]
    assert parse_strace("") == []


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is part of the test machine")
def test_real_strace_run_round_trips_a_hostile_name(tmp_path):
    name = tmp_path / 'a "q" $(touch pwned) \u00e9\n.txt'
    log = tmp_path / "log"
    proc = subprocess.run(["strace", "-f", "-tt", "-e", "trace=openat,open,execve", "-o", str(log), "-s", "512",
                           "--", sys.executable, "-c", "import sys; open(sys.argv[1], 'w').close()", str(name)],
                          capture_output=True, timeout=60)
    if proc.returncode != 0 and b"ptrace" in proc.stderr:
        pytest.skip("ptrace is refused in this container")
    events = parse_strace(log.read_text())
    assert [e.path for e in events if "O_CREAT" in e.flags] == [str(name)]
    assert events[0].syscall == "execve" and events[0].path == sys.executable
    assert not (tmp_path / "pwned").exists()


STAT_THEN_OPEN = "import os, sys; os.stat(sys.argv[1]); open(sys.argv[2]).close()"


def _traced_log(prefix: list[str], log: Path, statted: Path, opened: Path) -> str:
    proc = subprocess.run([*prefix, sys.executable, "-S", "-c", STAT_THEN_OPEN, str(statted), str(opened)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return log.read_text()


def test_a_run_traced_from_its_start_stops_only_at_the_opens_and_execs_where_the_kernel_filters(tmp_path):
    """The from-start trace filters in the kernel (--seccomp-bpf): the command's opens are in the log, its
    stats (most of an import's calls, which made a traced torch import three times slower) never stop it;
    the command still runs to its end."""
    from zdoctor.layers.libraries.live import STRACE_TRACE_FROM_START, strace_from_start

    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed")
    statted, opened, log = tmp_path / "statted.txt", tmp_path / "opened.txt", tmp_path / "log"
    statted.write_text("s")
    opened.write_text("o")
    prefix, problem = strace_from_start(strace, str(log))
    assert problem is None and prefix is not None
    assert "--seccomp-bpf" in prefix and STRACE_TRACE_FROM_START in prefix
    text = _traced_log(prefix, log, statted, opened)
    assert f'openat(AT_FDCWD, "{opened}", O_RDONLY|O_CLOEXEC) = ' in text
    calls_on = [line for line in text.splitlines() if str(statted) in line and "execve(" not in line]
    assert calls_on == []  # the stat family is not traced
    assert "execve(" in text


def test_a_strace_that_cannot_filter_in_the_kernel_traces_every_file_call(tmp_path):
    """An strace without --seccomp-bpf (before 5.3, or a kernel without seccomp) still traces the run, with
    the stat family too: there every call stops the command anyway."""
    from zdoctor.layers.libraries.live import STRACE_TRACE, strace_from_start

    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed")
    old = tmp_path / "strace"
    old.write_text('#!/bin/sh\nfor a in "$@"; do [ "$a" = --seccomp-bpf ] && '
                   '{ echo "strace: unrecognized option \'--seccomp-bpf\'" >&2; exit 1; }; done\n'
                   f'exec {strace} "$@"\n')
    old.chmod(0o755)
    statted, opened, log = tmp_path / "statted.txt", tmp_path / "opened.txt", tmp_path / "log"
    statted.write_text("s")
    opened.write_text("o")
    prefix, problem = strace_from_start(str(old), str(log))
    assert problem is None and prefix is not None
    assert "--seccomp-bpf" not in prefix and STRACE_TRACE in prefix
    text = _traced_log(prefix, log, statted, opened)
    assert re.search(r"(?:stat|statx)\(.*" + re.escape(str(statted)), text) and str(opened) in text
