"""One failure, one cause: the findings explaining one symptom never name cause classes that exclude each
other (zdoctor.core.causes.EXCLUSIVE). Shown on real broken states: a compile that stops on a real full TMPDIR (a
small tmpfs filled up) is that full folder, never a broken compiler; a real memory-cgroup OOM kill is the
job's limit in every finding of `zdoctor check`, never the host's memory. The property itself is checked
over the report's JSON, and shown to fail on a report that gives one kill two causes."""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys

import pytest
from hostilekit import run_measured
from test_full_disk import fill, small_tmpfs
from test_gpu_facts import h200
from test_hostram import by_id
from test_hostram_kills import LAUNCHER, _collect, real_memcg_kill  # noqa: F401 (a fixture)

from zdoctor.core.causes import (
    BROKEN_COMPILER,
    CAUSES,
    CGROUP_LIMIT,
    EXCLUSIVE,
    FULL_DISK,
    HOST_RAM,
    UNKNOWN_KILL,
    contradictions,
    kill_cause,
)
from zdoctor.layers.offload.check_hostram import check_hostram
from zdoctor.layers.toolchain.check_jitprereq import check_jitprereq
from zdoctor.layers.toolchain.probe_jitprereq import compile_test
from zdoctor.proc import scratch

CXX = shutil.which("g++") or shutil.which("c++")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs and making a memory cgroup need root")


def assert_one_cause(report: dict) -> None:
    """The property: no two findings explaining one symptom name exclusive cause classes, and every cause
    named is a known class."""
    assert {f["cause"] for f in report["findings"] if f.get("cause")} <= set(CAUSES)
    assert contradictions(report["findings"]) == []


def _text(f: dict) -> str:
    return " ".join([f["title"], f["detail"], *(r["title"] for r in f["remedies"])])


def test_the_property_fails_on_a_report_that_gives_one_symptom_two_causes():
    ok = {"findings": [
        {"id": "container.memory", "status": "fail", "title": "", "detail": "", "remedies": [], "explains": ["S1"],
         "cause": CGROUP_LIMIT},
        {"id": "offload.host-ram", "status": "fail", "title": "", "detail": "", "remedies": [],
         "explains": ["S1", "S2"], "cause": CGROUP_LIMIT},
        {"id": "toolchain.jit-prereq.compile", "status": "fail", "title": "", "detail": "", "remedies": [],
         "explains": ["S3"], "cause": FULL_DISK}]}
    assert_one_cause(ok)
    host = copy.deepcopy(ok)
    host["findings"][1]["cause"] = HOST_RAM
    with pytest.raises(AssertionError):
        assert_one_cause(host)
    assert contradictions(host["findings"]) == [
        "S1: container.memory says cgroup-limit (the job's memory cgroup limit was reached), offload.host-ram says "
        "host-ram (the host's memory ran out)"]
    compiler = copy.deepcopy(ok)
    compiler["findings"].append({**compiler["findings"][2], "id": "toolchain.jit-compiler",
                                 "cause": BROKEN_COMPILER})
    assert len(contradictions(compiler["findings"])) == 1
    passed = copy.deepcopy(host)
    passed["findings"][1]["status"] = "ok"  # a passing finding names no cause of a failure
    assert_one_cause(passed)
    assert all(group <= set(CAUSES) for group in EXCLUSIVE)


def test_one_classification_of_a_kill():
    memcg = {"constraint": "CONSTRAINT_MEMCG", "kind": "memcg"}
    host = {"constraint": "CONSTRAINT_NONE", "kind": "global"}
    unlogged = {"constraint": None, "kind": "unknown"}
    assert kill_cause([memcg]) == CGROUP_LIMIT and kill_cause([host]) == HOST_RAM
    assert kill_cause([memcg, host], 0) == CGROUP_LIMIT  # a cgroup constraint in the evidence is never host RAM
    assert kill_cause([]) is None and kill_cause([unlogged]) is None  # unknown, not "most likely host memory"
    assert kill_cause([], 2) == CGROUP_LIMIT and kill_cause([unlogged], 1) == CGROUP_LIMIT
    assert kill_cause([host], 3) == HOST_RAM  # the kernel's record of the kill says; a counter does not override


