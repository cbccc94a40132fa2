"""Record the practice scenario "offload on a slow SATA SSD, fixed by an NVMe drive" (part 2 of the story),
on the same node as part 1, and amend part 1 with that node's facts.

Both parts tell of one node, ``train-node-01``: part 1's recording gives its identity (OS, kernel, memory,
the training venv /opt/ds-env with torch and DeepSpeed); the block-device tree ``train-node-01`` gives
its disks (root on nvme0n1p2, ``/ssd`` a SATA SSD on sda, a blank NVMe drive); ``scenario-node`` gives
the startup files of its user alice (the ``~/.bashrc`` line that puts /opt/conda/lib on LD_LIBRARY_PATH).
The node's own figures (kernel, CPUs, memory, /dev/shm, no swap, bare metal) are :data:`NODE_MEMINFO_KB` and
the constants beside it, written into both parts, so no figure of the recording machine is left in the story.

Part 2's offload facts (ds_config lints with the installed DeepSpeed's fields, the memory planner for 13B
parameters on 8 GPUs, the training log's breakdown) are probed live from real files, with the node's
memory (part 1's /proc/meminfo) and the node's view of ``/ssd/offload`` (xfs on sda, one free-space
figure). The throughput of "How fast is it, really?" is a real measurement by zdoctor's own O_DIRECT test,
run on this machine's disk under the kernel's block throttle (cgroup blkio) set to a SATA SSD's rates;
this needs root and the cgroup v1 blkio controller.

    python tests/scenario_kit.py assets/scenarios
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIX = HERE / "fixtures"
NODE = FIX / "storage" / "train-node-01"
OFFLOAD_PATH = "/ssd/offload"
HOSTNAME = "train-node-01"


def scrub(text: str) -> str:
    """Replace the recording machine's own paths with the scenario node's plausible ones."""
    import sysconfig

    repo = str(HERE.parent)
    base = sysconfig.get_config_var("prefix") or sys.base_prefix
    swaps = [(str(FIX / "offload"), "/home/alice/job"),
             (os.path.join(repo, "zdoctor"), "/opt/python/3.11.7/lib/python3.11/site-packages/zdoctor"),
             (repo, "/home/alice"),
             (base, "/opt/python/3.11.7"),
             (os.path.realpath(base), "/opt/python/3.11.7"),
             (os.path.expanduser("~/.pyenv/shims"), "/usr/local/bin")]
    text = text.replace(os.environ.get("PATH", "\0"), "/opt/python/3.11.7/bin:/usr/local/bin:/usr/bin:/bin")
    for real, shown in swaps:
        text = text.replace(real, shown)
    return text.replace('"' + os.path.expanduser("~") + '"', '"/home/alice"')


PART1 = "conda-ld-library-path.json"
PART2 = "slow-ssd-offload.json"
SCENARIO_NODE = FIX / "scenario-node"
DS_ENV_SHOWN = "/opt/ds-env"
#: The node's disks as its tree has them: the root file system, and /ssd's free space (one figure).
ROOT_DEVICE = "/dev/nvme0n1p2"
SSD = {"device": "/dev/sda", "name": "sda", "point": "/ssd", "fstype": "xfs", "majmin": "8:0",
       "total": 999_653_638_144, "avail": 657_537_581_056}
#: A SATA SSD's sequential rates (bytes/s): SATA III carries at most about 550 MB/s.
SATA_READ_BPS, SATA_WRITE_BPS = 530_000_000, 500_000_000
#: alice's uid on the node (her home, her job files, her startup files).
ALICE_UID = 1000
#: How the node's own files are found when a kit recorded them (its home and system files).
SCRUB_DS_ENV = os.path.expanduser("~/.cache/zdoctor-tests/ds-env")
#: The training log: DeepSpeed 0.19's timer lines (printed bare, without the logger prefix of 0.17).
TRAIN_LOG = FIX / "offload" / "ds-0.19-wallclock-nvme.log"
#: The node itself: Debian 12's kernel, 64 CPUs and 256 GiB of RAM for its 8 GPUs (too little to hold a 13B
#: model's optimizer states in host memory, hence the NVMe offload), no swap, /dev/shm at tmpfs's default
#: half of RAM; MemAvailable is read while the job runs.
NODE_KERNEL = "6.1.0-28-amd64"
NODE_CPUS = 64
NODE_MEMINFO_KB = {"MemTotal": 263_842_468, "MemAvailable": 246_981_120, "SwapTotal": 0, "SwapFree": 0,
                   "Shmem": 2_105_344, "HugePages_Total": 0}
NODE_SHM_BYTES = NODE_MEMINFO_KB["MemTotal"] // 2 * 1024
#: Debian's libaio packages, installed on the node (the NVMe offload job builds DeepSpeed's async_io op).
LIBAIO_DEBS = ("libaio1", "libaio-dev")


def node_identity(part1: dict) -> dict:
    """Hostname, OS, kernel, architecture and the training interpreter of the node part 1 recorded."""
    h = part1["host"]
    return {k: h[k] for k in ("hostname", "os", "kernel", "arch", "python", "python_explicit")}


def node_meminfo_text() -> str:
    """The node's /proc/meminfo lines."""
    return "".join(f"{k + ':':<16}{v:>8} kB\n" for k, v in NODE_MEMINFO_KB.items())


