"""Who killed the training: a real memory-cgroup OOM kill (a cgroup made here, a process that outgrows its
limit, the kernel's own log lines read back), the same lines as recorded, and the kernel's global OOM
record. A memcg kill is the job's limit, never "host memory ran out" while the host has memory free."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from test_gpu_facts import h200
from test_hostram import OFFLOAD, by_id

from zdoctor.layers.kernel_log import kernlog
from zdoctor.layers.offload import hostram
from zdoctor.layers.offload.check_hostram import check_hostram

KMSG = "/dev/kmsg"

MEMINFO = str(OFFLOAD / "h200-meminfo.txt")  # 125 GiB available
LAUNCHER = ("[2026-11-30 10:00:00,001] [ERROR] [launch.py:325:sigkill_handler] ['python', 'train.py'] exits with "
            "return code = -9\n")
#: The kernel's global OOM record (mm/oom_kill.c dump_oom_summary / __oom_kill_process, kernel 6.x format).
GLOBAL_OOM = (
    "[ 9321.004211] python invoked oom-killer: gfp_mask=0x140dca(GFP_HIGHUSER_MOVABLE|__GFP_COMP|__GFP_ZERO), "
    "order=0, oom_score_adj=0\n"
    "[ 9321.004633] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0-1,global_oom,"
    "task_memcg=/user.slice/user-1000.slice/session-3.scope,task=python,pid=48211,uid=1000\n"
    "[ 9321.004706] Out of memory: Killed process 48211 (python) total-vm:1421937728kB, anon-rss:128300380kB, "
    "file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:254216kB oom_score_adj:0\n")


def _collect(tmp_path: Path, log_text: str, **kw):
    log = tmp_path / "train.log"
    log.write_text(log_text)
    return hostram.collect({}, {}, {"train_log": str(log)}, meminfo=MEMINFO, kernel_release="6.8.0", **kw)


def _memcg_dir() -> tuple[Path, str] | None:
    """A memory cgroup this test may create: (the cgroup mount holding it, 'v1' or 'v2')."""
    v1 = Path("/sys/fs/cgroup/memory")
    if (v1 / "memory.limit_in_bytes").exists() and os.access(v1, os.W_OK):
        return v1, "v1"
    v2 = Path("/sys/fs/cgroup")
    if "memory" in (v2 / "cgroup.subtree_control").read_text() if (v2 / "cgroup.subtree_control").exists() else "":
        return v2, "v2"
    return None


def _last_seq() -> int:
    """The sequence number of the kernel log's newest record (read, nothing written)."""
    got = kernlog.read_kmsg(KMSG)
    assert got.error is None, got.error
    return max((r["seq"] for r in got.records), default=-1)


def _kernel_records_since(seq: int) -> list[dict]:
    """The kernel log's records after ``seq``."""
    got = kernlog.read_kmsg(KMSG)
    assert got.error is None, got.error
    return [r for r in got.records if r["seq"] > seq]


@pytest.fixture
def real_memcg_kill(tmp_path):
    where = _memcg_dir()
    if where is None or os.geteuid() != 0 or not os.access(KMSG, os.R_OK):
        pytest.skip("needs root, a writable memory cgroup and a readable /dev/kmsg")
    mount, version = where
    name = f"zdoctor-h2-oom-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    cg = mount / name
    cg.mkdir()
    try:
        (cg / ("memory.limit_in_bytes" if version == "v1" else "memory.max")).write_text(str(64 * 1024 * 1024))
        if version == "v2":
            (cg / "memory.swap.max").write_text("0")
        start = _last_seq()
        script = f"import os; open({str(cg / 'cgroup.procs')!r}, 'w').write(str(os.getpid())); " \
                 "x = bytearray(400 * 1024 * 1024); print('survived')"
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert proc.returncode == -9, (proc.returncode, proc.stdout, proc.stderr)
        records = _kernel_records_since(start)
        kernel = "".join(r["text"] + "\n" for r in records)
        assert "oom-kill:constraint=CONSTRAINT_MEMCG" in kernel, kernel[-2000:]
        # the kernel's own report: its facility, the OOM killer's words first, so kernel evidence
        [kill] = [k for k in kernlog.classify(records)["ooms"] if k.get("task_memcg", "").startswith(f"/{name}")]
        assert kill["facility"] == 0 and kill["constraint"] == "CONSTRAINT_MEMCG"
        yield kernel, f"/{name}", cg
    finally:
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                import time

                time.sleep(0.1)


