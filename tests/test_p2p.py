"""GPU peer-to-peer behind the IOMMU and ACS: sysfs trees built in temporary directories (the real layout:
bus/pci/devices symlinks into the devices hierarchy, iommu_group links to kernel/iommu_groups/N/type),
recorded lspci -vvv text of PCIe switch ports, and two-GPU NVML facts made from the H200 capture."""

from __future__ import annotations

import copy
import os
import stat
from pathlib import Path

from test_gpu_checks import base
from test_gpu_facts import h200

from zdoctor.layers.gpu import p2p
from zdoctor.layers.gpu import probe_p2p as pp
from zdoctor.layers.gpu.check_p2p import check_p2p

ROOT_PORT, SWITCH_UP = "0000:00:01.0", "0000:01:00.0"
DOWN = ("0000:02:00.0", "0000:02:01.0")
GPUS = ("0000:03:00.0", "0000:04:00.0")

LSPCI_REDIRECT = """02:00.0 PCI bridge: PLX Technology, Inc. PEX 8747 48-Lane, 5-Port PCI Express Gen 3 Switch (rev ca)
\tCapabilities: [148 v1] Access Control Services
\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans+
\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
"""
LSPCI_OPEN = LSPCI_REDIRECT.replace("ACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+",
                                    "ACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd-")
LSPCI_DENIED = "02:00.0 PCI bridge: PLX Technology\n\tCapabilities: <access denied>\n"


def sysfs(tmp: Path, domain_type: str | None, units: tuple[str, ...] = ("dmar0",)) -> Path:
    """/sys with two GPUs below one PCIe switch (root port -> switch up -> two down ports -> GPUs)."""
    sys_root = tmp / "sys"
    top = sys_root / "devices" / "pci0000:00" / ROOT_PORT / SWITCH_UP
    (sys_root / "bus" / "pci" / "devices").mkdir(parents=True)
    for u in units:
        (sys_root / "class" / "iommu" / u).mkdir(parents=True)
    for i, gpu in enumerate(GPUS):
        down = DOWN[i]
        dev = top / down / gpu
        dev.mkdir(parents=True)
        for bdf, path in ((gpu, dev), (down, top / down)):
            link = sys_root / "bus" / "pci" / "devices" / bdf
            if not link.exists():
                link.symlink_to(path)
        if domain_type is not None:
            group = sys_root / "kernel" / "iommu_groups" / str(40 + i)
            group.mkdir(parents=True)
            (group / "type").write_text(domain_type + "\n")
            (dev / "iommu_group").symlink_to(group)
    return sys_root


def two_gpus() -> dict:
    nv = base("nvml")
    one = nv["gpus"][0]
    nv["gpus"] = [dict(copy.deepcopy(one), index=i, uuid=f"GPU-{i:08x}-aaaa", pci_bus_id=f"0000{GPUS[i]}")
                  for i in range(2)]
    nv["count"] = 2
    return nv


def facts_for(tmp: Path, *, domain_type="DMA", cmdline="BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on",
              lspci=LSPCI_REDIRECT, pairs=None, units=("dmar0",)):
    sys_root = sysfs(tmp, domain_type, units)
    (tmp / "cmdline").write_text(cmdline + "\n")
    nv = two_gpus()
    bridges = [SWITCH_UP, *DOWN]
    acs = {b: p2p.parse_acs(lspci) for b in bridges}
    f, ev = pp.collect_p2p(nv["gpus"], {}, sys_root=str(sys_root), cmdline=str(tmp / "cmdline"),
                           pairs={"0-1": 0, "1-0": 0} if pairs is None else pairs, acs=acs)
    return h200(nvml=nv, p2p=f), f


def by_id(findings):
    return {x.id: x for x in findings}


def test_pci_chain_and_the_bridges_between_two_gpus(tmp_path):
    sys_root = sysfs(tmp_path, "DMA")
    a, b = (p2p.pci_chain(g, str(sys_root)) for g in GPUS)
    assert a == [ROOT_PORT, SWITCH_UP, DOWN[0], GPUS[0]]
    between = p2p.bridges_between(a, b)
    assert between["common"] == SWITCH_UP and between["ports"] == list(DOWN) and not between["via_root_complex"]
    assert p2p.normalize_bdf("00000000:03:00.0") == GPUS[0]
    assert p2p.cmdline_params("ro quiet intel_iommu=on iommu=pt") == {"intel_iommu": "on", "iommu": "pt"}


def test_iommu_translation_and_acs_redirect_with_p2p_reported_ok_warns_with_workaround_and_fixes(tmp_path):
    facts, f = facts_for(tmp_path)
    assert f["iommu"]["mode"] == "translated" and f["iommu"]["units"] == ["dmar0"]
    (x,) = check_p2p(facts)
    assert x.id == "gpu.p2p" and x.status == "warn"
    assert "IOMMU translates" in x.title and "ACS redirects" in x.title
    assert "--p2p-test" in x.detail
    titles = [r.title for r in x.remedies]
    assert titles[0].startswith("Workaround: NCCL_P2P_DISABLE=1") and "slower" in x.remedies[0].explanation
    acs_fix = x.remedies[1]
    assert acs_fix.commands == [f"sudo setpci -s {b} ECAP_ACS+0x6.w=0000" for b in sorted([SWITCH_UP, *DOWN])]
    assert acs_fix.requires_root and "isolation" in acs_fix.explanation
    assert x.remedies[2].action["args"] == ["intel_iommu=on", "iommu=pt"] and "reboot" in x.remedies[2].explanation


