"""The rendezvous port taken on this node: a real process listening on the port, the real torchrun of the test
environment failing with torch's EADDRINUSE message, and zdoctor naming the process that holds the port (by
pid, command, user and start time), a free port, and explaining the message through the catalogue."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import run_cli
from dsenv import ensure
from test_gpu_facts import facts_of

from zdoctor.layers.launch import check_rendezvous as cr
from zdoctor.layers.launch.ports import parse_table, port_listeners
from zdoctor.layers.launch.probe_rendezvous import collect_rendezvous, rendezvous_ports
from zdoctor.symptoms.extract import from_text

# The holder takes a port the kernel chooses and says which: a port found free first and bound after could be
# taken in between by a test running beside this one.
HOLD = ("import socket, time\n"
        "s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen()\n"
        "print('listening', s.getsockname()[1], flush=True); time.sleep(600)\n")
SCRIPT = "import torch.distributed as dist\ndist.init_process_group('gloo')\n"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    python = ensure()
    work = tmp_path_factory.mktemp("port")
    (work / "t.py").write_text(SCRIPT)
    (work / "hold.py").write_text(HOLD)
    holder = subprocess.Popen([sys.executable, str(work / "hold.py")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    said, port_text = holder.stdout.readline().split()
    assert said == "listening"
    port = int(port_text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                                    "SLURM_"))}
    env["PATH"] = f"{python.parent}{os.pathsep}{env['PATH']}"
    command = f"torchrun --nproc_per_node 1 --master_port {port} t.py"
    real = subprocess.run(command.split(), cwd=work, env=env, capture_output=True, text=True, timeout=300)
    try:
        yield {"python": python, "work": work, "env": env, "port": port, "holder": holder, "real": real,
               "command": command}
    finally:
        holder.kill()
        holder.wait()


def test_the_kernel_table_names_the_listener_and_its_process(lab):
    (ls,) = port_listeners(lab["port"])
    assert ls["address"] == "0.0.0.0"
    (p,) = ls["processes"]
    assert p["pid"] == lab["holder"].pid and "hold.py" in p["command"] and p["user"] and p["started"]
    # a table line of another state (ESTABLISHED, 01) is no listener
    text = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
            "   0: 0100007F:7535 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242\n"
            "   1: 0100007F:7536 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4243\n")
    assert parse_table(text) == [{"address": "127.0.0.1", "port": 30005, "inode": 4242, "uid": 0}]


def test_the_real_eaddrinuse_is_explained_by_the_process_holding_the_port(lab):
    real = lab["real"]
    assert real.returncode != 0
    assert f"port: {lab['port']}, useIpv6: false, code: -98, name: EADDRINUSE" in real.stderr
    sy = {"symptoms": [s.to_dict() for s in from_text(real.stderr, "command", "--command")]}
    ports = rendezvous_ports({"options": {"master_port": str(lab["port"])}, "launcher": "torchrun"}, {},
                             sy["symptoms"])
    assert ports == [(lab["port"], "the launch's --master_port")]
    rf, _ = collect_rendezvous(ports, {})
    launch = {"launch": {"command": lab["command"], "launcher": "torchrun"}}
    (f,) = cr.check_port(facts_of(rendezvous=rf, symptoms=sy, launch=launch))
    assert f.status == "fail" and f"by pid {lab['holder'].pid}" in f.title
    assert f.explains == [s["id"] for s in sy["symptoms"] if s["kind"] == "port-in-use"] and f.explains
    kill, other = f.remedies
    assert kill.commands == [f"kill {lab['holder'].pid}"] and "hold.py" in kill.title
    free = rf["free_port"]
    assert other.commands == [f"torchrun --master_port={free} --nproc_per_node 1 t.py"]
    # the free port, run for real: torchrun's store binds it (the rank then finishes its rendezvous)
    rerun = subprocess.run(other.commands[0].split(), cwd=lab["work"], env=lab["env"], capture_output=True,
                           text=True, timeout=300)
    assert "EADDRINUSE" not in rerun.stderr and rerun.returncode == 0, rerun.stderr[-2000:]


def test_zdoctor_check_names_the_holder_for_the_real_failing_torchrun(lab):
    proc = run_cli(["check", "--json", "--no-log", "--python", str(lab["python"]), "--command", lab["command"]],
                   env=lab["env"], cwd=str(lab["work"]), timeout=600)
    doc = json.loads(proc.stdout)
    found = {f["id"]: f for f in doc["findings"]}
    f = found["launcher.port"]
    assert f["status"] == "fail" and str(lab["holder"].pid) in f["title"]
    (sym,) = [s for s in doc["symptoms"] if s["kind"] == "port-in-use"]
    assert sym["id"] in f["explains"] and "launcher.port" in sym["explained_by"]
    assert f["remedies"][0]["commands"] == [f"kill {lab['holder'].pid}"]


def test_a_slurm_job_is_offered_one_launcher_per_node():
    rf = {"ports": [{"port": 29500, "source": "MASTER_PORT", "listeners": [
        {"address": "0.0.0.0", "port": 29500, "uid": 0, "processes": [
            {"pid": 4242, "user": "alice", "command": "python -m torch.distributed.run t.py", "started": "x"}]}]}],
          "free_port": 29501, "launcher": "torchrun", "slurm": True, "job_pids": []}
    (f,) = cr.check_port(facts_of(rendezvous=rf, launch={"launch": {"command": "torchrun t.py"}}))
    assert f.status == "fail" and f.explains == []
    assert [r.commands[0] for r in f.remedies] == ["kill 4242", "torchrun --master_port=29501 t.py",
                                                   "srun --ntasks-per-node=1 torchrun t.py"]
    assert f.remedies[0].requires_root  # another user's process


def test_a_free_port_is_ok_and_the_job_s_own_listener_is_no_stranger():
    free = {"ports": [{"port": 29500, "source": "MASTER_PORT", "listeners": []}], "free_port": 29501,
            "launcher": "torchrun", "slurm": False, "job_pids": []}
    (f,) = cr.check_port(facts_of(rendezvous=free))
    assert f.status == "ok"
    own = {**free, "ports": [{"port": 29500, "source": "MASTER_PORT", "listeners": [
        {"address": "0.0.0.0", "port": 29500, "uid": 0, "processes": [{"pid": 7, "command": "python t.py"}]}]}],
        "job_pids": [7]}
    (f,) = cr.check_port(facts_of(rendezvous=own))
    assert f.status == "ok" and "job itself" in f.title
    (f,) = cr.check_port(facts_of(rendezvous={"skipped": "no launch"}))
    assert f.status == "skip"
