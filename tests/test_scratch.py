"""zdoctor's own temporary files live in one folder per run, which the next run sweeps after a SIGKILL (never
a live run's folder, another account's, or what a link points at); a compile ended at its time limit, or
whose keeper was killed outright, leaves no ``<defunct>`` child of zdoctor behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import REPO, run_cli

from zdoctor import scratch

#: A tool gcc starts each of its passes under (``g++ -wrapper``): it notes that it runs, then sleeps.
SLOW_TOOL = """#!/bin/sh
echo $$ >> {marks}/slow-tool.pids
sleep 1000
exec "$@"
"""


def write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def slow_compiler(tmp: Path, *, own_session: bool = False, kill_keeper: bool = False) -> Path:
    """A CXX that runs the real g++ with every pass held by a sleeping tool: with ``own_session`` the g++
    runs in a session of its own (as a compiler ninja starts in a group of its own); with ``kill_keeper``
    the wrapper then kills the keeper zdoctor runs it under (its parent) outright."""
    tool = write_exe(tmp / "slow-tool", SLOW_TOOL.format(marks=tmp))
    gxx = f"{'setsid ' if own_session else ''}g++ -wrapper {tool} \"$@\""
    body = f"{gxx} &\nwhile [ ! -s {tmp}/slow-tool.pids ]; do sleep 0.05; done\n"
    body += "kill -9 $PPID\n" if kill_keeper else ""
    return write_exe(tmp / "slow-cxx", f"#!/bin/sh\n{body}wait\n")


PROBE_RUN = textwrap.dedent("""
    import json, os, sys
    from zdoctor import children, scratch
    from zdoctor.probes import jitprereq
    children.install_signal_handlers()  # a subreaper, as zdoctor runs
    jitprereq.COMPILE_TIMEOUT = float(sys.argv[1])
    from zdoctor.host import LiveHost
    from zdoctor.registry import load_vocabulary
    load_vocabulary()
    host = LiveHost(python=sys.executable, env={**os.environ, "CXX": sys.argv[2]})
    compile = host.result("jitprereq").facts["compile"]
    me = str(os.getpid())
    kids = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            data = open(f"/proc/{name}/stat", "rb").read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2:].split()
        if fields[1].decode() == me:
            kids.append([int(name), fields[0].decode(), data[:data.rfind(b")") + 1].decode()])
    print(json.dumps({"compile": compile, "children": kids, "run_folder": scratch.made()}))
""")


def run_probe(cxx: Path, timeout: float, tmp: Path) -> dict:
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", PROBE_RUN, str(timeout), str(cxx)], capture_output=True,
                          text=True, env=env, timeout=300, cwd=str(tmp))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sleepers_gone(marks: Path) -> bool:
    pids = [int(x) for x in (marks / "slow-tool.pids").read_text().split()]
    return all(not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
               for pid in pids)


@pytest.mark.parametrize("own_session", [False, True], ids=["one-session", "compiler-in-own-session"])
def test_a_compile_at_its_time_limit_leaves_no_defunct_child(tmp_path, own_session):
    out = run_probe(slow_compiler(tmp_path, own_session=own_session), 2, tmp_path)
    assert "timed out after 2s" in (out["compile"]["plain"]["error"] or "")
    assert [k for k in out["children"] if k[1] == "Z"] == [], out["children"]
    assert sleepers_gone(tmp_path)


def test_a_keeper_killed_mid_compile_leaves_no_defunct_child(tmp_path):
    """The keeper dies first: the compiler (in a session of its own) and its passes are handed to zdoctor,
    the subreaper, and reaped as the command's cgroup is killed."""
    if os.geteuid() != 0:
        pytest.skip("the command's cgroup, which names the processes handed over, is made only as root")
    out = run_probe(slow_compiler(tmp_path, own_session=True, kill_keeper=True), 30, tmp_path)
    assert out["compile"]["plain"]["ok"] is False
    assert [k for k in out["children"] if k[1] == "Z"] == [], out["children"]
    assert sleepers_gone(tmp_path)


def test_the_run_folder_is_removed_when_the_run_ends(tmp_path):
    out = run_probe(write_exe(tmp_path / "cxx", "#!/bin/sh\nexec g++ \"$@\"\n"), 60, tmp_path)
    assert out["compile"]["plain"]["ok"] is True
    assert out["run_folder"] and Path(out["run_folder"]).parent == tmp_path
    assert not Path(out["run_folder"]).exists()
    assert not list(tmp_path.glob("cc*")) and not list(tmp_path.glob("zdoctor-*"))


def live_folder(tmp: Path, pid: int) -> Path:
    folder = tmp / f"{scratch.PREFIX}{pid}-{scratch.process_start(pid)}-live"
    folder.mkdir()
    (folder / "work").write_text("in use")
    return folder


def test_the_next_run_sweeps_what_a_sigkilled_check_left(tmp_path, spawn):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cxx = slow_compiler(tmp_path)
    env = {**os.environ, "TMPDIR": str(tmp), "CXX": str(cxx), "NO_COLOR": "1"}
    zd = subprocess.Popen([sys.executable, "-m", "zdoctor", "check", "--json", "--no-log", "--playbook", "toolchain"],
                          env=env, cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          stdin=subprocess.DEVNULL)
    marks = tmp_path / "slow-tool.pids"
    try:
        while not marks.exists() or not marks.read_text().strip():  # the compile test is under way
            assert zd.poll() is None, "zdoctor ended before its compile test ran"
            time.sleep(0.1)
        (left,) = tmp.glob(f"{scratch.PREFIX}{zd.pid}-*")
        (cc,) = left.glob("cc-*")
        assert (cc / "one_line.cpp").exists()
        assert list(cc.glob("cc*.s")), "the compiler's own temporary file is not in the run's folder"
    finally:
        zd.send_signal(signal.SIGKILL)
        zd.wait()
    assert left.exists() and not list(tmp.glob("cc*"))  # the compiler wrote nothing beside the run folder

    live = live_folder(tmp, spawn("import time; time.sleep(600)"))
    target = tmp_path / "not-zdoctors"
    target.mkdir()
    (target / "keep").write_text("x")
    link = tmp / f"{scratch.PREFIX}1-1-link"
    link.symlink_to(target)
    foreign = tmp / f"{scratch.PREFIX}{zd.pid}-1-foreign"
    if os.geteuid() == 0:
        foreign.mkdir()
        os.chown(foreign, 65534, 65534)

    proc = run_cli(["check", "--json", "--no-log", "--playbook", "gpu-stack"], env={**os.environ, "TMPDIR": str(tmp)})
    assert proc.returncode in (0, 1, 3), proc.stderr
    assert not left.exists()
    assert live.exists() and (live / "work").read_text() == "in use"
    assert link.is_symlink() and (target / "keep").exists()
    if os.geteuid() == 0:
        assert foreign.exists()
