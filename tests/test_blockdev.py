"""Block devices from sysfs: the H200 node's recorded tree, hand-made NVMe/SATA/HDD/virtio/md/LVM/loop
trees, PCIe link arithmetic, filesystem identity, and the NVMe drives that sit unused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from zdoctor.layers.offload import blockdev as bd
from zdoctor.layers.offload import probe_storage as ps
from zdoctor.readers import mounts as mt

FIX = Path(__file__).resolve().parent / "fixtures"
STORE = FIX / "storage"
CAPTURE = FIX / "gpu-node-h200"


def tree(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    bd.build_tree((STORE / name / "tree.txt").read_text(), str(root))
    return root


@pytest.fixture
def nvme(tmp_path):
    return tree(tmp_path, "nvme-node")


def info(root: Path, kname: str) -> dict:
    return bd.device_info(kname, str(root / "sys"))


# -- PCIe arithmetic ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text,gts", [("16.0 GT/s PCIe", 16.0), ("8 GT/s", 8.0), ("2.5 GT/s PCIe", 2.5),
                                      ("Unknown", None), ("", None), (None, None)])
def test_parse_link_speed(text, gts):
    assert bd.parse_link_speed(text) == gts


@pytest.mark.parametrize("gts,width,gbps,gen", [(2.5, 1, 0.25, 1), (5.0, 4, 2.0, 2), (8.0, 4, 3.938, 3),
                                                (16.0, 4, 7.877, 4), (32.0, 4, 15.754, 5), (64.0, 4, 30.25, 6)])
def test_link_rate_uses_the_line_encoding(gts, width, gbps, gen):
    assert bd.link_rate(gts, width) / 1e9 == pytest.approx(gbps, abs=0.001)
    assert bd.pcie_generation(gts) == gen


# -- the H200 node ----------------------------------------------------------------------------------
def test_h200_tree_matches_the_capture(tmp_path):
    root = tree(tmp_path, "h200")
    lsblk = json.loads((CAPTURE / "lsblk.json").read_text())["blockdevices"]
    units = {"B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    for dev in lsblk:
        got = info(root, dev["kname"])
        assert got["majmin"] == dev["maj:min"]
        size = dev["size"]
        assert got["size_bytes"] == pytest.approx(float(size[:-1]) * units[size[-1]], rel=0.001)
        assert got["rotational"] is dev["rota"]
    vda = info(root, "vda")
    assert (vda["kind"], vda["speed_class"]) == ("virtio", "unknown")  # virtio says rotational=1 regardless
    assert info(root, "zram0")["kind"] == "ram"
    assert info(root, "loop3")["kind"] == "loop"
    # the capture's sysblock.txt lists these rotational flags
    blocks = (CAPTURE / "sysblock.txt").read_text().split("== /sys/block/")[1:]
    for block in blocks:
        name = block.split("\n", 1)[0]
        rot = block.split("queue/rotational: ", 1)[1][0]
        assert info(root, name)["rotational"] is (rot == "1")
    # no /dev/disk/by-uuid and no NVMe on that node: no UUID links, and the inventory is empty
    assert "cannot access '/dev/disk/by-uuid'" in (CAPTURE / "by-uuid.txt").read_text()
    assert bd.by_uuid(str(root / "dev")) == {}
    assert (CAPTURE / "sysnvme.txt").read_text().strip() == "== /sys/class/nvme/*"
    drives, _ = bd.nvme_inventory(str(root / "sys"), dev_root=str(root / "dev"), udev_root=str(root / "run/udev"))
    assert drives == []


def test_h200_offload_on_root_is_the_virtio_disk(tmp_path):
    root = tree(tmp_path, "h200")
    facts, _ = ps.collect_storage("/root/offload", sysfs_root=str(root / "sys"), dev_root=str(root / "dev"),
                                  udev_root=str(root / "run/udev"), mountinfo=str(STORE / "h200" / "mountinfo"),
                                  fstab_path=str(CAPTURE / "fstab.txt"), live=False)
    assert facts["mount"]["point"] == "/" and facts["device"]["name"] == "vda"
    assert facts["device"]["kind"] == "virtio" and facts["in_fstab"] is None
    shm, _ = ps.collect_storage("/dev/shm/off", sysfs_root=str(root / "sys"),
                                mountinfo=str(STORE / "h200" / "mountinfo"), fstab_path=str(CAPTURE / "fstab.txt"),
                                live=False)
    assert shm["mount"]["fstype"] == "tmpfs" and not shm["mount"]["fit"] and shm["device"] is None


# -- NVMe ---------------------------------------------------------------------------------------------
def test_nvme_partition_under_native_multipath(nvme):
    p2 = info(nvme, "nvme0n1p2")
    assert (p2["kind"], p2["partition"], p2["disk"]) == ("nvme", 2, "nvme0n1")
    assert p2["model"] == "Samsung SSD 990 PRO 2TB" and p2["rotational"] is False
    link = p2["nvme"]["link"]
    assert (link["generation"], link["current_width"], link["downtrained"]) == (4, 4, False)
    assert link["theoretical_bps"] == pytest.approx(7.877e9, rel=1e-3)
    assert p2["nvme"]["controllers"][0]["name"] == "nvme0" and p2["nvme"]["controllers"][0]["address"] == "0000:01:00.0"
    assert bd.describe_device(p2) == "nvme0n1p2 on nvme0n1: NVMe, Samsung SSD 990 PRO 2TB, PCIe Gen4 x4 (7.88 GB/s)"


def test_nvme_without_multipath_and_a_downtrained_link(nvme):
    n1 = info(nvme, "nvme1n1")
    assert n1["kind"] == "nvme" and n1["nvme"]["link"]["generation"] == 4
    n2 = info(nvme, "nvme2n1")["nvme"]["link"]
    assert (n2["generation"], n2["current_width"], n2["max_generation"], n2["max_width"]) == (3, 2, 4, 4)
    assert n2["downtrained"] and bd.link_label(n2) == "PCIe Gen3 x2 (1.97 GB/s)"


def test_lvm_on_md_raid0_on_two_nvme(nvme):
    dm = info(nvme, "dm-0")
    assert dm["kind"] == "dm" and dm["dm"] == {"name": "vg0-data", "uuid": dm["dm"]["uuid"], "subtype": "lvm"}
    (md,) = dm["members"]
    assert md["kind"] == "md" and md["md"]["level"] == "raid0"
    assert [m["name"] for m in md["members"]] == ["nvme3n1", "nvme4n1"]
    assert (dm["effective_kind"], dm["speed_class"]) == ("nvme", "fast")
    assert dm["disks"] == ["nvme3n1", "nvme4n1"] and dm["stack"] == ["dm-0", "md127", "nvme3n1", "nvme4n1"]
    assert [leaf["nvme"]["link"]["generation"] for leaf in bd.leaves(dm)] == [5, 5]


def test_nvme_over_tcp_is_network(nvme):
    n6 = info(nvme, "nvme6n1")
    assert n6["kind"] == "network" and n6["speed_class"] == "slow" and "tcp" in n6["network_reason"]


def test_mount_sources_with_anonymous_device_numbers(nvme):
    tree_ = bd.SysTree(str(nvme / "sys"))
    btrfs = mt.MountEntry(1, 0, "0:45", "/@home", "/home", ["rw"], "btrfs", "/dev/nvme0n1p2")
    lvm = mt.MountEntry(2, 0, "0:46", "/", "/x", ["rw"], "xfs", "/dev/mapper/vg0-data")
    over = mt.MountEntry(3, 0, "0:47", "/", "/y", ["rw"], "overlay", "overlay")
    assert bd.kname_for_mount(tree_, btrfs) == "nvme0n1p2"
    assert bd.kname_for_mount(tree_, lvm) == "dm-0"
    assert bd.kname_for_mount(tree_, over) is None


def test_inventory_states_and_the_suggested_drive(nvme):
    facts, ev = ps.collect_inventory(sysfs_root=str(nvme / "sys"), dev_root=str(nvme / "dev"),
                                     udev_root=str(nvme / "run/udev"), mountinfo=str(STORE / "nvme-node/mountinfo"),
                                     swaps=str(STORE / "nvme-node/swaps"), live=False)
    states = {d["name"]: d["state"] for d in facts["drives"]}
    assert states == {"nvme0n1": "in-use", "nvme1n1": "blank", "nvme2n1": "has-filesystem", "nvme3n1": "in-use",
                      "nvme4n1": "in-use", "nvme5n1": "in-use", "nvme6n1": "blank"}
    by = {d["name"]: d for d in facts["drives"]}
    assert by["nvme3n1"]["uses"][0] == {"device": "dm-0", "via": "nvme3n1", "use": "mounted at /data"}
    assert by["nvme5n1"]["uses"][0]["use"] == "swap"
    assert by["nvme2n1"]["filesystems"]["nvme2n1"]["uuid"] == "b5e0c7d2-1f43-4a8e-8c6d-0e9f2a7b4c31"
    assert facts["unmounted"] == ["nvme1n1", "nvme2n1", "nvme6n1"]
    sug = facts["suggestion"]
    # the fastest usable local drive wins: nvme1n1 (Gen4 x4) over the downtrained nvme2n1; never nvme6 (tcp)
    assert sug["drive"] == "nvme1n1" and sug["needs_mkfs"] and sug["fstype"] == "ext4"
    assert sug["mountpoint"] == "/mnt/nvme" and sug["offload_dir"] == "/mnt/nvme/zero-offload"
    table = ev[0].table
    assert table.columns[0] == "drive" and len(table.rows) == 7 and table.highlight == [1, 2, 6]


def test_a_drive_with_a_filesystem_is_mounted_not_formatted(nvme):
    drives, _ = bd.nvme_inventory(str(nvme / "sys"), dev_root=str(nvme / "dev"), udev_root=str(nvme / "run/udev"),
                                  mounts=mt.read_mountinfo(str(STORE / "nvme-node/mountinfo")))
    only = [d for d in drives if d["name"] == "nvme2n1"]
    sug = ps.suggest(only, live=False)
    assert sug["needs_mkfs"] is False and sug["uuid"] == "b5e0c7d2-1f43-4a8e-8c6d-0e9f2a7b4c31"
    assert sug["fstype"] == "ext4" and sug["device"].endswith("/nvme2n1")


def test_without_udev_or_root_the_state_is_unknown(nvme):
    drives, _ = bd.nvme_inventory(str(nvme / "sys"), dev_root=str(nvme / "nodev"), udev_root=str(nvme / "noudev"))
    assert {d["state"] for d in drives if d["name"] in ("nvme1n1", "nvme2n1")} == {"unknown"}


# -- SATA, HDD, virtio, loop -----------------------------------------------------------------------------
def test_sata_hdd_virtio_and_loop(tmp_path):
    root = tree(tmp_path, "disks-node")
    sda, sdb1, vda1 = info(root, "sda"), info(root, "sdb1"), info(root, "vda1")
    assert (sda["kind"], sda["speed_class"], sda["model"]) == ("ssd", "medium", "ATA Samsung SSD 870")
    assert (sdb1["kind"], sdb1["disk"], sdb1["speed_class"]) == ("hdd", "sdb", "slow")
    assert (vda1["kind"], vda1["disk"]) == ("virtio", "vda")
    facts, _ = ps.collect_storage("/loopmnt/offload", sysfs_root=str(root / "sys"),
                                  mountinfo=str(STORE / "disks-node/mountinfo"), fstab_path=str(root / "none"),
                                  live=False)
    loop = facts["device"]
    assert loop["kind"] == "loop" and loop["loop"]["backing_file"] == "/vm/disk image.img"
    assert loop["loop"]["backing"]["name"] == "vda1" and loop["effective_kind"] == "virtio"
    nfs, _ = ps.collect_storage("/nfs/x", sysfs_root=str(root / "sys"), mountinfo=str(STORE / "disks-node/mountinfo"),
                                fstab_path=str(root / "none"), live=False)
    assert not nfs["mount"]["fit"] and nfs["device"] is None and "not a block device" in nfs["device_error"]


def test_unknown_device_is_reported_not_raised(tmp_path):
    root = tree(tmp_path, "disks-node")
    got = info(root, "nvme9n9")
    assert got["kind"] == "unknown" and "no sysfs entry" in got["error"]


# -- recording a tree, and the manifest format ----------------------------------------------------------
def test_recorded_manifest_rebuilds_the_same_answers(nvme, tmp_path):
    rec = bd.SysTree(str(nvme / "sys"), record=True)
    originals = {k: bd.device_info(k, tree=rec) for k in ("dm-0", "nvme0n1p2", "nvme2n1", "nvme6n1")}
    bd.nvme_inventory(tree=rec, mounts=mt.read_mountinfo(str(STORE / "nvme-node/mountinfo")))
    again = tmp_path / "again"
    bd.build_tree(rec.manifest("sys"), str(again))
    for k, v in originals.items():
        assert bd.device_info(k, str(again / "sys")) == v


def test_live_root_device_records_and_replays(tmp_path):
    entries = mt.read_mountinfo()
    m = mt.mount_for("/", entries)
    rec = bd.SysTree("/sys", record=True)
    name = bd.kname_for_mount(rec, m, live=True)
    if name is None:  # / from an overlay or another device-less file system (containers)
        assert m.fstype in mt.UNFIT_FS or m.majmin.startswith("0:")
        return
    live = bd.device_info(name, tree=rec)
    bd.build_tree(rec.manifest("sys"), str(tmp_path / "r"))
    assert bd.device_info(name, str(tmp_path / "r" / "sys")) == live


@pytest.mark.parametrize("bad", ["/abs = 1", "a/../../b = 1", "no-marker", "../x -> y"])
def test_manifest_rejects_paths_outside_the_tree(tmp_path, bad):
    with pytest.raises(ValueError):
        bd.build_tree(bad + "\n", str(tmp_path))


def test_links_never_escape_the_tree(tmp_path):
    bd.build_tree("sys/block/evil -> ../../../../../../etc\nsys/block/ok/dev = 1:2\n", str(tmp_path))
    t = bd.SysTree(str(tmp_path / "sys"))
    assert t.read("block/evil/hostname") is None
    assert t.read("block/ok/dev") == "1:2"
    assert os.path.commonpath([t.real("block/evil"), str(tmp_path / "sys")]) == str(tmp_path / "sys")


@pytest.mark.parametrize("model,kind", [("Amazon Elastic Block Store", "network"), ("nvme_card-pd", "network"),
                                        ("Amazon EC2 NVMe Instance Storage", "nvme")])
def test_cloud_network_volumes_presented_as_nvme(tmp_path, model, kind):
    c = "sys/devices/pci0000:00/0000:00:1f.0/nvme/nvme0"
    bd.build_tree(f"{c}/transport = pcie\n{c}/model = {model}\n{c}/nvme0n1/dev = 259:0\n"
                  f"{c}/nvme0n1/queue/rotational = 0\n{c}/nvme0n1/device -> ..\n"
                  f"sys/class/block/nvme0n1 -> ../../devices/pci0000:00/0000:00:1f.0/nvme/nvme0/nvme0n1\n",
                  str(tmp_path))
    assert info(tmp_path, "nvme0n1")["kind"] == kind
