"""A stale-lock scan that could not read everything never says "no lock": a real cache with more op
dirs than the scan reads (the stale lock in one past the cap), and a real op dir that the user zdoctor
runs as cannot read (an unprivileged user created here, removed after, scanning a cache where another
user's op dir is mode 0700 and holds a lock)."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from zdoctor.core.model import ProbeResult
from zdoctor.core.registry import Facts, load_vocabulary
from zdoctor.host import LiveHost
from zdoctor.layers import evaluate_check
from zdoctor.layers.toolchain.probe_hangs import collect_jitcache, collect_processes
from zdoctor.readers import jitcache as jc

load_vocabulary()

USER = "zdh3lock"


def target_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME", "CXX", "CC")}
    env.update(extra)
    return env


def make_op(root: Path, name: str, *, lock: bool = False) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "build.ninja").write_text("ninja_required_version = 1.3\ncxx = c++\n")
    if lock:
        os.close(os.open(d / "lock", os.O_CREAT | os.O_EXCL))
    return d


def stale_lock_findings(jit: dict) -> list:
    procs, _ = collect_processes(jit, 0.05)
    facts = Facts({"jitcache": ProbeResult(probe="jitcache", status="ok", facts=jit),
                   "processes": ProbeResult(probe="processes", status="ok", facts=procs),
                   "locktrial": ProbeResult(probe="locktrial", status="skip",
                                            facts={"skipped": "no stale JIT build lock", "trials": []})})
    return evaluate_check("hangs.stale-lock", facts)


def test_a_lock_past_the_entry_cap_is_not_no_lock(tmp_path: Path) -> None:
    root = tmp_path / "ext"
    for i in range(jc.MAX_OPS):
        make_op(root, f"op{i:04d}")
    make_op(root, "zz_cpu_adam", lock=True)  # sorted last: past the cap
    facts = LiveHost(python=sys.executable, env=target_env(TORCH_EXTENSIONS_DIR=str(root))).results(
        ["jitcache", "processes", "locktrial"])
    jit = facts.of("jitcache")
    assert len(jit["ops"]) == jc.MAX_OPS and not jit["locks"]
    assert any("1 more entries not read" in x and str(root) in x for x in jit["unscanned"]), jit["unscanned"]
    (f,) = evaluate_check("hangs.stale-lock", facts)
    assert f.status == "warn" and f.status != "ok" and "not scanned" in f.title, (f.title, f.detail)
    assert "No JIT build locks" not in f.title and str(root) in f.detail


@pytest.fixture
def user():
    subprocess.run(["userdel", USER], capture_output=True)
    subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", USER], check=True)
    try:
        yield pwd.getpwnam(USER)
    finally:
        subprocess.run(["userdel", USER], capture_output=True)


def scan_as(pw: pwd.struct_passwd, env: dict[str, str]) -> dict:
    """The jitcache facts, collected in a child that really runs as ``pw``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            facts, _ = collect_jitcache(env, None)
            os.write(w, json.dumps(facts).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_an_op_dir_that_cannot_be_read_is_named_not_passed_over(user) -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as top:  # pytest's tmp_path is private to root
        os.chmod(top, 0o755)
        root = Path(top) / "ext"
        make_op(root, "fused_adam")
        hidden = make_op(root, "cpu_adam", lock=True)
        os.chmod(root, 0o755)
        os.chmod(hidden, 0o700)  # another user's op dir: its lock cannot be seen
        jit = scan_as(user, target_env(TORCH_EXTENSIONS_DIR=str(root)))
        assert not jit["locks"] and [o["name"] for o in jit["ops"]] == ["cpu_adam", "fused_adam"]
        assert any(str(hidden) in x and "Permission denied" in x for x in jit["unscanned"]), jit["unscanned"]
        (f,) = stale_lock_findings(jit)
        assert f.status == "warn" and "not scanned" in f.title and str(hidden) in f.detail, (f.title, f.detail)
        # read as root, the same cache shows the lock itself
        root_jit, _ = collect_jitcache(target_env(TORCH_EXTENSIONS_DIR=str(root)), None)
        assert root_jit["locks"] == [str(hidden / "lock")] and not root_jit["unscanned"]