def node_meminfo(part1: dict, path: Path) -> str:
    """The node's /proc/meminfo (as part 1 recorded it) written to ``path`` for the planner to read."""
    mem = part1["probes"]["system"]["facts"]["memory"]
    path.write_text("".join(f"{k}: {mem[k] // 1024} kB\n" for k in ("MemTotal", "MemAvailable", "SwapTotal",
                                                                    "SwapFree", "Shmem") if k in mem))
    return str(path)


def node_libaio(tmp: str) -> dict:
    """The libaio check as the node answers it: Debian's libaio packages unpacked under ``tmp`` (``apt-get
    download``, ``dpkg -x``), found and compiled against by zdoctor's own test, then shown at their
    installed paths."""
    import subprocess

    from zdoctor.layers.offload import iotest as io

    root = os.path.join(tmp, "root")
    subprocess.run(["apt-get", "download", *LIBAIO_DEBS], cwd=tmp, check=True, capture_output=True)
    for deb in sorted(Path(tmp).glob("*.deb")):
        subprocess.run(["dpkg", "-x", str(deb), root], check=True)
    libdir = os.path.join(root, "usr", "lib", "x86_64-linux-gnu")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
    env.update(CFLAGS=f"-I{root}/usr/include", LDFLAGS=f"-L{libdir}")
    facts, _ = io.libaio_status(env)
    assert facts["ok"], facts
    facts = json.loads(json.dumps(facts).replace(root, ""))
    facts["runtime"] = "libaio.so.1"  # ldconfig's answer on the node, where the package is installed
    return facts


def ssd_view(path: str) -> dict:
    """What the node shows for a path under /ssd: xfs on the SATA SSD sda, with the node's free space."""
    return {"path": path, "absolute": True, "exists": True, "is_dir": True, "anchor": path, "writable": True,
            "owner_uid": 1000, "mode": "0o755", "uid": 1000,
            "mount": {"dev": SSD["majmin"], "fstype": SSD["fstype"], "options": "rw,noatime", "point": SSD["point"],
                      "source": SSD["device"]},
            "category": "block",
            "block": {"device": SSD["device"], "is_block": True, "name": SSD["name"], "nvme": False,
                      "rotational": False},
            "free_bytes": SSD["avail"], "total_bytes": SSD["total"]}


def node_limits(live) -> None:
    """The host_limits probe as the node answers it: bare metal (no container clue), /dev/shm at its size."""
    facts = live.result("host_limits").facts
    facts["container"] = {"clues": [], "in_container": False, "kind": None}
    facts["shm"].update(total=NODE_SHM_BYTES, free=NODE_SHM_BYTES,
                        options=f"rw,nosuid,nodev,size={NODE_SHM_BYTES // 1024}k,inode64")


def _whole_disk(directory: str) -> str:
    st = os.stat(directory)
    majmin = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    sysdir = os.path.realpath(f"/sys/dev/block/{majmin}")
    if os.path.exists(os.path.join(sysdir, "partition")):
        with open(os.path.join(os.path.dirname(sysdir), "dev"), encoding="ascii") as fh:
            majmin = fh.read().strip()
    return majmin


