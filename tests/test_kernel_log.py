"""The kernel log layer: a node's records (Xid 79 and 48, an NVRM API mismatch, an AER error at the H200
capture's bus address, a CONSTRAINT_MEMCG OOM kill) read through the probe and the checks, the records that
only look like the kernel's (written from user space, or the driver's words echoed mid-message) shown and
never judged, the unreadable or empty log as "not examined" with why, and the parsers on real-format lines.

The records are a private file in /dev/kmsg's format (tests/kmsgkit.py), read by ``collect(kmsg=...)`` or,
for a real ``zdoctor check``, bind-mounted over /dev/kmsg in a private mount namespace: nothing is written
into this machine's kernel log unless it opted in (ZDOCTOR_TEST_WRITE_KMSG=1, as CI does), and the tests
pass whatever the machine's own log holds."""

from __future__ import annotations

import copy
import functools
import json
import os
import pwd
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from kmsgkit import KERN, USER, WRITE_KMSG_ENV, add_records, kmsg_file, may_write_kmsg, run_cli_on
from test_gpu_facts import facts_of, h200_all, h200_nvml
from userkit import SYSTEM_PYTHON

from zdoctor.layers.gpu.check_gpu import check_driver
from zdoctor.layers.kernel_log import kernlog
from zdoctor.layers.kernel_log import probe_kernlog as kernlog_probe
from zdoctor.layers.kernel_log.check_kernlog import check_aer, check_api_mismatch, check_oom, check_xid
from zdoctor.layers.kernel_log.probe_kernlog import LOOK_ALIKES, SINCE_ENV, collect, kernel_log_probe, since_setting
from zdoctor.layers.offload.check_hostram import check_hostram
from zdoctor.symptoms.catalogue import SIGNATURES
from zdoctor.symptoms.extract import from_text

pytestmark = pytest.mark.needs_root
KMSG = "/dev/kmsg"
#: A PCI domain and bus no other test names (this process's own).
TAG = os.getpid() % 200 + 20
OWN_BUS = f"00{TAG:02x}:e1:00"
OWN_BUS2 = f"00{TAG:02x}:e2:00"
FORGED_BUS = f"00{TAG:02x}:e3:00"  # the look-alikes' bus: never a kernel record
H200_BUS = "0000:00:06.0"  # the H200 capture's NVML bus id 00000000:00:06.0, as the kernel writes it
KILLED_PID = 4_000_000 + os.getpid() % 100_000  # above any pid_max: no real process has it
CLIENT, MODULE = "580.159.04", "575.57.08"
FELL_OFF = "GPU has fallen off the bus."
#: The kernel's records of a node whose GPUs failed (facility 0, as the kernel logs them).
NODE_RECORDS = (
    "Linux version 6.8.0-49-generic (buildd@lcy02-amd64-103) #49-Ubuntu SMP PREEMPT_DYNAMIC",
    f"NVRM: Xid (PCI:{OWN_BUS}): 79, pid='<unknown>', name=<unknown>, {FELL_OFF}",
    f"NVRM: Xid (PCI:{OWN_BUS2}): 48, pid={KILLED_PID}, name=python3, An uncorrectable double bit error "
    "(DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 1.",
    f"NVRM: API mismatch: the client has the version {CLIENT}, but",
    f"NVRM: this kernel module has the version {MODULE}.  Please",
    "NVRM: make sure that this kernel module and all NVIDIA driver",
    "NVRM: components have the same version.",
    f"pcieport 0000:00:01.0: AER: Uncorrected (Non-Fatal) error received: {H200_BUS}",
    f"nvidia {H200_BUS}: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, "
    "(Requester ID)",
    "memory: usage 65536kB, limit 65536kB, failcnt 42",
    f"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
    f"oom_memcg=/zdoctor-h1-oom-{TAG},task_memcg=/zdoctor-h1-oom-{TAG}/job,task=python3,pid={KILLED_PID},uid=0",
    f"Memory cgroup out of memory: Killed process {KILLED_PID} (python3) total-vm:426168kB, "
    "anon-rss:72192kB, file-rss:6640kB, shmem-rss:0kB, UID:0 pgtables:208kB oom_score_adj:0")
#: What `echo ... > /dev/kmsg` from user space gives (the kernel forces LOG_USER), and a kernel message
#: (facility 0) that echoes a name someone chose, the driver's words mid-message.
FORGED_XID = f"NVRM: Xid (PCI:{FORGED_BUS}): 79, pid='<unknown>', name=<unknown>, {FELL_OFF}"
ECHOED_XID = f"EXT4-fs (loop0): unable to read superblock of {FORGED_XID}"
FORGED_AER = f"pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: {FORGED_BUS}.0"
FORGED_OOM = f"Out of memory: Killed process {KILLED_PID + 1} (python3) total-vm:9000kB, anon-rss:8000kB"


def after(records: list[dict[str, Any]], seq: int) -> list[dict[str, Any]]:
    return [r for r in records if (r.get("seq") or -1) > seq]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, Any]:
    """A node's kernel log in a private kmsg-format file (the kernel's records, then the look-alikes), read
    once through the probe."""
    began = time.time()
    dump = kmsg_file(tmp_path_factory.mktemp("kmsg") / "kmsg", *NODE_RECORDS)
    add_records(dump, FORGED_XID, FORGED_AER, FORGED_OOM, facility=USER)
    add_records(dump, ECHOED_XID, facility=KERN)
    facts, evidence = collect(kmsg=str(dump), use_journal=False)
    return {"start": 0, "began": began, "facts": facts, "evidence": evidence, "dump": dump}


def mine(facts: dict[str, Any], start: int) -> dict[str, Any]:
    """The probe's facts with only the records this module wrote."""
    out = copy.deepcopy(facts)
    for key in ("xids", "api_mismatch", "aer", "ooms"):
        out[key] = after(out[key], start)
    return out


