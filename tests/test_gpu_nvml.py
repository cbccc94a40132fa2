"""NVML failures injected at the library boundary (the real pynvml module, its functions replaced), and the
nvml probe's fallbacks: library missing, no device, calls NVML does not support, nvidia-smi in its place."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pynvml
import pytest
from test_gpu_facts import H200, UUID, facts_of, read

from zdoctor.layers.gpu import nvml
from zdoctor.layers.gpu.check_gpu import check_driver, check_health, check_pcie
from zdoctor.layers.gpu.probe_gpu import collect_nvml

CAPTURE = json.loads(read("nvml.json"))


def _raise(code: int):
    def f(*_a: Any, **_k: Any) -> Any:
        raise pynvml.NVMLError(code)
    return f


class _Obj:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def fake_h200(monkeypatch: pytest.MonkeyPatch, *, count: int = 1, unsupported: tuple[str, ...] = (),
              overrides: dict[str, Any] | None = None) -> None:
    """Replace the NVML entry points of the real pynvml with answers taken from the H200 dump."""
    g = CAPTURE["gpus"][0]
    answers: dict[str, Any] = {
        "nvmlInit": lambda: None, "nvmlShutdown": lambda: None,
        "nvmlSystemGetDriverVersion": lambda: CAPTURE["driver"],
        "nvmlSystemGetCudaDriverVersion_v2": lambda: CAPTURE["cuda_driver"],
        "nvmlSystemGetNVMLVersion": lambda: CAPTURE["nvml"],
        "nvmlDeviceGetCount": lambda: count,
        "nvmlDeviceGetHandleByIndex": lambda i: ("h", i),
        "nvmlDeviceGetName": lambda h: g["name"].encode(),  # old bindings return bytes
        "nvmlDeviceGetUUID": lambda h: g["uuid"],
        "nvmlDeviceGetBrand": lambda h: pynvml.NVML_BRAND_NVIDIA,  # the H200's product_brand in nvidia-smi -q
        "nvmlDeviceGetPciInfo": lambda h: _Obj(busId=g["pci"]["busId"]),
        "nvmlDeviceGetMemoryInfo": lambda h: _Obj(**g["memory"]),
        "nvmlDeviceGetUtilizationRates": lambda h: _Obj(**g["util"]),
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: g["pcie_gen"],
        "nvmlDeviceGetMaxPcieLinkGeneration": lambda h: g["pcie_gen_max"],
        "nvmlDeviceGetCurrPcieLinkWidth": lambda h: g["pcie_width"],
        "nvmlDeviceGetMaxPcieLinkWidth": lambda h: g["pcie_width_max"],
        "nvmlDeviceGetEccMode": lambda h: g["ecc"],
        "nvmlDeviceGetTotalEccErrors": lambda h, kind, scope: 0,
        "nvmlDeviceGetRemappedRows": lambda h: (0, 0, 0, 0),
        "nvmlDeviceGetPersistenceMode": lambda h: g["persistence"],
        "nvmlDeviceGetTemperature": lambda h, sensor: g["temp"],
        "nvmlDeviceGetPowerUsage": lambda h: g["power_mw"],
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: 700000,
        "nvmlDeviceGetPerformanceState": lambda h: 0,
        "nvmlDeviceGetComputeMode": lambda h: 0,
        "nvmlDeviceGetMigMode": lambda h: (0, 0),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: 0x1,
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [],
        "nvmlDeviceGetGraphicsRunningProcesses": lambda h: [],
    }
    answers.update(overrides or {})
    for name in unsupported:
        answers[name] = _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
    for name, func in answers.items():
        monkeypatch.setattr(pynvml, name, func)


def no_smi(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has no nvidia-smi."""
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    return {"PATH": str(empty)}


