"""zdoctor's own temporary files live in one folder per run, which the next run sweeps after a SIGKILL (never
a live run's folder, another account's, or what a link points at); a compile ended at its time limit, or
whose keeper was killed outright, leaves no ``<defunct>`` child of zdoctor behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from compilerkit import (
    DEFAULT_TMP,
    FALLBACK_PLACES,
    check_killed_mid_compile,
    killed_with_fallback_folders,
    slow_compiler,
    without_tmpdir,
    write_exe,
)
from conftest import REPO, run_cli

from zdoctor.proc import scratch

PROBE_RUN = textwrap.dedent("""
    import json, os, sys
    from zdoctor.proc import children, scratch
    from zdoctor.layers.toolchain import probe_jitprereq as jitprereq
    children.install_signal_handlers()  # a subreaper, as zdoctor runs
    jitprereq.COMPILE_TIMEOUT = float(sys.argv[1])
    from zdoctor.host import LiveHost
    from zdoctor.core.registry import load_vocabulary
    load_vocabulary()
    host = LiveHost(python=sys.executable, env={**os.environ, "CXX": sys.argv[2]})
    compile = host.result("jitprereq").facts["compile"]
    from compilerkit import defunct_children
    print(json.dumps({"compile": compile, "defunct": defunct_children(os.getpid()), "run_folder": scratch.made()}))
""")


def run_probe(cxx: Path, timeout: float, tmp: Path) -> dict:
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
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
    assert out["defunct"] == []
    assert sleepers_gone(tmp_path)


def test_a_keeper_killed_mid_compile_leaves_no_defunct_child(tmp_path):
    """The keeper dies first: the compiler (in a session of its own) and its passes are handed to zdoctor,
    the subreaper, and reaped as the command's cgroup is killed."""
    if os.geteuid() != 0:
        pytest.skip("the command's cgroup, which names the processes handed over, is made only as root")
    out = run_probe(slow_compiler(tmp_path, own_session=True, kill_keeper=True), 30, tmp_path)
    assert out["compile"]["plain"]["ok"] is False
    assert out["defunct"] == []
    assert sleepers_gone(tmp_path)


def test_the_run_folder_is_removed_when_the_run_ends(tmp_path):
    out = run_probe(write_exe(tmp_path / "cxx", "#!/bin/sh\nexec g++ \"$@\"\n"), 60, tmp_path)
    assert out["compile"]["plain"]["ok"] is True
    assert out["run_folder"] and Path(out["run_folder"]).parent == tmp_path
    assert not Path(out["run_folder"]).exists()
    assert not list(tmp_path.glob("cc*")) and not list(tmp_path.glob("zdoctor-*"))


def live_folder(tmp: Path, pid: int) -> Path:
    folder = tmp / f"{scratch.PREFIX}{scratch.pid_namespace()}-{pid}-{scratch.process_start(pid)}-live"
    folder.mkdir()
    (folder / "work").write_text("in use")
    return folder


def test_the_next_run_sweeps_what_a_sigkilled_check_left(tmp_path, spawn):
    """A check SIGKILLed mid-compile (no TMPDIR: its folder and the compiler's files go to /tmp) leaves its
    run folder, with the compile test's sources and the compiler's cc*.s in it; the next check removes it,
    and leaves alone a live run's folder, a link named like a run folder (and its target), a folder made in
    another pid namespace, and (as root) one owned by another account."""
    seen: dict[str, list[Path]] = {}
    ns = scratch.pid_namespace()

    def look(pid: int) -> None:
        """While the compile test runs: its sources and the compiler's own temporary files."""
        run = f"{scratch.PREFIX}{ns}-{pid}-*"
        seen["folders"] = list(DEFAULT_TMP.glob(run))
        seen["sources"] = list(DEFAULT_TMP.glob(f"{run}/cc-*/one_line.cpp"))
        seen["compiler"] = list(DEFAULT_TMP.glob(f"{run}/cc-*/cc*.s"))

    pid = check_killed_mid_compile(tmp_path, REPO, before_kill=look)
    (left,) = seen["folders"]
    assert seen["sources"] and seen["compiler"], seen
    assert left.exists()

    me = os.getpid()
    target = tmp_path / "not-zdoctors"
    target.mkdir()
    (target / "keep").write_text("x")
    link = DEFAULT_TMP / f"{scratch.PREFIX}{ns}-1-1-link{me}"
    other_namespace = DEFAULT_TMP / f"{scratch.PREFIX}1-{pid}-1-container{me}"  # a container sharing /tmp
    foreign = DEFAULT_TMP / f"{scratch.PREFIX}{ns}-{pid}-1-foreign{me}"
    live = live_folder(DEFAULT_TMP, spawn("import time; time.sleep(600)"))
    try:
        link.symlink_to(target)
        other_namespace.mkdir()
        if os.geteuid() == 0:
            foreign.mkdir()
            os.chown(foreign, 65534, 65534)
        proc = run_cli(["check", "--json", "--no-log", "--playbook", "gpu-stack"], env=without_tmpdir(dict(os.environ)))
        assert proc.returncode in (0, 1, 3), proc.stderr
        assert not left.exists()
        assert live.exists() and (live / "work").read_text() == "in use"
        assert link.is_symlink() and (target / "keep").exists()
        assert other_namespace.exists()
        if os.geteuid() == 0:
            assert foreign.exists()
    finally:
        if link.is_symlink():
            link.unlink()
        for folder in (other_namespace, foreign, live, left):
            shutil.rmtree(folder, ignore_errors=True)


