"""Nothing a command starts outlives it or zdoctor: new process groups, new sessions, daemons, and
zdoctor killed together with its reaper (the keeper, the cgroup, the descendant walk)."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from prockit import dead, wait_for

from zdoctor.layers.libraries.live import trace_command
from zdoctor.proc import cgroup, children
from zdoctor.proc.runner import run


def _token() -> str:
    """A `sleep` argument no other process uses: its processes are found by their command line."""
    return f"{600 + random.randint(1, 10**6) / 10**7:.7f}"


def _sleepers(token: str) -> list[int]:
    """Live processes whose command line is ``sleep TOKEN``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if argv[:2] == [b"sleep", token.encode()] and not dead(int(name)):
            found.append(int(name))
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


V2 = cgroup.base()
FREEZER = next((os.path.join(point, "") for point, fstype, opts in cgroup._mounts()
                if fstype == "cgroup" and "freezer" in opts.split(",")), None)


@pytest.fixture(params=["cgroup v2", "cgroup v1 freezer", "descendant walk"])
def backend(request, monkeypatch):
    """Each way zdoctor contains a child: the unified hierarchy's cgroup.kill, the v1 freezer, the keeper's
    walk of its descendants (no cgroup at all)."""
    if request.param == "cgroup v2":
        if V2 is None or V2[0] != "v2":
            pytest.skip("this node has no writable cgroup v2 hierarchy")
        monkeypatch.setattr(cgroup, "_base", V2)
    elif request.param == "cgroup v1 freezer":
        if FREEZER is None or not os.access(FREEZER, os.W_OK):
            pytest.skip("this node has no writable cgroup v1 freezer hierarchy")
        monkeypatch.setattr(cgroup, "_base", ("v1", FREEZER))
    else:
        monkeypatch.setattr(cgroup, "_base", None)
    return request.param


# A --python wrapper as it was met: it backgrounds its children, each in a group (and session) of its own.
WRAPPER = textwrap.dedent("""
    import subprocess, sys
    for _ in range(int(sys.argv[1])):
        subprocess.Popen(["sleep", sys.argv[2]], start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print("started")
""")


def test_a_wrapper_that_backgrounds_300_children_in_groups_of_their_own_leaves_none(backend):
    token = _token()
    try:
        ev = run([sys.executable, "-c", WRAPPER, "300", token], timeout=120)
        assert ev.exit_code == 0 and ev.stdout == "started\n", (ev.error, ev.stderr)
        assert wait_for(lambda: not _sleepers(token), 15), f"{len(_sleepers(token))} children outlived the wrapper"
        assert children.running() == []
        if backend != "descendant walk":
            assert not [n for n in os.listdir(cgroup._base[1]) if n.startswith(f"zdoctor-{os.getpid()}-")]
    finally:
        _kill(_sleepers(token))


def test_a_timed_out_command_ends_with_every_process_it_started(backend):
    token = _token()
    code = textwrap.dedent("""
        import os, subprocess, sys, time
        # a child in a new process group (as ninja runs each compiler) that starts a daemon of its own
        subprocess.Popen(["sh", "-c", "setsid sleep %s & exec sleep %s" % (sys.argv[1], sys.argv[1])],
                         preexec_fn=os.setpgrp)
        time.sleep(600)
    """)
    try:
        ev = run([sys.executable, "-c", code, token], timeout=4)
        assert ev.error and ev.error.startswith("timed out")
        assert wait_for(lambda: not _sleepers(token), 15), "a process of the timed-out command lives on"
    finally:
        _kill(_sleepers(token))


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_a_setsid_daemon_of_the_traced_command_is_ended_and_the_command_exit_decides(tmp_path):
    """The command exits after 1 s with code 3; its daemon would keep `strace -f` waiting (a false hang)."""
    token = _token()
    cmd = f"setsid sleep {token} </dev/null >/dev/null 2>&1 & sleep 1; echo done; exit 3"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
    try:
        t0 = time.monotonic()
        lt = trace_command(["/bin/sh", "-c", cmd], env, timeout=60)
        took = time.monotonic() - t0
        assert lt.strace_used, lt.notes
        assert not lt.timed_out and lt.exit_code == 3 and lt.evidence.stdout == "done\n", lt.notes
        assert took < 30, took
        assert wait_for(lambda: not _sleepers(token), 15), "the daemon outlived the command"
        assert lt.pending_calls == []  # nothing is reported as a hang
        # the keeper zdoctor runs the command under is not part of what the trace shows
        assert not any(e.syscall == "execve" and e.path == sys.executable
                       for evs in lt.last_files.values() for e in evs)
    finally:
        _kill(_sleepers(token))


