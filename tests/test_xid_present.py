"""A drastic remedy only on present facts: an Xid record is checked against the node now (the NVIDIA module
loaded or not, the record's PCI device on the bus and its link, the record's boot, the driver release's
known bugs) before a GPU reset, a reboot or an RMA is recommended.

The records come from a recorded /dev/kmsg dump read through the real probe (nothing is written into this
machine's kernel log); the bus is this machine's real /sys/bus/pci/devices, or a tree built from the H200
capture's recorded PCI facts where the record's GPU must be present.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

from test_gpu_facts import facts_of, h200_all, h200_nvml
from test_kernel_log import _walk

from zdoctor.core.model import Remedy
from zdoctor.core.present import option_label, recommendation, remedy_flags
from zdoctor.layers.driver_parts.probe_driverparts import collect_module
from zdoctor.layers.kernel_log.check_kernlog import check_api_mismatch, check_xid
from zdoctor.layers.kernel_log.probe_kernlog import collect
from zdoctor.layers.kernel_log.xids import DRIVER_FAULTS, driver_fault
from zdoctor.readers.pcipresent import PCI_DEVICES, pci_device
from zdoctor.report.docwriter import write_remedy
from zdoctor.report.export import MarkdownWriter
from zdoctor.report.htmlreport import HtmlWriter
from zdoctor.report.reportdoc import remedy_items

#: A PCI domain no machine has (0x00ff): the record names a device this node lacks.
ABSENT_BUS = "00ff:e1:00"
H200_BUS = "0000:00:06"  # the H200 capture's NVML bus id 00000000:00:06.0
#: PCIe generation -> the speed sysfs writes in current_link_speed (PCI Express base specifications).
GEN_SPEED = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe"}


def kmsg_dump(tmp_path: Path, *texts: str) -> str:
    """Records in /dev/kmsg's own format (``level,seq,usec,flags;text``), as a recorded dump to read."""
    dump = tmp_path / "kmsg.txt"
    dump.write_text("".join(f"3,{i},{1_000_000 + i},-;{t}\n" for i, t in enumerate(texts, 1)))
    return str(dump)


def xid_line(bus: str, number: int, text: str) -> str:
    return f"NVRM: Xid (PCI:{bus}): {number}, pid='<unknown>', name=<unknown>, {text}"


def h200_bus_tree(tmp_path: Path, **changes: str) -> str:
    """A sysfs-like tree with the H200 at its recorded address, vendor and link (tests/fixtures/gpu-node-h200/
    nvml.json: pciDeviceId's low 16 bits are the vendor; pcie_gen and pcie_width, current and max)."""
    [raw] = json.loads((Path(__file__).parent / "fixtures" / "gpu-node-h200" / "nvml.json").read_text())["gpus"]
    dev = tmp_path / "devices" / raw["pci"]["busIdLegacy"].lower()
    dev.mkdir(parents=True)
    files = {"vendor": f"0x{raw['pci']['pciDeviceId'] & 0xFFFF:04x}",
             "current_link_speed": GEN_SPEED[raw["pcie_gen"]], "max_link_speed": GEN_SPEED[raw["pcie_gen_max"]],
             "current_link_width": str(raw["pcie_width"]), "max_link_width": str(raw["pcie_width_max"])}
    files.update(changes)
    for name, value in files.items():
        (dev / name).write_text(value + "\n")
    return str(tmp_path / "devices")


def no_module(tmp_path: Path) -> dict[str, Any]:
    """The driver parts' module facts of a node with no NVIDIA module: this machine's own where it has none,
    else read from paths that do not exist (the same reader, the same answer)."""
    if os.path.exists("/sys/module/nvidia") or os.path.exists("/proc/driver/nvidia/version"):
        module = collect_module(str(tmp_path / "no-proc-version"), str(tmp_path / "no-sys-version"))
    else:
        module = collect_module()
    assert module["loaded"] is False
    return {"module": module, "distro": {"id": "ubuntu", "version_id": "22.04"},
            "skipped": "no NVIDIA kernel module loaded (/proc/driver/nvidia/version absent)"}


def now_of(kl: dict[str, Any], bus: str) -> dict[str, Any]:
    [dev] = [d for d in kl["devices_now"] if d["bus_address"] == bus]
    return dev


