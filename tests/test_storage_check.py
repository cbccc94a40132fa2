"""The storage probes, checks and predicates end to end: a real ext4 on a real loop device (kind, backing
file, UUID against blkid and dumpe2fs, O_DIRECT, throughput, an fstab line findmnt accepts, apply by
UUID with a real mount and a rollback, the guarded mkfs), real tmpfs and ramfs mounts, the recorded
NVMe/SATA/HDD/H200 nodes, and `zdoctor check --json`."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import zdoctor.layers.offload.check_storage as cs
import zdoctor.layers.offload.probe_storage as ps
from zdoctor.core.model import ProbeResult
from zdoctor.core.registry import PREDICATES, Facts
from zdoctor.host import LiveHost
from zdoctor.layers import evaluate_check
from zdoctor.layers.offload import blockdev as bd
from zdoctor.layers.offload import fstab as fs
from zdoctor.readers import mounts as mt

FIX = Path(__file__).resolve().parent / "fixtures"
STORE = FIX / "storage"
CHECK_IDS = ("storage.mount", "storage.device", "storage.odirect", "storage.libaio", "storage.throughput",
             "storage.unmounted-nvme", "storage.fstab")


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, argv))} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


@contextlib.contextmanager
def loop_device(img: Path, size: str = "512M", mkfs: bool = True) -> Iterator[str]:
    """A file-backed block device (ext4 when ``mkfs``); detached in every case."""
    sh("truncate", "-s", size, img)
    if mkfs:
        sh("mkfs.ext4", "-q", "-F", img)
    proc = subprocess.run(["losetup", "--find", "--show", str(img)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"losetup cannot attach a loop device (these tests need root and /dev/loop*): {proc.stderr}")
    dev = proc.stdout.strip()
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], capture_output=True)


@contextlib.contextmanager
def mounted(source: str, where: Path, *extra: str) -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    sh("mount", *extra, source, where)
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture(scope="module")
def loopfs(tmp_path_factory) -> Iterator[dict[str, str]]:
    base = tmp_path_factory.mktemp("loopfs")
    img = base / "disk image.img"
    with loop_device(img) as dev, mounted(dev, base / "mnt") as mp:
        yield {"img": str(img), "dev": dev, "mnt": str(mp), "base": str(base)}


def facts_of(storage: tuple[dict, list] | None, inventory: tuple[dict, list] | None = None,
             storage_status: str = "ok", error: str | None = None) -> Facts:
    results = {}
    if storage is not None:
        results["storage"] = ProbeResult("storage", status=storage_status, facts=storage[0], evidence=storage[1],
                                         error=error)
    inv = inventory if inventory is not None else ({"drives": [], "unmounted": [], "suggestion": None}, [])
    results["nvme_inventory"] = ProbeResult("nvme_inventory", facts=inv[0], evidence=inv[1])
    return Facts(results)


def findings(facts: Facts) -> dict[str, object]:
    out = {}
    for cid in CHECK_IDS:
        (f,) = evaluate_check(cid, facts)
        assert f.status != "crash", f.detail
        out[cid] = f
    return out


def pred(name: str, facts: Facts) -> bool:
    return PREDICATES[name].func(facts)


# -- the loop device ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def loop_facts(loopfs):
    return ps.collect_storage(os.path.join(loopfs["mnt"], "offload"), io_size="32M", explicit=True)


def test_loop_device_kind_backing_file_and_uuid(loopfs, loop_facts):
    facts, _ = loop_facts
    dev = facts["device"]
    assert dev["name"] == os.path.basename(loopfs["dev"]) and dev["kind"] == "loop"
    assert dev["loop"]["backing_file"] == os.path.realpath(loopfs["img"])
    # the backing file's own device is what holds the temp directory
    tmp_mount = mt.mount_for(loopfs["img"], mt.read_mountinfo())
    assert dev["loop"]["backing"]["name"] == bd.kname_for_mount(bd.SysTree(), tmp_mount, live=True)
    uuid = facts["filesystem"]["uuid"]
    blkid = sh("blkid", "-o", "value", "-s", "UUID", loopfs["dev"]).stdout.strip()
    dumpe2fs = [ln.split(":", 1)[1].strip() for ln in sh("dumpe2fs", "-h", loopfs["dev"]).stdout.splitlines()
                if ln.startswith("Filesystem UUID:")]
    assert uuid == blkid == dumpe2fs[0] and facts["filesystem"]["type"] == "ext4"
    assert facts["mount"]["fstype"] == "ext4" and facts["mount"]["fit"] and facts["exists"] is False


def test_loop_odirect_and_throughput(loopfs, loop_facts):
    facts, _ = loop_facts
    assert facts["odirect"]["ok"] is True
    tp = facts["throughput"]
    assert tp["ran"] and tp["error"] is None and tp["removed"]
    assert tp["write"]["bytes"] == tp["read"]["bytes"] == 32 * 1024 * 1024
    assert tp["write"]["bps"] > 0 and tp["read"]["bps"] > 0
    assert not [n for n in os.listdir(loopfs["mnt"]) if n.startswith(".zdoctor-")]


def test_loop_findings_and_predicates(loopfs, loop_facts):
    facts = facts_of(loop_facts)
    got = findings(facts)
    assert got["storage.mount"].status == "warn" and "does not exist yet" in got["storage.mount"].title
    slowest = min(loop_facts[0]["throughput"]["write"]["bps"], loop_facts[0]["throughput"]["read"]["bps"])
    expect = "ok" if slowest >= cs.SLOW_BPS else "fail"
    assert got["storage.throughput"].status == expect
    assert got["storage.odirect"].status == "ok"
    assert got["storage.libaio"].status == ("ok" if loop_facts[0]["libaio"]["ok"] else "fail")
    # mounted by hand, not in /etc/fstab: the fix is an fstab line by UUID, without mounting again
    fstab = got["storage.fstab"]
    uuid = loop_facts[0]["filesystem"]["uuid"]
    assert fstab.status == "warn" and f"UUID={uuid}" in fstab.evidence[0].stdout
    assert not any(c.startswith("mount ") for c in fstab.remedies[0].commands)
    assert pred("offload_path_missing", facts) and not pred("offload_path_unfit", facts)
    assert pred("offload_on_slow_device", facts) is (slowest < cs.SLOW_BPS)


def test_loop_fstab_line_validates_with_findmnt(loopfs, tmp_path):
    facts = ps.collect_storage(loopfs["mnt"], io_size="0")[0]
    assert facts["throughput"] == {"ran": False, "reason": "the throughput test was turned off (io size 0)"}
    mp = tmp_path / "by uuid $(x)"
    mp.mkdir()
    tab = tmp_path / "fstab"
    tab.write_text(fs.fstab_line(facts["filesystem"]["uuid"], str(mp), "ext4") + "\n")
    res, ev = fs.verify(str(tab))
    assert res["success"] and ev.exit_code == 0, ev.stdout + ev.stderr
    verbose = sh("findmnt", "--verify", "--verbose", "--tab-file", tab).stdout
    assert f"translated to {loopfs['dev']}" in verbose


def test_loop_apply_by_uuid_mounts_and_rollback_restores(loopfs, tmp_path):
    uuid = sh("blkid", "-o", "value", "-s", "UUID", loopfs["dev"]).stdout.strip()
    tab = tmp_path / "fstab"
    original = b"# node fstab\n"
    tab.write_bytes(original)
    mp = tmp_path / "second view"
    line = fs.fstab_line(uuid, str(mp), "ext4")
    rec = fs.apply_fstab_line(str(tab), line, mount=["mount", "--fstab", str(tab), str(mp)])
    try:
        assert rec.ok, rec.error
        here = mt.mount_for(str(mp), mt.read_mountinfo())
        assert here.point == str(mp) and here.source == loopfs["dev"] and "noatime" in here.options
        assert tab.read_bytes() == original + line.encode() + b"\n"
    finally:
        subprocess.run(["umount", str(mp)], capture_output=True)
    # the same line on a fresh fstab, with a mount that fails (wrong file system type): rolled back
    tab2 = tmp_path / "fstab2"
    tab2.write_bytes(original)
    mp2 = tmp_path / "third"
    rec = fs.apply_fstab_line(str(tab2), fs.fstab_line(uuid, str(mp2), "ext4"),
                              mount=["mount", "--fstab", str(tab2), "-t", "xfs", str(mp2)])
    assert not rec.ok and rec.rolled_back and rec.restored_identical and rec.mount["exit_code"] != 0
    assert tab2.read_bytes() == original and Path(rec.backup).read_bytes() == original
    assert not mp2.exists()


def test_mkfs_remedy_guard_and_format(loopfs, tmp_path):
    # a device with a filesystem: the guard keeps mkfs from running
    before = sh("blkid", "-o", "value", "-s", "UUID", loopfs["dev"]).stdout.strip()
    rem = fs.mkfs_remedy(loopfs["dev"], "ext4", fs.new_uuid())
    proc = subprocess.run(["bash", "-c", rem.commands[0]], capture_output=True, text=True)
    assert proc.returncode != 0
    assert sh("blkid", "-o", "value", "-s", "UUID", loopfs["dev"]).stdout.strip() == before
    # a blank device: formatted, with the UUID the fstab line will name
    with loop_device(tmp_path / "blank.img", "64M", mkfs=False) as blank:
        assert sh("blkid", "-p", blank, check=False).returncode == 2
        new = fs.new_uuid()
        rem = fs.mkfs_remedy(blank, "ext4", new)
        proc = subprocess.run(["bash", "-c", rem.commands[0]], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert sh("blkid", "-p", "-o", "value", "-s", "UUID", blank).stdout.strip() == new


def test_blank_loop_is_reported_blank_by_blkid(tmp_path):
    with loop_device(tmp_path / "b.img", "16M", mkfs=False) as dev:
        ident, ev = bd.fs_identity(os.path.basename(dev), None, use_blkid=True, uuid_map={})
        assert ident["known"] and ident["type"] is None and ident["sources"]["blkid"]["uuid"] is None
        assert ev[0].argv[:2] == ["blkid", "-p"]


# -- tmpfs and ramfs -----------------------------------------------------------------------------------------
def test_tmpfs_offload_is_unfit(tmp_path):
    with mounted("tmpfs", tmp_path / "shm like", "-t", "tmpfs", "-o", "size=16m") as d:
        facts = facts_of(ps.collect_storage(str(d), io_size="1M"))
        st = facts["storage"].facts
        assert st["mount"]["fstype"] == "tmpfs" and not st["mount"]["fit"]
        assert st["device"] is None and st["throughput"]["ran"] is False
        got = findings(facts)
        assert got["storage.mount"].status == "fail" and "unfit" in got["storage.mount"].title
        assert got["storage.device"].status == "skip"
        assert pred("offload_path_unfit", facts)


def test_ramfs_offload_fails_odirect(tmp_path):
    with mounted("ramfs", tmp_path / "r", "-t", "ramfs") as d:
        facts = facts_of(ps.collect_storage(str(d)))
        st = facts["storage"].facts
        assert st["odirect"]["ok"] is False and st["odirect"]["errno"] == "EINVAL"
        got = findings(facts)
        assert got["storage.odirect"].status == "fail" and "refuses O_DIRECT" in got["storage.odirect"].detail
        assert pred("offload_path_unfit", facts)


# -- recorded nodes ------------------------------------------------------------------------------------------
@pytest.fixture
def nvme_node(tmp_path):
    root = tmp_path / "nvme"
    bd.build_tree((STORE / "nvme-node/tree.txt").read_text(), str(root))
    kw = dict(sysfs_root=str(root / "sys"), dev_root=str(root / "dev"), udev_root=str(root / "run/udev"),
              mountinfo=str(STORE / "nvme-node/mountinfo"), live=False)
    inv = ps.collect_inventory(swaps=str(STORE / "nvme-node/swaps"), **kw)

    def at(path: str) -> Facts:
        return facts_of(ps.collect_storage(path, fstab_path=str(STORE / "nvme-node/fstab"), **kw), inv)
    return at


def test_offload_on_lvm_over_nvme_raid(nvme_node):
    facts = nvme_node("/data/offload")
    got = findings(facts)
    dev = got["storage.device"]
    assert dev.status == "ok" and dev.title == "Offload goes to dm-0 on nvme3n1+nvme4n1, NVMe"
    assert got["storage.device"].evidence[0].table.rows[2][0].strip() == "nvme3n1"
    assert got["storage.unmounted-nvme"].status == "ok"  # offload is already on fast NVMe
    title = got["storage.unmounted-nvme"].title
    assert "nvme1n1, nvme2n1" in title and "nvme6" not in title
    assert got["storage.fstab"].status == "ok"
    assert not pred("offload_on_slow_device", facts) and pred("unmounted_nvme_present", facts)
    assert got["storage.throughput"].status == "skip"


def test_fstab_entry_not_mounted_fails_with_the_mount_command(nvme_node):
    facts = nvme_node("/scratch/offload")
    got = findings(facts)
    f = got["storage.mount"]
    assert f.status == "fail" and f.title.startswith("/scratch is not mounted")
    assert f.remedies[0].commands == ["mount -- /scratch"]
    assert pred("offload_path_unfit", facts)


def test_tmpfs_offload_with_a_blank_nvme_gets_the_whole_fix(nvme_node):
    facts = nvme_node("/mnt/ram disk/offload")
    got = findings(facts)
    assert got["storage.mount"].status == "fail"
    f = got["storage.fstab"]
    assert f.status == "warn" and "nvme1n1" in f.title
    mkfs, mount, folder = f.remedies
    sug = facts["nvme_inventory"].facts["suggestion"]
    assert "DESTRUCTIVE" in mkfs.explanation and f"-U {sug['uuid']}" in mkfs.commands[0]
    assert mkfs.commands[0].endswith(f"-- {sug['device']}")
    line = fs.fstab_line(sug["uuid"], "/mnt/nvme", "ext4")
    assert any(line in c for c in mount.commands) and mount.commands[-1] == "mount -- /mnt/nvme"
    assert not any("/dev/nvme" in c and "fstab" in c for c in mount.commands)  # never a device name in fstab
    assert folder.commands[-1] == "chmod 0750 -- /mnt/nvme/zero-offload"
    assert got["storage.unmounted-nvme"].status == "warn"


@pytest.mark.parametrize("path,status,needle,slow", [("/hdd/offload", "fail", "rotational disk", True),
                                                      ("/sata/offload", "warn", "SATA/SAS SSD", True),
                                                      ("/", "warn", "speed unknown", False)])
def test_slow_and_unknown_devices(tmp_path, path, status, needle, slow):
    root = tmp_path / "disks"
    bd.build_tree((STORE / "disks-node/tree.txt").read_text(), str(root))
    facts = facts_of(ps.collect_storage(path, sysfs_root=str(root / "sys"), fstab_path=str(root / "none"),
                                        mountinfo=str(STORE / "disks-node/mountinfo"), live=False))
    (f,) = evaluate_check("storage.device", facts)
    assert f.status == status and needle in f.title
    assert pred("offload_on_slow_device", facts) is slow


def test_h200_node(tmp_path):
    root = tmp_path / "h200"
    bd.build_tree((STORE / "h200/tree.txt").read_text(), str(root))
    kw = dict(sysfs_root=str(root / "sys"), dev_root=str(root / "dev"), udev_root=str(root / "run/udev"),
              mountinfo=str(STORE / "h200/mountinfo"), live=False)
    facts = facts_of(ps.collect_storage("/root/offload", fstab_path=str(FIX / "gpu-node-h200/fstab.txt"), **kw),
                     ps.collect_inventory(swaps=str(root / "none"), **kw))
    got = findings(facts)
    assert got["storage.device"].status == "warn" and "vda" in got["storage.device"].title
    assert got["storage.unmounted-nvme"].title == "No NVMe drives on this node"
    assert got["storage.fstab"].status == "ok" and not pred("unmounted_nvme_present", facts)


# -- without a path -------------------------------------------------------------------------------------------
def test_no_offload_path_skips_with_the_reason():
    host = LiveHost(options={})
    res = host.result("storage")
    assert res.status == "skip" and "--offload-path" in res.error
    facts = Facts({"storage": res, "nvme_inventory": host.result("nvme_inventory")})
    got = findings(facts)
    assert {got[c].status for c in ("storage.mount", "storage.device", "storage.odirect", "storage.libaio",
                                    "storage.throughput")} == {"skip"}
    assert pred("offload_path_missing", facts) and not pred("offload_path_unfit", facts)


def test_path_from_the_ds_config(tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"zero_optimization": {"stage": 3,
                   "offload_param": {"device": "nvme", "nvme_path": str(tmp_path / "p")},
                   "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path / "o")}}}))
    target = ps.offload_target({"ds_config": str(cfg)})
    assert target["path"] == str(tmp_path / "o") and target["source"].endswith("offload_optimizer.nvme_path")
    assert [p["key"] for p in target["config_paths"]] == ["zero_optimization.offload_optimizer.nvme_path",
                                                          "zero_optimization.offload_param.nvme_path"]
    res = LiveHost(options={"ds_config": str(cfg)}).result("storage")
    assert res.status == "ok" and res.facts["throughput"]["ran"] is False  # no write unless asked
    bad = tmp_path / "bad.json"
    bad.write_text('{"zero_optimization": {\n  "stage": 3,,\n}}')
    target = ps.offload_target({"ds_config": str(bad)})
    assert target["path"] is None and target["ds_config_error"].startswith(f"{bad}:2:")
    assert ps.offload_target({"ds_config": str(tmp_path / "missing.json")})["ds_config_error"].endswith(
        "missing.json: no such ds_config")


def test_zdoctor_check_json_has_the_storage_findings(cli, loopfs):
    proc = cli(["check", "--json", "--no-log", "--offload-path", loopfs["mnt"], "--io-size", "16M"])
    assert proc.returncode in (0, 1, 3), proc.stderr
    doc = json.loads(proc.stdout)
    ids = {f["id"] for f in doc["findings"]}
    assert set(CHECK_IDS) <= ids
    tp = next(f for f in doc["findings"] if f["id"] == "storage.throughput")
    assert tp["status"] in ("ok", "fail") and "write" in tp["title"]


def test_uuid_sources_cross_checked(loopfs, tmp_path):
    kname = os.path.basename(loopfs["dev"])
    real = sh("blkid", "-o", "value", "-s", "UUID", loopfs["dev"]).stdout.strip()
    links = tmp_path / "dev" / "disk" / "by-uuid"
    links.mkdir(parents=True)
    (links / real).symlink_to(f"../../{kname}")
    assert bd.by_uuid(str(tmp_path / "dev")) == {kname: real}
    ident, _ = bd.fs_identity(kname, None, dev_root=str(tmp_path / "dev"), use_blkid=True)
    assert ident["uuid"] == real and ident["agree"] and set(ident["sources"]) == {"by-uuid", "blkid"}
    # a stale link (the filesystem was re-created) disagrees with what blkid reads: said, and blkid wins
    (links / real).unlink()
    (links / "11111111-2222-3333-4444-555555555555").symlink_to(f"../../{kname}")
    ident, ev = bd.fs_identity(kname, None, dev_root=str(tmp_path / "dev"), use_blkid=True)
    assert not ident["agree"] and ident["uuid"] == real
    assert ev[0].argv[-1] == loopfs["dev"]