def node(kernel_log: dict[str, Any], **more: dict[str, Any]):
    probes = h200_all()
    probes["kernel_log"] = kernel_log
    probes.update(more)
    return facts_of(**probes)


# -- real records through the probe ----------------------------------------------------------------------


def test_the_probe_reads_the_kernels_records_and_keeps_the_look_alikes_apart(written):
    f, start = written["facts"], written["start"]
    assert f["source"] == "kmsg" and f["path"] == str(written["dump"]) and not f.get("skipped")
    assert f["records_read"] == len(NODE_RECORDS) + 4 and f["kernel_records_read"] == len(NODE_RECORDS) + 1
    xids = {(r["bus_address"], r["xid"]): r for r in after(f["xids"], start)}
    assert set(xids) == {(OWN_BUS, 79), (OWN_BUS2, 48)}  # the look-alikes' bus is no kernel record
    assert xids[(OWN_BUS2, 48)]["pid"] == KILLED_PID and xids[(OWN_BUS2, 48)]["name"] == "python3"
    assert xids[(OWN_BUS, 79)]["facility"] == 0 and xids[(OWN_BUS, 79)]["level"] == 3
    # the look-alikes: kept for display, each with why it is no evidence, in no list a check judges
    forged = {(r["kind"], r["text"]): r for r in f["user_space"]}
    assert set(forged) == {("Xid", FORGED_XID), ("AER", FORGED_AER), ("OOM", FORGED_OOM), ("Xid", ECHOED_XID)}
    assert forged[("Xid", FORGED_XID)]["why"] == ("written from user space (facility user), not the kernel's: "
                                                  "not evidence") and forged[("Xid", FORGED_XID)]["facility"] == 1
    assert forged[("Xid", ECHOED_XID)]["facility"] == 0 and "not at the start" in forged[("Xid", ECHOED_XID)]["why"]
    assert all(k["pid"] != KILLED_PID + 1 for k in f["ooms"])
    assert FORGED_BUS not in json.dumps({k: f[k] for k in ("xids", "aer", "ooms", "api_mismatch", "devices_now")})
    [shown] = [e for e in written["evidence"] if e.label == LOOK_ALIKES]
    assert [row[1:3] for row in shown.table.rows] == [["Xid", "user"], ["AER", "user"], ["OOM", "user"],
                                                      ["Xid", "kern"]]
    # microseconds since boot turned into wall time, inside the window read
    w = f["window"]
    assert w["since"] <= xids[(OWN_BUS, 79)]["time"] <= w["until"] and abs(w["until"] - time.time()) < 120
    [mm] = after(f["api_mismatch"], start)
    assert (mm["client"], mm["module"]) == (CLIENT, MODULE)  # the module's version is on the next record
    aer = after(f["aer"], start)
    assert {(a["bus_address"], a["severity"]) for a in aer} == {("0000:00:06", "nonfatal")}
    [oom] = [k for k in after(f["ooms"], start) if k["pid"] == KILLED_PID]
    assert (oom["constraint"], oom["kind"], oom["task"]) == ("CONSTRAINT_MEMCG", "memcg", "python3")
    assert oom["task_memcg"] == f"/zdoctor-h1-oom-{TAG}/job" and oom["limit_kb"] == 65536
    assert json.loads(json.dumps(f)) == f


def test_xid_79_and_48_name_their_meaning_and_the_bus_this_node_lacks(written):
    kl = mine(written["facts"], written["start"])
    [f] = check_xid(node(kl))
    # the records name buses this machine does not have: read from the real bus, they are no failing GPU here
    assert f.status == "warn" and "Xid 48, 79" in f.title and "the node now does not support it" in f.title
    assert f"Xid 79 at PCI:{OWN_BUS} (no GPU NVML lists)" in f.detail and "fallen off the bus" in f.detail
    assert "Double-bit ECC error" in f.detail and f"no PCI device at {OWN_BUS}.0 now" in f.detail
    [table] = [e for e in f.evidence if e.label == "Xid records by GPU"]
    assert {row[0] for row in table.table.rows} == {"79", "48"}
    assert any(f"pid {KILLED_PID} (python3)" in row for row in table.table.rows)
    [reboot] = [r for r in f.remedies if r.title.startswith("Drain the node and reboot")]
    assert not reboot.recommended and not any("RMA" in r.title for r in f.remedies)


def test_an_xid_at_the_h200s_bus_is_tied_to_that_gpu_and_explains_the_pasted_line(written):
    kl = mine(written["facts"], written["start"])
    # the same record, as the H200's driver would have logged it for its GPU
    kl["xids"] = [dict(kl["xids"][0], bus="PCI:0000:00:06", bus_address=kernlog.bus_address("PCI:0000:00:06"))]
    pasted = from_text("NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
                       "the bus.", "symptom")
    other = from_text("NVRM: Xid (PCI:0000:00:07): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
                      "the bus.", "symptom", start=2)
    symptoms = {"symptoms": [s.to_dict() for s in pasted + other], "unreadable": []}
    [f] = check_xid(node(kl, symptoms=symptoms))
    assert "GPU 0 (NVIDIA H200, GPU-b6c81e45-f0f9-676b-dc11-842f9c19a18e)" in f.detail
    assert f.explains == [pasted[0].id]  # the line of another bus is not explained by it
    assert f.remedies[0].commands == ["nvidia-smi -r -i 0"]


