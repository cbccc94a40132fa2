"""A real deadlock of two gloo ranks on loopback (the lab env's torch, CPU): rank 0 waits in
``dist.all_gather`` while rank 1 waits in ``dist.barrier``. ``check --pid`` names both ranks, where each waits
and that they disagree, with py-spy installed and without it (then from /proc, the Python frame unknown);
``fleet --pid HOST=PID`` over the loopback sshd shows which rank on which node is out of step."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dsenv
import pytest
from sshkit import node_bin, require, start_sshd

from zdoctor.layers.ranks.pyspy import find_pyspy

RANK_SCRIPT = '''
import os, sys
import torch
import torch.distributed as dist

def train(ready):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(4)
    with open(os.path.join(ready, f"rank{rank}"), "w") as fh:
        fh.write(str(os.getpid()))
    if rank == 0:
        out = [torch.zeros(4) for _ in range(dist.get_world_size())]
        dist.all_gather(out, t)  # ALL_GATHER_LINE
    else:
        dist.barrier()  # BARRIER_LINE

train(sys.argv[1])
'''
NODE_A, NODE_B = "127.0.8.1", "127.0.8.2"
BASE_PATH = f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin"


def line_of(marker: str) -> int:
    return next(i for i, text in enumerate(RANK_SCRIPT.split("\n"), 1) if marker in text)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pyspy_dir() -> str:
    """A directory holding a py-spy that runs (installed from PyPI into the tests' cache once)."""
    found = shutil.which("py-spy")
    if found:
        return os.path.dirname(found)
    target = Path.home() / ".cache" / "zdoctor-tests" / "py-spy"
    exe = target / "bin" / "py-spy"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--target", str(target), "py-spy>=0.3"], check=True, timeout=300)
    return str(exe.parent)


def _main_syscall(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/syscall").read_text().split()[0]
    except (OSError, IndexError):
        return ""


def write_job(root: Path, name: str, python: Path) -> tuple[Path, Path]:
    """A job script starting the two ranks (the ranks write their pids into the ready directory)."""
    script = root / "rank.py"
    script.write_text(RANK_SCRIPT)
    ready = root / f"{name}-ready"
    ready.mkdir()
    job = root / f"{name}.sh"
    job.write_text("#!/bin/sh\n"
                   f"export MASTER_ADDR=127.0.0.1 MASTER_PORT={free_port()} WORLD_SIZE=2\n"
                   f"RANK=0 LOCAL_RANK=0 {python} {script} {ready} &\n"
                   f"RANK=1 LOCAL_RANK=1 {python} {script} {ready} &\n"
                   "wait\n")
    return job, ready


@pytest.fixture(scope="module")
def lab_python() -> Path:
    return dsenv.ensure()


@pytest.fixture(scope="module")
def deadlock(tmp_path_factory: pytest.TempPathFactory, lab_python: Path):
    """Two gloo ranks (children of a job script) blocked in different collectives; killed at the end."""
    python = lab_python
    root = tmp_path_factory.mktemp("hung-ranks")
    job, ready = write_job(root, "job", python)
    with open(root / "job.log", "wb") as log:
        proc = subprocess.Popen(["/bin/sh", str(job)], stdout=log, stderr=log, start_new_session=True)
    try:
        yield _blocked(proc, ready, root)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _blocked(proc: subprocess.Popen[bytes], ready: Path, root: Path) -> dict:
    """Wait until both ranks are in their collective and blocked there."""
    deadline = time.monotonic() + 120
    pids: dict[int, int] = {}
    while time.monotonic() < deadline and len(pids) < 2:
        assert proc.poll() is None, (root / "job.log").read_text()
        for rank in (0, 1):
            f = ready / f"rank{rank}"
            if f.exists() and f.read_text().strip().isdigit():
                pids[rank] = int(f.read_text())
        time.sleep(0.2)
    assert len(pids) == 2, f"the ranks did not start: {(root / 'job.log').read_text()}"
    # blocked: each main thread sleeps in futex (202 on x86_64, 98 on aarch64) for a while
    futex = {"x86_64": "202", "aarch64": "98"}.get(os.uname().machine, "202")
    steady = 0
    while time.monotonic() < deadline and steady < 5:
        steady = steady + 1 if all(_main_syscall(p) == futex for p in pids.values()) else 0
        time.sleep(0.2)
    assert steady >= 5, "the ranks never blocked"
    return {"job": proc.pid, "ranks": pids, "root": root}


def ranks_findings(stdout: str) -> dict[str, dict]:
    doc = json.loads(stdout)
    return {f["id"]: f for f in doc["findings"] if f["id"].startswith("ranks.")}, doc


def test_with_pyspy_both_ranks_named_with_where_each_waits_and_that_they_disagree(deadlock, pyspy_dir, cli):
    env = dict(os.environ, PATH=f"{pyspy_dir}:{BASE_PATH}")
    r = cli(["check", "--pid", str(deadlock["job"]), "--json", "--no-log"], env=env)
    found, doc = ranks_findings(r.stdout)
    f = found["ranks.waits"]
    assert f["status"] == "fail", f
    assert f["title"] == (f"Ranks disagree: rank 0 waits in all_gather (rank.py:{line_of('ALL_GATHER_LINE')}); "
                          f"rank 1 in barrier (rank.py:{line_of('BARRIER_LINE')})")
    r0, r1 = deadlock["ranks"][0], deadlock["ranks"][1]
    assert f"rank 0 (pid {r0}): all_gather (torch/distributed/distributed_c10d.py:" in f["detail"]
    assert f"rank 1 (pid {r1}): barrier (torch/distributed/distributed_c10d.py:" in f["detail"]
    assert "export TORCH_DISTRIBUTED_DEBUG=DETAIL" in [c for rem in f["remedies"] for c in rem["commands"]]
    layer = next(x for x in doc["layers"] if x["id"] == "ranks")
    assert layer["status"] == "examined"
    walk = next(p for p in doc["playbooks"] if p["id"] == "zero3-launch")
    assert walk["diagnosis"] == "diag-ranks-disagree", walk
    assert r.returncode == 1


def test_a_rank_pid_is_that_rank_alone_not_every_python_on_the_node(deadlock, pyspy_dir, cli):
    env = dict(os.environ, PATH=f"{pyspy_dir}:{BASE_PATH}")
    r1 = deadlock["ranks"][1]
    r = cli(["check", "--pid", str(r1), "--json", "--no-log"], env=env)
    found, _doc = ranks_findings(r.stdout)
    f = found["ranks.waits"]
    assert f["status"] == "warn"
    assert f["title"].startswith("1 rank of the job: barrier (torch/distributed/distributed_c10d.py:")
    assert f"rank 1 (pid {r1})" in f["detail"] and "rank 0" not in f["detail"]


def test_without_pyspy_the_waits_come_from_proc_and_the_frame_is_unknown(deadlock, cli):
    if find_pyspy(BASE_PATH):
        pytest.skip("py-spy is installed beside this interpreter: a PATH without it still finds it")
    env = dict(os.environ, PATH=BASE_PATH)
    r = cli(["check", "--pid", str(deadlock["job"]), "--json", "--no-log"], env=env)
    found, _doc = ranks_findings(r.stdout)
    f = found["ranks.waits"]
    assert f["status"] == "warn", f
    assert f["title"] == ("2 ranks blocked in futex: whether they disagree is unknown "
                          "(the Python frame is unknown)")
    r0, r1 = deadlock["ranks"][0], deadlock["ranks"][1]
    for rank, pid in ((0, r0), (1, r1)):
        line = next(ln for ln in f["detail"].splitlines() if ln.startswith(f"- rank {rank} (pid {pid}): "))
        assert "main thread blocked in futex" in line and "pt_gloo_runloop in futex" in line
        assert "gloo_tcp_loop " in line  # gloo's network thread: in epoll_wait, or woken as it was read
        assert line.endswith("Python frame unknown")
    assert "install zdoctor[hang] (py-spy)" in f["detail"]
    assert "disagree" not in f["title"].replace("whether they disagree is unknown", "")


def test_a_hung_command_is_read_before_its_time_limit_and_its_hang_explained(lab_python, pyspy_dir, cli, tmp_path):
    job, ready = write_job(tmp_path, "hung-command", lab_python)  # the same ranks, in a run zdoctor ends
    env = dict(os.environ, PATH=f"{pyspy_dir}:{BASE_PATH}")
    r = cli(["check", "--command", f"/bin/sh {job}", "--timeout", "30", "--json", "--no-log"], env=env,
            timeout=240)
    found, doc = ranks_findings(r.stdout)
    f = found["ranks.waits"]
    assert f["status"] == "fail", f
    assert f["title"] == (f"Ranks disagree: rank 0 waits in all_gather (rank.py:{line_of('ALL_GATHER_LINE')}); "
                          f"rank 1 in barrier (rank.py:{line_of('BARRIER_LINE')})")
    assert f["detail"].startswith("The job is the hung --command run (pid ")
    hang = next(s for s in doc["symptoms"] if s["kind"] == "hang")
    assert hang["id"] in f["explains"] and "ranks.waits" in hang["explained_by"]
    pids = [int((ready / f"rank{i}").read_text()) for i in (0, 1)]
    assert not any(Path(f"/proc/{p}").exists() for p in pids)  # the run's ranks ended with it


@pytest.mark.parametrize("launcher", ["ssh", "pdsh"])
def test_fleet_pid_shows_which_rank_on_which_node_is_out_of_step(deadlock, pyspy_dir, cli, tmp_path, launcher):
    require("/usr/sbin/sshd", "ssh", launcher)
    repo = Path(__file__).resolve().parent.parent
    # the nodes run this checkout's zdoctor, whatever an installed one is
    bindir = node_bin(tmp_path / "bin", body=f'PYTHONPATH={repo} exec {sys.executable} -m zdoctor "$@"\n')
    path = f"{bindir}:{pyspy_dir}:{BASE_PATH}"
    sshd = start_sshd(tmp_path / "sshd", {NODE_A: {"PATH": path}, NODE_B: {"PATH": path}})
    try:
        hf = tmp_path / "hostfile"
        hf.write_text(f"{NODE_A} slots=1\n{NODE_B} slots=1\n")
        r0, r1 = deadlock["ranks"][0], deadlock["ranks"][1]
        r = cli(["fleet", "--hostfile", str(hf), "--launcher", launcher, "--ssh-config", str(sshd.ssh_config),
                 "--zdoctor", "zdoctor-node", "--pid", f"{NODE_A}={r0}", "--pid", f"{NODE_B}={r1}", "--json",
                 "--no-log"], timeout=240)
    finally:
        sshd.stop()
    doc = json.loads(r.stdout)
    nodes = {n["host"]: n for n in doc["nodes"]}
    assert [nodes[h]["launch"]["status"] for h in (NODE_A, NODE_B)] == ["ok", "ok"], r.stderr
    # each node alone sees one rank: no disagreement there
    assert nodes[NODE_A]["cells"]["ranks.waits"] == "warn" and nodes[NODE_B]["cells"]["ranks.waits"] == "warn"
    f = next(x for x in doc["findings"] if x["id"] == "fleet.ranks")
    assert f["status"] == "fail"
    assert f["title"] == (f"Ranks disagree across nodes: rank 0 on {NODE_A} waits in all_gather "
                          f"(rank.py:{line_of('ALL_GATHER_LINE')}); rank 1 on {NODE_B} in barrier "
                          f"(rank.py:{line_of('BARRIER_LINE')})")
    assert r.returncode == 1
