"""Driver rules before CUDA 11 and driver advice that keeps the installed GPU's architecture: the H200's
recorded facts with the driver, the GPU model and torch's CUDA edited to the states users report."""

from __future__ import annotations

import copy

from test_gpu_checks import base, by_id
from test_gpu_facts import h200

from zdoctor.layers.gpu import check_cuda as g
from zdoctor.layers.gpu import cuda, drivers


def node(driver: str, cuda_int: int, gpu_name: str, torch_cuda: str):
    nv = base("nvml")
    nv.update(driver=driver, cuda_driver=cuda_int, cuda_driver_version=cuda.cuda_str(cuda_int))
    nv["gpus"] = [dict(copy.deepcopy(nv["gpus"][0]), name=gpu_name)]
    py = base("pyenv")
    py["torch"]["cuda"] = torch_cuda
    return h200(nvml=nv, pyenv=py)


def test_before_cuda_11_a_newer_minor_is_fatal_and_names_its_minimum_driver():
    assert cuda.driver_runtime_verdict("10.1", "10.2")["verdict"] == "too_old"
    assert cuda.driver_runtime_verdict("11.4", "11.8")["verdict"] == "minor"  # compatibility from 11 on
    f = by_id(g.check_runtime(node("418.87.01", 10010, "Tesla V100-SXM2-16GB", "10.2")))["gpu.runtime"]
    assert f.status == "fail"
    assert "no minor-version compatibility" in f.detail and "CUDA 10.2 needs driver >= 440.33" in f.detail


def test_driver_advice_never_drops_a_kepler_gpu():
    f = by_id(g.check_runtime(node("460.106.00", 11020, "Tesla K80", "12.1")))["gpu.runtime"]
    assert f.status == "fail"
    commands = [c for r in f.remedies for c in r.commands]
    assert "apt-get install -y nvidia-driver-470" in commands
    assert not any("driver-5" in c for c in commands)
    drv = next(r for r in f.remedies if "nvidia-driver-470" in r.commands[-1])
    assert "Kepler" in drv.title and "CUDA up to 11.4" in drv.title and "dropped the Kepler" in drv.explanation


def test_volta_keeps_the_580_branch_and_the_table_is_data_with_sources():
    f = by_id(g.check_runtime(node("450.80.02", 11000, "Tesla V100-SXM2-32GB", "12.4")))["gpu.runtime"]
    assert any(r.commands == ["apt-get update", "apt-get install -y nvidia-driver-580"] for r in f.remedies)
    assert drivers.arch_of("NVIDIA GeForce GTX 750 Ti") == "Maxwell"
    assert drivers.arch_of("NVIDIA GeForce GTX 780") == "Kepler"
    assert drivers.arch_of("NVIDIA H200") == "Hopper" and drivers.arch_of("Mystery GPU") is None
    ceil = drivers.driver_ceiling(["Tesla K80", "Tesla P100-PCIE-16GB"])
    assert ceil == {"branch": 470, "arch": "Kepler", "max_cuda": "11.4", "unknown": []}
    assert "Toolkit release notes" in drivers.__doc__ and "580 series will be the last" in drivers.__doc__
