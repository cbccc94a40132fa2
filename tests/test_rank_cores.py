"""Ranks and cores: NUMA nodes from sysfs (the real one and a recorded two-node tree), each rank's
Cpus_allowed_list read from real processes pinned with the real taskset, cores per rank against
OMP_NUM_THREADS and the launcher's binding, and the offload step-time finding stating them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_gpu_facts import facts_of

from zdoctor.layers.launch.probe_launch import collect_launch
from zdoctor.layers.offload import check_offload as co
from zdoctor.layers.offload import walllog
from zdoctor.layers.rank_cores import check_rankcores as cr
from zdoctor.layers.rank_cores import cores
from zdoctor.layers.rank_cores.probe_rankcores import collect_rankcores, rank_processes

OFF = Path(__file__).parent / "fixtures" / "offload"
RELEASES = Path(__file__).parent / "fixtures" / "deepspeed-releases"


def two_nodes(tmp_path: Path) -> Path:
    """A sysfs node directory as a two-socket, 16-CPU machine has it."""
    root = tmp_path / "node"
    for n, cpus in ((0, "0-7"), (1, "8-15")):
        (root / f"node{n}").mkdir(parents=True, exist_ok=True)
        (root / f"node{n}" / "cpulist").write_text(cpus + "\n")
    (root / "online").write_text("0-1\n")
    return root


def test_cpulists_parse_and_format():
    assert cores.parse_cpulist("0-3,8,10-14:2\n") == [0, 1, 2, 3, 8, 10, 12, 14]
    assert cores.format_cpulist([0, 1, 2, 3, 8, 10, 12, 14]) == "0-3,8,10,12,14"
    assert cores.parse_cpulist("") == [] and cores.parse_cpulist("3-1") is None
    assert cores.parse_cpulist("0-99999999") is None and cores.parse_cpulist("a,b") is None


def test_numa_nodes_of_the_real_sysfs_and_of_a_recorded_tree(tmp_path):
    real = cores.numa_nodes()
    if os.path.isdir("/sys/devices/system/node/node0"):
        assert real["error"] is None and real["nodes"][0]["node"] == 0
        on_nodes = {c for n in real["nodes"] for c in cores.parse_cpulist(n["cpus"]) or []}
        assert os.sched_getaffinity(0) <= on_nodes  # every CPU this process may use is on a node
    rec = cores.numa_nodes(str(two_nodes(tmp_path)))
    assert rec == {"nodes": [{"node": 0, "cpus": "0-7", "count": 8}, {"node": 1, "cpus": "8-15", "count": 8}],
                   "error": None}
    assert cores.nodes_of([6, 7, 8], rec["nodes"]) == [0, 1]
    assert "no node directories" in cores.numa_nodes(str(tmp_path))["error"]
    bad = two_nodes(tmp_path / "b")
    (bad / "node1" / "cpulist").write_text("garbage")
    assert cores.numa_nodes(str(bad))["error"].endswith("node1/cpulist: not a CPU list")


@pytest.fixture(scope="module")
def pinned_job():
    """A real job: a shell (the launcher) with two ranks, each pinned by the real taskset to one CPU and
    carrying LOCAL_RANK as a launcher gives it."""
    if not shutil.which("taskset"):
        pytest.fail("taskset (util-linux) is part of the test machine")
    cpu = sorted(os.sched_getaffinity(0))
    first, last = cpu[0], cpu[-1]
    script = (f"LOCAL_RANK=0 RANK=0 taskset -c {first} sleep 60 & "
              f"LOCAL_RANK=1 RANK=1 taskset -c {last} sleep 60 & wait")
    proc = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    deadline = time.time() + 10
    import psutil

    while time.time() < deadline and len(psutil.Process(proc.pid).children()) < 2:
        time.sleep(0.05)
    time.sleep(0.2)  # taskset execs sleep after setting the affinity
    yield {"pid": proc.pid, "first": first, "last": last}
    os.killpg(proc.pid, 9)
    proc.wait()


def test_each_running_ranks_cpus_come_from_its_status_file(pinned_job):
    lf, _ = collect_launch(None, {}, {}, pid=pinned_job["pid"])
    assert lf["source"] == "pid"
    rc, ev = collect_rankcores(lf, {})
    ranks = sorted(rc["ranks"], key=lambda r: r["local_rank"])
    assert [r["local_rank"] for r in ranks] == ["0", "1"]
    assert ranks[0]["cpus"] == str(pinned_job["first"]) and ranks[1]["cpus"] == str(pinned_job["last"])
    assert ranks[0]["count"] == 1 and ranks[0]["threads"] == 1
    assert rc["ranks_per_node"] == 2 and "LOCAL_RANK" in rc["ranks_how"]
    assert any(str(pinned_job["last"]) in " ".join(r) for r in ev[0].table.rows)


def _facts(command: str, env: dict, tmp_path: Path, release: str | None = None, **opts):
    py = {}
    if release:
        dest = tmp_path / release / "deepspeed"
        if not dest.exists():
            shutil.copytree(RELEASES / release, dest)
        py = {"deepspeed": {"installed": True, "version": release, "location": str(dest)}}
    lf, _ = collect_launch(command, env, py, cwd=str(tmp_path))
    rc, _ = collect_rankcores(lf, opts, node_root=str(two_nodes(tmp_path / "sys")))
    rc["cpus"] = {"pid": 1, "cpus": "0-15", "count": 16, "threads": 1, "error": None}  # the 16-CPU machine
    return facts_of(launch=lf, rankcores=rc)


def test_torchrun_leaves_each_cpu_optimizer_one_thread(tmp_path):
    (f,) = cr.check_rank_cores(_facts("torchrun --nproc_per_node 4 train.py", {}, tmp_path))
    assert f.status == "warn" and f.title == "OMP_NUM_THREADS=1: each rank's CPU optimizer uses one of its 4 cores"
    assert "torch/distributed/run.py" in f.detail and "2 NUMA nodes" in f.detail
    assert f.remedies[1].commands == ["export OMP_NUM_THREADS=4"]


def test_unbound_ranks_without_omp_num_threads_oversubscribe(tmp_path):
    (f,) = cr.check_rank_cores(_facts("deepspeed --num_gpus 8 train.py", {}, tmp_path))
    assert f.status == "warn" and "128 in all on 16 CPUs" in f.detail
    (f,) = cr.check_rank_cores(_facts("deepspeed --num_gpus 8 train.py", {"OMP_NUM_THREADS": "4"}, tmp_path))
    assert f.status == "warn" and f.title == "OMP_NUM_THREADS=4 x 8 ranks is more threads than the 16 CPUs"
    (f,) = cr.check_rank_cores(_facts("deepspeed --num_gpus 8 train.py", {"OMP_NUM_THREADS": "2"}, tmp_path))
    assert f.status == "ok" and f.title == "8 ranks with 2 cores each, 2 OpenMP threads per rank"


def test_bind_cores_to_rank_needs_numactl_and_a_release_that_has_it(tmp_path):
    cmd = "deepspeed --num_gpus 2 --bind_cores_to_rank train.py"
    (f,) = cr.check_rank_cores(_facts(cmd, {}, tmp_path, release="0.8.3"))
    assert f.status == "fail" and "0.8.3's launcher has no --bind_cores_to_rank" in f.title
    (f,) = cr.check_rank_cores(_facts(cmd, {}, tmp_path, release="0.9.0"))
    if shutil.which("numactl"):
        assert f.status == "ok" and f.title == "2 ranks with 8 cores each, 8 OpenMP threads per rank"
    else:  # this machine: numactl is not installed, and the launcher would run each rank under it
        assert f.status == "fail" and "needs numactl, which is not installed" in f.title
        assert any("numactl" in " ".join(r.commands) for r in f.remedies)


def test_unknown_rank_count_and_unreadable_cpus_are_not_examined(tmp_path):
    (f,) = cr.check_rank_cores(_facts("bash run.sh", {}, tmp_path))
    assert f.id == "cores.ranks.not-checked" and "--gpus-per-node" in f.detail
    (f,) = cr.check_rank_cores(_facts("bash run.sh", {}, tmp_path, gpus_per_node=4))
    assert f.status == "warn" and "4 ranks" in f.title


def test_the_offload_step_finding_states_the_ranks_cores(tmp_path):
    log = walllog.parse_log(str(OFF / "ds-0.19-wallclock.log"))
    log["error"] = None
    base = _facts("torchrun --nproc_per_node 4 train.py", {}, tmp_path)
    facts = facts_of(trainlog=log, rankcores=base["rankcores"].facts)
    (f,) = co.check_breakdown(facts)
    assert "enough cores" not in f.detail
    assert ("Ranks and cores: 4 ranks on 16 CPUs (2 NUMA nodes): 4 cores per rank, OMP_NUM_THREADS 1, not bound "
            "to cores" in f.detail)
    (f,) = co.check_breakdown(facts_of(trainlog=log))
    assert "Ranks and cores: not examined (the rankcores probe did not run)" in f.detail


def test_a_real_child_pinned_with_sched_setaffinity():
    cpu = max(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    try:
        time.sleep(0.1)
        rec = cores.process_cpus(child.pid)
        assert rec["cpus"] == str(cpu) and rec["count"] == 1 and rec["threads"] >= 1
    finally:
        child.kill()
        child.wait()
    assert cores.process_cpus(child.pid)["error"]


def test_a_ranks_data_loader_workers_are_not_ranks():
    rank = {"RANK": "3", "LOCAL_RANK": "1"}
    procs = [{"pid": 10, "ppid": 1, "env": {}}, {"pid": 11, "ppid": 10, "env": {"RANK": "2", "LOCAL_RANK": "0"}},
             {"pid": 12, "ppid": 10, "env": rank}, {"pid": 13, "ppid": 12, "env": rank},
             {"pid": 14, "ppid": 12, "env": rank}]
    assert [p["pid"] for p in rank_processes(procs)] == [11, 12]