def measure_at_sata_rates(directory: str, size: int = 1 << 30) -> dict:
    """zdoctor's O_DIRECT throughput test on ``directory``, run in a blkio cgroup that throttles its disk to
    a SATA SSD's read and write rates: a real measurement of a SATA-limited device."""
    import subprocess

    group = f"/sys/fs/cgroup/blkio/zdoctor-sata-{os.getpid()}"
    os.mkdir(group)
    try:
        disk = _whole_disk(directory)
        Path(group, "blkio.throttle.read_bps_device").write_text(f"{disk} {SATA_READ_BPS}\n")
        Path(group, "blkio.throttle.write_bps_device").write_text(f"{disk} {SATA_WRITE_BPS}\n")
        code = ("import json, os, sys; open(sys.argv[1] + '/cgroup.procs', 'w').write(str(os.getpid())); "
                "from zdoctor.layers.offload import iotest as io; "
                "print(json.dumps(io.measure(sys.argv[2], int(sys.argv[3]), time_limit=60)))")
        out = subprocess.run([sys.executable, "-c", code, group, directory, str(size)], check=True,
                             capture_output=True, text=True, cwd=str(HERE.parent)).stdout
        res = json.loads(out)
    finally:
        os.rmdir(group)
    res["link_bps"], res["ratio"] = None, None
    return res


def node_storage(measured_dir: str) -> tuple[dict, dict]:
    """The storage and nvme_inventory probes' facts and evidence for the node: the recorded tree, with the
    node's free space on /ssd and a real O_DIRECT check and throughput measured at SATA rates."""
    import zdoctor.layers.offload.probe_storage as ps
    from zdoctor.layers.offload import blockdev as bd
    from zdoctor.layers.offload import iotest as io

    with tempfile.TemporaryDirectory() as tmp:
        bd.build_tree((NODE / "tree.txt").read_text(), tmp)
        kw = dict(sysfs_root=os.path.join(tmp, "sys"), dev_root=os.path.join(tmp, "dev"),
                  udev_root=os.path.join(tmp, "run/udev"), mountinfo=str(NODE / "mountinfo"), live=False)
        facts, ev = ps.collect_storage(OFFLOAD_PATH, source="ds_config zero_optimization.offload_optimizer.nvme_path",
                                       explicit=False, fstab_path=str(NODE / "fstab"), **kw)
        inventory = ps.collect_inventory(swaps=str(NODE / "swaps"), **kw)
        text = json.dumps({"storage": [facts, [e.to_dict() for e in ev]],
                           "nvme_inventory": [inventory[0], [e.to_dict() for e in inventory[1]]]})
        text = text.replace(tmp, "").replace(str(NODE / "fstab"), "/etc/fstab")
    done = json.loads(text)
    facts = done["storage"][0]
    facts.update(exists=True, is_dir=True, user={"name": "alice", "group": "alice"},
                 space={"total_bytes": SSD["total"], "free_bytes": SSD["avail"], "avail_bytes": SSD["avail"]},
                 access={"owner": "alice", "group": "alice", "mode": "0o755", "writable": True, "user_writable": True},
                 odirect=io.odirect_check(measured_dir), throughput=measure_at_sata_rates(measured_dir))
    with tempfile.TemporaryDirectory() as tmp:
        facts["libaio"] = node_libaio(tmp)
    ev = [e for e in done["storage"][1] if e.get("label") != "where offload writes"]
    ev.insert(0, ps._mount_table(facts).to_dict())
    return {"storage": (facts, ev), "nvme_inventory": tuple(done["nvme_inventory"])}