def h200_with(driver_release: str | None = None) -> dict[str, dict[str, Any]]:
    probes = h200_all()
    if driver_release:
        probes["driver_parts"] = copy.deepcopy(probes["driver_parts"])
        probes["driver_parts"]["module"]["release"] = driver_release
        probes["driver_parts"]["distro"] = {"id": "ubuntu", "id_like": ["debian"], "version_id": "22.04"}
    return probes


def test_an_xid_79_for_a_bus_this_node_lacks_with_no_module_loaded_is_no_reboot(tmp_path):
    assert not os.path.exists(os.path.join(PCI_DEVICES, f"{ABSENT_BUS}.0"))
    kl, _ = collect(kmsg=kmsg_dump(tmp_path, xid_line(ABSENT_BUS, 79, "GPU has fallen off the bus.")))
    assert now_of(kl, ABSENT_BUS)["present"] is False and kl["boot"] == "this boot"
    probes = {"kernel_log": kl, "driver_parts": no_module(tmp_path),
              "nvml": {"skipped": "NVML did not start: Driver Not Loaded"}}
    [f] = check_xid(facts_of(**probes))
    # the finding names both facts, and is not a node-failing verdict
    assert f.status == "warn" and "does not support" in f.title
    assert "the NVIDIA kernel module is not loaded now" in f.detail
    assert f"no PCI device at {ABSENT_BUS}.0 now" in f.detail
    [now] = [e for e in f.evidence if e.label == "The record vs the node now"]
    verdicts = {row[0].split(": ")[1]: row[3] for row in now.table.rows}
    assert verdicts == {"the record's boot": "agrees", "the NVIDIA kernel module": "contradicts",
                        "the PCI device": "contradicts"}
    # drain/reboot listed, not tried, not recommended because of those facts; no RMA at all
    [reboot] = [r for r in f.remedies if r.title.startswith("Drain the node and reboot")]
    assert reboot.recommended is False and not reboot.tried
    assert reboot.note.startswith("the node's present state does not support the record")
    assert f"no PCI device at {ABSENT_BUS}.0" in reboot.note
    assert not any("RMA" in r.title for r in f.remedies)
    assert all(not r.recommended for r in f.remedies)
    # never labelled recommended, in any renderer; the JSON keeps the flag
    labels = [option_label(i, len(f.remedies), False, r) for i, r in enumerate(f.remedies, 1)]
    assert all(label.endswith("(not recommended)") for label in labels)
    assert recommendation(f.remedies).startswith("None is recommended")
    assert remedy_flags(reboot)[:2] == [f"not recommended, because {reboot.note}", "not tried"]
    recorded = [r.to_dict() for r in f.remedies]
    assert recorded[0]["recommended"] is False and Remedy.from_dict(recorded[0]).recommended is False
    md_writer, html_writer = MarkdownWriter(), HtmlWriter(4000)
    items = remedy_items(recorded, elsewhere=False, titles={})
    write_remedy(items[0], md_writer)
    for item in items:
        write_remedy(item, html_writer)
    md, html = "\n".join(md_writer.lines), "\n".join(html_writer.lines)
    for text in (md, html):
        assert "(not recommended)" in text and "(recommended)" not in text.replace("(not recommended)", "")
        assert "not recommended, because the node&#x27;s present state" in text.replace("'", "&#x27;")
    # the walk ends at the record the node does not support, not at failing hardware
    assert _walk(probes).diagnosis == "diag-xid-not-now"


def test_a_record_whose_device_cannot_be_read_is_not_confirmed(tmp_path):
    unreadable = str(tmp_path / "no-such-bus")
    kl, _ = collect(kmsg=kmsg_dump(tmp_path, xid_line(ABSENT_BUS, 48, "An uncorrectable double bit error.")),
                    pci_root=unreadable)
    assert now_of(kl, ABSENT_BUS)["present"] is None
    [f] = check_xid(facts_of(kernel_log=kl))  # nothing says whether the module is loaded either
    assert f.status == "warn"
    assert f"whether {ABSENT_BUS}.0 is on the PCI bus now was not read" in f.detail
    assert "whether the NVIDIA kernel module is loaded was not read" in f.detail
    assert f.remedies and all(not r.recommended for r in f.remedies)


