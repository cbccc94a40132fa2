"""The hang checks end to end on the live machine: a builder really killed mid-build, a launch really
waiting on its lock, a process really stuck in the kernel, damaged and foreign JIT ops, and remedies
run in bash that delete exactly what they name, hostile names included."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from prockit import BUILDER, WAITER, dead, wait_for

import zdoctor.layers.toolchain.check_hangs as hc
import zdoctor.layers.toolchain.probe_hangs as ph
import zdoctor.layers.toolchain.probe_toolchain  # noqa: F401 - registers the toolchain probe
from zdoctor.core.model import ProbeResult
from zdoctor.core.registry import CHECKS, PREDICATES, PROBES, Facts
from zdoctor.host import LiveHost
from zdoctor.layers import evaluate_check

# A parent blocked in vfork() until its child execs or exits: the kernel shows it in state D.
VFORK = """
import ctypes, sys
ctypes.CDLL("libstdc++.so.6")
libc = ctypes.CDLL(None)
open(sys.argv[1], "w").close()
if libc.vfork() == 0:
    libc.sleep(600)
    libc._exit(0)
"""
SOURCE = r"""
#include <string>
extern "C" int op_entry(const char *s) { return static_cast<int>(std::string(s).size()); }
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real g++ builds: a plain op, and one whose .comment also names a newer GCC (as if built elsewhere)."""
    d = tmp_path_factory.mktemp("ops")
    (d / "op.cpp").write_text(SOURCE)
    (d / "newer.cpp").write_text(SOURCE + '__asm__(".ident \\"GCC: (Other node image) 99.1.0\\"");\n')
    out = {}
    for name in ("op", "newer"):
        so = d / f"{name}.so"
        subprocess.run(["g++", "-shared", "-fPIC", "-o", str(so), str(d / f"{name}.cpp")], check=True, timeout=120)
        out[name] = so
    return out


def target_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME", "CXX", "CC")}
    env.update(extra)
    return env


def make_op(root: Path, name: str | bytes, *, so: bytes | None = None, lock: bool = False) -> Path:
    d = Path(os.fsdecode(os.path.join(os.fsencode(root), os.fsencode(name))))
    d.mkdir(parents=True)
    (d / "build.ninja").write_text("ninja_required_version = 1.3\ncxx = c++\n")
    if so is not None:
        (d / f"{d.name}.so").write_bytes(so)
    if lock:
        os.close(os.open(d / "lock", os.O_CREAT | os.O_EXCL))
    return d


def probe(env: dict[str, str], names: tuple[str, ...] = ("jitcache", "processes", "locktrial")) -> Facts:
    return LiveHost(python=sys.executable, env=env).results(names)


def tree(root: Path) -> set[str]:
    return {os.path.join(dp, f) for dp, dns, fs in os.walk(root) for f in [*fs, *dns]}


def bash(line: str, cwd: Path) -> None:
    assert "\n" not in line
    subprocess.run(["bash", "-c", line], cwd=cwd, check=True, timeout=30)


def test_vocabulary_is_registered() -> None:
    assert PROBES["jitcache"].title == "JIT-built DeepSpeed ops" and PROBES["jitcache"].needs == ("pyenv",)
    assert PROBES["processes"].title == "Running training processes"
    assert {"hangs.stale-lock", "hangs.processes", "jit.corrupt-ops", "jit.foreign-toolchain"} <= set(CHECKS)
    assert {"stale_jit_lock", "jit_op_corrupt"} <= set(PREDICATES)


def test_killed_builder_hangs_the_next_launch_and_the_remedy_frees_it(tmp_path: Path, spawn) -> None:
    root = tmp_path / "ext"
    env = target_env(TORCH_EXTENSIONS_DIR=str(root))
    adam = make_op(root, "cpu_adam")
    lion = make_op(root, "cpu_lion")
    ready, ready2, started, done = (tmp_path / n for n in ("ready", "ready2", "started", "done"))
    doomed = spawn(BUILDER, extra=[str(adam / "lock"), str(ready)])
    alive = spawn(BUILDER, extra=[str(lion / "lock"), str(ready2)])
    assert wait_for(ready.exists) and wait_for(ready2.exists)
    os.kill(doomed, signal.SIGKILL)
    assert wait_for(lambda: dead(doomed))
    waiter = spawn(WAITER, env=env, extra=[str(adam / "lock"), str(started), str(done)])
    assert wait_for(started.exists)
    time.sleep(0.5)
    assert not done.exists()  # it really waits

    facts = probe(env)
    json.dumps({n: r.to_dict() for n, r in facts.items()})
    assert hc.stale_jit_lock(facts)
    findings = evaluate_check("hangs.stale-lock", facts)
    assert len(findings) == 1, [f.title for f in findings]
    (f,) = findings
    assert f.status == "fail" and f.id == "hangs.stale-lock.cpu_adam" and "cpu_adam" in f.title
    assert str(adam / "lock") in f.detail and f"pid {waiter}" in f.detail
    assert any(e.kind == "table" and e.table.columns[:2] == ["op", "tag"] for e in f.evidence)
    (rem,) = f.remedies
    assert rem.commands == [f"(cd -P -- {shlex.quote(str(adam.parent))} && test ! -L cpu_adam && cd -- cpu_adam "
                            "&& test ! -L lock && rm -f -- lock)"]
    assert rem.action == {"kind": "remove-lock", "path": str(adam / "lock"), "lock_kind": "file", "wait_pids": []}
    assert rem.verified is False and rem.undo == [] and not rem.requires_root and rem.explanation

    before = tree(tmp_path)
    for line in rem.commands:
        bash(line, tmp_path)
    assert wait_for(done.exists, 5)  # the waiting launch stops waiting
    assert tree(tmp_path) - before == {str(done)}
    assert before - tree(tmp_path) == {str(adam / "lock")}
    assert (lion / "lock").exists()  # the live build's lock is untouched

    facts = probe(env)
    assert not hc.stale_jit_lock(facts)
    (ok,) = evaluate_check("hangs.stale-lock", facts)
    assert ok.status == "ok" and ok.id == "hangs.stale-lock" and "in progress" in ok.title
    assert f"pid {alive}" in ok.detail


def test_orphaned_compilers_are_waited_for_before_the_lock_goes(tmp_path: Path, spawn) -> None:
    root = tmp_path / "ext"
    env = target_env(TORCH_EXTENSIONS_DIR=str(root))
    d = make_op(root, "cpu_adam", lock=True)
    compiler = spawn("import time; time.sleep(600)", cwd=d, argv0="cc1plus")
    shell = spawn("import time; time.sleep(600)", cwd=d)  # someone looking around in the op dir
    assert wait_for(lambda: all(psutil.Process(p).cwd() == str(d) for p in (compiler, shell)))
    facts = probe(env)
    (lk,) = facts["processes"].facts["locks"]
    assert lk["stale"] and lk["orphans"] == [compiler] and lk["others"] == [shell] and lk["holders"] == []
    (f,) = evaluate_check("hangs.stale-lock", facts)
    assert f.status == "fail" and f"pid {compiler}" in f.detail and f"pid {shell}" in f.detail
    wait_line, rm_line = f.remedies[0].commands
    assert wait_line == f"while kill -0 {compiler} 2>/dev/null; do sleep 1; done"
    run = subprocess.Popen(["bash", "-c", f"{wait_line}\n{rm_line}"], cwd=tmp_path)
    try:
        time.sleep(1.5)
        assert run.poll() is None and (d / "lock").exists()  # still waiting for the compiler
        os.kill(compiler, signal.SIGKILL)
        assert run.wait(timeout=15) == 0
    finally:
        run.kill()
    assert not (d / "lock").exists() and (d / "build.ninja").exists()


HOSTILE: list[str | bytes] = ["a b", "x\ny", "$(touch PWNED)", "q'uote", "-rf", "semi;rm -rf ~", "tab\tx",
                              b"bad\xffbytes", "back\\slash"]


def test_hostile_names_remedies_delete_exactly_their_target(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "ext"
    env = target_env(TORCH_EXTENSIONS_DIR=str(root))
    for name in HOSTILE:
        make_op(root, name, so=b"garbage, not ELF", lock=True)
    keep = make_op(root, "a", so=b"also garbage")  # a prefix of "a b": must survive its neighbour's rm -rf
    (make_op(root, "dirlock") / "lock").mkdir()  # a directory named lock blocks torch just the same
    facts = probe(env)
    locks = evaluate_check("hangs.stale-lock", facts)
    assert len(locks) == len(HOSTILE) + 1 and {f.status for f in locks} == {"fail"}
    ids = [f.id for f in locks]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"hangs\.stale-lock\.[A-Za-z0-9_.-]+", i) for i in ids)
    for f in locks:
        (line,) = f.remedies[0].commands
        target = next(p for p in tree(root) if p.endswith("/lock") and
                      f"cd -- {hc.shell_quote(os.path.basename(os.path.dirname(p)))} &&" in line)
        assert line.endswith("rm -rf -- lock)" if target.endswith("/dirlock/lock") else "rm -f -- lock)")
        before = tree(tmp_path)
        bash(line, tmp_path)
        assert before - tree(tmp_path) == {target} and tree(tmp_path) <= before
    assert not [p for p in tree(root) if p.endswith("/lock")]

    corrupt = evaluate_check("jit.corrupt-ops", probe(env))
    assert len(corrupt) == len(HOSTILE) + 1 and {f.status for f in corrupt} == {"fail"}
    for f in corrupt:
        (line,) = f.remedies[0].commands
        assert line.startswith("rm -rf -- ")
        before = {p for p in tree(tmp_path) if os.path.dirname(p) == str(root)}
        bash(line, tmp_path)
        after = {p for p in tree(tmp_path) if os.path.dirname(p) == str(root)}
        assert len(before - after) == 1 and after < before
    assert [p.name for p in root.iterdir()] == ["dirlock"]  # it has no .so, so it is not damaged
    assert not (tmp_path / "PWNED").exists() and not keep.exists()


def test_damaged_ops_fail_with_a_remedy_and_good_ops_pass(tmp_path: Path, built: dict[str, Path]) -> None:
    root = tmp_path / "ext"
    env = target_env(TORCH_EXTENSIONS_DIR=str(root))
    good = make_op(root, "cpu_adam", so=built["op"].read_bytes())
    make_op(root, "fused_adam", so=b"\x7fELF" + b"\0" * 20)
    make_op(root, "async_io", so=built["op"].read_bytes()[:700])
    facts = probe(env, ("jitcache",))
    assert hc.jit_op_corrupt(facts)
    findings = {f.id: f for f in evaluate_check("jit.corrupt-ops", facts)}
    assert set(findings) == {"jit.corrupt-ops.fused_adam", "jit.corrupt-ops.async_io"}
    assert all(f.status == "fail" for f in findings.values())
    for f in findings.values():
        bash(f.remedies[0].commands[0], tmp_path)
    assert sorted(p.name for p in root.iterdir()) == ["cpu_adam"] and (good / "cpu_adam.so").exists()
    facts = probe(env, ("jitcache",))
    (ok,) = evaluate_check("jit.corrupt-ops", facts)
    assert ok.status == "ok" and ok.title.startswith("1 JIT-built op") and not hc.jit_op_corrupt(facts)


def test_half_written_op_under_a_live_build_is_only_a_warning(tmp_path: Path, spawn) -> None:
    root = tmp_path / "ext"
    env = target_env(TORCH_EXTENSIONS_DIR=str(root))
    d = make_op(root, "cpu_adam", so=b"\x7fELF\x02")
    ready = tmp_path / "ready"
    spawn(BUILDER, extra=[str(d / "lock"), str(ready)])
    assert wait_for(ready.exists)
    (f,) = evaluate_check("jit.corrupt-ops", probe(env))
    assert f.status == "warn" and f.remedies == [] and "live build" in f.detail


def test_process_stuck_in_the_kernel_is_a_warning(tmp_path: Path, spawn) -> None:
    ready = tmp_path / "ready"
    pid = spawn(VFORK, extra=[str(ready)])
    assert wait_for(ready.exists)
    assert wait_for(lambda: psutil.Process(pid).status() == psutil.STATUS_DISK_SLEEP, 10)
    facts = probe(target_env(TORCH_EXTENSIONS_DIR=str(tmp_path / "ext")), ("processes",))
    me = next(p for p in facts["processes"].facts["processes"] if p["pid"] == pid)
    assert me["state_letter"] == "D" and me["wchan"] and me["libstdcxx"]
    (f,) = evaluate_check("hangs.processes", facts)
    assert f.status == "warn" and "uninterruptible" in f.title and me["wchan"] in f.title
    assert f"pid {pid}" in f.detail and me["libstdcxx"][0]["path"] in f.detail
    table = next(e.table for e in f.evidence if e.kind == "table")
    assert table.columns == ["pid", "command", "state", "wchan", "elapsed", "libstdc++ mapped"]
    row = next(i for i, r in enumerate(table.rows) if r[0] == str(pid))
    assert row in table.highlight and table.rows[row][2].startswith("D")


def test_lock_of_another_interpreter_is_only_a_warning(tmp_path: Path) -> None:
    home = tmp_path / "home"
    base = home / ".cache" / "torch_extensions"
    mine = f"py{sys.version_info[0]}{sys.version_info[1]}_cpu"
    other = f"py{sys.version_info[0]}{sys.version_info[1] - 1}_cpu"
    make_op(base / mine, "cpu_adam", lock=True)
    make_op(base / other, "cpu_adam", lock=True)
    facts = probe(target_env(HOME=str(home)))
    assert facts["jitcache"].facts["python_version"].startswith(f"{sys.version_info[0]}.{sys.version_info[1]}.")
    findings = {f.id: f for f in evaluate_check("hangs.stale-lock", facts)}
    assert findings[f"hangs.stale-lock.{mine}.cpu_adam"].status == "fail"
    assert findings[f"hangs.stale-lock.{other}.cpu_adam"].status == "warn"
    assert "does not use" in findings[f"hangs.stale-lock.{other}.cpu_adam"].detail
    assert hc.stale_jit_lock(facts)


def test_unsure_cases_downgrade_and_facts_replay(tmp_path: Path) -> None:
    root = tmp_path / "ext"
    make_op(root, "cpu_adam", lock=True)
    facts = probe(target_env(TORCH_EXTENSIONS_DIR=str(root)))
    replayed = Facts({n: ProbeResult.from_dict(json.loads(json.dumps(r.to_dict()))) for n, r in facts.items()})
    (a,), (b,) = evaluate_check("hangs.stale-lock", facts), evaluate_check("hangs.stale-lock", replayed)
    assert a.to_dict() == b.to_dict() and a.status == "fail"

    def variant(**change) -> str:
        res = ProbeResult.from_dict(json.loads(json.dumps(facts["processes"].to_dict())))
        res.facts["locks"][0].update(change)
        (f,) = evaluate_check("hangs.stale-lock", Facts({"jitcache": facts["jitcache"], "processes": res,
                                                         "locktrial": facts["locktrial"]}))
        return f.status

    assert variant(network=True, age_s=60) == "warn"  # a build on another node may hold it
    assert variant(network=True, age_s=7200) == "fail"
    assert variant(uncertain=[1]) == "warn"


def test_op_built_by_a_newer_gcc_elsewhere(tmp_path: Path, built: dict[str, Path]) -> None:
    root = tmp_path / "ext"
    env = target_env(TORCH_EXTENSIONS_DIR=str(root))
    make_op(root, "cpu_adam", so=built["op"].read_bytes())
    make_op(root, "cpu_lion", so=built["newer"].read_bytes())
    other = make_op(root, "fused_adam", so=built["newer"].read_bytes())
    (other / "build.ninja").write_text("ninja_required_version = 1.3\ncxx = gcc\n")
    facts = probe(env, ("jitcache", "toolchain"))
    ops = {o["name"]: o for o in facts["jitcache"].facts["ops"]}
    assert ops["cpu_lion"]["so_info"]["compiler_version"] == "99.1.0"
    (f,) = evaluate_check("jit.foreign-toolchain", facts)
    assert f.id == "jit.foreign-toolchain.cpu_lion" and f.status == "warn" and "99.1.0" in f.title
    assert "GLIBCXX_3.4" in f.detail
    assert f.remedies[0].commands == [f"rm -rf -- {shlex.quote(str(root / 'cpu_lion'))}"]
    # fused_adam's build command changed: ninja rebuilds it by itself, so it is no finding.
    bash(f.remedies[0].commands[0], tmp_path)
    (ok,) = evaluate_check("jit.foreign-toolchain", probe(env, ("jitcache", "toolchain")))
    assert ok.status == "ok" and "fused_adam" in ok.detail


def test_display_helpers() -> None:
    assert ph.show("x\ny") == "x\\ny" and ph.show("a" * 100, 20).count("…") == 1
    assert ph.duration(59) == "59s" and ph.duration(3725) == "1h02m" and ph.duration(None) == "?"
    assert hc.shell_quote("plain/path") == "plain/path"
    assert hc.shell_quote("x\ny") == "$'x\\x0ay'"
    assert hc.shell_quote(os.fsdecode(b"b\xff'\\")) == "$'b\\xff\\'\\\\'"


def test_process_count_does_not_call_any_python_a_training_process(tmp_path: Path, spawn) -> None:
    """The probe lists every python, launcher and compiler process: a plain ``python -c sleep`` is one of
    them, and the title counts what was found without calling it training."""
    pid = spawn("import time; time.sleep(60)")
    assert wait_for(lambda: psutil.Process(pid).status() == psutil.STATUS_SLEEPING)
    facts = probe(target_env(TORCH_EXTENSIONS_DIR=str(tmp_path / "ext")), ("processes",))
    assert any(p["pid"] == pid for p in facts["processes"].facts["processes"])
    (f,) = evaluate_check("hangs.processes", facts)
    assert f.status == "ok"
    assert re.search(r"\d+ python, launcher or compiler process(es)? on this node, none stuck", f.title)
    assert "training" not in f.title