def test_the_next_run_sweeps_what_a_killed_run_left_in_var_tmp_and_dev_shm(tmp_path, spawn):
    """A run killed (SIGKILL) while its compile test had fallen back to /var/tmp and its /dev/shm write test
    had its folder there leaves both; the next check removes them, and leaves alone a live run's folder, a
    link named like a run folder (and what it points at) and (as root) one owned by another account."""
    ns = scratch.pid_namespace()
    pid, left = killed_with_fallback_folders(tmp_path, REPO)
    var_tmp, dev_shm = FALLBACK_PLACES
    [left_cc] = [p for p in left if p.parent == var_tmp]
    [left_shm] = [p for p in left if p.parent == dev_shm]
    assert list(left_cc.glob("cc-*/one_line.cpp")) and list(left_cc.glob("cc-*/ccA1b2C3.s"))
    assert (left_shm / "done").exists()

    me = os.getpid()
    target = tmp_path / "not-zdoctors"
    target.mkdir()
    (target / "keep").write_text("x")
    link = dev_shm / f"{scratch.PREFIX}{ns}-1-1-link{me}"
    foreign = var_tmp / f"{scratch.PREFIX}{ns}-{pid}-1-foreign{me}"
    live = live_folder(var_tmp, spawn("import time; time.sleep(600)"))
    try:
        link.symlink_to(target)
        if os.geteuid() == 0:
            foreign.mkdir()
            os.chown(foreign, 65534, 65534)
        proc = run_cli(["check", "--json", "--no-log", "--playbook", "gpu-stack"], env=without_tmpdir(dict(os.environ)))
        assert proc.returncode in (0, 1, 3), proc.stderr
        assert not left_cc.exists() and not left_shm.exists()
        assert live.exists() and (live / "work").read_text() == "in use"
        assert link.is_symlink() and (target / "keep").exists()
        if os.geteuid() == 0:
            assert foreign.exists()
    finally:
        if link.is_symlink():
            link.unlink()
        for folder in (foreign, live, left_cc, left_shm):
            shutil.rmtree(folder, ignore_errors=True)


def test_the_libaio_test_and_a_file_edits_text_are_made_in_the_run_folder(tmp_path):
    from zdoctor.edit.core_apply import action_argv

    with scratch.private_folder("aio-") as aio:
        assert Path(aio).parent == Path(scratch.run_folder()) and Path(aio).name.startswith("aio-")
    assert not Path(aio).exists()
    action = {"text": "new", "path": str(tmp_path / "f"), "sha256": "0" * 64, "backup": str(tmp_path / "b")}
    with action_argv(action) as argv:
        text = Path(argv[argv.index("--text-file") + 1])
        assert text.read_text() == "new" and text.parent.parent == Path(scratch.run_folder())
    assert not text.parent.exists()


def test_a_compile_retried_in_dev_shm_keeps_the_compilers_files_in_the_run_folder_there(tmp_path):
    """The retry of a compile stopped on a full temporary directory, in /dev/shm: the compiler's TMPDIR is a
    folder of this run there (swept should the run be killed), removed after; the trial still names the place."""
    from zdoctor.layers.toolchain.probe_jitprereq import no_space

    src = tmp_path / "one.cpp"
    src.write_text("int one;\n")
    told = tmp_path / "tmpdirs"
    cxx = write_exe(tmp_path / "cxx", f'#!/bin/sh\necho "$TMPDIR" >> {told}\nexec g++ "$@"\n')
    env = {"PATH": os.environ["PATH"], "TMPDIR": str(tmp_path), "HOME": str(tmp_path / "home")}
    facts, _ = no_space([[str(cxx), "-c", str(src), "-o", str(tmp_path / "one.o")]], env, ("/dev/shm",))
    assert facts["trials"] == [{"tmpdir": "/dev/shm", "ok": True, "stderr": ""}]
    [used] = told.read_text().split()
    assert Path(used).parent == Path(scratch.run_folder("/dev/shm")) and Path(used).name.startswith("cc-")
    assert not Path(used).exists()