def test_library_missing_is_a_clear_skip(monkeypatch, tmp_path):
    # the real pynvml loader, made to fail the way it does without a driver
    def no_lib(*_a: Any, **_k: Any) -> Any:
        raise OSError("libnvidia-ml.so.1: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "CDLL", no_lib)
    facts = nvml.collect(pynvml)
    assert facts["available"] is False and facts["error_kind"] == "library_not_found"
    assert "libnvidia-ml.so.1" in facts["error"] and facts["gpus"] == []
    full, ev = collect_nvml(no_smi(tmp_path), nv=pynvml)
    assert full["skipped"].startswith("no usable NVIDIA driver") and "nvidia-smi is not on the training PATH" \
        in full["skipped"]
    assert json.loads(json.dumps(full)) == full
    f = check_driver(facts_of(nvml=full))
    assert [(x.id, x.status) for x in f] == [("gpu.driver", "skip")]
    assert "libnvidia-ml.so.1" in f[0].detail
    assert [x.status for x in check_pcie(facts_of(nvml=full))] == ["skip"]
    assert [x.status for x in check_health(facts_of(nvml=full))] == ["skip"]


@pytest.mark.parametrize("code,kind,words", [
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver_not_loaded", "kernel driver is not loaded"),
    (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "driver_mismatch", "Driver/library version mismatch"),
    (pynvml.NVML_ERROR_NO_PERMISSION, "no_permission", "/dev/nvidia"),
])
def test_init_errors_are_named(monkeypatch, code, kind, words):
    monkeypatch.setattr(pynvml, "nvmlInit", _raise(code))
    facts = nvml.collect(pynvml)
    assert facts["available"] is False and facts["error_kind"] == kind and words in facts["error"]


def test_no_device_is_a_skip_naming_the_driver(monkeypatch, tmp_path):
    fake_h200(monkeypatch, count=0)
    facts, _ev = collect_nvml(no_smi(tmp_path), nv=pynvml)
    assert facts["count"] == 0 and facts["source"] == "nvml" and facts["driver"] == "580.159.04"
    assert "no GPU is visible (device count 0)" in facts["skipped"]
    f = check_driver(facts_of(nvml=facts))
    assert f[0].status == "skip" and "580.159.04" in f[0].detail


def test_unsupported_calls_become_fields_not_crashes(monkeypatch, tmp_path):
    fake_h200(monkeypatch, unsupported=("nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetTotalEccErrors",
                                        "nvmlDeviceGetRemappedRows", "nvmlDeviceGetPowerUsage",
                                        "nvmlDeviceGetComputeRunningProcesses"),
              overrides={"nvmlDeviceGetTemperature": _raise(pynvml.NVML_ERROR_UNKNOWN)})
    facts, ev = collect_nvml(no_smi(tmp_path), nv=pynvml)
    g = facts["gpus"][0]
    assert g["name"] == "NVIDIA H200" and g["uuid"] == UUID and g["memory"]["total"] == 150754820096
    assert set(g["not_supported"]) >= {"pcie.gen", "ecc.volatile_uncorrected", "ecc.remapped_rows", "power",
                                      "processes.compute"}
    assert g["pcie"]["gen"] is None and g["pcie"]["width"] == 16 and g["power_w"] is None
    assert "temperature" in g["errors"] and g["temperature_c"] is None
    assert g["throttle"] == {"mask": 1, "reasons": ["gpu_idle"]}
    assert json.loads(json.dumps(facts)) == facts
    fs = facts_of(nvml=facts)
    drv = check_driver(fs)[0]
    assert drv.status == "ok" and "Not supported by this GPU/driver" in drv.detail and "pcie.gen" in drv.detail
    pcie = check_pcie(fs)[0]
    assert pcie.status == "ok" and "not reported for GPU 0" in pcie.detail
    assert {f.id: f.status for f in check_health(fs)}["gpu.health.ecc"] == "ok"


def test_old_bindings_without_clock_event_names(monkeypatch, tmp_path):
    fake_h200(monkeypatch)
    monkeypatch.delattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", lambda h: 0x48, raising=False)
    facts, _ = collect_nvml(no_smi(tmp_path), nv=pynvml)
    assert facts["gpus"][0]["throttle"]["reasons"] == ["hw_slowdown", "hw_thermal_slowdown"]
    th = {f.id: f for f in check_health(facts_of(nvml=facts))}["gpu.health.throttle"]
    assert th.status == "warn" and "hw_thermal_slowdown" in th.evidence[0].table.rows[0][4]


def test_throttle_mask_decoding():
    assert nvml.decode_throttle(None) == []
    assert nvml.decode_throttle(0) == []
    assert nvml.decode_throttle(0x1 | 0x4) == ["gpu_idle", "sw_power_cap"]
    assert nvml.decode_throttle(0x80 | 0x800) == ["hw_power_brake_slowdown", "bit_0x800"]
    assert [nvml.reason_severity(r) for r in ("gpu_idle", "sw_power_cap", "hw_slowdown")] == \
        ["benign", "power", "bad"]


def test_processes_and_sampling(monkeypatch, tmp_path):
    me = os.getpid()
    proc = _Obj(pid=me, usedGpuMemory=80 * 1024 ** 3)
    ticks = iter([0.0, 0.1, 0.6, 1.2, 9.0, 9.0, 9.0])
    gens = iter([1, 4, 4, 4, 4])
    fake_h200(monkeypatch, overrides={"nvmlDeviceGetComputeRunningProcesses": lambda h: [proc],
                                      "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: next(gens, 4),
                                      "nvmlDeviceGetUtilizationRates": lambda h: _Obj(gpu=97, memory=40)})
    facts = nvml.collect(pynvml)
    g = facts["gpus"][0]
    assert g["processes"][0]["pid"] == me and g["processes"][0]["name"] == Path(f"/proc/{me}/comm").read_text().strip()
    nvml.sample(pynvml, facts["gpus"], 1.0, clock=lambda: next(ticks), sleep=lambda s: None)
    s = g["sample"]
    assert s["util_max"] == 97 and s["pcie_gen_min"] == 4 and s["samples"] >= 2
    g["pcie"]["gen_max"] = 5  # under load the link stays at Gen4 of Gen5: a real slowdown
    pcie = check_pcie(facts_of(nvml={**facts, "source": "nvml"}))[0]
    assert pcie.status == "warn" and "while the GPU is busy" in pcie.detail
    held = {f.id: f for f in check_health(facts_of(nvml={**facts, "source": "nvml"}))}["gpu.health.processes"]
    assert held.status == "warn" and held.remedies[0].commands[0] == f"ps -o pid,user,etime,args -p {me}"


def _fake_smi(tmp_path: Path, xml_file: Path | None, csv_text: str = "") -> dict[str, str]:
    """A real executable called nvidia-smi that prints a recorded answer."""
    bindir = tmp_path / "smi-bin"
    bindir.mkdir()
    script = bindir / "nvidia-smi"
    if xml_file is not None:
        body = f'case "$1" in -q) cat {xml_file} ;; *) exit 3 ;; esac\n'
    else:
        csv = tmp_path / "q.csv"
        csv.write_text(csv_text)
        body = f'case "$1" in -q) echo "<nvidia_smi_log><gpu" ;; --query-gpu=*) cat {csv} ;; esac\n'
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bindir}:/usr/bin:/bin"}


