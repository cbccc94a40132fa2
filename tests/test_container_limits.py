"""The container and its limits: zdoctor run inside a real memory cgroup with a small limit (v1 here) sees that
limit, not /proc/meminfo's host memory, a child that outgrows it is really killed by the kernel and the
cgroup's OOM-kill counter explains the --command run's "Killed"; a real pids cgroup refuses threads; v2 from a
recorded tree of cgroup files (a parent's memory.max binding); not a container, and what cannot be read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from test_gpu_facts import facts_of

from zdoctor.layers.container.check_container import cgroup_memory_limit_runs_out, check_container
from zdoctor.layers.offload import hostram, planner
from zdoctor.layers.offload.check_hostram import check_hostram
from zdoctor.readers import cgroups
from zdoctor.readers import containerdetect as detect
from zdoctor.symptoms.extract import from_text

ROOT = Path(__file__).resolve().parent.parent
V1 = Path("/sys/fs/cgroup")
LIMIT = 256 * 1024 * 1024
GIB = 2**30
ALLOC = """import os
with open("/proc/self/oom_score_adj", "w") as fh:
    fh.write("1000")  # the kernel's OOM killer takes this child, not zdoctor beside it in the cgroup
x = bytearray(600 * 1024 * 1024)
print("survived")
"""
CONFIG = {"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}}


def _v1_ready(*controllers: str) -> bool:
    return os.geteuid() == 0 and all(os.access(V1 / c / "cgroup.procs", os.W_OK) for c in controllers)


def _rmdir(path: Path) -> None:
    for _ in range(100):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)


def by_id(findings):
    return {f.id: f for f in findings}


# -- one real run of zdoctor inside a v1 memory and pids cgroup ---------------------------------------------

@pytest.fixture(scope="module")
def inside(tmp_path_factory):
    """``zdoctor check --json`` run inside a new 256 MiB memory cgroup (and a pids cgroup of 300), its --command
    a child that allocates 600 MiB: (the JSON report, the cgroup's name, its memory.oom_control after)."""
    if not _v1_ready("memory", "pids"):
        pytest.skip("needs root and the v1 memory and pids hierarchies")
    tmp = tmp_path_factory.mktemp("inside")
    name = f"zdoctor-h3-limits-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    mem, pids = V1 / "memory" / name, V1 / "pids" / name
    mem.mkdir()
    pids.mkdir()
    try:
        (mem / "memory.limit_in_bytes").write_text(str(LIMIT))
        if (mem / "memory.memsw.limit_in_bytes").exists():
            (mem / "memory.memsw.limit_in_bytes").write_text(str(LIMIT))
        (pids / "pids.max").write_text("300")
        (tmp / "alloc.py").write_text(ALLOC)
        (tmp / "ds.json").write_text(json.dumps(CONFIG))
        check = [sys.executable, "-m", "zdoctor", "check", "--json", "--playbook", "offload-bottleneck",
                 "--model-params", "1B", "--gpus-per-node", "1", "--ds-config", str(tmp / "ds.json"),
                 "--command", f"{sys.executable} {tmp / 'alloc.py'}"]
        wrapper = ("echo $$ > \"$1\"/cgroup.procs && echo $$ > \"$2\"/cgroup.procs && shift 2 && exec \"$@\"")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.run(["/bin/sh", "-c", wrapper, "sh", str(mem), str(pids), *check], capture_output=True,
                              text=True, timeout=240, env=env, cwd=str(tmp))
        assert proc.stdout.strip().startswith("{"), proc.stderr[-3000:]
        yield json.loads(proc.stdout), f"/{name}", (mem / "memory.oom_control").read_text()
    finally:
        _rmdir(mem)
        _rmdir(pids)


def test_the_kill_by_the_cgroup_limit_is_counted_and_explains_the_commands_killed(inside):
    report, name, oom_control = inside
    assert cgroups.parse_keyed(oom_control)["oom_kill"] >= 1  # the kernel really killed the child
    found = {f["id"]: f for f in report["findings"]}
    mem = found["container.memory"]
    assert mem["status"] == "fail"
    assert mem["title"].startswith("The job's memory cgroup limit (256 MiB) killed")
    assert f"memory.limit_in_bytes of {name}" in mem["detail"]
    killed = [s for s in report["symptoms"] if s["kind"] == "killed"]
    assert killed and killed[0]["source"] == "command"
    assert killed[0]["id"] in mem["explains"]
    assert "container.memory" in killed[0]["explained_by"]
    layer = next(x for x in report["layers"] if x["id"] == "container")
    assert layer["status"] == "examined"


def test_the_planner_and_host_ram_judge_the_cgroup_limit_and_say_so(inside):
    report, name, _ = inside
    found = {f["id"]: f for f in report["findings"]}
    cap, ram = found["offload.capacity"], found["offload.host-ram"]
    words = f"the job's cgroup limit 0.25 GiB (memory.limit_in_bytes of {name})"
    assert words in cap["detail"] and "lower than the host's MemAvailable" in cap["detail"]
    assert "/proc/meminfo" in cap["detail"]
    assert cap["status"] == "fail"  # 1B parameters offloaded to the CPU do not fit in 256 MiB
    assert float(cap["title"].rsplit("; ", 1)[1].split()[0]) < 0.26  # the room under the limit, not the host's
    assert "available (room under the cgroup limit)" in json.dumps(cap["evidence"])
    assert ram["status"] == "fail" and "under the job's cgroup limit of 0.25 GiB" in ram["title"]
    assert words in ram["detail"]
    assert ram["remedies"][0]["title"].startswith("Raise the job's memory limit")


def test_the_pids_cgroup_the_job_runs_in_is_read(inside):
    report, _, _ = inside
    pids = {f["id"]: f for f in report["findings"]}["container.pids"]
    assert pids["status"] == "ok" and pids["title"] == "The job's pids limit (300) leaves room"


def test_the_offload_playbook_ends_at_the_cgroup_limit(inside):
    report, _, _ = inside
    walk = next(p for p in report["playbooks"] if p["id"] == "offload-bottleneck")
    assert walk["diagnosis"] == "diag-cgroup-limit" and walk["path"][-2:] == ["ram", "diag-cgroup-limit"]


# -- a real pids limit refusing threads ---------------------------------------------------------------------

THREADS = """import sys, threading
ev = threading.Event()
try:
    for _ in range(64):
        threading.Thread(target=ev.wait, daemon=True).start()
except RuntimeError as exc:
    print(f"RuntimeError: {exc}", flush=True)
sys.stdin.readline()
"""


def test_a_real_pids_limit_refuses_threads_and_explains_cant_start_new_thread():
    if not _v1_ready("pids"):
        pytest.skip("needs root and the v1 pids hierarchy")
    cg = V1 / "pids" / f"zdoctor-h3-pids-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    cg.mkdir()
    child = None
    try:
        (cg / "pids.max").write_text("8")
        wrapper = "echo $$ > \"$1\"/cgroup.procs && shift && exec \"$@\""
        child = subprocess.Popen(["/bin/sh", "-c", wrapper, "sh", str(cg), sys.executable, "-c", THREADS],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = child.stdout.readline()
        assert "can't start new thread" in line, line
        facts = cgroups.read_process(child.pid)
    finally:
        if child is not None:
            child.communicate("\n", timeout=30)
        _rmdir(cg)
    p = facts["pids"]
    assert (p["version"], p["max"], p["current"]) == ("v1", 8, 8) and p["refused"] >= 1
    syms = {"symptoms": [s.to_dict() for s in from_text(line, "log", "--log")]}
    assert [s["kind"] for s in syms["symptoms"]] == ["thread-limit"]
    f = by_id(check_container(facts_of(container=_probe_facts(facts), symptoms=syms)))["container.pids"]
    assert f.status == "fail" and "refused" in f.title and f.explains == [syms["symptoms"][0]["id"]]


def _probe_facts(cg: dict, mem_available: int | None = 23 * GIB, box: dict | None = None) -> dict:
    return {"container": box or {"in_container": False, "kind": None, "clues": [], "signs": []},
            "whose": "the --pid process", "pid": cg.get("pid"), "after_command": False, "cgroup": cg,
            "headroom": cgroups.headroom(mem_available, cg)}


# -- v2 from a recorded tree --------------------------------------------------------------------------------

def _write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def v2_tree(root: Path, *, kills: int = 2) -> dict:
    """A pod's container cgroup under cgroup v2: no memory.max of its own, 8 GiB on the pod's (the binding one),
    pids.max 100 with 90 in use."""
    _write(root, "proc/self/cgroup", "0::/kubepods/pod1/ctr\n")
    _write(root, "proc/self/mountinfo", "25 1 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - "
                                        "cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
                                        "1 0 259:1 / / rw,relatime - ext4 /dev/nvme0n1p1 rw\n")
    cg = "sys/fs/cgroup"
    _write(root, f"{cg}/cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n")
    _write(root, f"{cg}/kubepods/memory.max", "max\n")
    _write(root, f"{cg}/kubepods/memory.current", str(20 * GIB) + "\n")
    _write(root, f"{cg}/kubepods/pod1/memory.max", str(8 * GIB) + "\n")
    _write(root, f"{cg}/kubepods/pod1/memory.current", str(7 * GIB) + "\n")
    _write(root, f"{cg}/kubepods/pod1/memory.stat", f"anon {6 * GIB}\ninactive_file {GIB // 2}\n")
    _write(root, f"{cg}/kubepods/pod1/ctr/memory.max", "max\n")
    _write(root, f"{cg}/kubepods/pod1/ctr/memory.high", "max\n")
    _write(root, f"{cg}/kubepods/pod1/ctr/memory.current", str(6 * GIB) + "\n")
    _write(root, f"{cg}/kubepods/pod1/ctr/memory.peak", str(8 * GIB) + "\n")
    _write(root, f"{cg}/kubepods/pod1/ctr/memory.events",
           f"low 0\nhigh 0\nmax 41\noom {kills + 1}\noom_kill {kills}\noom_group_kill 0\n")
    _write(root, f"{cg}/kubepods/pod1/ctr/pids.max", "100\n")
    _write(root, f"{cg}/kubepods/pod1/ctr/pids.current", "90\n")
    _write(root, f"{cg}/kubepods/pod1/ctr/pids.events", "max 0\n")
    return cgroups.read_process(proc=str(root / "proc"), mountinfo=str(root / "proc/self/mountinfo"),
                                sysroot=str(root))


def test_v2_a_parents_memory_max_binds_and_its_kills_are_counted(tmp_path):
    cg = v2_tree(tmp_path)
    m = cg["memory"]
    assert (m["version"], m["cgroup"], m["limit"], m["limit_cgroup"]) == ("v2", "/kubepods/pod1/ctr", 8 * GIB,
                                                                          "/kubepods/pod1")
    assert m["room"] == 8 * GIB - 7 * GIB + GIB // 2  # inactive page cache is given back before an OOM kill
    assert (m["usage"], m["peak"], m["oom"], m["oom_kill"], m["failcnt"]) == (6 * GIB, 8 * GIB, 3, 2, 41)
    room = cgroups.headroom(125 * GIB, cg)
    assert room["source"] == "cgroup" and room["bytes"] == m["room"]
    assert room["text"] == ("the job's cgroup limit 8.00 GiB (memory.max of /kubepods/pod1), 1.50 GiB of it free, "
                            "lower than the host's MemAvailable 125.00 GiB shown by /proc/meminfo")
    text = "[  99.1] Memory cgroup out of memory: Killed process 4242 (python)\nKilled\n"
    syms = {"symptoms": [s.to_dict() for s in from_text(text, "log", "--log")]}
    found = by_id(check_container(facts_of(container=_probe_facts(cg, 125 * GIB), symptoms=syms)))
    assert found["container.memory"].status == "fail"
    assert set(found["container.memory"].explains) == {s["id"] for s in syms["symptoms"]}
    assert found["container.pids"].status == "warn" and "90 of pids.max 100" in found["container.pids"].title


def test_v2_the_planner_uses_the_room_under_the_limit_and_host_ram_says_which_number(tmp_path):
    cg = v2_tree(tmp_path, kills=0)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {250 * 2**20} kB\nMemAvailable: {125 * 2**20} kB\nSwapFree: 0 kB\n")
    m = planner.this_machine(str(meminfo), cgroup=cg)
    assert (m.mem_available, m.mem_available_host, m.mem_source) == (int(1.5 * GIB), 125 * GIB, "cgroup")
    plain = planner.this_machine(str(meminfo), cgroup=None)
    assert (plain.mem_available, plain.mem_source) == (125 * GIB, "meminfo")  # no limit: the host's figure
    cap = {"params": 10**9, "gpus_per_node": 1, "nodes": 1, "chosen_table": "zero3", "chosen_rows": [0],
           "zero3": [{"cpu_bytes": 18 * 10**9}]}
    f, _ = hostram.collect({"path": "ds.json", "settings": {}}, cap, {}, meminfo=str(meminfo),
                           kernel_release="6.8.0", cgroup=cg)
    assert (f["mem_available"], f["mem_total"], f["mem_source"]) == (int(1.5 * GIB), 8 * GIB, "cgroup")
    assert f["mem_available_host"] == 125 * GIB
    found = by_id(check_hostram(facts_of(hostram=f)))["offload.host-ram"]
    assert found.status == "fail" and found.title.startswith("Offload needs 16.76 GiB of host memory per node")
    assert "1.50 GiB is available under the job's cgroup limit of 8.00 GiB" in found.title
    assert "memory.max of /kubepods/pod1" in found.detail
    probe = _probe_facts(cg, 125 * GIB)
    assert cgroup_memory_limit_runs_out(facts_of(container=probe, hostram=f))


def test_no_tighter_limit_changes_nothing(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {64 * 2**20} kB\nMemAvailable: {2 * 2**20} kB\n")
    cg = v2_tree(tmp_path / "tree", kills=0)  # room 1.5 GiB, below the 2 GiB the host has: the cgroup binds
    assert planner.this_machine(str(meminfo), cgroup=cg).mem_source == "cgroup"
    meminfo.write_text(f"MemTotal: {64 * 2**20} kB\nMemAvailable: {2**20} kB\n")  # 1 GiB: the host binds
    m = planner.this_machine(str(meminfo), cgroup=cg)
    assert (m.mem_available, m.mem_source) == (GIB, "meminfo")
    assert "MemAvailable 1.00 GiB" in m.mem_source_text and "more" in m.mem_source_text


# -- not a container, what cannot be read -------------------------------------------------------------------

def test_not_a_container_is_a_finding_with_what_was_looked_at(tmp_path):
    _write(tmp_path, "proc/1/comm", "systemd\n")
    _write(tmp_path, "proc/1/cgroup", "0::/init.scope\n")
    _write(tmp_path, "proc/self/cgroup", "0::/user.slice/user-1000.slice/session-3.scope\n")
    _write(tmp_path, "proc/self/mountinfo", "1 0 259:1 / / rw,relatime - ext4 /dev/nvme0n1p1 rw\n")
    box = detect.detect({}, root=str(tmp_path))
    assert not box["in_container"] and box["kind"] is None
    assert {s["sign"]: s["present"] for s in box["signs"]} == {
        "/.dockerenv": False, "/run/.containerenv": False, "the job's cgroup": False, "PID 1's cgroup": False,
        "PID 1": False, "root file system": False}
    cg = cgroups.read_process(proc=str(tmp_path / "proc"), mountinfo=str(tmp_path / "proc/self/mountinfo"),
                              sysroot=str(tmp_path))
    found = by_id(check_container(facts_of(container=_probe_facts(cg, box=box))))
    assert found["container.runtime"].status == "ok" and found["container.runtime"].title == "Not in a container"
    assert "PID 1 is 'systemd' (a host's init)" in found["container.runtime"].detail
    mem = found["container.memory"]
    assert mem.status == "skip" and mem.detail.endswith("the unified (v2) cgroup hierarchy is not mounted here")


def test_a_docker_container_by_its_signs(tmp_path):
    _write(tmp_path, ".dockerenv", "")
    _write(tmp_path, "proc/1/comm", "python3\n")
    _write(tmp_path, "proc/1/cgroup", "12:memory:/docker/0123abcd\n")
    _write(tmp_path, "proc/self/mountinfo", "1 0 0:52 / / rw,relatime - overlay overlay rw,lowerdir=/l\n")
    box = detect.detect({}, root=str(tmp_path))
    assert box["in_container"] and box["kind"] == "docker"
    assert "/proc/1/cgroup mentions docker" in box["clues"] and "/ is overlay (overlay)" in box["clues"]


def test_unreadable_cgroup_files_are_said_not_guessed(tmp_path):
    cg = cgroups.read_process(proc=str(tmp_path / "none"))
    assert cg["error"] and cg["memory"]["error"].endswith("could not be read")
    found = by_id(check_container(facts_of(container=_probe_facts(cg))))
    assert found["container.memory"].status == "skip" and found["container.pids"].status == "skip"
    # A FIFO where memory.max should be: read as unreadable at once, never waited on.
    v2_tree(tmp_path / "t", kills=0)
    fifo = tmp_path / "t/sys/fs/cgroup/kubepods/pod1/memory.max"
    fifo.unlink()
    os.mkfifo(fifo)
    cg = cgroups.read_process(proc=str(tmp_path / "t/proc"), mountinfo=str(tmp_path / "t/proc/self/mountinfo"),
                              sysroot=str(tmp_path / "t"))
    assert cg["memory"]["limit"] is None and cg["memory"]["limit_cgroup"] is None
    assert cgroups.headroom(4 * GIB, cg)["source"] == "meminfo"
    limit = by_id(check_container(facts_of(container=_probe_facts(cg))))["container.memory"]
    assert limit.status == "skip" and "the limit could not be read" in limit.detail  # unknown, never "no limit"
    found = check_container(facts_of())
    assert [(f.id, f.status) for f in found] == [("container.not-checked", "skip")]


def test_a_real_unified_hierarchy_without_the_memory_controller_says_so():
    from zdoctor.proc.cgroup import paths_of
    from zdoctor.readers.mounts import read_mountinfo

    mounts = [m for m in read_mountinfo() if m.fstype == "cgroup2"]
    if not mounts:
        pytest.skip("no cgroup v2 mount on this machine")
    offered = (Path(mounts[-1].point) / "cgroup.controllers").read_text().split()
    where = cgroups.locate("memory", {"": (paths_of() or {}).get("", "/")}, mounts)
    if "memory" in offered:
        assert where["version"] == "v2" and os.path.isdir(where["dir"])
    else:
        assert "memory controller is not enabled in the unified (v2) hierarchy" in where["error"]


def test_the_new_messages_are_catalogued():
    kinds = {t: [(s.kind, s.fields.get("constraint") or s.fields.get("signal")) for s in from_text(t, "log", "x")]
             for t in ("Task in /docker/ab killed as a result of limit of /docker/ab", "OOMKilled: true",
                       "trainer-1 exited with code 137", "RuntimeError: can't start new thread",
                       "bash: fork: retry: Resource temporarily unavailable",
                       "libgomp: Thread creation failed: Resource temporarily unavailable",
                       "OpenBLAS blas_thread_init: pthread_create failed for thread 3 of 8: Resource temporarily "
                       "unavailable")}
    assert list(kinds.values()) == [[("oom-kill", "CONSTRAINT_MEMCG")], [("oom-kill", "CONSTRAINT_MEMCG")],
                                    [("killed", "9")]] + [[("thread-limit", None)]] * 4


def test_recorded_container_facts_of_the_wrong_type_give_findings_never_tracebacks(tmp_path):
    import random

    from test_mutations import _mutate

    from zdoctor.core.registry import Facts
    from zdoctor.host import ReplayHost

    base = [_probe_facts(v2_tree(tmp_path / "a")), _probe_facts(v2_tree(tmp_path / "b", kills=0)),
            _probe_facts(cgroups.read_process(proc=str(tmp_path / "none")), None)]
    base = json.loads(json.dumps(base))
    rng = random.Random(20261202)
    for _ in range(300):
        record, path = _mutate({"facts": rng.choice(base), "status": "ok"}, rng)
        res = ReplayHost({"format": "zdoctor-snapshot", "version": 1, "probes": {"container": record}}).result(
            "container")
        found = check_container(Facts({"container": res}))  # raises on a traceback
        assert found and all(f.id.startswith("container.") for f in found), path
        cgroup_memory_limit_runs_out(Facts({"container": res}))


def test_the_glossary_explains_a_memory_cgroup():
    from zdoctor.core.glossary import find_term, load_glossary

    term = find_term(load_glossary(), "memory cgroup")
    assert term is not None and "CONSTRAINT_MEMCG" in term.text and "memory.limit_in_bytes" in term.text


def test_the_commands_kill_has_one_cause_in_every_finding(inside):
    from zdoctor.core.causes import CGROUP_LIMIT, contradictions

    report, _, _ = inside
    assert contradictions(report["findings"]) == []
    named = {f["id"]: f["cause"] for f in report["findings"] if f.get("cause")}
    assert named.get("container.memory") == CGROUP_LIMIT and set(named.values()) == {CGROUP_LIMIT}, named
    for f in report["findings"]:
        assert "host memory ran out" not in f["title"] + f["detail"], f["id"]