# A zdoctor stand-in: it runs a command that starts a worker, prints the pids, and waits.
DRIVER = textwrap.dedent("""
    import sys, threading
    from zdoctor.proc import children, runner
    children.install_signal_handlers()
    def started(pid):
        print(pid, children._reaper.pid, flush=True)
    runner.run([sys.executable, "-c", sys.argv[1], sys.argv[2]], timeout=600, on_start=started)
""")
TREE = textwrap.dedent("""
    import subprocess, sys, time
    subprocess.Popen(["sleep", sys.argv[1]], start_new_session=True)
    subprocess.Popen(["sleep", sys.argv[1]])
    time.sleep(600)
""")


TRACING_DRIVER = textwrap.dedent("""
    import os, sys, threading, time
    from zdoctor.proc import children
    from zdoctor.layers.libraries.live import trace_command
    children.install_signal_handlers()
    def tell():
        while not children._reaper or not children.running():
            time.sleep(0.05)
        print(children.running()[-1], children._reaper.pid, flush=True)
    threading.Thread(target=tell, daemon=True).start()
    trace_command([sys.executable, "-c", sys.argv[1], sys.argv[2]], dict(os.environ), timeout=600)
""")


@pytest.mark.parametrize("how", ["run", "traced under strace"])
def test_sigkill_of_zdoctor_and_its_reaper_together_ends_the_command_tree(how):
    if how != "run" and shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    token = _token()
    driver = DRIVER if how == "run" else TRACING_DRIVER
    proc = subprocess.Popen([sys.executable, "-c", driver, TREE, token], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, reaper = map(int, proc.stdout.readline().split())
        assert wait_for(lambda: len(_sleepers(token)) == 2, 60), "the tree never started"
        os.kill(reaper, signal.SIGKILL)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        assert wait_for(lambda: not _sleepers(token), 15), "the traced command's tree outlived zdoctor"
    finally:
        _kill(_sleepers(token))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize("backend", ["cgroup v2", "cgroup v1 freezer"], indirect=True)
def test_a_cgroup_outlives_zdoctor_its_reaper_and_the_keeper_and_the_next_zdoctor_ends_it(backend, monkeypatch):
    """Everything zdoctor had is killed at once; the command's cgroup remains, and the next start kills it."""
    token = _token()
    kind, base = cgroup._base
    driver = DRIVER.replace("children.install_signal_handlers()",
                            f"children.install_signal_handlers()\nfrom zdoctor.proc import cgroup\n"
                            f"cgroup._base = {cgroup._base!r}")
    proc = subprocess.Popen([sys.executable, "-c", driver, TREE, token], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        keeper, reaper = map(int, proc.stdout.readline().split())
        assert wait_for(lambda: len(_sleepers(token)) == 2, 60)
        groups = [os.path.join(base, n) for n in os.listdir(base) if n.startswith(f"zdoctor-{proc.pid}-")]
        assert len(groups) == 1
        for sig in (signal.SIGSTOP, signal.SIGKILL):  # stopped first: none of them can react to the others
            for pid in (proc.pid, reaper, keeper):
                os.kill(pid, sig)
        proc.wait(30)
        time.sleep(1)
        assert len(_sleepers(token)) == 2  # no one was left to end them
        assert set(groups) <= set(cgroup.sweep_stale())  # what the next zdoctor does as it starts
        assert wait_for(lambda: not _sleepers(token), 15)
        assert not os.path.exists(groups[0])
    finally:
        _kill(_sleepers(token))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_python_wrapper_that_backgrounds_children_leaves_none_after_a_check(tmp_path):
    """`--python` names a wrapper script that starts 100 children, each in a session of its own, then runs
    the real interpreter: zdoctor runs it for several probes, and none of their children outlives the run
    that started it."""
    token = _token()
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nfor i in $(seq 100); do setsid sleep {token} </dev/null >/dev/null 2>&1 & done\n"
                       f'exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    try:
        proc = subprocess.run([sys.executable, "-m", "zdoctor", "check", "--no-log", "--json",
                               "--python", str(wrapper)], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode in (0, 1, 3), proc.stderr[-2000:]
        assert f'"{wrapper}"' in proc.stdout  # the wrapper was the interpreter probed
        assert wait_for(lambda: not _sleepers(token), 15), f"{len(_sleepers(token))} children outlived zdoctor"
    finally:
        _kill(_sleepers(token))