def test_the_api_mismatch_record_sets_both_versions_side_by_side(written):
    kl = mine(written["facts"], written["start"])
    nv = {"skipped": "no usable NVIDIA driver: Driver/library version mismatch",
          "library": {"available": False, "error_kind": "driver_mismatch",
                      "error": "Driver/library version mismatch"},
          "kernel_module": {"modules": {"nvidia": []}, "unload_order": ["nvidia"], "kernel_version": MODULE,
                            "library": f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{CLIENT}",
                            "library_version": CLIENT}}
    pasted = from_text(f"NVRM: API mismatch: the client has the version {CLIENT}, but this kernel module has the "
                       f"version {MODULE}.  Please make sure", "symptom")
    other = from_text("NVRM: API mismatch: the client has the version 1.2.3, but this kernel module has the version "
                      "4.5.6.", "symptom", start=2)
    seen = {"symptoms": [x.to_dict() for x in pasted + other], "unreadable": []}
    [f] = check_api_mismatch(node(kl, nvml=nv, symptoms=seen))
    assert f.status == "fail" and CLIENT in f.title and MODULE in f.title
    assert f.explains == [pasted[0].id]  # the same two versions, not another pair
    [table] = [e for e in f.evidence if e.label.startswith("NVRM API mismatch")]
    versions = [row[2] for row in table.table.rows]
    assert versions[:4] == [CLIENT, MODULE, MODULE, CLIENT]
    assert any(c.startswith("modprobe -r nvidia") for r in f.remedies for c in r.commands)
    # gpu.driver's own mismatch finding names the kernel log's record instead of repeating the search
    [d] = check_driver(node(kl, nvml=nv))
    assert d.status == "fail" and f"user space {CLIENT}, kernel module {MODULE}" in d.detail
    # on the H200 as captured, NVML starts: the record is past, a warning
    [past] = check_api_mismatch(node(kl))
    assert past.status == "warn" and "NVML starts now with driver 580.159.04" in past.title


def test_an_aer_error_at_the_h200s_bus_names_the_gpu(written):
    kl = mine(written["facts"], written["start"])
    pasted = from_text(f"nvidia {H200_BUS}: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction "
                       "Layer, (Requester ID)", "symptom")
    assert [s.kind for s in pasted] == ["aer"]
    seen = {"symptoms": [s.to_dict() for s in pasted], "unreadable": []}
    # this machine's own bus has no device at the H200's address: read against it, the records are not supported
    [here] = check_aer(node(kl, symptoms=seen))
    assert here.status == "warn" and f"no PCI device at {H200_BUS[:-2]}.0 now" in here.detail
    assert here.remedies and not any(r.recommended for r in here.remedies[:-1])
    # on the H200 as captured (NVML lists its GPU there; its bus was not recorded)
    [f] = check_aer(node(dict(kl, devices_now=[]), symptoms=seen))
    assert f.status == "fail" and "GPU 0 (NVIDIA H200" in f.title
    assert "worst nonfatal (Transaction Layer)" in f.detail and f.explains == [pasted[0].id]
    assert f.remedies[0].commands == ["nvidia-smi -r -i 0"] and f.remedies[0].recommended


def test_the_memcg_oom_kill_is_tied_to_the_run_and_feeds_host_ram(written):
    kl = mine(written["facts"], written["start"])
    live = {"source": "command", "pids": [KILLED_PID], "exit_code": -9}
    pasted = from_text(f"Memory cgroup out of memory: Killed process {KILLED_PID} (python3) total-vm:426168kB", "log")
    seen = {"symptoms": [x.to_dict() for x in pasted], "unreadable": []}
    [f] = check_oom(node(kl, livetrace=live, symptoms=seen))
    assert f.status == "fail" and f"pid {KILLED_PID}" in f.title and "CONSTRAINT_MEMCG" in f.title
    assert f.explains == [pasted[0].id]
    assert "a process of the --command run" in f.detail and f"/zdoctor-h1-oom-{TAG}/job" in f.detail
    time.sleep(0.01)  # a replay of the same facts later gives the same finding, evidence included
    assert check_oom(node(kl, livetrace=live, symptoms=seen))[0].to_dict() == f.to_dict()
    # the same kill, not tied to any process of the run: news of the node, not the job's failure
    [other] = check_oom(node(kl, livetrace={"source": "command", "pids": [1]}))
    assert other.status == "warn" and "None of them is a process of the --command run" in other.detail
    # offload.host-ram reads the kill from the kernel log (no --log given): the job's cgroup limit, 64 MiB
    hostram = {"config": None, "log": None, "extra": [], "oom_kills": [], "killed": [], "mem_total": 64 << 30,
               "mem_available": 60 << 30, "extra_per_node": 0, "extra_known_per_node": 0}
    [h] = check_hostram(node(kl, livetrace=live, hostram=hostram))
    assert h.status == "fail" and "memory cgroup limit (64 MiB)" in h.title
    assert "kernel log 20" in h.detail and "CONSTRAINT_MEMCG" in h.detail


def test_a_readable_log_with_nothing_in_the_window_is_ok_for_that_window_only(written):
    since = time.time() + 1
    facts, _ = collect(kmsg=str(written["dump"]), use_journal=False, since=since)
    assert facts["source"] == "kmsg" and facts["window"]["since"] == since
    kl = node(dict(facts, xids=[], aer=[], api_mismatch=[], ooms=[]))
    for check in (check_xid, check_aer, check_api_mismatch, check_oom):
        [f] = check(kl)
        assert f.status == "ok" and time.strftime("%Y-%m-%d %H:%M", time.gmtime(since)) in f.title, f.title
        assert "Records from before then" in f.detail and "are not seen" in f.detail