def test_a_kill_nothing_classifies_is_unknown_with_what_would_tell(tmp_path):
    f, _ = _collect(tmp_path, LAUNCHER)
    found = by_id(check_hostram(h200(hostram=f)))["offload.host-ram"]
    assert found.status == "fail" and UNKNOWN_KILL in found.title and found.cause is None
    assert "most likely" not in found.title and "memory.events oom_kill" in found.detail


@as_root
def test_a_real_full_tmpdir_is_the_cause_not_the_compiler(tmp_path):
    roomy = tmp_path / "roomy"
    roomy.mkdir()
    with small_tmpfs(256) as point:
        fill(point, 0)
        env = {"PATH": os.environ["PATH"], "TMPDIR": str(point), "HOME": str(tmp_path / "home")}
        facts, evs = compile_test(CXX, env, None, tmp_candidates=(str(roomy),))
    assert facts["plain"]["ok"] is False and "No space left on device" in facts["plain"]["stderr"]
    ns = facts["no_space"]
    assert (ns["tmpdir"], ns["chosen_by"]) == (str(point), "$TMPDIR")
    assert ns["space"]["avail_bytes"] == 0 and ns["space"]["total_bytes"] == 256 * 1024
    assert ns["space"]["mount"]["fstype"] == "tmpfs"
    assert ns["trials"] == [{"tmpdir": str(roomy), "ok": True, "stderr": ""}]  # the real g++ compiled there
    jp = {"python": sys.executable, "ninja": {"on_path": None}, "python_headers": {"python_h": None},
          "compile": facts}
    c = {x.id: x for x in check_jitprereq(h200(jitprereq=jp))}["toolchain.jit-prereq.compile"]
    assert c.status == "fail" and c.cause == FULL_DISK
    assert f"temporary directory {point} ($TMPDIR) is full: 0 B free of 256 KiB" in c.title
    assert "inodes free, on tmpfs" in c.detail and "JIT build directory" in c.detail
    assert "not a compiler" not in c.title + c.detail
    assert not any("Install g++" in r.title for r in c.remedies)
    fix = c.remedies[0]
    assert fix.commands == [f"export TMPDIR={roomy}"] and fix.undo == [f"export TMPDIR={point}"]
    # the compiler now compiles there; the user's own build was not re-run, so it is never called "fixed"
    assert fix.to_dict()["verification"]["state"] == "tool_starts"


@as_root
def test_the_compile_test_runs_when_zdoctors_own_temporary_directory_is_the_full_one(tmp_path, monkeypatch):
    import tempfile

    roomy = tmp_path / "roomy"
    roomy.mkdir()
    with small_tmpfs(256) as point:
        fill(point, 0)
        monkeypatch.setattr(tempfile, "tempdir", str(point))
        facts, _ = compile_test(CXX, {"PATH": os.environ["PATH"], "TMPDIR": str(point)}, None,
                                tmp_candidates=(str(roomy),))
        scratch.remove_run_folder()  # as the run ends
        left = sorted(p.name for p in point.iterdir())
    assert facts["no_space"]["tmpdir"] == str(point) and facts["no_space"]["trials"][0]["ok"] is True
    assert left == ["filler"] and not list(roomy.iterdir())  # the scratch folders are gone


