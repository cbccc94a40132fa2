"""Locked memory for RDMA, on real processes: a process whose RLIMIT_MEMLOCK is set low with prlimit (its
mlock of 1 MiB fails with the kernel's real ENOMEM, the errno ibv_reg_mr gets from the same limit, and
succeeds once the limit is raised), and the real sshd of sshkit whose limit is lowered while it runs (the
limit a process started through ssh gets, read the way pdsh's ranks would get it). zdoctor names the path, the
limit and the remedies, and explains NCCL's message through the catalogue."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from conftest import run_cli
from sshkit import SSHD, require, start_sshd
from test_gpu_facts import facts_of
from userkit import unprivileged_user

from zdoctor.layers.nccl_network import check_memlock as cm
from zdoctor.layers.nccl_network.memlock import parse_proc_limits, process_memlock
from zdoctor.layers.nccl_network.probe_memlock import collect_memlock
from zdoctor.symptoms.extract import from_text

ROOT = Path(__file__).resolve().parent.parent
NCCL = ("node1:2345:2390 [0] misc/ibvwrap.cc:190 NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate "
        "memory")
LOCK = textwrap.dedent("""
    import ctypes, mmap, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    buf = mmap.mmap(-1, 1 << 20)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    rc = libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(1 << 20))
    print("mlock:", "ok" if rc == 0 else os.strerror(ctypes.get_errno()), flush=True)
    if len(sys.argv) > 1:
        sys.stdin.read()
""")


def _symptoms(text: str) -> dict:
    return {"symptoms": [s.to_dict() for s in from_text(text, "log")]}


def _prlimit(*args: str) -> list[str]:
    tool = shutil.which("prlimit")
    if tool is None:
        pytest.fail("prlimit (util-linux) is part of the test machine")
    return [tool, *args]


def _without_ipc_lock(argv: list[str]) -> list[str]:
    """``argv`` without CAP_IPC_LOCK, as a rank of an ordinary user or a container runs (root's capability
    lets it lock memory beyond the limit)."""
    return [str(shutil.which("setpriv")), "--bounding-set=-ipc_lock", *argv]


def test_a_rank_with_a_low_limit_is_named_and_explains_nccl_s_message():
    low = subprocess.Popen(_without_ipc_lock([*_prlimit("--memlock=65536:65536"), sys.executable, "-c", LOCK, "wait"]),
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert low.stdout is not None
        assert low.stdout.readline().strip() == "mlock: Cannot allocate memory"  # the kernel's ENOMEM
        rank = process_memlock(low.pid)
        assert rank["soft_kb"] == 64 and rank["hard_kb"] == 64 and rank["error"] is None
        assert rank["ipc_lock"] is False
        mf, ev = collect_memlock({"memlock_soft_kb": "unlimited", "memlock_hard_kb": "unlimited"}, [low.pid], [])
        mf["limits_d"] = {"path": "/etc/security/limits.d", "names": []}
        sy = _symptoms(NCCL)
        (f,) = cm.check_memlock(facts_of(memlock_paths=mf, symptoms=sy))
        assert f.status == "fail" and f.explains == [sy["symptoms"][0]["id"]]
        assert f.title == f"Locked memory is limited to 64 KiB on running pid {low.pid}: RDMA registration fails " \
                          "with ENOMEM"
        assert "get less than the launching shell (unlimited)" in f.detail
        titles = [r.title for r in f.remedies]
        assert any("memlock for every login" in t for t in titles)
        assert not any("container" in t for t in titles)  # this is not a container
    finally:
        low.communicate("")
    # the remedy's effect, for real: the same lock with the limit raised succeeds (to the machine's own hard
    # limit: raising a hard limit takes CAP_SYS_RESOURCE, which a container may lack)
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    raised = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    assert raised == "unlimited" or hard >= 2 << 20
    fixed = subprocess.run(_without_ipc_lock([*_prlimit(f"--memlock={raised}:{raised}"), sys.executable, "-c",
                                              LOCK]),
                           capture_output=True, text=True, timeout=60)
    assert fixed.stdout.strip() == "mlock: ok"


def test_the_proc_limits_line_and_unlimited_everywhere():
    text = ("Limit                     Soft Limit           Hard Limit           Units     \n"
            "Max locked memory         8388608              unlimited            bytes     \n")
    assert parse_proc_limits(text) == {"soft_kb": 8192, "hard_kb": "unlimited"}
    mf = {"shell": {"soft_kb": "unlimited", "hard_kb": "unlimited"}, "ranks": [], "ssh": []}
    (f,) = cm.check_memlock(facts_of(memlock_paths=mf, symptoms=_symptoms(NCCL)))
    assert f.status == "warn" and f.explains == [] and "not this limit's" in f.detail
    (f,) = cm.check_memlock(facts_of(memlock_paths={"skipped": "x"}))
    assert f.status == "skip"
    box = {"shell": {"soft_kb": 64, "hard_kb": "unlimited"}, "ranks": [], "ssh": [],
           "container": {"in_container": True}}
    (f,) = cm.check_memlock(facts_of(memlock_paths=box, symptoms=_symptoms("libibverbs: Warning: RLIMIT_MEMLOCK "
                                                                            "is 65536 bytes.")))
    assert f.status == "fail" and len(f.explains) == 1
    assert [r.title for r in f.remedies][:2] == ["Start the container with no locked-memory limit",
                                                 "Raise the soft limit in the launching shell"]
    assert f.remedies[1].commands == ["ulimit -l unlimited"]


PROBE = textwrap.dedent("""
    import json, sys
    from zdoctor.layers.nccl_network.probe_memlock import collect_memlock
    host = sys.argv[1]
    facts, _ = collect_memlock({"memlock_soft_kb": "unlimited", "memlock_hard_kb": "unlimited"}, [], [host])
    print(json.dumps(facts))