def test_the_window_asked_for_hides_the_records_before_it(written, monkeypatch):
    # the probe as zdoctor runs it, reading the module's private log
    monkeypatch.setattr(kernlog_probe, "collect", functools.partial(collect, kmsg=str(written["dump"]),
                                                                      use_journal=False))
    monkeypatch.setenv(SINCE_ENV, str(time.time() + 1))
    facts, _ = kernel_log_probe(None)
    assert facts["window"]["since_given"] and after(facts["xids"], written["start"]) == []
    [f] = check_xid(node(mine(facts, written["start"])))
    assert f.status == "ok" and "the window asked for (ZDOCTOR_KERNEL_LOG_SINCE)" in f.detail
    monkeypatch.setenv(SINCE_ENV, "after lunch")
    facts, evidence = kernel_log_probe(None)
    assert "is not a time" in facts["since_error"] and not facts["window"]["since_given"]
    assert {(x["bus_address"], x["xid"]) for x in after(facts["xids"], written["start"])} == {(OWN_BUS, 79),
                                                                                           (OWN_BUS2, 48)}
    assert since_setting("2026-12-01T10:00:00+00:00") == (1796119200.0, None)
    assert since_setting("1796119200") == (1796119200.0, None) and since_setting("") == (None, None)


def test_the_json_layers_show_the_kernel_log_examined(written):
    from zdoctor.walk.doctor import layers_examined

    kl = mine(written["facts"], written["start"])
    facts = node(kl)
    found = [x for c in (check_xid, check_aer, check_api_mismatch, check_oom) for x in c(facts)]
    [layer] = [x for x in layers_examined(found) if x["id"] == "kernel-log"]
    assert layer["status"] == "examined" and set(layer["checks"]) == {"kernel.xid", "kernel.aer",
                                                                       "kernel.api-mismatch", "kernel.oom"}
    skipped = [x for c in (check_xid, check_aer) for x in c(node({"skipped": "the kernel log could not be read: "
                                                                              "/dev/kmsg: Operation not permitted"}))]
    [layer] = [x for x in layers_examined(skipped) if x["id"] == "kernel-log"]
    assert layer["status"] == "not examined" and "Operation not permitted" in layer["why"]


def test_check_json_lists_the_kernel_log_layer_from_a_replayed_snapshot(written):
    from zdoctor.host.replay import ReplayHost
    from zdoctor.walk.doctor import check

    doc = json.loads((Path(__file__).parent / "fixtures" / "snapshots" / "healthy.json").read_text())
    kl = mine(written["facts"], written["start"])
    doc["probes"]["kernel_log"] = {"probe": "kernel_log", "status": "ok", "facts": kl, "error": None}
    report = check(ReplayHost(copy.deepcopy(doc)), walk=False).to_dict()
    [layer] = [x for x in report["layers"] if x["id"] == "kernel-log"]
    assert layer["status"] == "examined" and "kernel.xid" in layer["checks"]
    assert {f["id"]: f["status"] for f in report["findings"]}["kernel.xid"] == "warn"  # buses it lacks
    # a recording whose kernel log facts have the wrong types is not read: not examined, and says so
    doc["probes"]["kernel_log"]["facts"] = dict(kl, xids="79")
    report = check(ReplayHost(doc), walk=False).to_dict()
    [layer] = [x for x in report["layers"] if x["id"] == "kernel-log"]
    assert layer["status"] == "not examined" and "kernel_log" in layer["why"]


def test_check_json_reads_the_records_from_dev_kmsg(written):
    # the real probe reads /dev/kmsg: the module's log, bind-mounted there in a private mount namespace; a
    # window that starts just before its records (btime, in whole seconds, can put a record's time up to a
    # second early)
    env = dict(os.environ, **{SINCE_ENV: str(written["began"] - 3)})
    proc = run_cli_on(written["dump"], ["check", "--json", "--no-log", "--playbook", "gpu-health"], env=env)
    doc = json.loads(proc.stdout)
    [layer] = [x for x in doc["layers"] if x["id"] == "kernel-log"]
    assert layer["status"] == "examined" and "kernel.xid" in layer["checks"]
    found = {f["id"]: f for f in doc["findings"]}
    # the records name buses this machine lacks: checked against the node now, no drain or reboot is recommended
    xid_found = found["kernel.xid"]
    assert xid_found["status"] == "warn" and f"Xid 79 at PCI:{OWN_BUS}" in xid_found["detail"]
    assert f"no PCI device at {OWN_BUS}.0 now" in xid_found["detail"] and FORGED_BUS not in xid_found["detail"]
    assert xid_found["remedies"] and all(r["recommended"] is False for r in xid_found["remedies"])
    assert CLIENT in found["kernel.api-mismatch"]["title"] and found["kernel.aer"]["status"] == "warn"
    assert "the node now does not support them" in found["kernel.aer"]["title"]
    [walk] = doc["playbooks"]
    # nothing confirmed failing on this node: incomplete (3), not failing (1)
    assert walk["path"][:2] == ["xid", "diag-xid-not-now"] and proc.returncode == 3


def _check_on(dump: Path) -> dict[str, Any]:
    """``zdoctor check --json`` of the gpu-health walk with ``dump`` as /dev/kmsg (its whole window)."""
    env = dict(os.environ, **{SINCE_ENV: ""})
    proc = run_cli_on(dump, ["check", "--json", "--no-log", "--playbook", "gpu-health"], env=env)
    assert proc.stdout.startswith("{"), proc.stderr[-2000:]
    return json.loads(proc.stdout)


# A node's H200 at its bus, in NVML's words: the record a forger would write to take it out of service.
H200_XID = f"NVRM: Xid (PCI:{H200_BUS[:-2]}): 79, pid='<unknown>', name=<unknown>, {FELL_OFF}"