@as_root
def test_zdoctor_check_on_a_full_tmpdir_names_one_cause(tmp_path):
    with small_tmpfs(256) as point:
        fill(point, 0)
        line = f"x.cpp:1:21: fatal error: error closing {point}/ccQJTlch.s: No space left on device"
        m = run_measured(["check", "--json", "--no-log", "--playbook", "toolchain", "--symptom", line],
                         env={**os.environ, "TMPDIR": str(point)}, wall_limit=300)
    assert "Traceback" not in m.stderr, m.stderr[-2000:]
    report = json.loads(m.stdout)
    assert_one_cause(report)
    compile_ = next(f for f in report["findings"] if f["id"] == "toolchain.jit-prereq.compile")
    assert compile_["status"] == "fail" and compile_["cause"] == FULL_DISK and str(point) in compile_["title"]
    assert not [f["id"] for f in report["findings"] if f.get("cause") == BROKEN_COMPILER]
    assert not [f["id"] for f in report["findings"] if "is not a compiler" in _text(f)]
    (s,) = report["symptoms"]  # the compiler's line, recognised and explained by the full folder
    assert s["signature"] == "build.no-space" and s["explained_by"] == ["toolchain.jit-prereq.compile"]


@as_root
def test_a_real_memcg_kill_has_no_host_memory_cause_anywhere_in_the_report(tmp_path, real_memcg_kill):  # noqa: F811
    kernel, path, _ = real_memcg_kill
    log = tmp_path / "train.log"
    log.write_text(kernel + LAUNCHER + "Killed\n")
    m = run_measured(["check", "--json", "--no-log", "--playbook", "offload-bottleneck", "--log", str(log)],
                     wall_limit=300)
    assert "Traceback" not in m.stderr, m.stderr[-2000:]
    report = json.loads(m.stdout)
    assert_one_cause(report)
    named = {f["id"]: f for f in report["findings"] if f.get("cause")}
    assert named["offload.host-ram"]["cause"] == CGROUP_LIMIT and named["offload.host-ram"]["explains"]
    assert {f["cause"] for f in named.values()} == {CGROUP_LIMIT}
    for f in report["findings"]:
        assert "host memory ran out" not in _text(f) and "most likely host memory" not in _text(f), f["id"]
    killed = [s["id"] for s in report["symptoms"] if s["kind"] == "killed"]
    assert killed and all(s["explained_by"] for s in report["symptoms"] if s["id"] in killed)


def test_a_bare_kill_in_a_cgroup_that_counted_kills_at_its_limit_is_that_limit_in_every_finding(tmp_path):
    from test_container_limits import _probe_facts, _write, v2_tree
    from test_gpu_facts import facts_of

    from zdoctor.layers.container.check_container import check_container
    from zdoctor.readers import cgroups
    from zdoctor.symptoms.extract import from_text

    cg = v2_tree(tmp_path / "root", kills=2)  # memory.events: oom 3, oom_kill 2
    f, _ = _collect(tmp_path, LAUNCHER + "Killed\n")
    syms = {"symptoms": [s.to_dict() for s in from_text(LAUNCHER + "Killed\n", "log", "--log")]}

    def report(cgroup: dict) -> dict:
        facts = facts_of(container=_probe_facts(cgroup, 125 * 2**30), hostram=f, symptoms=syms)
        return {"findings": [x.to_dict() for x in [*check_container(facts), *check_hostram(facts)]]}

    at_limit = {x["id"]: x for x in report(cg)["findings"]}
    assert_one_cause({"findings": list(at_limit.values())})
    assert at_limit["container.memory"]["cause"] == at_limit["offload.host-ram"]["cause"] == CGROUP_LIMIT
    assert set(at_limit["container.memory"]["explains"]) & set(at_limit["offload.host-ram"]["explains"])
    assert "host memory" not in _text(at_limit["offload.host-ram"])
    # v2 counts kills by the host's OOM killer too: with no OOM event at the limit the count is not the limit's
    _write(tmp_path / "root", "sys/fs/cgroup/kubepods/pod1/ctr/memory.events",
           "low 0\nhigh 0\nmax 41\noom 0\noom_kill 2\noom_group_kill 0\n")
    root = tmp_path / "root"
    elsewhere = cgroups.read_process(proc=str(root / "proc"), mountinfo=str(root / "proc/self/mountinfo"),
                                     sysroot=str(root))
    found = {x["id"]: x for x in report(elsewhere)["findings"]}
    assert found["container.memory"]["status"] == "warn" and "not at its" in found["container.memory"]["title"]
    assert "cause" not in found["container.memory"] and not found["container.memory"]["explains"]
    assert UNKNOWN_KILL in found["offload.host-ram"]["title"] and "cause" not in found["offload.host-ram"]


