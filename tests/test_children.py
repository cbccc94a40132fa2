"""No orphans: every process zdoctor started ends when zdoctor is signalled, killed or its SSH session drops."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prockit import dead, wait_for

from zdoctor.proc import children

# A launch that starts a worker, as a launcher does; both record their pids and sleep.
TREE = textwrap.dedent("""
    import os, subprocess, sys, time
    out = sys.argv[1]
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(out + ".tmp", "w") as fh:
        fh.write(f"{os.getpid()} {worker.pid}\\n")
    os.rename(out + ".tmp", out)
    time.sleep(600)
""")

# zdoctor's own entry point, as the console script runs it.
ZDOCTOR = [sys.executable, "-c", "import sys; from zdoctor.front.cli import main; sys.exit(main())"]


def _tree_pids(pidfile: Path) -> list[int]:
    assert wait_for(pidfile.exists, 90), "the traced command never started"
    return [int(p) for p in pidfile.read_text().split()]


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _start_check(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    (tmp_path / "tree.py").write_text(TREE)
    pidfile = tmp_path / "pids"
    cmd = f"{sys.executable} {tmp_path / 'tree.py'} {pidfile}"
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    proc = subprocess.Popen([*ZDOCTOR, "check", "--no-log", "--python", sys.executable, "--command", cmd,
                             "--timeout", "300"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    return proc, pidfile


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGKILL],
                         ids=["SIGHUP", "SIGTERM", "SIGINT", "SIGKILL"])
def test_a_signalled_check_leaves_no_process_of_the_traced_launch(tmp_path, sig):
    proc, pidfile = _start_check(tmp_path)
    pids: list[int] = []
    try:
        pids = _tree_pids(pidfile)
        assert not any(dead(p) for p in pids)
        proc.send_signal(sig)
        code = proc.wait(30)
        assert all(wait_for(lambda p=p: dead(p), 15) for p in pids), "a process of the launch outlived zdoctor"
        if sig == signal.SIGINT:
            assert code == 130 and b"interrupted" in proc.stderr.read()
        else:
            assert code == -sig  # it dies of the signal, as the sender expects
    finally:
        _kill_all(pids)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# A zdoctor stand-in that runs one command through the core and never gets to clean up by itself.
DRIVER = textwrap.dedent("""
    import sys, threading
    from zdoctor.proc import children, runner
    if sys.argv[1] == "no-reaper":
        children._reaper = False  # the parent-death signal alone
    children.install_signal_handlers()
    argv = [sys.executable, sys.argv[2], sys.argv[3]]
    if sys.argv[4] == "remedy":
        from zdoctor.walk.apply import run_remedy
        from zdoctor.core.model import Remedy
        import shlex, os
        work = threading.Thread(target=run_remedy, args=(Remedy(title="re-run", commands=[shlex.join(argv)]),
                                                         dict(os.environ)))
    else:
        work = threading.Thread(target=runner.run, args=(argv,), kwargs={"timeout": 600})
    work.start()
    work.join()
""")


@pytest.mark.parametrize("how", ["runner", "remedy"])
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGKILL], ids=["SIGHUP", "SIGTERM", "SIGKILL"])
def test_children_started_from_a_worker_thread_end_with_zdoctor(tmp_path, sig, how):
    (tmp_path / "tree.py").write_text(TREE)
    pidfile = tmp_path / "pids"
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, "reaper", str(tmp_path / "tree.py"), str(pidfile), how],
                            start_new_session=True)
    pids: list[int] = []
    try:
        pids = _tree_pids(pidfile)
        proc.send_signal(sig)
        assert proc.wait(30) == -sig
        assert all(wait_for(lambda p=p: dead(p), 15) for p in pids)
    finally:
        _kill_all(pids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_parent_death_signal_ends_the_direct_child_on_sigkill(tmp_path):
    (tmp_path / "tree.py").write_text(TREE)
    pidfile = tmp_path / "pids"
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, "no-reaper", str(tmp_path / "tree.py"), str(pidfile),
                             "runner"], start_new_session=True)
    pids: list[int] = []
    try:
        pids = _tree_pids(pidfile)
        proc.kill()
        proc.wait(30)
        assert wait_for(lambda: dead(pids[0]), 15), "the parent-death signal did not reach the child"
    finally:
        _kill_all(pids)


def test_the_parent_death_signal_is_set_up_without_a_child_of_its_own(monkeypatch):
    # ctypes.util.find_library("c") would run ldconfig (and a compiler) as children nothing contains
    def no_child(*a, **k):
        raise AssertionError(f"a child process was started: {a!r}")

    monkeypatch.setattr(subprocess, "Popen", no_child)
    monkeypatch.setattr(children, "_prctl", None)
    prctl = children._load_prctl()
    assert prctl is not None
    assert prctl(3, 0, 0, 0, 0) in (0, 1, 2)  # the real prctl: PR_GET_DUMPABLE answers 0, 1 or 2


def test_registry_forgets_reaped_groups_and_ends_running_ones(tmp_path):
    from zdoctor.proc.runner import run

    ev = run([sys.executable, "-c", "print('ok')"])
    assert ev.exit_code == 0 and children.running() == []
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    children.register(child.pid)
    try:
        assert children.end_all(grace=5) == [child.pid]
        assert child.wait(10) == -signal.SIGTERM
    finally:
        children.forget(child.pid)
        if child.poll() is None:
            child.kill()
            child.wait()
    assert children.pdeathsig_hook() is not None or not sys.platform.startswith("linux")


# After SIGINT, a worker thread still queued (a remedy re-run behind the traced launch) starts its command.
AFTER_SIGINT = textwrap.dedent("""
    import os, signal, sys, threading, time
    from zdoctor.proc import children, runner
    children.install_signal_handlers()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    except KeyboardInterrupt:
        pass
    t0 = time.monotonic()
    ev = runner.run([sys.executable, "-c", "import time; time.sleep(600)"], timeout=600)
    print(f"{ev.exit_code} {time.monotonic() - t0:.1f}")