""")


def test_the_limit_a_process_started_through_ssh_gets():
    require("ssh", SSHD, "unshare", "prlimit")
    # sshd reads the user's authorized keys as that user: a folder every account may enter
    top = Path(tempfile.mkdtemp(prefix="zdoctor-memlock-"))
    os.chmod(top, 0o755)
    try:
        with unprivileged_user("ml") as user:
            _through_ssh(top, user.name)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _through_ssh(tmp_path: Path, user: str) -> None:
    subprocess.run(["usermod", "-p", "*", user], check=True)  # no password, not locked: a key logs in
    sshd = start_sshd(tmp_path / "sshd", {"127.0.0.2": {}})
    try:
        # sshd runs without PAM here: its sessions inherit its own limit, lowered while it runs
        subprocess.run(_prlimit("--pid", str(sshd.proc.pid), "--memlock=131072:131072"), check=True)
        (tmp_path / "etcssh").mkdir()
        (tmp_path / "etcssh" / "ssh_config").write_text(f"User {user}\n" + sshd.ssh_config.read_text())
        script = f"{shutil.which('mount')} --bind {tmp_path / 'etcssh'} /etc/ssh && exec \"$@\""
        r = subprocess.run([str(shutil.which("unshare")), "-m", "/bin/sh", "-c", script, "sh", sys.executable, "-c",
                            PROBE, "127.0.0.2"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert r.returncode == 0, r.stderr
        mf = json.loads(r.stdout)
    finally:
        sshd.stop()
    (via,) = mf["ssh"]
    assert via == {"host": "127.0.0.2", "soft_kb": 128, "hard_kb": 128, "ipc_lock": False, "error": None}
    sy = _symptoms(NCCL)
    (f,) = cm.check_memlock(facts_of(memlock_paths=mf, symptoms=sy))
    assert f.status == "fail" and "128 KiB on a process ssh starts on 127.0.0.2" in f.title
    sshd_fix = f.remedies[-1]
    assert sshd_fix.title.startswith("On 127.0.0.2: let sshd hand its sessions no locked-memory limit")
    assert "LimitMEMLOCK=infinity" in sshd_fix.commands[0] and sshd_fix.requires_root
    # without the message, a path lower than the shell is still said
    (f,) = cm.check_memlock(facts_of(memlock_paths=mf))
    assert f.status == "warn" and f.explains == []


def test_the_glossary_explains_memlock_pdsh_and_the_rendezvous_port():
    from zdoctor.core.glossary import find_term, load_glossary

    terms = load_glossary()
    assert "CAP_IPC_LOCK" in find_term(terms, "memlock").text
    assert "launcher 'pdsh' not installed." in find_term(terms, "pdsh").text
    assert "EADDRINUSE" in find_term(terms, "rendezvous port").text


def test_zdoctor_check_on_a_running_rank_explains_the_pasted_message():
    """`zdoctor check --pid RANK --symptom MESSAGE`: the rank's own limit read from /proc, the message explained
    through the catalogue, the multinode walk ending at the locked-memory diagnosis."""
    rank = subprocess.Popen(_without_ipc_lock([*_prlimit("--memlock=65536:65536"), sys.executable, "-c", LOCK,
                                               "wait"]), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout is not None and rank.stdout.readline().strip() == "mlock: Cannot allocate memory"
        proc = run_cli(["check", "--json", "--no-log", "--pid", str(rank.pid), "--symptom", NCCL,
                        "--playbook", "multinode"], timeout=600)
        doc = json.loads(proc.stdout)
    finally:
        rank.communicate("")
    (sym,) = doc["symptoms"]
    assert sym["kind"] == "memlock" and sym["explained_by"] == ["nccl.memlock"]
    (f,) = [f for f in doc["findings"] if f["id"] == "nccl.memlock"]
    assert f["status"] == "fail" and f"64 KiB on running pid {rank.pid}" in f["title"]
    assert [p["diagnosis"] for p in doc["playbooks"] if p["id"] == "multinode"] == ["diag-memlock"]