def test_a_real_memcg_kill_is_the_jobs_limit_not_the_hosts_memory(tmp_path, real_memcg_kill):
    kernel, path, cg = real_memcg_kill
    f, _ = _collect(tmp_path, kernel + LAUNCHER)
    assert f["oom_kills"][0]["kind"] == "memcg" and f["oom_kills"][0]["memcg"] == path
    assert f["oom_kills"][0]["limit_kb"] == 65536
    assert f["oom_kills"][0]["cgroup_now"]["bytes"] == 64 * 1024 * 1024
    found = by_id(check_hostram(h200(hostram=f)))["offload.host-ram"]
    assert found.status == "fail"
    assert "host memory ran out" not in found.title
    assert found.title.startswith("The job's memory cgroup limit (64 MiB) was hit")
    assert "the host had memory left (125.40 GiB available)" in found.title
    assert "constraint=CONSTRAINT_MEMCG" in found.detail and path in found.detail
    assert "--mem" in found.remedies[0].commands[0]


def test_recorded_memcg_kill_and_a_global_oom_are_told_apart(tmp_path):
    recorded = (OFFLOAD / "memcg-oom-kmsg.txt").read_text()
    f, _ = _collect(tmp_path, recorded + LAUNCHER, cgroup_sysroot=str(tmp_path / "no-cgroups"))
    k = f["oom_kills"][0]
    assert (k["kind"], k["memcg"], k["task"], k["pid"], k["limit_kb"]) == \
        ("memcg", "/zdoctor-h2-probe", "python3", 30375, 65536)
    assert k["cgroup_now"] is None  # that cgroup is gone: only what the log says
    memcg = by_id(check_hostram(h200(hostram=f)))["offload.host-ram"]
    assert "memory cgroup limit" in memcg.title and "host memory ran out" not in memcg.title
    f, _ = _collect(tmp_path, GLOBAL_OOM + LAUNCHER)
    assert [(k["kind"], k["constraint"]) for k in f["oom_kills"]] == [("global", "CONSTRAINT_NONE")]
    # the training log's lines alone: what it says, not a fact of this node
    unconfirmed = by_id(check_hostram(h200(hostram=f)))["offload.host-ram"]
    assert unconfirmed.status == "warn" and "not confirmed on this node" in unconfirmed.title
    assert "host memory ran out" not in unconfirmed.title and not unconfirmed.explains
    # the same kill in this node's kernel log (the kernel's facility, read from a private kmsg-format file)
    from zdoctor.layers.kernel_log.probe_kernlog import collect

    dump = tmp_path / "kmsg"
    dump.write_text("".join(f"3,{n},{9321004211 + n};{line.split('] ', 1)[1]}\n"
                            for n, line in enumerate(GLOBAL_OOM.splitlines())))
    kernel_log, _ev = collect(kmsg=str(dump), use_journal=False)
    glob = by_id(check_hostram(h200(hostram=f, kernel_log=kernel_log)))["offload.host-ram"]
    assert glob.status == "fail" and "host memory ran out" in glob.title and "CONSTRAINT_NONE" in glob.title


def test_a_bare_sigkill_does_not_claim_to_know_who_killed(tmp_path):
    f, _ = _collect(tmp_path, LAUNCHER)
    assert f["oom_kills"] == []
    found = by_id(check_hostram(h200(hostram=f)))["offload.host-ram"]
    assert found.status == "fail" and "the log does not say who killed it" in found.title
    assert "CONSTRAINT_MEMCG" in found.detail


def test_the_memcg_kill_explains_the_kernels_oom_line_and_the_kill(tmp_path):
    from test_gpu_facts import facts_of, h200_all

    from zdoctor.core.registry import Facts
    from zdoctor.symptoms.extract import from_text

    text = (OFFLOAD / "memcg-oom-kmsg.txt").read_text() + "Killed\n"
    f, _ = _collect(tmp_path, text, cgroup_sysroot=str(tmp_path / "none"))
    syms = {"symptoms": [s.to_dict() for s in from_text(text, "log", "--log")]}
    kinds = {s["id"]: (s["kind"], s["fields"].get("constraint")) for s in syms["symptoms"]}
    assert ("oom-kill", "CONSTRAINT_MEMCG") in kinds.values() and ("killed", None) in kinds.values()
    base = {n: h200().get(n) for n in h200_all()}
    base.update(hostram=facts_of(hostram=f).get("hostram"), symptoms=facts_of(symptoms=syms).get("symptoms"))
    found = by_id(check_hostram(Facts(base)))["offload.host-ram"]
    assert set(found.explains) == set(kinds), (found.explains, kinds)
