"""Which processes are the training job: real processes on this node, one of them really stuck in the
kernel (a vfork parent waits in state D until its child exits), none of them the job. With --pid or
--command only the job's own process tree is judged; with neither the finding speaks of "processes on
this node", never of the training job."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import run_cli
from prockit import spawn, wait_for  # noqa: F401 - spawn is a fixture
from test_gpu_facts import facts_of

from zdoctor.core.registry import load_vocabulary
from zdoctor.host import LiveHost
from zdoctor.layers.toolchain.check_hangs import check_processes
from zdoctor.layers.toolchain.probe_hangs import collect_processes
from zdoctor.readers import processes as pr

# The parent of a vfork() waits in the kernel (state D, wchan kernel_clone) until the child exits.
VFORK_C = "#include <unistd.h>\nint main(void) { if (vfork() == 0) { sleep(600); _exit(0); } return 0; }\n"
JOB = "import time, sys; time.sleep(600)"

pytestmark = pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")


def state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


@pytest.fixture
def stuck(tmp_path, spawn):  # noqa: F811
    """A python-named process on this node, not the job, in state D."""
    exe = tmp_path / "python-dwait-h3"
    src = tmp_path / "dwait.c"
    src.write_text(VFORK_C)
    subprocess.run(["gcc", "-O0", "-o", str(exe), str(src)], check=True)
    pid = spawn(f"import os; os.execv({str(exe)!r}, [{str(exe)!r}])")
    assert wait_for(lambda: state(pid) == "D", 10), state(pid)
    return pid


def judge(facts: dict) -> object:
    (f,) = check_processes(facts_of(processes=facts))
    return f


def test_with_a_pid_only_its_tree_is_the_job(stuck, spawn):  # noqa: F811
    job = spawn(JOB)
    load_vocabulary()
    facts = LiveHost(options={"pid": job}).results(["processes"])
    scope = facts.of("processes")["scope"]
    assert scope["kind"] == "pid" and scope["pids"] == [job]
    (f,) = check_processes(facts)
    assert f.status == "ok" and f.title.startswith("The job's 1 process, none stuck"), f.title
    assert f"pid {stuck}" in f.detail and "not part of the job" in f.detail
    node = judge(collect_processes(None, 0.1)[0])  # node-wide, the same process is judged stuck
    assert node.status == "warn" and "uninterruptible sleep" in node.title and f"pid {stuck}" in node.detail
    # a pid that runs nowhere is not judged at all
    gone = judge(collect_processes(None, 0.1, pid=2**22 + 7)[0])
    assert gone.status == "skip" and "none found" in gone.title


def test_without_pid_or_command_it_says_processes_on_this_node(stuck, spawn):  # noqa: F811
    spawn(JOB)
    facts, ev = collect_processes(None, 0.1)
    assert facts["scope"]["kind"] == "node"
    f = judge(facts)
    assert f.status == "warn" and "on this node" in f.title and "job" not in f.title, f.title
    assert "not known" in f.detail and ev[0].label.startswith("processes on this node")


def test_with_a_command_its_running_processes_are_the_job(stuck, spawn, tmp_path):  # noqa: F811
    marker = f"zdh3job-{os.getpid()}"
    command = f"python3 -c {JOB!r} {marker}"
    job = spawn(f"import os; os.execv('/bin/sh', ['sh', '-c', {command!r}])")
    # the marker is in the spawning python's own argv before it execs the shell: wait for the shell itself
    assert wait_for(lambda: bool(pr.command_roots(command)), 10)
    facts, _ev = collect_processes(None, 0.1, command=command)
    scope = facts["scope"]
    assert scope["kind"] == "command" and job in scope["pids"] and stuck not in scope["pids"], scope
    f = judge(facts)
    assert f.status == "ok" and f.title.startswith("The job's"), f.title
    assert f"pid {stuck}" in f.detail and "not part of the job" in f.detail


def test_pid_on_the_command_line_reaches_the_job_options():
    bad = run_cli(["check", "--pid", "0", "--no-log"])
    assert bad.returncode == 2 and "--pid must be at least 1" in bad.stderr
    from zdoctor.front.cli import build_parser
    from zdoctor.proc.target import OPTION_KEYS

    args = build_parser().parse_args(["check", "--pid", "4242"])
    assert "pid" in OPTION_KEYS and args.pid == 4242
