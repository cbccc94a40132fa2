"""Every practice scenario is one node that tells the truth: every check is evaluated on its snapshot and the
facts and findings are cross-examined for contradictions (drives and swap, RAM and CPUs against GPUs and the
model, the training log's format against the installed DeepSpeed, redaction of what is no secret, root need
against the recorded owner, the kernel against the OS, the story's claims against the facts)."""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

import pytest

from zdoctor.core.redact import REDACTED, is_secret_name
from zdoctor.host import ReplayHost
from zdoctor.walk import practice
from zdoctor.walk.doctor import check

SCENARIOS = practice.load_scenarios()
GIB = 1 << 30
#: The least a GPU training node carries per GPU: host RAM and CPU cores (the planner's own figures for
#: offload need far more; below these the node is a laptop or a small VM, not the node of the story).
MIN_RAM_PER_GPU, MIN_CPUS_PER_GPU = 16 * GIB, 4
#: A Debian release's own kernel package names (``uname -r``).
DEBIAN_KERNELS = {"12": re.compile(r"^6\.1\.0-\d+-(amd64|cloud-amd64|rt-amd64|arm64)$"),
                  "11": re.compile(r"^5\.10\.0-\d+-(amd64|cloud-amd64|rt-amd64|arm64)$")}
#: Mount points a node's own system lives on: never an offload target.
SYSTEM_MOUNTS = ("/", "/boot", "/boot/efi")


def _facts(doc: dict, probe: str) -> dict[str, Any]:
    return ((doc.get("probes") or {}).get(probe) or {}).get("facts") or {}


def _node(scenario) -> dict[str, Any]:
    """The facts of the scenario and of every scenario that tells of the same host, merged per probe."""
    own = json.loads(scenario.snapshot.read_text())
    out: dict[str, Any] = {"host": own["host"], "probes": {}}
    for s in SCENARIOS:
        doc = json.loads(s.snapshot.read_text())
        if doc["host"].get("hostname") == own["host"].get("hostname"):
            for name, res in doc["probes"].items():
                out["probes"].setdefault(name, res)
    out["probes"].update(own["probes"])
    return out


def _version(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text or "")[:3])


def _redacted_members(obj: Any, key: str = "") -> Iterator[str]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _redacted_members(v, str(k))
    elif isinstance(obj, list):
        for v in obj:
            yield from _redacted_members(v, key)
    elif obj == REDACTED:
        yield key