def record_slow_ssd(out: Path | None = None, part1_path: Path | None = None) -> dict:
    """The scenario's snapshot document (written to ``out`` when given), on part 1's node."""
    from zdoctor.core.redact import redact
    from zdoctor.core.registry import load_vocabulary
    from zdoctor.host import LiveHost
    from zdoctor.host.replay import snapshot_document
    from zdoctor.layers.offload import lint, planner

    load_vocabulary()
    part1 = json.loads(Path(part1_path or HERE.parent / "assets" / "scenarios" / PART1).read_text())
    ds_python = os.path.join(SCRUB_DS_ENV, "bin", "python")
    saved = (planner.MEMINFO, planner.fs_space, lint.inspect_path)
    real_space = planner.fs_space
    with tempfile.TemporaryDirectory() as tmp:
        planner.MEMINFO = node_meminfo(part1, Path(tmp) / "meminfo")
        planner.fs_space = lambda p: ({"total": SSD["total"], "free": SSD["avail"], "measured_at": OFFLOAD_PATH}
                                      if p.startswith(SSD["point"]) else
                                      {"total": NODE_SHM_BYTES, "free": NODE_SHM_BYTES, "measured_at": p}
                                      if p == "/dev/shm" else real_space(p))
        lint.inspect_path = lambda p, mounts="/proc/self/mountinfo": ssd_view(p)
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
            env["PATH"] = os.path.dirname(ds_python) + ":" + env.get("PATH", "")
            env.update(HOME="/home/alice", USER="alice", LOGNAME="alice")
            live = LiveHost(python=ds_python, env=env,
                            options={"ds_config": str(FIX / "offload" / "zero3-nvme-on-ssd.json"),
                                     "model_params": "13B", "gpus_per_node": 8,
                                     "train_log": str(TRAIN_LOG)})
            node_limits(live)
            for name in ("pyenv", "dsconfig", "capacity", "trainlog", "gpusample"):
                live.result(name)
            # the job's files are alice's, in her home (here they are the test suite's fixtures)
            live.result("dsconfig").facts["file"] = {"owner_uid": 1000, "dir_owner_uid": 1000, "dir_mode": "0o755"}
            doc = snapshot_document(live)
        finally:
            planner.MEMINFO, planner.fs_space, lint.inspect_path = saved
        measured = os.path.join(tmp, "offload")
        os.mkdir(measured)
        storage = node_storage(measured)
    for name, (facts, evidence) in storage.items():
        doc["probes"][name] = {"probe": name, "status": "ok", "facts": facts, "evidence": evidence, "error": None,
                               "started": doc["created"], "duration_s": 0.0}
    doc["probes"].pop("nvml", None)  # the recording machine's (no GPU); the node's GPUs were not recorded
    doc["host"] = {**doc["host"], **node_identity(part1),
                   "options": {k: (os.path.join("/home/alice/job", os.path.basename(str(v)))
                                   if k in ("ds_config", "train_log") else v)
                               for k, v in doc["host"].get("options", {}).items()}}
    text = json.dumps(doc, indent=1, sort_keys=True)
    text = text.replace(measured, OFFLOAD_PATH).replace(SCRUB_DS_ENV, DS_ENV_SHOWN)
    text = text.replace(os.uname().release, part1["host"]["kernel"])  # the node's kernel, as part 1 has it
    text = scrub(text)
    doc = redact(json.loads(text))
    if out is not None:
        Path(out).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return doc


def amend_part1(path: Path) -> dict:
    """Part 1 on the same node: its JIT cache lives on the node's root device, and the shellinit probe
    reads alice's startup files (the recorded ``scenario-node`` tree)."""
    from zdoctor.core.model import Evidence
    from zdoctor.layers.libraries.shellinit import scan

    doc = json.loads(path.read_text())
    recorded_kernel = doc["host"]["kernel"]
    doc = json.loads(json.dumps(doc).replace(recorded_kernel, NODE_KERNEL))
    # plan keys, which an older redaction took for secrets (a member named ``key`` is a record's field)
    keys = {"Drop ": "ld-library-path", "Preload ": "ld-preload", "Upgrade libstdcxx-ng": "conda-libstdcxx"}
    for plan in (doc["probes"].get("libfix") or {}).get("facts", {}).get("plans") or []:
        if plan.get("key") == "<redacted>":
            plan["key"] = next(v for k, v in keys.items() if plan["title"].startswith(k))
    system = doc["probes"]["system"]
    system["facts"].update(cpus=NODE_CPUS, memory={k: v * 1024 if k != "HugePages_Total" else v
                                                   for k, v in NODE_MEMINFO_KB.items()})
    for ev in system["evidence"]:
        if ev.get("label") == "read /proc/meminfo":
            ev["stdout"] = node_meminfo_text().rstrip("\n")
    for root in doc["probes"]["jitcache"]["facts"].get("roots") or []:
        if (root.get("mount") or {}).get("point") == "/":
            root["mount"]["source"] = ROOT_DEVICE
    facts = scan("/home/alice", ["/opt/conda", DS_ENV_SHOWN], root=str(SCENARIO_NODE))
    for shown, source in facts["sources"].items():  # her own files are hers on the node (uid 1000)
        if shown.startswith("/home/alice/"):
            source["uid"] = ALICE_UID
    rows = [[f"{x['file']}:{x['line']}", x["variable"], x["text"]] for x in facts["lines"]]
    ev = Evidence.of_table("shell startup lines that set LD_LIBRARY_PATH / LD_PRELOAD", ["where", "variable", "line"],
                           rows)
    doc["probes"]["shellinit"] = {"probe": "shellinit", "status": "ok", "facts": facts, "evidence": [ev.to_dict()],
                                  "error": None, "started": doc["created"], "duration_s": 0.0}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