def test_passthrough_and_open_acs_is_ok(tmp_path):
    facts, f = facts_for(tmp_path, domain_type="identity", cmdline="intel_iommu=on iommu=pt", lspci=LSPCI_OPEN)
    assert f["iommu"]["mode"] == "passthrough"
    (x,) = check_p2p(facts)
    assert x.status == "ok" and "passthrough" in x.title


def test_unreadable_acs_is_not_called_fine(tmp_path):
    facts, _ = facts_for(tmp_path, domain_type=None, units=(), cmdline="quiet", lspci=LSPCI_DENIED)
    (x,) = check_p2p(facts)
    assert x.status == "skip" and "unknown" in x.detail


def test_nvml_reporting_no_p2p_means_host_memory_not_a_hang(tmp_path):
    facts, _ = facts_for(tmp_path, pairs={"0-1": 3, "1-0": 3})
    (x,) = check_p2p(facts)
    assert x.status == "ok" and "unavailable for 2 GPU pairs" in x.title and "IOH topology" in x.detail


def test_the_single_gpu_h200_has_no_peer_traffic():
    nv = base("nvml")
    f, _ = pp.collect_p2p(nv["gpus"], {}, sys_root="/nonexistent", cmdline="/nonexistent", pairs={}, acs={})
    (x,) = check_p2p(h200(p2p=f))
    assert x.status == "ok" and "Fewer than two GPUs" in x.title


def test_a_hung_peer_copy_is_killed_and_named(tmp_path, monkeypatch):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho '{\"devices\": 2}'\necho '{\"src\": 0, \"dst\": 1, \"can_access\": true, "
                    "\"begin\": true}'\nexec sleep 30\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(pp, "PEER_COPY_TIMEOUT", 2.0)
    copy_ = pp.peer_copy(str(fake), dict(os.environ))
    assert copy_["hung_pair"] == [0, 1] and copy_["timed_out"]
    facts, f = facts_for(tmp_path)
    f["peer_copy"] = copy_
    found = by_id(check_p2p(h200(nvml=two_gpus(), p2p=f)))
    assert found["gpu.p2p.copy"].status == "fail" and "GPU 0 -> GPU 1 hung" in found["gpu.p2p.copy"].title
    assert found["gpu.p2p.copy"].remedies[0].commands == ["export NCCL_P2P_DISABLE=1"]


def test_no_driver_is_not_called_fewer_than_two_gpus():
    nv = {"available": False, "error_kind": "driver_not_loaded", "error": "NVML did not initialise", "gpus": []}
    f, _ = pp.collect_p2p([], {}, sys_root="/nonexistent", cmdline="/nonexistent", pairs={}, acs={})
    (x,) = check_p2p(h200(nvml=nv, p2p=f))
    assert x.status == "skip" and "NVML did not initialise" in x.detail


def config_space(acs_ctl: int | None, size: int = 4096) -> bytes:
    """A bridge's PCI config space as sysfs gives it: AER at 0x100, then (when given) ACS at 0x148."""
    data = bytearray(size)
    data[0:4] = (0x8747 << 16 | 0x10B5).to_bytes(4, "little")  # device / vendor
    if size >= 0x200:
        nxt = 0x148 if acs_ctl is not None else 0
        data[0x100:0x104] = (0x0001 | 1 << 16 | nxt << 20).to_bytes(4, "little")  # AER, v1
        if acs_ctl is not None:
            data[0x148:0x14C] = (0x000D | 1 << 16).to_bytes(4, "little")  # ACS, v1, last
            data[0x14C:0x14E] = (0x007F).to_bytes(2, "little")  # ACS capability: every bit
            data[0x14E:0x150] = acs_ctl.to_bytes(2, "little")  # ACS control
    return bytes(data)


def test_acs_read_from_sysfs_config_space_without_lspci(tmp_path):
    sys_root = sysfs(tmp_path, "DMA")
    top = sys_root / "devices" / "pci0000:00" / ROOT_PORT / SWITCH_UP
    (sys_root / "bus" / "pci" / "devices" / SWITCH_UP).symlink_to(top)
    (top / "config").write_bytes(config_space(0x0001))  # SrcValid only
    for down in DOWN:
        (top / down / "config").write_bytes(config_space(0x001D))  # SrcValid ReqRedir CmpltRedir UpstreamFwd
    (tmp_path / "cmdline").write_text("intel_iommu=on\n")
    empty = tmp_path / "no-tools"
    empty.mkdir()
    f, _ = pp.collect_p2p(two_gpus()["gpus"], {"PATH": str(empty)}, sys_root=str(sys_root),
                          cmdline=str(tmp_path / "cmdline"), pairs={"0-1": 0, "1-0": 0})
    assert f["acs"][SWITCH_UP]["redirect"] is False
    assert all(f["acs"][d]["redirect"] and f["acs"][d]["flags"]["CmpltRedir"] for d in DOWN)
    (x,) = check_p2p(h200(nvml=two_gpus(), p2p=f))
    assert x.status == "warn" and x.remedies[1].commands == [f"sudo setpci -s {d} ECAP_ACS+0x6.w=0000" for d in DOWN]
    # read as a non-root user, sysfs gives 64 bytes: unknown, and without lspci it says so
    for d in DOWN:
        (top / d / "config").write_bytes(config_space(0x001D, size=64))
    f, _ = pp.collect_p2p(two_gpus()["gpus"], {"PATH": str(empty)}, sys_root=str(sys_root),
                          cmdline=str(tmp_path / "cmdline"), pairs={"0-1": 0, "1-0": 0})
    assert f["acs"][DOWN[0]]["redirect"] is None and "needs root" in f["acs"][DOWN[0]]["why"]