def test_an_xid_79_whose_h200_is_on_the_bus_keeps_the_drastic_remedy_recommended(tmp_path):
    tree = h200_bus_tree(tmp_path)
    kl, _ = collect(kmsg=kmsg_dump(tmp_path, xid_line(H200_BUS, 79, "GPU has fallen off the bus.")), pci_root=tree)
    dev = now_of(kl, H200_BUS)
    assert dev["present"] is True and dev["vendor"] == "0x10de" and dev["current_link_width"] == "16"
    probes = {**h200_all(), "kernel_log": kl}
    [f] = check_xid(facts_of(**probes))
    assert f.status == "fail" and "does not support" not in f.title
    [now] = [e for e in f.evidence if e.label == "The record vs the node now"]
    assert {row[3] for row in now.table.rows} == {"agrees"}
    assert any("x16 at 32.0 GT/s PCIe of x16 at 32.0 GT/s PCIe (full)" in row[2] for row in now.table.rows)
    assert f.remedies[0].commands == ["nvidia-smi -r -i 0"] and all(r.recommended for r in f.remedies)
    assert option_label(1, len(f.remedies), False, f.remedies[0]) == "Option 1 (recommended)"
    assert any("RMA" in r.title for r in f.remedies)
    assert _walk(probes).diagnosis == "diag-xid-hardware"
    # the same record with the device gone from the bus: no longer recommended
    os.makedirs(tmp_path / "devices-empty")
    gone, _ = collect(kmsg=kmsg_dump(tmp_path, xid_line(H200_BUS, 79, "GPU has fallen off the bus.")),
                      pci_root=str(tmp_path / "devices-empty"))
    [g] = check_xid(facts_of(**{**h200_all(), "kernel_log": gone, "nvml": {"skipped": "GPU is lost"}}))
    assert g.status == "warn" and f"no PCI device at {H200_BUS}.0 now" in g.detail


def test_a_degraded_link_is_told_beside_the_record(tmp_path):
    tree = h200_bus_tree(tmp_path, current_link_width="8", current_link_speed=GEN_SPEED[3])
    kl, _ = collect(kmsg=kmsg_dump(tmp_path, xid_line(H200_BUS, 79, "GPU has fallen off the bus.")), pci_root=tree)
    [f] = check_xid(facts_of(**{**h200_all(), "kernel_log": kl}))
    [now] = [e for e in f.evidence if e.label == "The record vs the node now"]
    assert any("x8 at 8.0 GT/s PCIe of x16 at 32.0 GT/s PCIe (degraded)" in row[2] for row in now.table.rows)


def test_a_gsp_timeout_on_an_affected_525_release_gets_the_driver_update_not_an_rma(tmp_path):
    tree = h200_bus_tree(tmp_path)
    line = xid_line(H200_BUS, 119, "Timeout after 6s of waiting for RPC response from GPU0 GSP!")
    kl, _ = collect(kmsg=kmsg_dump(tmp_path, line), pci_root=tree)
    probes = {**h200_with("525.85.12"), "kernel_log": kl}
    [f] = check_xid(facts_of(**probes))
    assert "a known driver fault" in f.title and "It is the driver's fault, not the GPU's" in f.detail
    first = f.remedies[0]
    assert first.title.startswith("Update the NVIDIA driver to 525.105.17 or newer of branch 525")
    assert first.commands == ["apt-get update", "apt-get install -y --only-upgrade nvidia-driver-525"]
    assert first.recommended and option_label(1, len(f.remedies), False, first) == "Option 1 (recommended)"
    assert not any("RMA" in r.title for r in f.remedies)
    assert _walk(probes).diagnosis == "diag-xid-driver"
    # the fixed release: the same record is the GPU's, with the RMA after a repeat
    fixed = {**h200_with("525.105.17"), "kernel_log": kl}
    [g] = check_xid(facts_of(**fixed))
    assert "driver fault" not in g.title and any("RMA" in r.title for r in g.remedies)
    assert _walk(fixed).diagnosis == "diag-xid-hardware"


