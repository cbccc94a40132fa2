"""The launch layer: which launcher a command line runs, the variables each rank needs, the DeepSpeed
launcher's CUDA_VISIBLE_DEVICES rule read from release files (the launcher's runner.py of the release tags),
and a hostfile's hosts resolved for real and tried with the real ssh."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from test_gpu_facts import facts_of

from zdoctor.core.errors import UsageError
from zdoctor.front.cli import parse_args
from zdoctor.layers.launch import check_launch as cl
from zdoctor.layers.launch import dslauncher
from zdoctor.layers.launch.command import parse_launch, python_script
from zdoctor.layers.launch.probe_launch import collect_hostfile, collect_launch, hostfile_of
from zdoctor.layers.launch.rankenv import rank_env
from zdoctor.proc.target import Target
from zdoctor.symptoms.catalogue import BY_ID
from zdoctor.symptoms.extract import from_text

RELEASES = Path(__file__).parent / "fixtures" / "deepspeed-releases"
#: What DeepSpeed 0.19.8 printed, run as `python t.py` where t.py calls deepspeed.init_distributed() with no
#: launcher and no mpi4py (the real run is in test_launch_e2e.py).
PLAIN_PYTHON_OUTPUT = """\
[2026-12-02 01:05:12,101] [INFO] [comm.py:892:init_distributed] Not using the DeepSpeed or dist launchers, \
attempting to detect MPI environment...
Traceback (most recent call last):
  File "/tmp/t.py", line 2, in <module>
    deepspeed.init_distributed()
