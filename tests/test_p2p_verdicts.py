"""Peer copies judged against the link between the two GPUs (PCIe generation x width from the H200
capture, NVLink from NVML through the real pynvml module with its entry points replaced), and a hung copy
with neither IOMMU translation nor an ACS redirect to blame."""

from __future__ import annotations

import os
import stat
from typing import Any

import pynvml
from test_gpu_checks import branch
from test_gpu_facts import h200
from test_p2p import LSPCI_OPEN, facts_for, two_gpus

from zdoctor.layers.gpu import p2p
from zdoctor.layers.gpu import probe_p2p as pp
from zdoctor.layers.gpu.check_p2p import check_p2p

PASSTHROUGH = {"domain_type": "identity", "cmdline": "intel_iommu=on iommu=pt", "lspci": LSPCI_OPEN}


def _with_copy(tmp_path, copy: dict[str, Any], nvlinks: dict[str, Any] | None = None, **kw):
    _, f = facts_for(tmp_path, **{**PASSTHROUGH, **kw})
    f["peer_copy"] = copy
    if nvlinks is not None:
        f["nvlinks"] = nvlinks
    facts = h200(nvml=two_gpus(), p2p=f)
    return {x.id: x for x in check_p2p(facts)}, facts


def _copies(gbps: float) -> dict[str, Any]:
    return {"devices": 2, "hung_pair": None, "timed_out": False,
            "pairs": [{"src": 0, "dst": 1, "can_access": True, "ok": True, "gbps": gbps},
                      {"src": 1, "dst": 0, "can_access": True, "ok": True, "gbps": gbps}]}


def test_the_h200s_pcie_link_sets_the_expected_rate():
    g = two_gpus()["gpus"]
    assert (g[0]["pcie"]["gen_max"], g[0]["pcie"]["width"]) == (5, 16)  # from the capture
    assert p2p.expected_rate(g[0], g[1]) == {"gbps": 63.0, "link": "PCIe Gen5 x16", "why": None}


def test_a_copy_at_a_few_hundredths_of_the_link_is_slow_not_fine(tmp_path):
    found, facts = _with_copy(tmp_path, _copies(1.3))
    x = found["gpu.p2p.copy"]
    assert x.status == "warn"
    assert x.title == ("Peer copies arrived intact but slow: GPU 0 -> GPU 1 at 1.3 GB/s, 2% of its PCIe Gen5 x16 "
                       "link (63.0 GB/s)")
    assert branch("diag-p2p-unexplained", facts) and not branch("diag-p2p-iommu", facts)
    found, _ = _with_copy(tmp_path / "fast", _copies(48.0))
    assert found["gpu.p2p.copy"].status == "ok" and "at the link's speed" in found["gpu.p2p.copy"].title


def _fake_nvlink(monkeypatch, links: int = 18, version: int = 4) -> None:
    answers = {"nvmlInit": lambda: None, "nvmlShutdown": lambda: None,
               "nvmlDeviceGetHandleByIndex": lambda i: ("h", i),
               "nvmlDeviceGetNvLinkState": _link_state(links),
               "nvmlDeviceGetNvLinkVersion": lambda h, link: version,
               "nvmlDeviceGetNvLinkRemotePciInfo": lambda h, link: type("P", (), {"busId": b"00000000:C8:00.0"})(),
               "nvmlDeviceGetNvLinkRemoteDeviceType": lambda h, link: 2}  # NVML_NVLINK_DEVICE_TYPE_SWITCH
    for name, func in answers.items():
        monkeypatch.setattr(pynvml, name, func)


def _link_state(links: int):
    def state(h: Any, link: int) -> int:
        if link >= links:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1
    return state


def test_an_nvlink_pair_is_judged_against_nvlink_not_pcie(tmp_path, monkeypatch):
    _fake_nvlink(monkeypatch)
    links = pp.nvml_nvlinks(2, nv=pynvml)
    assert len(links["0"]) == 18 and links["0"][0] == {"link": 0, "active": True, "version": 4,
                                                        "remote": "00000000:C8:00.0", "remote_type": "switch"}
    found, _ = _with_copy(tmp_path, _copies(40.0), nvlinks=links)
    x = found["gpu.p2p.copy"]
    # 40 GB/s is most of a PCIe Gen5 x16 link, but 9% of 18 NVLink 4 links through the NVSwitch
    assert x.status == "warn" and "9% of its NVLink 4 x18 link (450.0 GB/s)" in x.title


def test_unknown_link_rate_is_not_called_full_speed(tmp_path):
    _, f = facts_for(tmp_path, **PASSTHROUGH)
    nv = two_gpus()
    for g in nv["gpus"]:
        g["pcie"] = {"gen": None, "gen_max": None, "width": None, "width_max": None}
    f["peer_copy"] = _copies(1.3)
    (copy_f,) = [x for x in check_p2p(h200(nvml=nv, p2p=f)) if x.id == "gpu.p2p.copy"]
    assert copy_f.status == "ok" and "speed not judged" in copy_f.title


def test_a_hung_copy_without_iommu_or_acs_is_not_blamed_on_them(tmp_path, monkeypatch):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho '{\"devices\": 2}'\necho '{\"src\": 0, \"dst\": 1, \"can_access\": true, "
                    "\"begin\": true}'\nexec sleep 30\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(pp, "PEER_COPY_TIMEOUT", 2.0)
    copy_ = pp.peer_copy(str(fake), dict(os.environ))
    assert copy_["hung_pair"] == [0, 1]
    no_iommu = {"domain_type": None, "units": (), "cmdline": "quiet"}
    (tmp_path / "off" / "sys" / "class" / "iommu").mkdir(parents=True)  # sysfs readable, no remapping unit
    for case, kw in (("passthrough", {}), ("off", no_iommu), ("unknown", no_iommu)):
        found, facts = _with_copy(tmp_path / case, copy_, **kw)
        assert (facts.of("p2p") or {})["iommu"]["mode"] == case
        x = found["gpu.p2p.copy"]
        assert x.status == "fail"
        assert x.title == ("Peer copy GPU 0 -> GPU 1 hung (killed at the time limit): peer path broken, cause not "
                           "visible")
        assert "does not explain the hang" in x.detail and "nvidia-smi topo -p2p rw" in x.detail
        assert [r.title for r in x.remedies] == ["Workaround: NCCL_P2P_DISABLE=1 (NCCL copies through host memory)"]
        assert branch("diag-p2p-unexplained", facts) and not branch("diag-p2p-iommu", facts)