def test_application_faults_never_get_a_reboot_or_an_rma(tmp_path):
    lines = [xid_line(H200_BUS, n, "fault") for n in (13, 31, 43)]
    kl, _ = collect(kmsg=kmsg_dump(tmp_path, *lines), pci_root=h200_bus_tree(tmp_path))
    [f] = check_xid(facts_of(**{**h200_all(), "kernel_log": kl}))
    assert f.status == "warn"
    assert [r.title for r in f.remedies] == ["Restart the job; if it faults again, find the failing kernel"]
    assert not any(e.label == "The record vs the node now" for e in f.evidence)


def test_the_driver_fault_table_cites_its_source_and_bounds_the_releases():
    assert all(fault.source and fault.fixed_in.startswith(str(fault.branch)) for fault in DRIVER_FAULTS)
    assert driver_fault(119, "525.85.12") is not None and driver_fault(119, "525.60.13") is not None
    assert driver_fault(119, "525.105.17") is None and driver_fault(119, "535.54.03") is None
    assert driver_fault(119, "520.61.05") is None  # before the 525 branch the bug was not there
    assert driver_fault(79, "525.85.12") is None and driver_fault(119, None) is None
    assert driver_fault(119, "not a release") is None


def test_the_bus_reader_on_a_real_tree_and_on_this_machine(tmp_path):
    tree = h200_bus_tree(tmp_path)
    assert pci_device("0000:00:06.0", tree)["vendor"] == "0x10de"
    assert pci_device("0000:00:07.0", tree)["present"] is False
    assert pci_device("0000:00:06.0", str(tmp_path / "none"))["present"] is None
    real = sorted(os.listdir(PCI_DEVICES))[0]
    assert pci_device(real)["present"] is True and pci_device(real)["vendor"].startswith("0x")
    assert h200_nvml()["gpus"][0]["pci_bus_id"].lower().endswith("00:06.0")


def test_an_api_mismatch_record_on_a_node_with_no_module_loaded_is_no_reboot(tmp_path):
    dump = kmsg_dump(tmp_path, "NVRM: API mismatch: the client has the version 580.159.04, but",
                     "NVRM: this kernel module has the version 575.57.08.  Please")
    kl, _ = collect(kmsg=dump)
    probes = {"kernel_log": kl, "driver_parts": no_module(tmp_path),
              "nvml": {"skipped": "NVML did not start: Driver Not Loaded",
                       "library": {"available": False, "error": "Driver Not Loaded"}}}
    [f] = check_api_mismatch(facts_of(**probes))
    assert f.status == "warn" and "cannot confirm" in f.title
    assert "NVML could not confirm it now: Driver Not Loaded" in f.detail
    assert "the NVIDIA kernel module is not loaded now" in f.detail
    reboot = f.remedies[-1]
    assert reboot.title.startswith("Drain the node and reboot") and not reboot.recommended and not reboot.tried
    assert "the NVIDIA kernel module is not loaded now" in remedy_flags(reboot)[0]


def test_the_guide_labels_the_unsupported_reboot_not_recommended_and_does_not_apply_it(tmp_path):
    from test_tui import SCENARIO, make, name, plain, run, settle
    from test_tui_fixes import remedy_screen

    from zdoctor.walk.practice import get_scenario

    kl, _ = collect(kmsg=kmsg_dump(tmp_path, xid_line(ABSENT_BUS, 79, "GPU has fallen off the bus.")))
    [f] = check_xid(facts_of(kernel_log=kl, driver_parts=no_module(tmp_path)))

    async def scenario() -> None:
        app = make(host=get_scenario(SCENARIO).host(), argv=["tui"], export_dir=tmp_path / "export")
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen")
            app.push_screen(remedy_screen()(app.ctx, "gpu-health", "diag-xid-not-now",
                                            [(f, r) for r in f.remedies]))
            await settle(pilot, lambda: name(app) == "RemedyScreen" and bool(app.screen.query("#rem-title")))
            rs = app.screen
            assert rs.labels and all(label.endswith("(not recommended)") for label in rs.labels)
            assert "None is recommended" in plain(rs.query_one("#rem-title"), width=1000)
            await pilot.press("a")
            await pilot.pause(0.3)
            assert name(app) == "RemedyScreen"  # no confirmation offered: nothing to say yes to
            sid = app.ctx.log.id
        from zdoctor.walk.session import load_events
        assert not [e for e in load_events(sid) if e["type"] in ("remedy_applied", "remedy_confirmed")]

    run(scenario())