def test_nvidia_smi_stands_in_when_nvml_cannot_load(monkeypatch, tmp_path):
    monkeypatch.setattr(pynvml, "nvmlInit", _raise(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    facts, ev = collect_nvml(_fake_smi(tmp_path, H200 / "nvidia-smi-q.xml"), nv=pynvml)
    assert facts["source"] == "nvidia-smi" and "skipped" not in facts
    assert facts["driver"] == "580.159.04" and facts["cuda_driver_version"] == "13.0"
    assert facts["gpus"][0]["uuid"] == UUID and any(e.label == "nvidia-smi -q -x" for e in ev)
    d = check_driver(facts_of(nvml=facts))[0]
    assert d.status == "warn" and "come from nvidia-smi" in d.detail


def test_nvidia_smi_cross_check_and_csv_fallback(monkeypatch, tmp_path):
    fake_h200(monkeypatch, overrides={"nvmlSystemGetDriverVersion": lambda: "575.51.03"})
    facts, _ = collect_nvml(_fake_smi(tmp_path, H200 / "nvidia-smi-q.xml"), nv=pynvml)
    assert facts["smi"]["disagree"] == ["driver: NVML 575.51.03, nvidia-smi 580.159.04"]
    assert check_driver(facts_of(nvml=facts))[0].status == "warn"
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setattr(pynvml, "nvmlInit", _raise(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    facts, ev = collect_nvml(_fake_smi(other, None, read("nvidia-smi-query.csv")), nv=pynvml)
    assert facts["source"] == "nvidia-smi" and facts["driver"] == "580.159.04" and facts["count"] == 1
    assert [e.label for e in ev][-2:] == ["nvidia-smi -q -x", "nvidia-smi --query-gpu"]


def test_the_real_library_on_this_machine():
    """Whatever this machine has: NVML either answers or says why not; never an exception."""
    facts = nvml.collect()
    if facts["available"]:
        assert isinstance(facts["count"], int) and facts["driver"]
    else:
        assert facts["error_kind"] and facts["error"]
        with pytest.raises(pynvml.NVMLError):
            pynvml.nvmlInit()  # the same failure, straight from pynvml