ModuleNotFoundError: No module named 'mpi4py'
"""


def by_id(findings):
    return {f.id: f for f in findings}


def install(tmp_path: Path, release: str) -> Path:
    dest = tmp_path / release / "site-packages" / "deepspeed"
    if not dest.exists():
        shutil.copytree(RELEASES / release, dest)
    return dest


def pyenv(location: Path | None = None, version: str | None = None, mpi4py: bool | None = False) -> dict:
    pk = {"mpi4py": {"installed": mpi4py}} if mpi4py is not None else {}
    ds = {"installed": True, "version": version, "location": str(location)} if version else {"installed": False}
    return {"deepspeed": ds, "packages": pk}


def symptoms(text: str) -> dict:
    return {"symptoms": [s.to_dict() for s in from_text(text, "command", "--command")]}


# -- the command line ------------------------------------------------------------------------------------

@pytest.mark.parametrize("command, launcher, options, script", [
    ("python train.py --deepspeed ds.json", "python", {}, "train.py"),
    ("CUDA_VISIBLE_DEVICES=0,2 deepspeed --num_gpus 2 train.py", "deepspeed", {"num_gpus": "2"}, "train.py"),
    ("python3 -u -m torch.distributed.run --nproc_per_node=4 train.py", "torchrun", {"nproc_per_node": "4"},
     "train.py"),
    ("accelerate launch --num_processes 8 train.py", "accelerate", {"nproc_per_node": "8"}, "train.py"),
    ("nohup env A=1 timeout 600 deepspeed -H hosts --bind_cores_to_rank t.py", "deepspeed",
     {"hostfile": "hosts", "bind_cores_to_rank": True}, "t.py"),
    ("/opt/venv/bin/deepspeed --include localhost:1,3 t.py", "deepspeed", {"include": "localhost:1,3"}, "t.py"),
])
def test_the_launcher_and_its_options_from_the_command_line(command, launcher, options, script):
    got = parse_launch(command)
    assert (got["launcher"], got["options"], got["script"]) == (launcher, options, script)


def test_mpirun_and_srun_are_parsed_down_to_the_program_and_its_binding():
    got = parse_launch("srun -n 8 --cpu-bind=cores numactl -C 0-3 python train.py")
    assert got["launcher"] == "srun" and got["options"] == {"np": "8", "bind_to": "cores"}
    assert got["inner"]["launcher"] == "python" and python_script(got) == "train.py"
    assert got["binders"] == [{"tool": "numactl", "args": ["-C", "0-3"]}]
    assert parse_launch("mpirun -np 4 -x NCCL_DEBUG python t.py")["options"] == {"np": "4", "export": ["NCCL_DEBUG"]}
    assert parse_launch("bash run.sh")["launcher"] == "other"
    assert parse_launch("python -c 'unterminated")["error"].startswith("the command line cannot be split")


def test_each_launcher_sets_what_plain_python_lacks():
    assert rank_env("deepspeed", {})["missing"] == []
    assert rank_env("torchrun", {})["falls_back_to_mpi"] is False
    plain = rank_env("python", {"MASTER_ADDR": "10.0.0.1"})
    assert plain["given"] == ["MASTER_ADDR"] and plain["missing"] == ["RANK", "WORLD_SIZE", "MASTER_PORT",
                                                                        "LOCAL_RANK"]
    assert rank_env("mpirun", {"OMPI_COMM_WORLD_RANK": "0"})["mpi"] == ["OMPI_COMM_WORLD_RANK"]
    assert rank_env("python", dict.fromkeys(["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"],
                                            "1"))["falls_back_to_mpi"] is False


# -- plain python and deepspeed.init_distributed -----------------------------------------------------------

def test_plain_python_calling_init_distributed_is_told_why_it_asks_for_mpi4py(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import deepspeed\ndeepspeed.init_distributed()\n")
    cmd = f"python {script} --epochs 1"
    lf, _ = collect_launch(cmd, {"PATH": "/usr/bin"}, pyenv(mpi4py=False), cwd=str(tmp_path))
    assert lf["script"]["calls"] == ["init_distributed"] and lf["rank_env"]["falls_back_to_mpi"]
    sy = symptoms(PLAIN_PYTHON_OUTPUT)
    kinds = {s["kind"]: s["id"] for s in sy["symptoms"]}
    assert {"no-launcher", "module-missing"} <= set(kinds)
    (f,) = cl.check_launcher(facts_of(launch=lf, symptoms=sy))
    assert f.status == "fail" and "MPI discovery" in f.title
    assert set(f.explains) == {kinds["no-launcher"], kinds["module-missing"]}
    assert "mpi4py is not installed" in f.detail and "from mpi4py import MPI" in f.detail
    assert f.remedies[0].commands == [f"deepspeed {script} --epochs 1"]
    assert f.remedies[1].commands == [f"torchrun --nproc_per_node gpu {script} --epochs 1"]
    assert f.remedies[2].commands[0].startswith("RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 "
                                                "MASTER_PORT=29500 python ")


def test_a_hostile_script_name_is_quoted_in_the_relaunch_line(tmp_path):
    script = tmp_path / "my train;rm -rf ~.py"
    script.write_text("import deepspeed\ndeepspeed.initialize(model=None)\n")
    lf, _ = collect_launch(f"python '{script}'", {}, pyenv(mpi4py=None), cwd=str(tmp_path))
    (f,) = cl.check_launcher(facts_of(launch=lf))
    assert f.status == "fail" and "whether mpi4py is installed is unknown" in f.detail
    assert f.remedies[0].commands == [f"deepspeed '{script}'"]


def test_plain_python_without_deepspeed_calls_is_fine_and_the_launchers_are_ok(tmp_path):
    (tmp_path / "plain.py").write_text("print('hi')\n")
    lf, _ = collect_launch("python plain.py", dict.fromkeys(["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                               "MASTER_PORT"], "0"), pyenv(), cwd=str(tmp_path))
    assert cl.check_launcher(facts_of(launch=lf))[0].title.startswith("The launch's environment has RANK")
    lf, _ = collect_launch("python plain.py", {}, pyenv(), cwd=str(tmp_path))
    assert cl.check_launcher(facts_of(launch=lf))[0].status == "ok"
    lf, _ = collect_launch("deepspeed plain.py", {}, pyenv(), cwd=str(tmp_path))
    (f,) = cl.check_launcher(facts_of(launch=lf))
    assert f.status == "ok" and "deepspeed gives each rank" in f.title


def test_mpirun_without_mpi4py_fails_and_with_it_passes(tmp_path):
    (tmp_path / "t.py").write_text("import deepspeed\ndeepspeed.init_distributed()\n")
    lf, _ = collect_launch("mpirun -np 2 python t.py", {}, pyenv(mpi4py=False), cwd=str(tmp_path))
    (f,) = cl.check_launcher(facts_of(launch=lf))
    assert f.status == "fail" and f.remedies[0].commands == ["python -m pip install mpi4py"]
    lf, _ = collect_launch("mpirun -np 2 python t.py", {}, pyenv(mpi4py=True), cwd=str(tmp_path))
    assert cl.check_launcher(facts_of(launch=lf))[0].status == "ok"


def test_without_a_command_the_launch_is_not_examined():
    (f,) = cl.check_launcher(facts_of(launch={"skipped": "no --command or --pid given: zdoctor does not know"}))
    assert f.id == "launcher.env.not-checked" and f.status == "skip"
    (h,) = cl.check_hostfile(facts_of(hostfile={"skipped": "no hostfile given"}))
    assert h.id == "launcher.hostfile.not-checked" and "no hostfile given" in h.detail


# -- the DeepSpeed launcher's CUDA_VISIBLE_DEVICES rule, by release -----------------------------------------

def test_the_launcher_rules_are_data_with_sources():
    for rule in dslauncher.RULES:
        assert rule["sources"] and rule["states"] and rule["release"]
    assert any("PR 960" in s and "v0.5.7" in s for s in dslauncher.RULES_BY_ID["visible-devices"]["sources"])
    assert any("PR 6530" in s and "v0.15.2" in s for s in dslauncher.RULES_BY_ID["visible-devices"]["sources"])
    assert any("PR 2881" in s for s in dslauncher.RULES_BY_ID["bind-cores-to-rank"]["sources"])


@pytest.mark.parametrize("release, devices, bind", [
    ("0.5.6", "ignored", "absent"), ("0.5.7", "count-checked", "absent"), ("0.8.3", "count-checked", "absent"),
    ("0.9.0", "count-checked", "present"), ("0.15.1", "count-checked", "present"),
    ("0.15.2", "index-seeded", "present"),
])
def test_each_release_file_decides_its_rule(tmp_path, release, devices, bind):
    rules = dslauncher.installed_launcher_rules(str(install(tmp_path, release)), release)
    assert rules["visible-devices"]["state"] == devices and rules["bind-cores-to-rank"]["state"] == bind
    assert rules["visible-devices"]["how"] == "read from the installed runner.py"
    # the release number alone gives the same answer (the upstream tags)
    assert dslauncher.by_version("visible-devices", dslauncher.parse_version(release)) == devices


def _devices(tmp_path, release, command, env, symptom_text=""):
    lf, _ = collect_launch(command, env, pyenv(install(tmp_path, release), release), cwd=str(tmp_path))
    extra = {"symptoms": symptoms(symptom_text)} if symptom_text else {}
    return cl.check_devices(facts_of(launch=lf, **extra))


def test_a_non_contiguous_list_is_refused_by_a_count_checking_release(tmp_path):
    (f,) = _devices(tmp_path, "0.15.1", "deepspeed t.py", {"CUDA_VISIBLE_DEVICES": "0,2"})
    assert f.status == "warn" and "No slot '2' specified on host 'localhost'" in f.title
    assert f.remedies[0].commands == ["env -u CUDA_VISIBLE_DEVICES deepspeed --include localhost:0,2 t.py"]
    (f,) = _devices(tmp_path, "0.15.1", "CUDA_VISIBLE_DEVICES=0,2 deepspeed t.py", {},
                    "ValueError: No slot '2' specified on host 'localhost'")
    assert f.status == "fail" and f.explains
    (f,) = _devices(tmp_path, "0.15.1", "deepspeed t.py", {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert f.status == "ok"


def test_the_fixed_release_takes_any_list_and_the_oldest_ignores_it(tmp_path):
    (f,) = _devices(tmp_path, "0.15.2", "deepspeed t.py", {"CUDA_VISIBLE_DEVICES": "4,5"})
    assert f.status == "ok" and "any list is taken" in f.detail
    (f,) = _devices(tmp_path, "0.5.6", "deepspeed t.py", {"CUDA_VISIBLE_DEVICES": "1"})
    assert f.status == "warn" and "ignores CUDA_VISIBLE_DEVICES=1" in f.title
    (f,) = _devices(tmp_path, "0.15.2", "deepspeed --num_gpus 2 t.py", {"CUDA_VISIBLE_DEVICES": "1"})
    assert f.status == "warn" and "ignores the launching node's CUDA_VISIBLE_DEVICES" in f.detail


def test_num_gpus_with_include_is_refused_as_the_launcher_does(tmp_path):
    lf, _ = collect_launch("deepspeed --num_gpus 2 --include localhost:0,1 t.py", {}, pyenv(), cwd=str(tmp_path))
    sy = symptoms("ValueError: Cannot specify num_nodes/gpus with include/exclude")
    (f,) = cl.check_devices(facts_of(launch=lf, symptoms=sy))
    assert f.status == "fail" and "--num_gpus 2, --include localhost:0,1" in f.detail and f.explains
    # every release file read has the rule
    for runner in RELEASES.glob("*/launcher/runner.py"):
        assert "Cannot specify num_nodes/gpus with include/exclude" in runner.read_text()


def test_include_slots_against_the_hostfile(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("localhost slots=2\n")
    lf, _ = collect_launch(f"deepspeed -H {hf} --include localhost:0,3 t.py", {}, pyenv(), cwd=str(tmp_path))
    hff, _ = collect_hostfile(str(hf), "test", ssh=False)
    sy = symptoms("ValueError: No slot '3' specified on host 'localhost'")
    (f,) = cl.check_devices(facts_of(launch=lf, hostfile=hff, symptoms=sy))
    assert f.status == "fail" and "localhost has slots=2 (0..1), not slot 3" in f.detail and f.explains


# -- the hostfile: real name lookups and the real ssh ------------------------------------------------------

def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_host_that_does_not_resolve_explains_the_launchers_errors(tmp_path):
    hf = tmp_path / "hostfile"
    hf.write_text("localhost slots=1\nh7-nohost.invalid slots=1\n")
    facts, ev = collect_hostfile(str(hf), "--hostfile", ssh=False)
    res = {r["host"]: r for r in facts["resolve"]}
    assert res["localhost"]["addresses"] and not res["h7-nohost.invalid"]["addresses"]
    sy = symptoms("ssh: Could not resolve hostname h7-nohost.invalid: Name or service not known\n"
                  "RuntimeError: Using hostfile at hostfile but host=h7-nohost.invalid was not reachable via ssh. "
                  "If you are running with a single node please remove hostfile or setup passwordless ssh.")
    assert {s["kind"] for s in sy["symptoms"]} == {"host-unresolved", "host-unreachable"}
    (f,) = cl.check_hostfile(facts_of(hostfile=facts, symptoms=sy))
    assert f.status == "fail" and "h7-nohost.invalid" in f.title
    assert len(f.explains) == 2
    assert "getent hosts h7-nohost.invalid" in f.detail


def test_the_real_ssh_is_tried_in_batch_mode_and_its_refusal_is_a_finding(tmp_path):
    if not shutil.which("ssh"):
        pytest.fail("ssh is part of the test machine")
    hf = tmp_path / "hostfile"
    hf.write_text("127.0.0.1 slots=1\n")
    facts, ev = collect_hostfile(str(hf), "--hostfile", port=str(_closed_port()))
    (s,) = facts["ssh"]
    assert s["ok"] is False and "BatchMode=yes" in s["argv"] and "refused" in s["said"]
    (f,) = cl.check_hostfile(facts_of(hostfile=facts))
    assert f.status == "fail" and "ssh does not log in to 1 host" in f.title and "127.0.0.1 (refused)" in f.title
    json.dumps(facts)  # facts are JSON (a replay reads them back)


def test_a_malformed_hostfile_is_a_finding_and_check_takes_hostfile(tmp_path):
    hf = tmp_path / "hostfile"
    hf.write_text("worker-1 slots=eight\n")
    facts, _ = collect_hostfile(str(hf), "--hostfile")
    (f,) = cl.check_hostfile(facts_of(hostfile=facts))
    assert f.status == "fail" and "expected 'slots=N'" in f.detail
    args = parse_args(["check", "--hostfile", str(hf)])
    assert args.hostfile == str(hf)
    opts = {k: None for k in ("ds_config", "offload_path", "model_params", "model_config", "nodes",
                              "gpus_per_node", "train_log", "io_size", "gpu_sample", "user", "p2p_test",
                              "symptom", "pid", "as_root")}
    assert Target.from_args(None, None, [], None, {**opts, "hostfile": str(hf)}).options["hostfile"] == str(hf)
    with pytest.raises(UsageError, match="--hostfile"):
        Target.from_args(None, None, [], None, {**opts, "hostfile": str(tmp_path / "none")})
    assert hostfile_of({}, parse_launch("deepspeed --hostfile=/x/h t.py")) == (
        "/x/h", "the command's hostfile option (deepspeed)")
    assert hostfile_of({}, parse_launch("python t.py")) == (None, "")


def test_the_launchers_messages_are_catalogued_and_confirmed_by_these_checks():
    assert BY_ID["deepspeed.no-launcher"].confirm == ("launcher.env",)
    assert BY_ID["python.no-mpi4py"].confirm == ("launcher.env",)
    assert BY_ID["deepspeed.no-slot"].confirm == ("launcher.devices",)
    assert BY_ID["ssh.resolve"].confirm == ("launcher.hostfile",)
    assert BY_ID["deepspeed.ssh-unreachable"].confirm == ("launcher.hostfile",)
    assert BY_ID["deepspeed.num-with-include"].confirm == ("launcher.devices",)


def test_a_running_jobs_launcher_and_ranks_come_from_its_process_tree(tmp_path):
    """A real tree: a process whose argv[0] is torchrun (bash's exec -a) with a child carrying the rank
    variables a launcher gives."""
    rank = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    child = f"{shlex.quote(sys.executable)} -c 'import time; time.sleep(30)'"
    top = subprocess.Popen(["bash", "-c", f"exec -a torchrun {shlex.quote(sys.executable)} -c "
                            f"{shlex.quote(f'import subprocess; subprocess.run({child!r}, shell=True)')} "
                            "--nproc_per_node 1 train.py"], env={**rank, "PATH": "/usr/bin:/bin"},
                           start_new_session=True)
    try:
        deadline = time.time() + 15
        while time.time() < deadline and not psutil.Process(top.pid).children(recursive=True):
            time.sleep(0.05)
        time.sleep(0.2)
        lf, ev = collect_launch(None, {}, pyenv(), pid=top.pid)
        assert lf["source"] == "pid" and lf["launch"]["launcher"] == "torchrun"
        assert len(lf["processes"]) >= 2 and all(p["env"].get("RANK") == "0" for p in lf["processes"])
        (f,) = cl.check_launcher(facts_of(launch=lf))
        assert f.status == "ok" and f.title.startswith("torchrun gives each rank")
        assert ev[-1].label == f"The job under pid {top.pid}: its processes"
    finally:
        os.killpg(top.pid, 9)
        top.wait()
