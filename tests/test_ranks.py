"""The ranks layer on recorded and small real states: a recorded gloo deadlock (the ranks probe's facts with
py-spy's stacks), DeepSpeed ZeRO-3 stacks made of DeepSpeed 0.19.8's own functions, a real launcher chain
(a process whose argv[0] is torchrun), a real TCP connection read back from /proc, and fleet --pid's parsing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zdoctor.core.errors import UsageError
from zdoctor.core.model import ProbeResult
from zdoctor.core.registry import Facts
from zdoctor.fleet.collect import NodeRun
from zdoctor.fleet.ranks import fleet_rank_findings
from zdoctor.front.fleet_command import node_pids
from zdoctor.host import ReplayHost
from zdoctor.layers.ranks import rankstate, ranktree
from zdoctor.layers.ranks.check_ranks import check_ranks
from zdoctor.layers.ranks.probe_ranks import NOT_NAMED
from zdoctor.layers.ranks.pyspy import pyspy_dump
from zdoctor.layers.ranks.rankwaits import classify, parse_pyspy

FIXTURE = Path(__file__).parent / "fixtures" / "ranks" / "gloo-deadlock.json"


def recorded() -> dict:
    return json.loads(FIXTURE.read_text())


def findings_of(facts: dict) -> dict:
    return {f.id: f for f in check_ranks(Facts({"ranks": ProbeResult(probe="ranks", status="ok", facts=facts)}))}


def test_the_recorded_gloo_deadlock_names_both_ranks_and_that_they_disagree():
    host = ReplayHost(recorded(), source=str(FIXTURE))
    found = {f.id: f for f in check_ranks(host.results(["ranks"]))}
    f = found["ranks.waits"]
    assert f.status == "fail"
    assert f.title == "Ranks disagree: rank 0 waits in all_gather (rank.py:11); rank 1 in barrier (rank.py:13)"
    assert "rank 0 (pid 17694): all_gather (torch/distributed/distributed_c10d.py:4287), called from train " \
           "(rank.py:11)" in f.detail
    table = f.evidence[0].table
    assert [row[0] for row in table.rows] == ["rank 0 (pid 17694)", "rank 1 (pid 17695)"]


def test_the_same_ranks_without_stacks_say_the_frame_is_unknown_not_that_they_agree():
    facts = recorded()["probes"]["ranks"]["facts"]
    for r in facts["ranks"]:
        r["python"] = None
    facts["pyspy"] = {"path": None}
    f = findings_of(facts)["ranks.waits"]
    assert f.status == "warn"
    assert f.title == "2 ranks blocked in futex: whether they disagree is unknown (the Python frame is unknown)"
    assert "install zdoctor[hang] (py-spy)" in f.detail


def test_a_pyspy_that_may_not_read_the_rank_is_one_clear_line(tmp_path):
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho 'Error: Permission Denied: Try running again with elevated permissions' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    got = pyspy_dump(str(fake), os.getpid())
    assert set(got) == {"error"} and "ptrace refused" in got["error"] and "Permission Denied" in got["error"]
    facts = recorded()["probes"]["ranks"]["facts"]
    for r in facts["ranks"]:
        r["python"] = got
    f = findings_of(facts)["ranks.waits"]
    assert f.status == "warn" and "ptrace refused" in f.detail


def test_pyspy_output_that_is_not_its_json_is_refused():
    with pytest.raises(ValueError):
        parse_pyspy('{"not": "threads"}')
    with pytest.raises(ValueError):
        parse_pyspy("[{}]")


def frame(name: str, file: str, line: int) -> dict:
    return {"name": name, "filename": f"/opt/venv/lib/python3.11/site-packages/{file}" if "/" in file else
            f"/home/alice/{file}", "short_filename": file, "line": line}


#: DeepSpeed 0.19.8's ZeRO-3 parameter fetch, as a rank blocked in it shows (functions and lines of its source).
ZERO3_FETCH = [
    frame("AllGatherCoalescedHandle.wait", "deepspeed/runtime/zero/partition_parameters.py", 716),
    frame("PartitionedParameterCoordinator.fetch_sub_module", "deepspeed/runtime/zero/partitioned_param_coordinator.py",
          336),
    frame("decorate_context", "torch/utils/_contextlib.py", 120),
    frame("DeepSpeedZeRoOffload._pre_forward_module_hook.<locals>.pre_sub_module_forward_function",
          "deepspeed/runtime/zero/parameter_offload.py", 473),
    frame("Module._call_impl", "torch/nn/modules/module.py", 1840),
]
GENERATE = [frame("GenerationMixin._sample", "transformers/generation/utils.py", 2790),
            frame("GenerationMixin.generate", "transformers/generation/utils.py", 2255),
            frame("decorate_context", "torch/utils/_contextlib.py", 120),
            frame("evaluate", "train.py", 88)]
BARRIER = [frame("barrier", "torch/distributed/distributed_c10d.py", 5356),
           frame("_exception_logger.<locals>.wrapper", "torch/distributed/c10d_logger.py", 83)]


def job(*stacks: list[dict], launcher: str | None = None, local_world: str | None = None) -> dict:
    ranks = []
    for i, frames in enumerate(stacks):
        env = {"RANK": str(i), "LOCAL_RANK": str(i), "WORLD_SIZE": str(len(stacks))}
        if local_world:
            env["LOCAL_WORLD_SIZE"] = local_world
        stack = [{"os_thread_id": 100 + i, "thread_name": "MainThread", "active": False, "frames": frames}]
        ranks.append({"pid": 100 + i, "comm": "python", "state": "S", "state_words": "sleeping",
                      "wchan": "futex_do_wait", "syscall": "futex", "rank": str(i), "local_rank": str(i),
                      "env": env, "env_readable": True,
                      "threads": [{"tid": 100 + i, "comm": "python", "state": "S", "wchan": "futex_do_wait",
                                   "syscall": "futex"}], "kernel_stack": None, "tcp_peers": [], "cpu_s": 1.0,
                      "cpu_delta_s": 0.0, "cpu_sample_s": 0.5,
                      "python": {"threads": parse_pyspy(json.dumps(stack))}})
    return {"named": 99, "root": 99, "launcher": launcher, "how": "pid 99 and the descendants",
            "processes": [{"pid": 99, "ppid": 1, "name": "torchrun", "cmdline": ["torchrun"], "launcher": launcher,
                           "python": False}], "ranks": ranks, "helpers": [], "pyspy": {"path": "py-spy",
                                                                                        "version": "0.4.3"}}


def test_zero3_generate_without_synced_gpus_is_named():
    found = findings_of(job([*ZERO3_FETCH, *GENERATE], [*BARRIER, frame("evaluate", "train.py", 95)]))
    assert found["ranks.waits"].status == "fail"
    assert found["ranks.waits"].title.startswith(
        "Ranks disagree: rank 0 waits in ZeRO-3 parameter all-gather (train.py:88); rank 1 in barrier (train.py:95)")
    g = found["ranks.waits.zero3-generate"]
    assert g.status == "fail" and "synced_gpus" in g.title
    assert "rank 0 (pid 100) is still in a ZeRO-3 forward pass inside generate() while rank 1 (pid 101) left it" \
        in g.detail
    assert "synced_gpus=True" in g.remedies[0].title
    assert "ranks.waits.uneven-steps" not in found


def test_a_rank_in_a_step_while_another_left_the_loop_is_uneven_steps():
    step = [*ZERO3_FETCH, frame("DeepSpeedEngine.forward", "deepspeed/runtime/engine.py", 2105),
            frame("train", "train.py", 40)]
    found = findings_of(job(step, [*BARRIER, frame("train", "train.py", 60)]))
    u = found["ranks.waits.uneven-steps"]
    assert u.status == "fail"
    assert "rank 0 (pid 100) is inside a DeepSpeed step (forward (deepspeed/runtime/engine.py:2105))" in u.detail
    assert "drop_last=True" in u.remedies[0].explanation
    assert "ranks.waits.zero3-generate" not in found


def test_ranks_in_the_same_collective_from_the_same_line_agree():
    same = [frame("all_reduce", "torch/distributed/distributed_c10d.py", 2810), frame("train", "train.py", 30)]
    found = findings_of(job(same, same))
    f = found["ranks.waits"]
    assert f.status == "warn"
    assert f.title == "All 2 ranks here wait in the same all_reduce (torch/distributed/distributed_c10d.py:2810)"
    assert "zdoctor fleet --pid" in f.detail


def test_the_same_collective_from_different_lines_disagrees():
    a = [frame("all_reduce", "torch/distributed/distributed_c10d.py", 2810), frame("train", "train.py", 30)]
    b = [frame("all_reduce", "torch/distributed/distributed_c10d.py", 2810), frame("metrics", "train.py", 70)]
    f = findings_of(job(a, b))["ranks.waits"]
    assert f.status == "fail"
    assert f.title == "Ranks disagree: rank 0 waits in all_reduce (train.py:30); rank 1 in all_reduce (train.py:70)"


def test_a_local_rank_the_launcher_started_and_that_is_gone_is_named():
    one = [frame("all_reduce", "torch/distributed/distributed_c10d.py", 2810), frame("train", "train.py", 30)]
    found = findings_of(job(one, launcher="torchrun", local_world="2"))
    m = found["ranks.waits.missing"]
    assert m.status == "fail" and m.title == "Local rank 1 of 2 no longer run while the others wait"


def test_no_job_named_is_not_examined_with_why():
    res = ProbeResult(probe="ranks", status="skip", facts={"skipped": NOT_NAMED}, error=NOT_NAMED)
    [f] = check_ranks(Facts({"ranks": res}))
    assert f.id == "ranks.waits.not-checked" and f.status == "skip"
    assert f.detail == "no hung job named (give --pid PID of a rank or its launcher, or --command)"
    from zdoctor.walk.doctor import layers_examined

    layer = next(x for x in layers_examined([f]) if x["id"] == "ranks")
    assert layer["status"] == "not examined" and "no hung job named" in layer["why"]


def test_classify_reads_the_user_frame_and_generate():
    got = classify(parse_pyspy(json.dumps([{"frames": [*ZERO3_FETCH, *GENERATE]}]))[0]["frames"])
    assert got["zero3"].startswith("wait (deepspeed/runtime/zero/partition_parameters.py:716)")
    assert got["generate"] == "_sample (transformers/generation/utils.py:2790)"
    assert got["user"] == "evaluate (train.py:88)"


@pytest.mark.parametrize("argv,kind", [
    (["/usr/bin/python3", "/opt/venv/bin/deepspeed", "train.py"], "deepspeed"),
    (["python", "-u", "-m", "deepspeed.launcher.launch", "--world_info=x"], "deepspeed"),
    (["/opt/venv/bin/torchrun", "--nproc-per-node", "8", "train.py"], "torchrun"),
    (["python3", "-m", "torch.distributed.run", "train.py"], "torchrun"),
    (["mpirun", "-np", "16", "python", "train.py"], "mpirun"),
    (["srun", "python", "train.py"], "srun"),
    (["python", "train.py"], None),
    (["bash", "run.sh"], None),
])
def test_launchers_are_known_by_their_command_line(argv, kind):
    assert ranktree.launcher_of(argv) == kind


def test_a_rank_pid_brings_its_launchers_tree_and_only_it():
    # a real chain: a process whose argv[0] is torchrun, its python child, and an unrelated python beside
    launcher = subprocess.Popen(["bash", "-c", f"exec -a torchrun bash -c '{sys.executable} -c \"import time; "
                                 f"time.sleep(60)\" & wait'"], start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 20
        import psutil

        kids: list = []
        while time.monotonic() < deadline and not kids:
            kids = [c for c in psutil.Process(launcher.pid).children() if "python" in c.name()]
            time.sleep(0.05)
        assert kids
        job = ranktree.job_processes(kids[0].pid)
        assert job["root"] == launcher.pid and job["launcher"] == "torchrun"
        assert job["how"] == f"pid {kids[0].pid} and its launcher (torchrun, pid {launcher.pid}) and the descendants"
        env = {p["pid"]: rankstate.read_env(p["pid"]) for p in job["processes"] if p["python"]}
        ranks, helpers = ranktree.rank_pids(job["processes"], env)
        assert ranks == [kids[0].pid] and helpers == [] and other.pid not in {p["pid"] for p in job["processes"]}
    finally:
        for p in (launcher, other):
            os.killpg(launcher.pid, 9) if p is launcher else p.kill()
            p.wait()


def test_the_tcp_peer_of_a_connection_is_read_from_proc():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    try:
        peers = rankstate.tcp_peers(os.getpid())
        assert f"127.0.0.1:{server.getsockname()[1]}" in peers and f"127.0.0.1:{client.getsockname()[1]}" in peers
    finally:
        for s in (conn, client, server):
            s.close()


def test_syscalls_and_states_of_proc():
    assert rankstate.syscall_name("202 0x55 0x189 0x0", "x86_64") == "futex"
    assert rankstate.syscall_name("98 0x1 0x2", "aarch64") == "futex"
    assert rankstate.syscall_name("running") == "running"
    assert rankstate.syscall_name("-1 0x7ffc 0x7f") is None
    assert rankstate.syscall_name("999 0x0", "x86_64") == "syscall 999"
    me = rankstate.read_rank(os.getpid())
    assert me is not None and me["threads"][0]["tid"] == os.getpid() and me["cpu_s"] is not None


def test_fleet_pid_arguments():
    hosts = ["a", "b", "c"]
    assert node_pids(["7"], hosts) == {h: ["--pid", "7"] for h in hosts}
    assert node_pids(["7", "b=9"], hosts) == {"a": ["--pid", "7"], "b": ["--pid", "9"], "c": ["--pid", "7"]}
    assert node_pids(["a=3"], hosts) == {"a": ["--pid", "3"]}
    with pytest.raises(UsageError, match="not one of the job's nodes"):
        node_pids(["d=3"], hosts)
    with pytest.raises(UsageError, match="expected PID or HOST=PID"):
        node_pids(["a=x"], hosts)


def test_the_fleet_judges_the_ranks_of_every_node_as_one_job():
    doc = recorded()
    runs = []
    for host, keep in (("node-a", "0"), ("node-b", "1")):
        d = json.loads(json.dumps(doc))
        facts = d["probes"]["ranks"]["facts"]
        facts["ranks"] = [r for r in facts["ranks"] if r["rank"] == keep]
        runs.append(NodeRun(host, "ok", snapshot=d))
    [f] = fleet_rank_findings(runs)
    assert f.id == "fleet.ranks" and f.status == "fail"
    assert f.title == ("Ranks disagree across nodes: rank 0 on node-a waits in all_gather (rank.py:11); "
                       "rank 1 on node-b in barrier (rank.py:13)")
    assert fleet_rank_findings(runs[:1]) == []


def test_torchs_collective_mismatch_report_is_a_known_message():
    from zdoctor.symptoms.extract import from_text

    text = (FIXTURE.parent / "collective-mismatch.log").read_text()  # a real TORCH_DISTRIBUTED_DEBUG=DETAIL run
    found = from_text(text, "log", "train.log")
    assert [(s.signature, s.fields) for s in found] == [
        ("c10d.collective-mismatch", {"rank": "0", "seq": "0", "op": "ALLGATHER", "other_rank": "1",
                                      "other_op": "REDUCE"}),
        ("c10d.collective-mismatch", {"rank": "1", "seq": "0", "op": "BARRIER", "other_rank": "0",
                                      "other_op": "GATHER"})]


WATCHDOG = ("[rank0]:[E ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=7, OpType={op}, NumelIn=4, NumelOut=8, Timeout(ms)=600000) ran for 600012 "
            "milliseconds before timing out.")


@pytest.mark.parametrize("op,explained", [("ALLGATHER", True), ("ALLREDUCE", True), ("BROADCAST", False)])
def test_a_watchdog_timeout_is_explained_by_the_ranks_that_disagree_in_that_collective(op, explained):
    from zdoctor.symptoms.extract import from_text

    [symptom] = from_text(WATCHDOG.format(op=op), "user", "--symptom")
    assert symptom.signature == "nccl.watchdog-timeout"
    facts = Facts({"ranks": ProbeResult(probe="ranks", status="ok", facts=recorded()["probes"]["ranks"]["facts"]),
                   "symptoms": ProbeResult(probe="symptoms", status="ok", facts={"symptoms": [symptom.to_dict()]})})
    f = {x.id: x for x in check_ranks(facts)}["ranks.waits"]
    # rank 0 waits in all_gather (ALLGATHER), rank 1 in barrier (NCCL's barrier is an ALLREDUCE)
    assert f.status == "fail" and f.explains == ([symptom.id] if explained else [])


def test_a_rank_that_exited_while_the_other_waits_disagrees():
    one = [frame("all_reduce", "torch/distributed/distributed_c10d.py", 2810), frame("train", "train.py", 30)]
    facts = job(one, one)
    facts["ranks"][1].update(state="Z", state_words="a zombie", python={"error": "py-spy dump exited with 1"})
    f = findings_of(facts)["ranks.waits"]
    assert f.status == "fail"
    assert f.title == "Ranks disagree: rank 0 waits in all_reduce (train.py:30); rank 1 has exited"


def test_a_pyspy_that_does_not_run_is_not_called_missing(tmp_path, monkeypatch):
    from zdoctor.layers.ranks.rankjob import collect_ranks

    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        facts = collect_ranks(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert facts["pyspy"]["path"] == str(fake) and "error" in facts["pyspy"]
    [rank] = facts["ranks"]
    assert rank["python"]["error"].startswith(f"py-spy ({fake}) does not run")
    f = findings_of({**facts, "source": "pid"})["ranks.waits"]
    assert f.title.startswith("1 rank blocked in ") and f.title.endswith(": the Python frame is unknown")
    assert "does not run" in f.detail and "install zdoctor[hang]" not in f.detail


def test_the_fleet_report_prints_the_ranks_across_the_nodes():
    import io

    from zdoctor.fleet.result import FleetReport
    from zdoctor.report.fleettext import print_fleet

    doc = recorded()
    runs = []
    for host, keep in (("node-a", "0"), ("node-b", "1")):
        d = json.loads(json.dumps(doc))
        d["probes"]["ranks"]["facts"]["ranks"] = [r for r in d["probes"]["ranks"]["facts"]["ranks"]
                                                  if r["rank"] == keep]
        runs.append(NodeRun(host, "ok", snapshot=d))
    report = FleetReport.build(runs, "ssh", "hostfile")
    assert report.exit_code == 1 and [f["id"] for f in report.to_dict()["findings"]] == ["fleet.ranks"]
    out = io.StringIO()
    print_fleet(report, out)
    text = out.getvalue()
    assert "The job's ranks across the nodes" in text
    assert "rank 0 on node-a waits in all_gather (rank.py:11)" in text
    assert "- rank 1 on node-b (pid 17695): barrier (torch/distributed/distributed_c10d.py:5356)" in text


def test_a_real_zero3_generate_hang_is_named():
    # recorded from zero3-generate.py: DeepSpeed 0.19.8 ZeRO-3 on the CPU accelerator with gloo, rank 0
    # generating 4 steps, rank 1 one step and then a barrier
    facts = json.loads((FIXTURE.parent / "zero3-generate.json").read_text())
    found = findings_of(facts)
    f = found["ranks.waits"]
    assert f.status == "fail"
    assert f.title == ("Ranks disagree: rank 0 waits in broadcast under ZeRO-3 (gen.py:19); "
                       "rank 1 in barrier (gen.py:28)")
    assert "under ZeRO-3's assert_lst_len_same_as_other_ranks (deepspeed/runtime/zero/utils.py:89), inside " \
           "generate (gen.py:19)" in f.detail
    g = found["ranks.waits.zero3-generate"]
    assert g.status == "fail" and g.detail.startswith(
        "rank 0 (pid 23593) is still in a ZeRO-3 forward pass inside generate() while rank 1 (pid 23594) left it.")


def test_a_real_zero3_run_with_uneven_steps_is_named():
    # recorded from zero3-uneven-steps.py: rank 0 has three batches, rank 1 one and then a barrier
    found = findings_of(json.loads((FIXTURE.parent / "zero3-uneven-steps.json").read_text()))
    assert found["ranks.waits"].title == ("Ranks disagree: rank 0 waits in broadcast under ZeRO-3 (steps.py:18); "
                                          "rank 1 in barrier (steps.py:19)")
    u = found["ranks.waits.uneven-steps"]
    assert u.status == "fail" and u.detail.startswith(
        "rank 0 (pid 24653) is inside a DeepSpeed step (forward (deepspeed/runtime/engine.py:3007)) while rank 1 "
        "(pid 24654) is outside the engine: the ranks ran different numbers of steps.")
    assert "ranks.waits.zero3-generate" not in found


@pytest.mark.parametrize("pid,why", [(1, "starts the node's processes, not one job"), (-3, "is not a process id"),
                                     (4194303, "no process 4194303 runs on this node")])
def test_a_pid_that_is_no_job_is_not_examined_with_why(pid, why):
    job = ranktree.job_processes(pid)
    assert job["processes"] == [] and why in job["missing"]
    [f] = findings_of({**job, "ranks": [], "helpers": [], "pyspy": {"path": None}, "source": "pid"}).values()
    assert f.id == "ranks.waits.not-checked" and why in f.detail


def test_a_launcher_whose_ranks_run_on_other_nodes_points_at_the_fleet():
    procs = [{"pid": 10, "ppid": 1, "name": "python3", "cmdline": ["python3", "/usr/bin/deepspeed", "train.py"],
              "launcher": "deepspeed", "python": True},
             {"pid": 11, "ppid": 10, "name": "pdsh", "cmdline": ["pdsh", "-w", "n1,n2"], "launcher": None,
              "python": False}]
    [f] = findings_of({"named": 10, "root": 10, "launcher": "deepspeed", "how": "pid 10 and the descendants",
                       "processes": procs, "ranks": [], "helpers": [], "pyspy": {"path": None},
                       "source": "pid"}).values()
    assert f.status == "warn" and f.title == "The job's tree holds no Python rank on this node"
    assert "It starts its ranks on other nodes (pdsh): `zdoctor fleet --pid HOST=PID`" in f.detail