PART1_COMMAND = "python -c 'from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()'"
#: Where part 1's story has the JIT-built op (alice's default torch extension cache).
PART1_EXT_DIR = "/home/alice/.cache/torch_extensions/py311_cpu"


def _same_role_pids(run: list[tuple], recorded: list[dict]) -> dict[int, int]:
    """This run's pids -> the recorded run's, process by process: the n-th process that loaded libstdc++ for
    the same object (ninja, libtorch_python.so) in one run is the n-th in the other."""
    def role(needed_by: str | None) -> str:
        return os.path.basename(needed_by or "")

    left = [(role(r.get("needed_by")), r["pid"]) for r in recorded]
    out: dict[int, int] = {}
    for pid, _path, _via, needed_by in run:
        if pid in out:
            continue
        match = next((x for x in left if x[0] == role(needed_by)), None)
        if match is not None:
            left.remove(match)
            out[pid] = match[1]
    return out


def part1_strace_lines(part1: dict) -> list[str]:
    """strace's own lines that matter for part 1 (each open of the old libstdc++), from a real run of part 1's
    command: the training venv (the test suite's torch + DeepSpeed, with its JIT-built cpu_adam) with an old
    libstdc++ (GLIBCXX_3.4.29, 3.4.30 and CXXABI_1.3.13 renamed away) first on LD_LIBRARY_PATH, traced by
    zdoctor's own live trace. The run's paths become the node's and its pids the recorded run's, process by
    role, so the lines agree with the rest of the recording."""
    import shutil

    sys.path.insert(0, str(HERE))
    import dsenv
    from envkit import make_old_libstdcxx

    from zdoctor.layers.libraries.live import trace_command

    python = dsenv.ensure()
    venv = python.parent.parent
    with tempfile.TemporaryDirectory(prefix="part1-strace-") as tmp:
        conda_lib = Path(tmp) / "conda" / "lib"
        make_old_libstdcxx(conda_lib)
        ext = Path(tmp) / "ext"
        shutil.copytree(venv / "zdoctor-torch-extensions", ext, symlinks=True)
        env = {"HOME": tmp, "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
               "LD_LIBRARY_PATH": str(conda_lib), "TORCH_EXTENSIONS_DIR": str(ext)}
        lt = trace_command(["/bin/sh", "-c", PART1_COMMAND], env, timeout=300)
        assert lt.strace_used and lt.exit_code not in (0, None), (lt.exit_code, lt.notes)
        pids = _same_role_pids(lt.libstdcxx, part1["probes"]["livetrace"]["facts"]["libstdcxx"])
        out = []
        for line in lt.strace_lines:
            head, _, rest = line.partition(" ")
            if not head.isdigit() or int(head) not in pids:
                continue
            line = f"{pids[int(head)]} {rest}"
            for real, shown in ((str(conda_lib), "/opt/conda/lib"), (str(ext), PART1_EXT_DIR),
                                (str(venv), DS_ENV_SHOWN)):
                line = line.replace(real, shown)
            out.append(line)
        return out


def amend_part1_strace(path: Path) -> dict:
    """Part 1's live trace with strace's own lines of a real run (see :func:`part1_strace_lines`)."""
    doc = json.loads(path.read_text())
    doc["probes"]["livetrace"]["facts"]["strace_lines"] = part1_strace_lines(doc)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    where = Path(sys.argv[1])
    amend_part1(where / PART1)
    amend_part1_strace(where / PART1)
    record_slow_ssd(where / PART2, where / PART1)
