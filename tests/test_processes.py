"""Training processes read from the live /proc: real lock owners and waiters (torch FileBaton's
protocol, reproduced with real processes), killed builders, libraries mapped, psutil refusals."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from prockit import BUILDER, WAITER, dead, wait_for

from zdoctor.readers import jitcache as jc
from zdoctor.readers import processes as pr


def by_pid(procs: list[pr.ProcInfo], pid: int) -> pr.ProcInfo:
    found = [p for p in procs if p.pid == pid]
    assert found, f"pid {pid} not among {[p.pid for p in procs]}"
    return found[0]


def op_dir(tmp_path: Path, name: str = "cpu_adam") -> tuple[Path, Path, dict[str, str]]:
    root = tmp_path / "ext"
    d = root / name
    d.mkdir(parents=True)
    (d / "build.ninja").write_text("ninja_required_version = 1.3\ncxx = c++\n")
    return d, d / "lock", {"TORCH_EXTENSIONS_DIR": str(root)}




def test_builder_killed_mid_build_leaves_a_stale_lock(tmp_path: Path, spawn) -> None:
    d, lock, env = op_dir(tmp_path)
    ready = tmp_path / "ready"
    pid = spawn(BUILDER, extra=[str(lock), str(ready)])
    assert wait_for(ready.exists)
    ops = jc.scan_jit_cache(env)
    assert [op.lock_path for op in ops] == [str(lock)]
    procs = pr.training_processes(watch=[str(d)])
    builder = by_pid(procs, pid)
    assert str(lock) in builder.open_files
    assert [p.pid for p in pr.lock_owners(str(lock), procs)] == [pid]
    assert pr.stale_locks(ops, procs) == []
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: dead(pid))
    assert lock.exists()  # nobody deleted it
    procs = pr.training_processes(watch=[str(d)])
    assert pr.lock_owners(str(lock), procs) == []
    assert [op.name for op in pr.stale_locks(jc.scan_jit_cache(env), procs)] == ["cpu_adam"]


def test_a_waiting_launch_is_seen_sleeping_in_its_poll_loop(tmp_path: Path, spawn) -> None:
    d, lock, env = op_dir(tmp_path)
    os.close(os.open(lock, os.O_CREAT | os.O_EXCL))  # left behind by a dead builder
    started, done = tmp_path / "started", tmp_path / "done"
    pid = spawn(WAITER, env={**os.environ, **env}, extra=[str(lock), str(started), str(done)])
    assert wait_for(started.exists)
    time.sleep(1.2)
    procs = pr.training_processes()
    w = by_pid(procs, pid)
    assert w.state_letter == "S" and w.state == psutil.STATUS_SLEEPING
    assert pr.sleeping_wchan(w.wchan), w.wchan
    assert "os.path.exists(sys.argv[1])" in " ".join(w.cmdline) and w.matched == "python"
    assert w.elapsed_s >= 1.0
    assert w.environ["TORCH_EXTENSIONS_DIR"] == env["TORCH_EXTENSIONS_DIR"]
    assert pid in [p.pid for p in pr.likely_waiters(procs, [env["TORCH_EXTENSIONS_DIR"]])]
    assert pid not in [p.pid for p in pr.likely_waiters(procs, [str(tmp_path / "other")])]
    pr.sample_cpu([w], 0.5)
    assert w.cpu_delta_s is not None and w.cpu_delta_s < 0.2
    assert [op.name for op in pr.stale_locks(jc.scan_jit_cache(env), procs)] == ["cpu_adam"]
    lock.unlink()  # what the remedy does: the waiter stops waiting at once
    assert wait_for(done.exists, 5)


def test_processes_in_the_op_dir_are_builders_not_owners(tmp_path: Path, spawn) -> None:
    d, lock, env = op_dir(tmp_path)
    os.close(os.open(lock, os.O_CREAT | os.O_EXCL))
    in_dir = spawn("import time; time.sleep(600)", cwd=d, argv0="cc1plus")
    naming = spawn("import time; time.sleep(600)", argv0="ninja", extra=["-C", str(d)])
    bystander = spawn("import time; time.sleep(600)", cwd=tmp_path)
    assert wait_for(lambda: all(psutil.Process(p).cwd() for p in (in_dir, naming, bystander)))
    procs = pr.training_processes(watch=[str(d)])
    assert by_pid(procs, naming).cmdline[:3] == ["ninja", "-c", "import time; time.sleep(600)"]
    assert by_pid(procs, in_dir).cwd == str(d)
    holders = {p.pid for p in pr.lock_holders(str(lock), procs)}
    assert {in_dir, naming} <= holders and bystander not in holders
    # Neither has the lock open: like compilers left running after their launcher was killed, they
    # will never delete it.
    assert pr.lock_owners(str(lock), procs) == []
    assert [op.name for op in pr.stale_locks(jc.scan_jit_cache(env), procs)] == ["cpu_adam"]


def test_watched_dirs_bring_in_processes_of_any_name(tmp_path: Path, spawn) -> None:
    d, lock, _env = op_dir(tmp_path)
    ready = tmp_path / "ready"
    pid = spawn(BUILDER, argv0="custom-launcher", extra=[str(lock), str(ready)])
    assert wait_for(ready.exists)
    # The process name still says python; match on something it does not carry.
    assert pid not in [p.pid for p in pr.training_processes(match=("no-such-tool",))]
    found = by_pid(pr.training_processes(match=("no-such-tool",), watch=[str(d)]), pid)
    assert found.matched is None and str(lock) in found.open_files


def test_own_process_tree_is_left_out() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert wait_for(lambda: psutil.Process(child.pid).cmdline() != [])
        assert child.pid not in [p.pid for p in pr.training_processes()]
        assert os.getpid() not in [p.pid for p in pr.training_processes()]
        assert child.pid in [p.pid for p in pr.training_processes(exclude=())]
    finally:
        child.kill()
        child.wait()


def test_mapped_libstdcxx_and_environment(tmp_path: Path, spawn) -> None:
    ready = tmp_path / "ready"
    code = ("import ctypes, sys, time; ctypes.CDLL('libstdc++.so.6'); open(sys.argv[1], 'w').close(); "
            "time.sleep(600)")
    env = {**os.environ, "LD_LIBRARY_PATH": "/opt/one:/opt/two", "LD_PRELOAD": ""}
    pid = spawn(code, env=env, extra=[str(ready)])
    assert wait_for(ready.exists)
    info = by_pid(pr.training_processes(), pid)
    assert info.libstdcxx, info.errors
    m = info.libstdcxx[0]
    assert os.path.basename(m["path"]).startswith("libstdc++.so.6") and not m["deleted"]
    st = os.stat(m["path"])
    assert m["inode"] == st.st_ino
    assert re.fullmatch(r"[0-9a-f]+:[0-9a-f]+", m["dev"])
    assert int(m["dev"].split(":")[0], 16) == os.major(st.st_dev)
    assert info.libgcc_s and os.path.basename(info.libgcc_s[0]["path"]).startswith("libgcc_s.so")
    assert info.ld_library_path == "/opt/one:/opt/two" and info.ld_preload == ""
    json.dumps(info.to_dict())
    assert pr.ProcInfo.from_dict(json.loads(json.dumps(info.to_dict()))) == info


def test_access_denied_is_recorded_per_field(tmp_path: Path, spawn, monkeypatch) -> None:
    d, lock, env = op_dir(tmp_path)
    ready = tmp_path / "ready"
    pid = spawn(BUILDER, extra=[str(lock), str(ready)])
    assert wait_for(ready.exists)

    def denied(self, *a, **k):
        raise psutil.AccessDenied(self.pid, self._name)

    monkeypatch.setattr(psutil.Process, "open_files", denied)
    monkeypatch.setattr(psutil.Process, "cwd", denied)
    info = by_pid(pr.training_processes(), pid)
    assert info.errors == {"open_files": "AccessDenied", "cwd": "AccessDenied"}
    assert info.open_files == [] and info.cwd is None and info.state_letter == "S"
    # The owner's files cannot be seen: the lock looks stale, and the process is named as uncertain.
    procs = pr.training_processes()
    assert pid in [p.pid for p in pr.uncertain_for(procs)]


def test_zombies_and_vanished_processes_never_raise() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        proc = psutil.Process(child.pid)
        assert wait_for(lambda: proc.status() == psutil.STATUS_ZOMBIE)
        z = pr.read_process(proc, "python")
        assert z.state == psutil.STATUS_ZOMBIE and z.state_letter == "Z" and "zombie" in z.errors
        assert pr.lock_holders("/x/lock", [z]) == [] and not z.gone
    finally:
        child.wait()
    gone = pr.read_process(proc, "python")
    assert gone.gone and gone.errors["process"] == "NoSuchProcess"


def test_cpu_sample_tells_busy_from_idle(spawn) -> None:
    busy = spawn("while True: pass")
    idle = spawn("import time; time.sleep(600)")
    time.sleep(0.3)
    procs = [p for p in pr.training_processes() if p.pid in (busy, idle)]
    pr.sample_cpu(procs, 0.6)
    delta = {p.pid: p.cpu_delta_s for p in procs}
    assert delta[busy] > 0.05 and delta[idle] < 0.02
