"""Slurm's memory limit: slurmstepd's OOM lines explained by the job's own --mem / --mem-per-cpu.

The real state: zdoctor run inside a real v1 memory cgroup of 256 MiB (as Slurm's cgroup task plugin makes
one per step) with the SLURM_* variables Slurm gives a task that asked for ``--mem=256M``; its --command is
a child that outgrows the limit and is really killed by the kernel there; the --log holds slurmstepd's and
srun's lines about it, in the words of Slurm's own source (task_cgroup_memory.c, launch_slurm.c). Slurm is
not installed here; the kernel's kill, the cgroup and its counter are real.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from test_container_limits import ALLOC, V1, _rmdir, _v1_ready
from test_gpu_facts import facts_of

from zdoctor.layers.container.check_slurmmem import check_slurm_memory
from zdoctor.layers.container.slurmjob import job_memory
from zdoctor.symptoms.extract import from_text

ROOT = Path(__file__).resolve().parent.parent
LIMIT_MIB = 256
#: Slurm 21.08's wording (task_cgroup_memory_check_oom), then srun's (launch_slurm.c _task_finish).
STEPD_2108 = ("slurmstepd: error: Detected 1 oom-kill event(s) in StepId=4242.0 cgroup. Some of your processes may "
              "have been killed by the cgroup out-of-memory handler.")
SRUN = "srun: error: gpu-node-07: task 0: Out Of Memory"
#: Slurm 22.05 and later.
STEPD_2205 = ("slurmstepd: error: Detected 2 oom_kill events in StepId=5150.batch. Some of the step tasks have been "
              "OOM Killed.")
SLURM_ENV = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_MEM_PER_NODE": str(LIMIT_MIB),
             "SLURM_CPUS_ON_NODE": "8", "SLURM_JOB_NUM_NODES": "1"}


@pytest.fixture(scope="module")
def in_a_slurm_step(tmp_path_factory):
    """``zdoctor check --json`` run inside a new 256 MiB memory cgroup with a Slurm task's environment, its
    --command a child that allocates 600 MiB and its --log slurmstepd's lines: (the JSON report, the cgroup)."""
    if not _v1_ready("memory"):
        pytest.skip("needs root and the v1 memory hierarchy")
    tmp = tmp_path_factory.mktemp("slurm")
    name = f"zdoctor-slurm-step-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    mem = V1 / "memory" / name
    mem.mkdir()
    try:
        (mem / "memory.limit_in_bytes").write_text(str(LIMIT_MIB * 1024 * 1024))
        if (mem / "memory.memsw.limit_in_bytes").exists():
            (mem / "memory.memsw.limit_in_bytes").write_text(str(LIMIT_MIB * 1024 * 1024))
        (tmp / "alloc.py").write_text(ALLOC)
        (tmp / "slurm-4242.out").write_text(f"step 120 loss 2.31\n/var/spool/slurmd/job04242/slurm_script: line 9: "
                                            f"31337 Killed python train.py\n{STEPD_2108}\n{SRUN}\n")
        check = [sys.executable, "-m", "zdoctor", "check", "--json", "--playbook", "offload-bottleneck",
                 "--log", str(tmp / "slurm-4242.out"), "--command", f"{sys.executable} {tmp / 'alloc.py'}"]
        wrapper = "echo $$ > \"$1\"/cgroup.procs && shift && exec \"$@\""
        env = dict(os.environ, PYTHONPATH=str(ROOT), **SLURM_ENV)
        proc = subprocess.run(["/bin/sh", "-c", wrapper, "sh", str(mem), *check], capture_output=True, text=True,
                              timeout=300, env=env, cwd=str(tmp))
        assert proc.stdout.strip().startswith("{"), proc.stderr[-3000:]
        yield json.loads(proc.stdout), f"/{name}"
    finally:
        _rmdir(mem)