""")


def test_a_child_started_after_an_interrupt_is_ended_at_once(tmp_path):
    """zdoctor interrupted: a probe or re-run that a worker thread starts afterwards must not keep it alive
    (the interpreter waits for its threads) -- the new child is killed as it starts."""
    proc = subprocess.run([sys.executable, "-c", AFTER_SIGINT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    code, took = proc.stdout.split()
    assert int(code) == -signal.SIGKILL and float(took) < 60, proc.stdout


# The signal arrives while the main thread itself holds the registry's lock (starting a child, say).
SIGNAL_UNDER_LOCK = textwrap.dedent("""
    import os, signal, sys, threading, time
    from zdoctor.proc import children, runner
    children.install_signal_handlers()
    threading.Thread(target=runner.run, args=([sys.executable, "-c", "import time; time.sleep(600)"],),
                     kwargs={"timeout": 600, "on_start": lambda pid: print(pid, flush=True)}).start()
    time.sleep(float(sys.argv[1]))
    with children._lock:
        os.kill(os.getpid(), getattr(signal, sys.argv[2]))
        time.sleep(60)
""")


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_signal_while_the_main_thread_holds_the_lock_still_ends_zdoctor_and_its_children(sig):
    proc = subprocess.Popen([sys.executable, "-c", SIGNAL_UNDER_LOCK, "3", sig], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        child = int(proc.stdout.readline())
        proc.wait(30)  # it used to wait for its own lock forever
        assert wait_for(lambda: dead(child), 15), "the child outlived zdoctor"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# The signal lands on a probe's thread, not the main one, while the main thread waits for the probes.
SIGNAL_ON_A_WORKER = textwrap.dedent("""
    import os, signal, sys, threading, time
    from zdoctor.proc import children, runner; from zdoctor.core import registry
    from zdoctor.host import LiveHost
    children.install_signal_handlers()

    @registry.probe("t.sleeper", title="sleeps", timeout=600)
    def sleeper(host):
        ev = runner.run([sys.executable, "-c", "import time; time.sleep(600)"], timeout=600,
                        on_start=lambda pid: print(pid, flush=True))
        return {}, [ev]

    def aim():
        time.sleep(2)
        worker = next(t for t in threading.enumerate() if t.name == "probe:t.sleeper")
        signal.pthread_kill(worker.ident, getattr(signal, sys.argv[1]))

    threading.Thread(target=aim, daemon=True).start()
    LiveHost().results(["t.sleeper"])
""")


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_delivered_to_a_probe_thread_still_ends_zdoctor(sig):
    proc = subprocess.Popen([sys.executable, "-c", SIGNAL_ON_A_WORKER, sig], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        child = int(proc.stdout.readline())
        proc.wait(30)  # the main thread sat in one long join and never ran the handler
        assert wait_for(lambda: dead(child), 15), "the child outlived zdoctor"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_keeper_ends_with_the_thread_that_started_it_and_is_started_without_a_preexec_fn(monkeypatch):
    """The keeper asks for its parent-death signal itself (so its start can be a vfork): when the zdoctor
    thread that started it ends, the keeper ends the command it keeps."""
    import threading

    from zdoctor.proc import contain

    real_popen = subprocess.Popen
    hooks: list[object] = []

    def popen(*args, **kwargs):
        hooks.append(kwargs.get("preexec_fn"))
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)
    started: list[contain.Contained] = []
    worker = threading.Thread(target=lambda: started.append(contain.popen(["sleep", "60"], stdout=subprocess.DEVNULL)))
    worker.start()
    worker.join()
    (child,) = started
    try:
        assert hooks and all(h is None for h in hooks)  # the reaper, then the keeper
        assert child.proc.wait(15) is not None  # the keeper got its signal when the thread ended
        keeper_gone = child.proc.returncode
        assert keeper_gone != 0
    finally:
        with contextlib.suppress(OSError):
            os.killpg(child.proc.pid, signal.SIGKILL)
        child.finish()
