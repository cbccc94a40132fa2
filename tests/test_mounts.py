"""The mount holding a path: mountinfo parsing (escapes, optional fields, stacked mounts), the longest
prefix, fitness for offload, and a real tmpfs mounted under a hostile name."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest

from zdoctor.readers import mounts as mt

FIX = Path(__file__).resolve().parent / "fixtures"
H200 = FIX / "storage" / "h200" / "mountinfo"
NVME = FIX / "storage" / "nvme-node" / "mountinfo"


def test_parse_recorded_mountinfo_with_escapes_and_optional_fields():
    entries = mt.read_mountinfo(str(NVME))
    assert [e.point for e in entries] == ["/", "/boot/efi", "/data", "/dev/shm", "/mnt/ram disk"]
    data = entries[2]
    assert (data.majmin, data.fstype, data.source, data.optional) == ("253:0", "xfs", "/dev/mapper/vg0-data",
                                                                       ["shared:3"])
    assert data.options == ["rw", "noatime"] and "inode64" in data.super_options


def test_h200_root_and_stacked_mounts():
    entries = mt.read_mountinfo(str(H200))
    root = mt.mount_for("/root/offload", entries, resolve=False)
    assert (root.point, root.fstype, root.source, root.majmin) == ("/", "ext4", "/dev/vda", "254:0")
    # /dev/shm is mounted twice on that node: the later mount is the one in effect
    shm = mt.mount_for("/dev/shm/x", entries, resolve=False)
    assert shm.super_options[-1] == "size=134217728k"
    # a sibling whose name starts with a mount point's name is not inside it
    assert mt.mount_for("/dev/shmx", entries, resolve=False).point == "/dev"
    nv = mt.describe(mt.mount_for("/usr/local/nvidia/lib", entries, resolve=False))
    assert nv["readonly"] and not nv["fit"] and "read-only" in nv["unfit_reason"]


def test_malformed_lines_are_skipped():
    text = ("garbage\n1 2 3\nx y 0:1 / /a rw - ext4 /dev/a rw\n5 1 0:9 / /ok rw - tmpfs tmpfs rw\n"
            "5 1 0:9 / /short rw -\n")
    entries = mt.parse_mountinfo(text)
    assert [e.point for e in entries] == ["/ok"]


@pytest.mark.parametrize("fstype,fit", [("ext4", True), ("xfs", True), ("tmpfs", False), ("ramfs", False),
                                        ("overlay", False), ("nfs4", False), ("fuse.sshfs", False),
                                        ("fuse", False), ("squashfs", False), ("vfat", False), ("lustre", True)])
def test_fitness(fstype, fit):
    m = mt.MountEntry(1, 0, "0:1", "/", "/x", ["rw"], fstype, "src", ["rw"])
    ok, why = mt.fitness(m)
    assert ok is fit and (why is None) is fit
    if fstype == "lustre":
        assert mt.describe(m)["network"]


def test_unescape_round_trip_of_hostile_names():
    assert mt.unescape(r"/mnt/a\040b/$(touch\040x)\011t\134") == "/mnt/a b/$(touch x)\tt\\"


@contextlib.contextmanager
def mounted(fstype: str, where: Path, options: str = "size=8m"):
    where.mkdir(parents=True)
    proc = subprocess.run(["mount", "-t", fstype, "-o", options, fstype, str(where)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"cannot mount a {fstype} at {where} (tests run as root): {proc.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_live_tmpfs_under_a_hostile_name(tmp_path):
    where = tmp_path / "off load $(touch pwned)"
    with mounted("tmpfs", where):
        res = mt.path_mount(str(where / "not-yet" / "deeper"))
        assert res["exists"] is False and res["probed_path"] == str(where)
        m = res["mount"]
        assert m["point"] == str(where) and m["fstype"] == "tmpfs"
        assert m["fit"] is False and "RAM" in m["unfit_reason"]
        assert res["space"]["total_bytes"] == 8 * 1024 * 1024
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_live_root_is_a_real_mount():
    res = mt.path_mount(os.getcwd())
    assert res["exists"] and res["mount"] is not None and res["space"]["total_bytes"] > 0


def test_h200_mountinfo_mirrors_the_captured_mounts_and_df():
    entries = mt.read_mountinfo(str(H200))
    captured = [ln.split()[:3] for ln in (FIX / "gpu-node-h200" / "mounts.txt").read_text().splitlines()]
    assert [[e.source, e.point, e.fstype] for e in entries] == [[s, p, t] for s, p, t in captured]
    for line in (FIX / "gpu-node-h200" / "df.txt").read_text().splitlines()[1:]:
        source, fstype, *_, point = line.split()
        m = mt.mount_for(point, entries, resolve=False)
        assert (m.point, m.source, m.fstype) == (point, source, fstype)


def test_one_reader_and_one_classifier_judge_a_path_the_same_everywhere(tmp_path):
    """The storage check, the ds_config lint, the JIT cache and /dev/shm all read mounts here: a file system
    is network (or not) for all of them, from mountinfo or /proc/mounts text alike."""
    from zdoctor.layers.offload import lint
    from zdoctor.readers import hostlimits as limits
    from zdoctor.readers import mounts as m

    info = tmp_path / "mountinfo"
    info.write_text("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"
                    "2 1 0:50 / /mnt/share rw - virtiofs share rw\n"
                    "3 1 0:51 / /mnt/ocfs rw - ocfs2 /dev/sdb rw\n"
                    "4 1 0:52 / /mnt/ssh rw - fuse.sshfs host:/x rw\n"
                    "5 1 0:53 / /dev/shm rw - tmpfs tmpfs rw,size=65536k\n")
    procmounts = tmp_path / "mounts"
    procmounts.write_text("/dev/sda1 / ext4 rw 0 0\nshare /mnt/share virtiofs rw 0 0\n/dev/sdb /mnt/ocfs ocfs2 rw 0 0\n"
                          "host:/x /mnt/ssh fuse.sshfs rw 0 0\ntmpfs /dev/shm tmpfs rw,size=65536k 0 0\n")
    for table in (info, procmounts):
        entries = m.read_mountinfo(str(table))
        for path, network in (("/mnt/share/a", True), ("/mnt/ocfs/b", True), ("/mnt/ssh/c", True), ("/x", False)):
            found = m.mount_of(path, str(table))
            assert m.is_network_fs(found["fstype"]) is network, (table.name, path)
            assert m.describe(m.mount_for(path, entries, resolve=False))["network"] is network
        assert limits.parse_mounts(table.read_text())["fstype"] == "tmpfs"
    from zdoctor.readers import jitcache

    for mod in (lint, jitcache, limits):  # no copy of its own of the list or the lookup
        assert not hasattr(mod, "NETWORK_FS") and getattr(mod, "mount_of", m.mount_of) is m.mount_of