def contradictions(scenario) -> list[str]:
    """What the scenario's facts, findings and story say against each other."""
    doc = json.loads(scenario.snapshot.read_text())
    node = _node(scenario)
    host = node["host"]
    report = check(ReplayHost.load(str(scenario.snapshot)))
    findings = report.findings
    said = "\n".join([scenario.title, scenario.summary, scenario.story])
    out: list[str] = []

    # -- the kernel belongs to the OS, and the node is not a micro-VM
    kernel, os_name = host.get("kernel") or "", host.get("os") or ""
    m = re.match(r"Debian GNU/Linux (\d+)", os_name)
    if m and m.group(1) in DEBIAN_KERNELS and not DEBIAN_KERNELS[m.group(1)].match(kernel):
        out.append(f"kernel {kernel} is not a kernel of {os_name}")
    if re.search(r"(^|[-.])(fc|firecracker)([-.]|$)", kernel):
        out.append(f"kernel {kernel} is a Firecracker micro-VM's")

    # -- memory and swap
    mem = _facts(node, "system").get("memory") or {}
    cap = _facts(node, "capacity").get("machine") or {}
    swap_total = mem.get("SwapTotal")
    swap_free = cap.get("swap_free", mem.get("SwapFree"))
    drives = _facts(node, "nvme_inventory").get("drives") or []
    swap_drives = [d["name"] for d in drives if any("swap" in (u.get("use") or "") for u in d.get("uses") or [])]
    if swap_drives and not swap_total:
        out.append(f"{', '.join(swap_drives)} in use as swap, while the node's SwapTotal is {swap_total}")
    if swap_total == 0 and swap_free:
        out.append(f"SwapFree {swap_free} with no swap at all")
    if mem.get("MemTotal") and cap.get("mem_total") and mem["MemTotal"] != cap["mem_total"]:
        out.append(f"two MemTotals for one node: {mem['MemTotal']} and {cap['mem_total']}")

    # -- RAM and CPUs against the GPUs and the model
    opts = host.get("options") or {}
    gpus = opts.get("gpus_per_node")
    total = min((x for x in (mem.get("MemTotal"), cap.get("mem_total")) if x), default=None)
    if isinstance(gpus, int) and gpus > 0:
        if total and total < gpus * MIN_RAM_PER_GPU:
            out.append(f"{gpus} GPUs with {total / GIB:.1f} GiB of host RAM")
        cpus = _facts(node, "system").get("cpus")
        if isinstance(cpus, int) and cpus < gpus * MIN_CPUS_PER_GPU:
            out.append(f"{gpus} GPUs with {cpus} CPUs")
        nvml = _facts(node, "nvml")
        if nvml and not nvml.get("available") and nvml.get("error_kind") == "library_not_found":
            out.append(f"{gpus} GPUs on a node whose NVML says no NVIDIA driver is installed")
    if re.search(r"do not fit in the node's host RAM", said):
        cpu_rows = [r for r in _facts(node, "capacity").get("zero3") or [] if "offload_optimizer=cpu" in r["label"]]
        fitting = [r["label"] for r in cpu_rows if isinstance(r.get("cpu_need"), (int, float))
                   and isinstance(r.get("cpu_available"), (int, float)) and r["cpu_need"] <= r["cpu_available"]]
        if fitting:
            out.append(f"the story says the model states do not fit in host RAM, the planner fits {fitting}")

    # -- the training log's DeepSpeed and the node's
    ds = (_facts(node, "pyenv").get("deepspeed") or {}).get("version")
    fmt = _facts(doc, "trainlog").get("format") or ""
    if ds and "before 0.18" in fmt and _version(ds) >= (0, 18):
        out.append(f"a training log in the format DeepSpeed printed before 0.18 on a node with DeepSpeed {ds}")
    if ds and "0.18 and later" in fmt and _version(ds) < (0, 18):
        out.append(f"a training log in DeepSpeed 0.18's format on a node with DeepSpeed {ds}")
    log_path = _facts(doc, "trainlog").get("path") or ""
    named = re.search(r"ds-(\d+\.\d+)", log_path)
    if ds and named and _version(named.group(1)) != _version(ds)[:2]:
        out.append(f"the training log {log_path} is named for DeepSpeed {named.group(1)}, the node has {ds}")

    # -- the NVMe job runs, so async_io built: libaio cannot be missing
    by_id = {f.id: f for f in findings}
    swaps_timed = bool((_facts(doc, "trainlog").get("swap") or {}).get("timers"))
    if swaps_timed and by_id.get("storage.libaio") and by_id["storage.libaio"].status == "fail":
        out.append("the log times NVMe swaps, yet libaio (needed to build async_io) is missing")

    # -- drives: what the story calls unused, and every fast mounted drive named where a target is chosen
    unused = [d["name"] for d in drives if d.get("state") in ("blank", "has-filesystem") or d.get("unmounted")]
    if re.search(r"\ban NVMe drive left unused\b|\ba blank NVMe drive\b", said) and len(unused) != 1:
        out.append(f"the story speaks of one unused NVMe drive; the node has {len(unused)}: {unused}")
    if unused and by_id.get("storage.fstab"):
        chosen = "\n".join(part for fid in ("storage.fstab", "storage.unmounted-nvme", "offload.patch")
                           if fid in by_id for part in [by_id[fid].title, by_id[fid].detail or "",
                                                        *(r.title for r in by_id[fid].remedies)])
        for d in drives:
            points = [u["use"].split(" at ", 1)[1] for u in d.get("uses") or []
                      if (u.get("use") or "").startswith("mounted at ")]
            faster = [p for p in points if p not in SYSTEM_MOUNTS]
            for p in faster:
                if not re.search(re.escape(p) + r"\b", chosen):
                    out.append(f"{d['name']} is mounted at {p} and never named as an offload target")

    # -- redaction: only secrets
    for key in _redacted_members(doc):
        if key == "key" or not is_secret_name(key):
            out.append(f"{key!r} redacted, though it names no secret")
            break

    # -- root need: a remedy that edits only the training user's own files needs no root
    home = (_facts(node, "pyenv").get("env") or {}).get("HOME")
    user = (_facts(doc, "storage").get("user") or {}).get("name")
    for f in findings:
        for r in f.remedies:
            if not r.requires_root or not home or not r.commands:
                continue
            written = [w for c in r.commands for w in re.findall(r"(?:>|cp -p -- \S+|mv -- \S+) (/\S+)", c)]
            if written and all(w.startswith(home.rstrip("/") + "/") for w in written):
                out.append(f"{r.title!r} needs root for {user or 'the user'}'s own files {written}")
    return out


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_a_practice_node_never_contradicts_itself(scenario):
    assert contradictions(scenario) == []


def test_the_cross_examination_catches_a_contradicting_node(tmp_path):
    """The rules bite: the node as it was first recorded (a micro-VM's kernel and RAM under 8 GPUs, swap
    listed with none counted, a 0.17 log on 0.19.8, a redacted config key, libaio missing under a running
    NVMe job) is caught on each count."""
    s = next(x for x in SCENARIOS if x.id == "slow-ssd-offload")
    doc = json.loads(s.snapshot.read_text())
    doc["host"]["kernel"] = "6.18.44-fc-v657"
    doc["probes"]["capacity"]["facts"]["machine"]["mem_total"] = 25_276_510_208
    doc["probes"]["trainlog"]["facts"]["format"] = "prefixed (before 0.18)"
    doc["probes"]["dsconfig"]["facts"]["nvme_paths"][0]["key"] = REDACTED
    lib = doc["probes"]["storage"]["facts"]["libaio"]
    lib.update(ok=False, header=None, dev_library=None, runtime=None)
    lib["link_test"].update(ok=False, error="<stdin>:1:10: fatal error: libaio.h: No such file or directory")
    drive = doc["probes"]["nvme_inventory"]["facts"]["drives"][0]
    drive["uses"].append({"device": "nvme0n1p3", "use": "swap", "via": "nvme0n1p3"})
    snap = tmp_path / "node.json"
    snap.write_text(json.dumps(doc))
    found = "\n".join(contradictions(practice.Scenario(**{**s.__dict__, "snapshot": snap})))
    for words in ("Firecracker", "not a kernel of", "GiB of host RAM", "before 0.18", "redacted",
                  "libaio", "in use as swap"):
        assert words in found, (words, found)