def test_a_cgroup_constraint_among_the_jobs_kills_is_never_told_as_host_memory(tmp_path):
    from test_hostram import OFFLOAD
    from test_hostram_kills import GLOBAL_OOM

    f, _ = _collect(tmp_path, (OFFLOAD / "memcg-oom-kmsg.txt").read_text() + GLOBAL_OOM + LAUNCHER,
                    cgroup_sysroot=str(tmp_path / "none"))
    assert {k["kind"] for k in f["oom_kills"]} == {"memcg", "global"}
    found = by_id(check_hostram(h200(hostram=f)))["offload.host-ram"]
    assert found.cause == CGROUP_LIMIT and "host memory ran out" not in found.title + found.detail
    assert "Also killed outside the cgroup's limit" in found.detail  # the other kill is still shown


def test_no_folder_for_the_compile_test_is_not_checked_never_a_broken_compiler(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))
    facts, _ = compile_test(CXX, {"PATH": os.environ["PATH"]}, None, tmp_candidates=(str(tmp_path / "gone2"),))
    assert facts["plain"] is None and "no folder for the compile test" in facts["error"]
    jp = {"python": sys.executable, "ninja": {"on_path": None}, "python_headers": {"python_h": None},
          "compile": facts}
    c = {x.id: x for x in check_jitprereq(h200(jitprereq=jp))}["toolchain.jit-prereq.compile"]
    assert c.status == "skip" and c.cause is None and "no folder for the compile test" in c.detail + c.title


@as_root
@pytest.mark.slow
def test_a_real_jit_build_on_a_full_tmpdir_is_explained_by_the_full_folder(tmp_path):
    """The real first build of DeepSpeed's cpu_adam, with TMPDIR on a full 256 KiB tmpfs: g++ stops on 'No
    space left on device', torch wraps it in 'Error building extension', and DeepSpeed fails the load. Every
    line the user saw is explained by the one full-folder finding; nothing calls the compiler broken."""
    import shlex

    import dsenv

    python = dsenv.ensure()
    with small_tmpfs(256) as point:
        fill(point, 0)
        env = {**os.environ, "TMPDIR": str(point), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"),
               "PATH": f"{python.parent}:{os.environ['PATH']}"}
        cmd = shlex.join([str(python), "-c", "from deepspeed.ops.op_builder import CPUAdamBuilder; "
                                             "CPUAdamBuilder().load()"])
        m = run_measured(["check", "--json", "--no-log", "--python", str(python), "--command", cmd, "--timeout", "300",
                          "--playbook", "toolchain"], env=env, wall_limit=900)
    assert "Traceback" not in m.stderr, m.stderr[-2000:]
    report = json.loads(m.stdout)
    assert_one_cause(report)
    sigs = {s["signature"]: s for s in report["symptoms"]}
    assert "build.no-space" in sigs, report["symptoms"]
    for s in report["symptoms"]:
        assert s["explained_by"], s
    assert "toolchain.jit-prereq.compile" in sigs["build.no-space"]["explained_by"]
    if "build.extension-failed" in sigs:  # torch's wrapper: explained by what explains the compiler's line
        assert "toolchain.jit-prereq.compile" in sigs["build.extension-failed"]["explained_by"]
    assert not [f["id"] for f in report["findings"] if "is not a compiler" in _text(f)]
    assert report["findings"][0]["id"] == "toolchain.jit-prereq.compile"  # the answer comes first