def test_slurmstepds_oom_lines_are_explained_by_the_jobs_mem_request(in_a_slurm_step):
    report, name = in_a_slurm_step
    found = {f["id"]: f for f in report["findings"]}
    slurm = found["container.slurm-memory"]
    assert slurm["status"] == "fail"
    assert slurm["title"].startswith("The job's Slurm memory request (--mem=256M) was the limit that killed it")
    assert "Slurm job 4242 step 0 asked for --mem=256M (SLURM_MEM_PER_NODE)" in slurm["detail"]
    assert f"limit 256 MiB (memory.limit_in_bytes of {name})" in slurm["detail"]  # the real cgroup, read
    said = [s for s in report["symptoms"] if s["kind"] == "slurm-oom"]
    assert {s["signature"] for s in said} == {"slurm.oom-kill-events", "slurm.task-out-of-memory"}
    for s in said:
        assert "container.slurm-memory" in s["explained_by"], s
    first = slurm["remedies"][0]
    assert first["title"] == "Ask Slurm for more memory: --mem=512M instead of --mem=256M"
    for r in slurm["remedies"]:
        assert r["verification"] == {"state": "not_tried", "reason": "the limit is fixed when Slurm starts the job; "
                                     "it takes a new submission"}, r


def test_the_kernel_really_killed_the_child_in_that_cgroup(in_a_slurm_step):
    report, _ = in_a_slurm_step
    detail = {f["id"]: f for f in report["findings"]}["container.slurm-memory"]["detail"]
    found = re.search(r", (\d+) OOM kills? counted", detail)
    assert found, detail
    counted = int(found.group(1))
    assert counted >= 1


# -- the same lines without a real job ----------------------------------------------------------------------

def _facts(env: dict, log: str, memory: dict | None = None):
    symptoms = [s.to_dict() for s in from_text(log, "log", "slurm.out")]
    probes = {"slurm_job": job_memory(env), "symptoms": {"symptoms": symptoms}}
    if memory is not None:
        probes["container"] = {"cgroup": {"memory": memory}}
    return facts_of(**probes)


def test_outside_the_job_the_message_alone_names_the_request_and_what_to_read():
    (f,) = check_slurm_memory(_facts({}, STEPD_2205))
    assert f.status == "warn" and f.title.endswith("(from the message only)")
    assert "StepId=5150.batch" in f.title and f.explains == ["S1"]
    assert "sacct -j 5150 -o JobID,ReqMem,MaxRSS,State" in f.detail
    assert [r.title for r in f.remedies] == ["Ask Slurm for all of the node's memory: --mem=0"]


def test_mem_per_cpu_is_named_with_the_cpus_of_this_node():
    env = {"SLURM_JOB_ID": "77", "SLURM_MEM_PER_CPU": "4000", "SLURM_CPUS_ON_NODE": "4"}
    memory = {"limit": 16000 * 1024 * 1024, "limit_cgroup": "/slurm/uid_0/job_77", "limit_file": "memory.max",
              "oom_kill": 1, "events_file": "memory.events"}
    (f,) = check_slurm_memory(_facts(env, STEPD_2205, memory))
    assert f.status == "fail" and "(--mem-per-cpu=4000M)" in f.title
    assert "--mem-per-cpu=4000M (SLURM_MEM_PER_CPU x 4 from SLURM_CPUS_ON_NODE = 16000M on this node)" in f.detail
    assert f.remedies[0].commands[0] == "#SBATCH --mem-per-cpu=8000M"


def test_a_slurm_job_with_no_kill_is_ok_only_when_the_counter_was_read():
    (f,) = check_slurm_memory(_facts(SLURM_ENV, ""))
    assert f.status == "skip" and "OOM-kill counter was not read" in f.detail
    (f,) = check_slurm_memory(_facts(SLURM_ENV, "", {"limit": 2**30, "oom_kill": 0}))
    assert f.status == "ok"
    (f,) = check_slurm_memory(_facts({}, ""))
    assert f.status == "ok" and f.title.startswith("Not a Slurm job") and "SLURM_JOB_ID is not set" in f.detail


def test_a_request_that_is_not_a_number_is_said_not_guessed():
    got = job_memory({"SLURM_JOB_ID": "1", "SLURM_MEM_PER_NODE": "lots"})
    assert got["request"] is None and got["bad"] == ["SLURM_MEM_PER_NODE='lots'"]