def test_an_xid_written_from_user_space_is_shown_never_judged(tmp_path):
    # the same Xid 79 text, once as the kernel logs it (facility 0) and once as user space's write gives it
    # (facility 1, prio 11): only the first is the kernel's
    kernels = kmsg_file(tmp_path / "kernels", NODE_RECORDS[0], H200_XID)
    forged = kmsg_file(tmp_path / "forged", NODE_RECORDS[0])
    add_records(forged, H200_XID, facility=USER)
    assert forged.read_text().splitlines()[1].startswith("11,2,")
    judged = {f["id"]: f for f in _check_on(kernels)["findings"]}["kernel.xid"]
    assert judged["status"] != "ok" and "Xid 79" in judged["title"]
    doc = _check_on(forged)
    found = {f["id"]: f for f in doc["findings"]}
    xid_found = found["kernel.xid"]
    assert xid_found["status"] == "ok" and xid_found["title"].startswith("No NVIDIA Xid record in the kernel log")
    assert not xid_found["remedies"] and not any("reboot" in r["title"].lower() for f in doc["findings"]
                                                 for r in f["remedies"])
    [shown] = [e for e in xid_found["evidence"] if e["label"] == LOOK_ALIKES]
    assert shown["table"]["rows"][0][1:4] == ["Xid", "user", H200_XID]
    assert "written from user space (facility user)" in shown["table"]["rows"][0][4]
    assert [x for x in doc["layers"] if x["id"] == "kernel-log"][0]["status"] == "examined"


def test_the_drivers_words_mid_message_are_not_the_drivers(tmp_path):
    # a kernel message (facility 0) that echoes a name someone chose: a mount's error naming its device
    echoed = kmsg_file(tmp_path / "kmsg", NODE_RECORDS[0], f"EXT4-fs (loop0): unable to read superblock of "
                       f"{H200_XID}", f"ISO 9660 Extensions: {FORGED_AER}")
    f, evidence = collect(kmsg=str(echoed), use_journal=False)
    assert f["xids"] == [] and f["aer"] == [] and f["kernel_records_read"] == 3
    assert [(r["kind"], r["facility"]) for r in f["user_space"]] == [("Xid", 0), ("AER", 0)]
    [x] = check_xid(facts_of(kernel_log=f))
    assert x.status == "ok" and any(e.label == LOOK_ALIKES for e in evidence)
    assert "2 records that read like the kernel's but are not its own" in x.detail and LOOK_ALIKES in x.detail
    [a] = check_aer(facts_of(kernel_log=f))
    assert a.status == "ok"


