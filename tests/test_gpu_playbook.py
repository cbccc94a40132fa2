"""The gpu-stack playbook: it lints, every node explains itself, and walks over recorded facts end at the
diagnosis each mismatch calls for. And `zdoctor check --json` on this machine reports the GPU part as it is."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from test_gpu_facts import h200_all

from zdoctor.core.registry import load_vocabulary
from zdoctor.core.resources import data_dir
from zdoctor.host import ReplayHost
from zdoctor.layers.gpu import nvml
from zdoctor.walk.engine import Walk
from zdoctor.walk.playbook import load_playbook
from zdoctor.walk.playbook_lint import lint_path

BOOK = data_dir("playbooks") / "gpu-stack.toml"
NO_DRIVER = {"available": False, "error_kind": "library_not_found", "source": None, "count": None, "gpus": [],
             "skipped": "no usable NVIDIA driver: NVML did not initialise (NVML Shared Library Not Found)"}


def walk(**changes: dict[str, Any]) -> list[str]:
    load_vocabulary()
    probes = h200_all()
    probes.update({k: copy.deepcopy(v) for k, v in changes.items()})
    doc = {"format": "zdoctor-snapshot", "version": 1, "probes": {
        n: {"probe": n, "status": "skip" if f.get("skipped") else "ok", "facts": f, "error": f.get("skipped")}
        for n, f in probes.items()}}
    result = Walk(load_playbook(BOOK), ReplayHost(json.loads(json.dumps(doc)))).run()
    assert result.diagnosis == result.path[-1]
    return result.path


def test_lints_clean_and_explains_every_node():
    load_vocabulary()
    assert lint_path(BOOK) == []
    pb = load_playbook(BOOK)
    assert pb.start == "driver"
    for node in pb.nodes.values():
        assert len(node.why) > 20 and len(node.explain) > 80, node.id
        if node.kind == "diagnosis" and node.id != pb.unexplained:  # that end names the symptoms, not a check
            assert node.checks, node.id
    order = ["driver", "gpus", "parts", "runtime", "toolkit", "host-compiler", "nccl", "environment", "limits"]
    assert all(n in pb.nodes for n in order)


def test_the_healthy_h200_walks_every_layer():
    assert walk() == ["driver", "gpus", "parts", "runtime", "toolkit", "host-compiler", "nccl", "environment",
                      "limits", "cuda-lookup", "diag-healthy"]


def test_no_driver_stops_at_the_bottom():
    assert walk(nvml=NO_DRIVER) == ["driver", "diag-no-driver"]
    none = {**h200_all()["nvml"], "count": 0, "gpus": [], "skipped": "no GPU is visible (device count 0)"}
    assert walk(nvml=none) == ["driver", "diag-no-gpu"]


def _var(name: str, fn) -> dict[str, Any]:
    d = copy.deepcopy(h200_all()[name])
    fn(d)
    return d


@pytest.mark.parametrize("changes,end", [
    ({"nvml": lambda d: d["gpus"][0]["ecc"].update(volatile_uncorrected=1)}, ["gpus", "diag-gpu-unhealthy"]),
    ({"nvml": lambda d: d["gpus"][0]["pcie"].update(width=8)}, ["gpus", "diag-pcie"]),
    ({"nvml": lambda d: d["gpus"][0]["processes"].append({"pid": 7, "used_bytes": 1, "type": "compute",
                                                           "name": "python"})}, ["gpus", "diag-gpu-busy"]),
    ({"nvml": lambda d: d.update(cuda_driver=12040, cuda_driver_version="12.4")},
     ["runtime", "remedy-runtime", "diag-driver-runtime"]),
    ({"pyenv": lambda d: d["torch"].update(cuda=None)}, ["runtime", "diag-torch-no-cuda"]),
    ({"cuda_stack": lambda d: d["nvcc"].update(release="12.6")}, ["toolkit", "diag-nvcc-mismatch"]),
    ({"cuda_stack": lambda d: d["cuda_home"].update(headers=False)}, ["toolkit", "diag-no-toolkit"]),
    ({"toolchain": lambda d: d["cuda_host"].update(version="16.1.0", major=16)},
     ["host-compiler", "diag-host-gcc"]),
    ({"nccl": lambda d: d["wheels"].append({"dist": "nvidia-nccl-cu12", "version": "2.21.5", "cuda_major": 12,
                                            "site": "/x", "dist_info": "/x/d", "record_size": 1})},
     ["nccl", "diag-nccl"]),
    ({"gpu_env": lambda d: d["vars"].update(CUDA_VISIBLE_DEVICES="1")}, ["environment", "diag-visible-devices"]),
    ({"gpu_env": lambda d: d["vars"].update(NCCL_ASYNC_ERROR_HANDLING="1")}, ["environment", "diag-deprecated-env"]),
    ({"host_limits": lambda d: d["shm"].update(total=64 * 1024 ** 2)}, ["limits", "diag-shm"]),
    ({"host_limits": lambda d: d["target"].update(memlock_soft_kb=64)}, ["limits", "diag-memlock"]),
    ({"host_limits": lambda d: d["target"].update(nofile_soft=1024)}, ["limits", "diag-nofile"]),
])
def test_each_mismatch_ends_at_its_diagnosis(changes, end):
    path = walk(**{name: _var(name, fn) for name, fn in changes.items()})
    assert path[-len(end):] == end


def test_check_json_reports_the_gpu_part_as_it_is_on_this_machine(cli):
    proc = cli(["check", "--json", "--no-log"], timeout=180)
    assert proc.returncode in (0, 1, 3), proc.stderr
    doc = json.loads(proc.stdout)
    # 3: the default interpreter has no torch here, so the training environment could not be examined
    assert proc.returncode != 3 or doc.get("exit_code") == 3
    found = {f["id"]: f for f in doc["findings"]}
    for fid in ("gpu.driver", "gpu.runtime", "gpu.nccl", "gpu.env.deprecated", "gpu.limits.shm"):
        assert any(k == fid or k.startswith(fid + ".") for k in found), fid
    walked = {p["id"]: p for p in doc["playbooks"]}["gpu-stack"]
    if nvml.collect()["available"]:
        assert found["gpu.driver"]["status"] in ("ok", "warn")
        return
    # a machine without an NVIDIA driver: the GPU part is skipped, and says why
    drv = found["gpu.driver"]
    assert drv["status"] == "skip" and drv["title"] == "NVIDIA driver and GPUs: not checked"
    assert "no usable NVIDIA driver" in drv["detail"] and "libnvidia-ml.so.1" in drv["detail"]
    for fid in ("gpu.pcie", "gpu.health"):
        assert found[fid]["status"] == "skip" and "NVML" in found[fid]["detail"]
    assert found["gpu.runtime"]["status"] == "skip" and found["gpu.runtime"]["detail"]
    assert walked["path"] == ["driver", "diag-no-driver"]
    # the host limits do not need a GPU and are checked anyway
    assert found["gpu.limits.shm"]["status"] in ("ok", "warn", "fail")