def test_a_log_with_no_record_of_the_kernels_is_not_examined(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("")
    only_user = kmsg_file(tmp_path / "user", H200_XID, FORGED_OOM, facility=USER)
    for dump, read in ((empty, "0 records"), (only_user, "2 records")):
        f, _ = collect(kmsg=str(dump), use_journal=False)
        assert f["skipped"].startswith("the kernel log was not examined: ") and read in f["skipped"]
        for check in (check_xid, check_aer, check_api_mismatch, check_oom):
            [x] = check(facts_of(kernel_log=f))
            assert x.status == "skip" and "none of them from the kernel's facility" in x.detail
    doc = _check_on(only_user)
    [layer] = [x for x in doc["layers"] if x["id"] == "kernel-log"]
    assert layer["status"] == "not examined" and "none of them from the kernel's facility" in layer["why"]
    found = {f["id"]: f for f in doc["findings"]}
    assert found["kernel.xid.not-checked"]["status"] == "skip" and "kernel.xid" not in found


def test_a_record_written_to_the_real_kmsg_from_user_space_is_no_xid():
    # the kernel's own rule on this machine: what user space writes to /dev/kmsg gets LOG_USER, whatever
    # priority it asks for, and a mount's error echoes the option it was given after its own prefix; only
    # where the machine opted in (CI), since the records stay in its kernel log
    if not may_write_kmsg():
        pytest.skip(f"writes into this machine's kernel log: only with {WRITE_KMSG_ENV}=1 (the private-log "
                    "tests above show the same rule)")
    before = kernlog.read_kmsg(KMSG)
    assert before.error is None, before.error
    last = max((r["seq"] for r in before.records), default=-1)
    text = f"NVRM: Xid (PCI:{FORGED_BUS}): 79, pid='<unknown>', name=<unknown>, {FELL_OFF}"
    fd = os.open(KMSG, os.O_WRONLY)
    try:
        os.write(fd, f"<0>{text}\n".encode())  # asks for LOG_KERN, level emerg
    finally:
        os.close(fd)
    # and a mount's error, which the kernel itself logs (facility 0), echoing the option it was given
    mount = subprocess.run(["unshare", "--mount", "--", "mount", "-t", "tmpfs", "-o", text.split(",")[0], "none",
                            "/mnt"], capture_output=True, text=True, timeout=30)
    assert mount.returncode != 0, mount.stderr
    f, _ = collect(use_journal=False)
    [mine_] = [r for r in after(f["user_space"], last) if r["text"] == text]
    assert mine_["facility"] == USER and "written from user space" in mine_["why"]
    [echo] = [r for r in after(f["user_space"], last) if r["text"].startswith("tmpfs: Unknown parameter 'NVRM: Xid")]
    assert echo["facility"] == KERN and echo["why"] == kernlog.NOT_AT_START
    assert not [x for x in f["xids"] if x["bus_address"] == FORGED_BUS]
    [x] = check_xid(facts_of(kernel_log=f))
    assert FORGED_BUS not in x.title + x.detail


# -- the unreadable log ----------------------------------------------------------------------------------


def _as_user(name: str, code: str) -> dict[str, Any]:
    pw = pwd.getpwnam(name)
    proc = subprocess.run([SYSTEM_PYTHON, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin"},
                          user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def account():
    name = f"zdh1kl{os.getpid() % 100000}"
    subprocess.run(["userdel", name], capture_output=True)
    subprocess.run(["groupdel", name], capture_output=True)
    subprocess.run(["useradd", "-M", "-U", "-d", "/nonexistent", "-s", "/bin/sh", name], check=True,
                   capture_output=True)
    yield name
    subprocess.run(["userdel", name], capture_output=True)
    subprocess.run(["groupdel", name], capture_output=True)


def test_a_log_the_user_cannot_read_is_not_examined_and_says_why(account, tmp_path):
    unreadable = tmp_path / "kmsg"
    unreadable.write_text("6,1,1,-;hello\n")
    unreadable.chmod(0o600)
    tmp_path.chmod(0o755)
    code = ("import json; from zdoctor.layers.kernel_log.probe_kernlog import collect; "
            f"f, _ = collect(kmsg={str(unreadable)!r}, journalctl='/nonexistent/journalctl'); print(json.dumps(f))")
    f = _as_user(account, code)
    assert f["skipped"].startswith("the kernel log could not be read: ") and "Permission denied" in f["skipped"]
    assert [a["source"] for a in f["attempts"]] == [str(unreadable), "journalctl -k"]
    assert "journalctl -k" in f["attempts"][1]["error"]
    [x] = check_xid(facts_of(kernel_log=f))
    assert x.status == "skip" and "Permission denied" in x.detail
    # the real /dev/kmsg as that user: refused under kernel.dmesg_restrict=1, read otherwise
    real = _as_user(account, "import json; from zdoctor.layers.kernel_log.probe_kernlog import collect; "
                             "f, _ = collect(); print(json.dumps(f))")
    with open("/proc/sys/kernel/dmesg_restrict") as fh:
        restricted = fh.read().strip() == "1"
    if restricted:
        assert "kernel.dmesg_restrict=1" in real["skipped"] and real["attempts"][0]["source"] == KMSG
    else:
        assert real["source"] == "kmsg" and not real.get("skipped")


# -- parsers on real-format lines ------------------------------------------------------------------------


def test_a_kmsg_record_with_its_device_properties():
    rec = kernlog.parse_kmsg_record("3,1234,5678901,-;nvidia 0000:3b:00.0: PCIe Bus Error: severity=Corrected, "
                                    "type=Physical Layer, (Receiver ID)\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0")
    assert rec is not None
    assert (rec["seq"], rec["usec"], rec["facility"], rec["level"]) == (1234, 5678901, 0, 3)
    assert rec["device"] == "+pci:0000:3b:00.0" and rec["subsystem"] == "pci"
    assert kernlog.parse_kmsg_record("not a record") is None
    assert kernlog.parse_kmsg_record("12,7,99,-;a\\x0aline")["text"] == "a\nline"


def test_bus_ids_written_three_ways_are_one_gpu():
    nvml_bus = h200_nvml()["gpus"][0]["pci_bus_id"]
    assert nvml_bus == "00000000:00:06.0"
    assert {kernlog.bus_address(b) for b in (nvml_bus, "0000:00:06.0", "PCI:0000:00:06")} == {"0000:00:06"}
    assert kernlog.bus_address("PCI:0000:3B:00") == "0000:3b:00" and kernlog.bus_address("nothing") is None


def _records(*texts: str) -> list[dict[str, Any]]:
    return [{"seq": i, "usec": i * 1000, "time": None, "facility": 0, "level": 3, "transport": "kernel", "text": t}
            for i, t in enumerate(texts)]


def test_classify_real_format_lines():
    got = kernlog.classify(_records(
        "NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
        "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to "
        "activate.",
        "NVRM: API mismatch: the client has the version 535.54.03, but\nNVRM: this kernel module has the version "
        "530.41.03.  Please",
        "pcieport 0000:00:01.0: AER: Correctable error message received from 0000:3b:00.0",
        "pcieport 0000:00:01.0: AER: Multiple Uncorrected (Fatal) error received: 0000:3b:00.0",
        "Out of memory: Killed process 777 (python) total-vm:9000kB, anon-rss:8000kB",
    ))
    assert [(x["xid"], x["pid"], x["name"], x["bus_address"]) for x in got["xids"]] == [
        (45, 1818990, "python3", "0000:dc:00"), (63, 1896, None, "0000:10:1c")]
    assert [(m["client"], m["module"]) for m in got["api_mismatch"]] == [("535.54.03", "530.41.03")]
    assert [(a["severity"], a["port"], a["bus_address"]) for a in got["aer"]] == [
        ("corrected", "0000:00:01.0", "0000:3b:00"), ("fatal", "0000:00:01.0", "0000:3b:00")]
    assert [(k["pid"], k["kind"]) for k in got["ooms"]] == [(777, "global")]


def test_journal_json_lines_are_records_too():
    lines = [json.dumps({"MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 79, pid=123, name=python, GPU has fallen off "
                                    "the bus.", "__REALTIME_TIMESTAMP": "1796161157000000", "PRIORITY": "3",
                         "SYSLOG_FACILITY": "0", "_SOURCE_MONOTONIC_TIMESTAMP": "42"}),
             json.dumps({"MESSAGE": list(b"NVRM: API mismatch: the client has the version 1.2, but \xff"),
                         "__REALTIME_TIMESTAMP": "1796161158000000"}),
             "not json"]
    got = kernlog.parse_journal(lines)
    assert got.read == 2 and got.records[0]["time"] == 1796161157.0 and got.records[0]["usec"] == 42
    assert got.records[1]["text"].startswith("NVRM: API mismatch")


def test_journald_records_count_only_from_the_kernels_transport_and_facility():
    xid = f"NVRM: Xid (PCI:{OWN_BUS}): 79, pid='<unknown>', name=<unknown>, {FELL_OFF}"

    def line(**fields: str) -> str:
        return json.dumps({"MESSAGE": xid, "PRIORITY": "3", "__REALTIME_TIMESTAMP": "1796161157000000", **fields})

    got = kernlog.parse_journal([
        line(_TRANSPORT="kernel", SYSLOG_FACILITY="0"),
        line(_TRANSPORT="kernel", SYSLOG_FACILITY="1"),  # echo > /dev/kmsg: journald reads it from the kernel too
        line(_TRANSPORT="syslog", SYSLOG_FACILITY="0"),  # logger(1) claiming the kernel's facility
        line(SYSLOG_FACILITY="0"),  # no transport: its source is not known
    ])
    assert got.read == 4 and got.kernel == 1
    found = kernlog.classify(got.records)
    assert [x["facility"] for x in found["xids"]] == [0]
    assert [r["why"].split(",")[0] for r in found["user_space"]] == [
        "written from user space (facility user)", "sent by syslog", "sent by an unknown transport"]


def test_the_aer_messages_are_in_the_catalogue_with_their_source():
    by_id = {s.id: s for s in SIGNATURES}
    for sid in ("kernel.aer-bus-error", "kernel.aer-received"):
        assert by_id[sid].kind == "aer" and "drivers/pci/pcie/aer.c" in by_id[sid].sources[0]
        assert by_id[sid].confirm == ("kernel.aer",)
    assert "kernel.xid" in by_id["kernel.xid"].confirm
    # older drivers wrote the bus without "PCI:"; the record is the same GPU's
    [old] = from_text("NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff", "symptom")
    assert old.kind == "xid" and (old.fields["xid"], kernlog.bus_address(old.fields["bus"])) == ("3", "0000:01:00")


# -- the gpu-health playbook, and NVML's handle errors through the stand-in ------------------------------


def _walk(probes: dict[str, dict[str, Any]]) -> Any:
    from zdoctor.core.registry import load_vocabulary
    from zdoctor.host.replay import ReplayHost
    from zdoctor.walk.engine import Walk
    from zdoctor.walk.playbook import load_all

    load_vocabulary()
    doc = {"format": "zdoctor-snapshot", "version": 1, "probes": {
        n: {"probe": n, "status": "skip" if f.get("skipped") else "ok", "facts": f, "error": f.get("skipped")}
        for n, f in probes.items()}}
    return Walk(load_all()["gpu-health"], ReplayHost(json.loads(json.dumps(doc)))).run()


def _empty_log(written: dict[str, Any]) -> dict[str, Any]:
    """A log read whole that holds the kernel's records but none of the GPUs'."""
    quiet = kmsg_file(written["dump"].with_name("quiet"), NODE_RECORDS[0])
    facts, _ = collect(kmsg=str(quiet), use_journal=False)
    assert not facts.get("skipped") and facts["kernel_records_read"] == 1
    return dict(facts, xids=[], aer=[], api_mismatch=[], ooms=[])


def test_the_gpu_health_walk_ends_where_the_records_point(written):
    probes = h200_all()
    probes["kernel_log"] = _empty_log(written)
    res = _walk(probes)
    assert res.path == ["xid", "aer", "handles", "diag-healthy"], res.path
    kl = mine(written["facts"], written["start"])
    assert _walk({**probes, "kernel_log": kl}).diagnosis == "diag-xid-not-now"  # buses this node lacks
    # the same record at the H200's bus, with the H200's NVML listing its GPU there (this machine's own bus,
    # which has no such device, is left out: it is not the H200's)
    at_h200 = dict(kl, xids=[dict(kl["xids"][0], bus="PCI:0000:00:06", bus_address="0000:00:06")], devices_now=[])
    assert _walk({**probes, "kernel_log": at_h200}).diagnosis == "diag-xid-hardware"  # NVML lists it there
    only_aer = dict(kl, xids=[], api_mismatch=[])
    assert _walk({**probes, "kernel_log": only_aer}).path[-2:] == ["aer", "diag-aer"]
    unreadable = {"skipped": "the kernel log could not be read: /dev/kmsg: Operation not permitted", "attempts": []}
    res = _walk({**probes, "kernel_log": unreadable})
    assert res.diagnosis == "diag-not-checked" and "Operation not permitted" in res.outcomes[-2].reason
    # a GPU whose memory lost data: ECC from the H200's own record, one uncorrectable error more
    sick = copy.deepcopy(probes)
    sick["kernel_log"] = _empty_log(written)
    sick["nvml"]["gpus"][0]["ecc"]["volatile_uncorrected"] = 1
    assert _walk(sick).path[-2:] == ["handles", "diag-ecc"]
    # a pasted Xid line the window does not hold: never healthy while it stands unexplained
    pasted = from_text(f"NVRM: Xid (PCI:{OWN_BUS}): 95, pid=1, name=python3, Uncontained: FBHUB.", "symptom")
    seen = {**probes, "kernel_log": _empty_log(written),
            "symptoms": {"symptoms": [x.to_dict() for x in pasted], "unreadable": []}}
    assert _walk(seen).diagnosis == "diag-unexplained"


def test_a_lost_gpu_through_nvmls_real_error_code_names_its_xid_79_record(monkeypatch, tmp_path, written):
    import pynvml
    from test_gpu_nvml import _raise, fake_h200, no_smi

    from zdoctor.layers.gpu.check_gpu import check_health
    from zdoctor.layers.gpu.probe_gpu import collect_nvml

    fake_h200(monkeypatch, overrides={"nvmlDeviceGetHandleByIndex": _raise(pynvml.NVML_ERROR_GPU_IS_LOST)})
    nv, _ = collect_nvml(no_smi(tmp_path), nv=pynvml)
    assert nv["gpus"][0]["errors"]["handle"] == "GPU is lost"
    kl = mine(written["facts"], written["start"])
    kl["xids"] = [x for x in kl["xids"] if x["xid"] == 79]
    [d] = check_driver(facts_of(nvml=nv, kernel_log=kl))
    assert d.status == "fail" and "The kernel log has the driver's record (1 record" in d.detail
    assert f"NVRM: Xid (PCI:{OWN_BUS}): 79" in d.detail and "dmesg" not in d.detail
    # without the kernel log read, the advice to look stays
    [d2] = check_driver(facts_of(nvml=nv))
    assert "`dmesg | grep -i xid`" in d2.detail
    # the walk: no Xid in the window, the GPU unreachable through NVML
    probes = {**h200_all(), "nvml": nv, "kernel_log": _empty_log(written)}
    assert _walk(probes).path[-2:] == ["handles", "diag-unreachable"]
    assert [f.id for f in check_health(facts_of(nvml=nv))] == ["gpu.health.reachable"]


# -- the readers' bounds, and journald as the fallback ----------------------------------------------------


def test_the_reader_is_bounded_and_never_blocks(tmp_path):
    dump = tmp_path / "kmsg.txt"
    dump.write_text("".join(f"6,{i},{i * 1000},-;line {i}\n SUBSYSTEM=pci\n" for i in range(50)))
    got = kernlog.read_kmsg(str(dump), max_records=5)
    assert [r["seq"] for r in got.records] == [45, 46, 47, 48, 49] and got.read == 50
    assert got.truncated == "kept the newest 5 of 50 records" and got.first_usec == 0
    got = kernlog.read_kmsg(str(dump), max_bytes=100)
    assert got.truncated == "stopped after 100 bytes" and got.read < 50
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # a writer that never writes: a blocking read would hang here
    try:
        t0 = time.monotonic()
        got = kernlog.read_kmsg(str(fifo))
        assert time.monotonic() - t0 < 2 and got.records == [] and got.error is None
    finally:
        os.close(writer)
    got = kernlog.read_kmsg(str(tmp_path))
    assert got.error is not None and "directory" in got.error.lower()


def test_journald_is_the_fallback_where_kmsg_cannot_be_opened(tmp_path):
    record = {"MESSAGE": f"NVRM: Xid (PCI:{OWN_BUS}): 119, pid=77, name=python3, Timeout after 6s of waiting for "
                         "RPC response from GPU0 GSP!", "__REALTIME_TIMESTAMP": "1796161157000000", "PRIORITY": "3",
              "SYSLOG_FACILITY": "0", "_TRANSPORT": "kernel", "_SOURCE_MONOTONIC_TIMESTAMP": "42"}
    stand_in = tmp_path / "journalctl"
    stand_in.write_text("#!/bin/sh\n# a stand-in journalctl: the args it got, then one kernel record\n"
                        f"echo \"$*\" > {tmp_path / 'args'}\n"
                        f"printf '%s\\n' {json.dumps(json.dumps(record))}\n")
    stand_in.chmod(0o755)
    f, _ = collect(kmsg=str(tmp_path / "no-kmsg"), journalctl=str(stand_in))
    assert f["source"] == "journalctl" and f["attempts"][0]["error"].endswith("No such file or directory")
    assert [(x["xid"], x["bus_address"], x["time"]) for x in f["xids"]] == [(119, OWN_BUS, 1796161157.0)]
    assert (tmp_path / "args").read_text().split()[:4] == ["-k", "-o", "json", "--no-pager"]
    [x] = check_xid(facts_of(kernel_log=f))
    assert "GSP RPC timeout" in x.detail and "journalctl -k (this boot)" in x.detail
    # neither the module nor the bus read beside it: the record is not confirmed, so not a failing GPU
    assert x.status == "warn" and "whether the NVIDIA kernel module is loaded was not read" in x.detail
    # journalctl for a user who sees only their own journal: not "no record", but not read
    stand_in.write_text("#!/bin/sh\necho 'Hint: You are currently not seeing messages from other users and the "
                        "system.' >&2\n")
    f, _ = collect(kmsg=str(tmp_path / "no-kmsg"), journalctl=str(stand_in))
    assert "this user sees only its own journal" in f["skipped"]


def test_the_glossary_explains_xid_and_aer():
    from zdoctor.core.glossary import find_term, load_glossary

    terms = load_glossary()
    xid_term, aer_term = find_term(terms, "Xid"), find_term(terms, "AER")
    assert xid_term is not None and aer_term is not None
    assert "00000000:3B:00.0" in xid_term.text and "Xid 79" in aer_term.text


def test_a_hung_peer_copy_names_the_kernel_logs_records_for_its_two_gpus(tmp_path):
    from test_p2p import facts_for, two_gpus
    from test_p2p_verdicts import PASSTHROUGH

    from zdoctor.layers.gpu.check_p2p import check_p2p

    nv = two_gpus()
    gpu1 = f"{kernlog.bus_address(nv['gpus'][1]['pci_bus_id'])}.0"
    dump = kmsg_file(tmp_path / "kmsg", f"nvidia {gpu1}: PCIe Bus Error: severity=Uncorrected (Fatal), "
                     "type=Transaction Layer, (Requester ID)")
    kl, _ = collect(kmsg=str(dump), use_journal=False)
    _, f = facts_for(tmp_path, **PASSTHROUGH)
    f["peer_copy"] = {"devices": 2, "hung_pair": [0, 1], "timed_out": True, "pairs": []}
    probes = {**h200_all(), "nvml": nv, "p2p": f}
    [x] = [x for x in check_p2p(facts_of(**probes, kernel_log=kl)) if x.id == "gpu.p2p.copy"]
    assert f"kernel.xid, kernel.aer): AER fatal at {gpu1}" in x.detail and "dmesg" not in x.detail
    [y] = [x for x in check_p2p(facts_of(**probes)) if x.id == "gpu.p2p.copy"]
    assert "`dmesg -T | grep -iE 'xid|aer|pcieport|nvrm'`" in y.detail
