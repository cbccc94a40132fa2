"""Findings and remedies of the GPU checks for the healthy H200 and for hand-made variants of it, one per
mismatch: driver vs runtime, nvcc vs torch (DeepSpeed's rule), host GCC vs nvcc, NCCL providers, the
environment, and host limits."""

from __future__ import annotations

import copy
import shlex

import pytest
from test_gpu_facts import SITE, UUID, h200, h200_all, h200_cuda_stack, provider

from zdoctor.core.model import Finding
from zdoctor.core.registry import CHECKS, PREDICATES, load_vocabulary
from zdoctor.layers.gpu import check_cuda as gcuda
from zdoctor.layers.gpu import check_gpu as g
from zdoctor.layers.gpu import check_gpuenv as gpuenv
from zdoctor.layers.gpu import check_limits as glimits
from zdoctor.layers.gpu import check_nccl as gnccl
from zdoctor.layers.gpu import cuda

PY = "/opt/torch/.venv/bin/python3"


def by_id(findings: list[Finding]) -> dict[str, Finding]:
    return {f.id: f for f in findings}


def base(name: str) -> dict:
    return copy.deepcopy(h200_all()[name])


def all_commands(f: Finding) -> list[str]:
    return [c for r in f.remedies for c in r.commands]


def test_registered_vocabulary():
    load_vocabulary()
    for name in ("gpu.driver", "gpu.pcie", "gpu.health", "gpu.runtime", "gpu.toolkit", "gpu.host-compiler",
                 "gpu.nccl", "gpu.env", "gpu.limits"):
        assert name in CHECKS
    assert {"gpu_nvml_unavailable", "gpu_none_visible", "gpu_unhealthy", "gpu_torch_without_cuda"} <= set(PREDICATES)


def test_the_healthy_h200_passes_every_gpu_check():
    facts = h200()
    found: list[Finding] = []
    for name in ("gpu.driver", "gpu.pcie", "gpu.health", "gpu.runtime", "gpu.toolkit", "gpu.host-compiler",
                 "gpu.nccl", "gpu.env", "gpu.limits"):
        found += CHECKS[name].func(facts)
    status = {f.id: f.status for f in found}
    assert set(status.values()) == {"ok"}, status
    f = by_id(found)
    assert f["gpu.driver"].title == "NVIDIA driver 580.159.04 (CUDA up to 13.0), 1 GPU: 1x NVIDIA H200"
    assert "nvidia-smi agrees with NVML" in f["gpu.driver"].detail
    assert f["gpu.runtime"].title == "torch's CUDA 13.0 fits driver 580.159.04 (CUDA 13.0)"
    assert f["gpu.toolkit.nvcc-version"].title == "nvcc 13.0 matches torch's CUDA 13.0"
    assert "GCC <= 15" in f["gpu.host-compiler"].evidence[0].table.rows[0][3]
    # the system libnccl 2.28.3 in ld.so.cache is worth a note, not a warning: torch's RPATH finds its wheel
    assert f["gpu.nccl"].title == "NCCL 2.28.9 as torch's wheel requires (nvidia-nccl-cu13==2.28.9)"
    assert "/lib/x86_64-linux-gnu/libnccl.so.2 (NCCL 2.28.3) is in ld.so.cache" in f["gpu.nccl"].detail
    assert f["gpu.limits.shm"].title == "/dev/shm is 128 GiB"
    for p in ("gpu_unhealthy", "gpu_nvml_unavailable"):
        assert PREDICATES[p].func(facts) is False, p
    for to in ("remedy-runtime", "diag-nvcc-mismatch", "diag-nccl", "diag-shm", "diag-memlock", "diag-pcie",
               "diag-gpu-busy"):
        assert branch(to, facts) is False, to


# -- driver vs runtime -------------------------------------------------------------------------------------


def test_runtime_newer_major_than_driver_fails_with_both_ways_out():
    nv = base("nvml")
    nv.update(driver="550.54.15", cuda_driver=12040, cuda_driver_version="12.4")
    facts = h200(nvml=nv)
    f = by_id(gcuda.check_runtime(facts))["gpu.runtime"]
    assert f.status == "fail"
    assert f.title == "torch needs CUDA 13.0 but driver 550.54.15 supports only CUDA 12.4"
    assert "CUDA driver version is insufficient for CUDA runtime version" in f.detail
    assert "The NVIDIA driver on your system is too old (found version 12040)" in f.detail
    rows = f.evidence[0].table.rows
    assert rows[1] == ["CUDA the driver supports", "nvmlSystemGetCudaDriverVersion_v2", "12.4"]
    assert rows[2][2] == "13.0" and rows[3] == ["torch config 'CUDA Runtime'", "torch.__config__.show()", "13.0"]
    assert f.remedies[0].commands == [f"{PY} -m pip install --upgrade --force-reinstall torch --index-url "
                                      "https://download.pytorch.org/whl/cu124"]
    assert f.remedies[1].requires_root
    assert f.remedies[1].commands == ["apt-get update", "apt-get install -y nvidia-driver-580"]
    assert branch("remedy-runtime", facts)


def test_runtime_newer_minor_warns_and_needs_the_minimum_driver():
    nv = base("nvml")
    nv.update(driver="550.54.15", cuda_driver=12040, cuda_driver_version="12.4")
    py = base("pyenv")
    py["torch"]["cuda"] = "12.8"
    f = by_id(gcuda.check_runtime(h200(nvml=nv, pyenv=py)))["gpu.runtime"]
    assert f.status == "warn" and "minor-version compatibility" in f.detail
    assert "the provided PTX was compiled with an unsupported toolchain" in f.detail
    assert "cu124" in f.remedies[0].commands[0]
    nv["driver"] = "520.61.05"  # older than 525.60.13, the floor for any CUDA 12.x
    f = by_id(gcuda.check_runtime(h200(nvml=nv, pyenv=py)))["gpu.runtime"]
    assert f.status == "fail" and "older than 525.60.13" in f.detail


def test_cpu_torch_on_a_gpu_node_fails_and_points_at_the_matching_index():
    py = base("pyenv")
    py["torch"].update(cuda=None, version="2.11.0+cpu")
    facts = h200(pyenv=py)
    f = by_id(gcuda.check_runtime(facts))["gpu.runtime"]
    assert f.status == "fail" and f.title == "torch is a CPU build on a node with 1 GPU"
    assert f.remedies[0].commands[0].endswith("--index-url https://download.pytorch.org/whl/cu130")
    assert gcuda.gpu_torch_without_cuda(facts)
    assert by_id(gcuda.check_toolkit(facts))["gpu.toolkit"].status == "skip"


def test_runtime_skips_say_why():
    nv = {"skipped": "no usable NVIDIA driver: NVML did not initialise", "source": None, "gpus": []}
    f = by_id(gcuda.check_runtime(h200(nvml=nv)))["gpu.runtime"]
    assert f.status == "skip" and "driver's CUDA version is unknown" in f.detail and "NVML did not" in f.detail
    py = base("pyenv")
    py["torch"] = {"installed": False}
    f = by_id(gcuda.check_runtime(h200(pyenv=py)))["gpu.runtime"]
    assert f.status == "skip" and f.detail == f"torch is not installed in {PY}"


def test_failed_import_still_reads_the_wheel_tag():
    py = base("pyenv")
    py["torch"]["import"] = {"state": "failed", "error_line": "ImportError: libcudnn.so.9: cannot open"}
    py["torch"]["dist_version"] = "2.11.0+cu130"
    tc = gcuda.torch_cuda(h200(pyenv=py))
    assert tc["state"] == "import_failed" and tc["cuda"] == "13.0" and tc["source"] == "wheel tag +cu130"


# -- nvcc vs torch ------------------------------------------------------------------------------------------


def with_nvcc(release: str, *, env: dict | None = None, ds: bool = True) -> dict:
    cs = h200_cuda_stack()
    cs["nvcc"]["release"] = release
    cs["env"].update(env or {})
    return cs


def ds_pyenv(torch_cuda: str = "13.0", installed: bool = True) -> dict:
    py = base("pyenv")
    py["torch"]["cuda"] = torch_cuda
    py["deepspeed"] = {"installed": installed, "version": "0.19.8", "prebuilt_ops": []}
    return py


def test_nvcc_mismatch_fails_with_deepspeeds_exact_message_and_remedies():
    cs = with_nvcc("12.4")
    facts = h200(cuda_stack=cs, pyenv=ds_pyenv("13.0"))
    f = by_id(gcuda.check_toolkit(facts))["gpu.toolkit.nvcc-version"]
    assert f.status == "fail"
    assert ("Installed CUDA version 12.4 does not match the version torch was compiled with 13.0, unable to "
            "compile cuda/cpp extensions without a matching cuda version.") in f.detail
    assert ("The detected CUDA version (12.4) mismatches the version that was used to compilePyTorch (13.0)"
            in f.detail)
    assert f.evidence[0].table.highlight == [1, 2]
    # the installed 13.0 toolkit is offered first, then installing the package matching torch
    assert f.remedies[0].commands == ["export CUDA_HOME=/usr/local/cuda-13.0",
                                      'export PATH=/usr/local/cuda-13.0/bin:"$PATH"']
    assert f.remedies[1].commands == ["apt-get update", "apt-get install -y cuda-toolkit-13-0",
                                      "export CUDA_HOME=/usr/local/cuda-13.0"]
    assert f.remedies[1].requires_root
    assert branch("diag-nvcc-mismatch", facts)


def test_nvcc_rules_accept_listed_minors_and_honour_ds_skip():
    f = by_id(gcuda.check_toolkit(h200(cuda_stack=with_nvcc("12.4"), pyenv=ds_pyenv("12.1"))))
    v = f["gpu.toolkit.nvcc-version"]
    assert v.status == "ok" and "accepting this combination" in v.detail and "minor version mismatch" in v.detail
    # 12.7 is not in DeepSpeed's list (there is no CUDA 12.7 toolkit), 13.x has no list at all
    assert cuda.deepspeed_nvcc_rule("12.9", "12.7", {})["verdict"] == "mismatch"
    assert cuda.deepspeed_nvcc_rule("13.1", "13.0", {})["verdict"] == "mismatch"
    assert cuda.torch_nvcc_rule("13.1", "13.0")["verdict"] == "minor"
    skipped = with_nvcc("12.4", env={"DS_SKIP_CUDA_CHECK": "1"})
    v = by_id(gcuda.check_toolkit(h200(cuda_stack=skipped, pyenv=ds_pyenv("13.0"))))["gpu.toolkit.nvcc-version"]
    assert v.status == "warn" and "Detected `DS_SKIP_CUDA_CHECK=1`" in v.detail
    # without DeepSpeed the same mismatch is a warning (torch itself refuses only another major)
    v = by_id(gcuda.check_toolkit(h200(cuda_stack=with_nvcc("12.4"), pyenv=ds_pyenv("13.0", False))))
    assert v["gpu.toolkit.nvcc-version"].status == "warn"


def test_no_toolkit_at_all():
    cs = h200_cuda_stack()
    cs["cuda_home"] = {"path": None, "source": None, "nvcc": None, "headers": False, "exists": False}
    cs["nvcc"] = {"path": None, "exists": False, "release": None, "build": None, "error": None}
    cs["toolkits"] = []
    facts = h200(cuda_stack=cs, pyenv=ds_pyenv())
    f = by_id(gcuda.check_toolkit(facts))
    home = f["gpu.toolkit.cuda-home"]
    assert home.status == "warn" and "CUDA_HOME does not exist, unable to compile CUDA op(s)" in home.detail
    assert "cpu_adam and async_io are C++ ops" in home.detail
    assert home.remedies[0].commands[1] == "apt-get install -y cuda-toolkit-13-0"
    assert f["gpu.toolkit.nvcc-version"].status == "skip"
    assert branch("diag-no-toolkit", facts)


# -- host compiler ------------------------------------------------------------------------------------------


def test_gcc_newer_than_nvcc_accepts_fails_with_nvccs_error_and_an_installed_older_gcc():
    cs = with_nvcc("12.8")
    cs["versioned_compilers"] = [{"major": 12, "gcc": "/usr/bin/gcc-12", "gxx": "/usr/bin/g++-12"},
                                 {"major": 14, "gcc": "/usr/bin/gcc-14", "gxx": "/usr/bin/g++-14"},
                                 {"major": 15, "gcc": "/usr/bin/gcc-15", "gxx": "/usr/bin/g++-15"}]
    tc = base("toolchain")
    tc["cuda_host"].update(version="15.1.0", major=15, path="/usr/bin/gcc")
    tc["jit"].update(version="15.1.0", major=15)
    facts = h200(cuda_stack=cs, toolchain=tc, pyenv=ds_pyenv("12.8"))
    f = by_id(gcuda.check_host_compiler(facts))["gpu.host-compiler"]
    assert f.status == "fail"
    assert "#error -- unsupported GNU version! gcc versions later than 14 are not supported!" in f.detail
    assert ("The current installed version of c++ (15.1.0) is greater than the maximum required version by CUDA "
            "12.8. Please make sure to use an adequate version of c++ (>=6.0.0, <15.0).") in f.detail
    assert f.evidence[0].table.highlight == [0, 1]
    assert f.remedies[0].commands == ["export CC=/usr/bin/gcc-14", "export CXX=/usr/bin/g++-14"]
    assert branch("diag-host-gcc", facts)


def test_host_config_from_the_toolkit_wins_over_the_table():
    cs = h200_cuda_stack()
    cs["host_config"] = {"path": "/usr/local/cuda/include/crt/host_config.h", "gcc_max": 12, "gcc_min": None,
                         "error_line": "#error -- unsupported GNU version! gcc versions later than 12 are not "
                                       "supported! (custom)", "error": None}
    f = by_id(gcuda.check_host_compiler(h200(cuda_stack=cs)))["gpu.host-compiler"]
    assert f.status == "fail" and "(custom)" in f.detail and "#if __GNUC__ > 12" in f.detail
    assert f.remedies[0].requires_root and f.remedies[0].commands[1] == "apt-get install -y gcc-12 g++-12"
    tc = base("toolchain")
    tc["jit"]["version"] = "16.0.1"  # outside torch's table too, but the check is switched off
    cs["env"]["TORCH_DONT_CHECK_COMPILER_ABI"] = "1"
    f = by_id(gcuda.check_host_compiler(h200(cuda_stack=cs, toolchain=tc)))["gpu.host-compiler"]
    assert "torch does not check" in f.evidence[0].table.rows[1][4]


def test_host_config_parser_and_table():
    text = ("#if defined(__GNUC__)\n\n#if __GNUC__ > 15\n\n#error -- unsupported GNU version! gcc versions later "
            "than 15 are not supported! The nvcc flag '-allow-unsupported-compiler' can be used.\n\n#endif\n")
    hc = cuda.parse_host_config(text)
    assert hc["gcc_max"] == 15 and hc["error_line"].startswith("#error -- unsupported GNU version!")
    assert cuda.gcc_max_for("12.6") == (13, "NVIDIA's host-compiler table for CUDA 12.6")
    assert cuda.gcc_max_for("13.2")[0] == 15 and "newer than the table" in cuda.gcc_max_for("13.2")[1]


# -- NCCL ---------------------------------------------------------------------------------------------------


def test_two_nccl_wheels_keep_torchs_and_reinstall_it():
    nf = base("nccl")
    nf["wheels"].append({"dist": "nvidia-nccl-cu12", "version": "2.21.5", "cuda_major": 12, "site": SITE,
                         "dist_info": "x", "record_size": 2})
    facts = h200(nccl=nf)
    f = by_id(gnccl.check_nccl(facts))["gpu.nccl"]
    assert f.status == "warn" and "nvidia-nccl-cu13==2.28.9, nvidia-nccl-cu12==2.21.5" in f.detail
    assert "undefined symbol: ncclCommRegister" in f.detail
    assert all_commands(f) == [f"{PY} -m pip uninstall -y nvidia-nccl-cu12",
                               f"{PY} -m pip install --force-reinstall --no-deps nvidia-nccl-cu13==2.28.9"]
    assert branch("diag-nccl", facts)


def test_older_nccl_loaded_than_torch_requires_fails():
    nf = base("nccl")
    nf["providers"][0].update(version="2.18.1", loaded=True)
    nf["torch_nccl"] = "2.18.1"
    f = by_id(gnccl.check_nccl(h200(nccl=nf)))["gpu.nccl"]
    assert f.status == "fail" and "torch uses NCCL 2.18.1 but its wheel requires nvidia-nccl-cu13==2.28.9" in f.detail
    assert all_commands(f) == [f"{PY} -m pip install --force-reinstall --no-deps nvidia-nccl-cu13==2.28.9"]


def test_preloaded_and_ld_library_path_nccl():
    nf = base("nccl")
    nf["providers"].insert(0, provider("/opt/nccl 2.18/lib/libnccl.so.2", "ld_library_path", "2.18.3"))
    nf["providers"].insert(0, provider("/usr/lib/x86_64-linux-gnu/libnccl.so.2", "preload", "2.28.3"))
    nf["env"] = {"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64:/opt/nccl 2.18/lib:/usr/local/nvidia/lib",
                 "LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libnccl.so.2 /opt/my lib/libtcmalloc.so"}
    f = by_id(gnccl.check_nccl(h200(nccl=nf)))["gpu.nccl"]
    assert f.status == "warn"
    assert "LD_LIBRARY_PATH entry" not in f.title and "provides NCCL 2.18.3" in f.detail
    cmds = all_commands(f)
    assert "export LD_PRELOAD='/opt/my lib/libtcmalloc.so'" in cmds
    assert "export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/nvidia/lib" in cmds


def test_nccl_symbol_error_at_import_fails():
    nf = base("nccl")
    nf["import_error_nccl"] = ("ImportError: .../libtorch_cuda.so: undefined symbol: ncclCommRegister")
    f = by_id(gnccl.check_nccl(h200(nccl=nf)))["gpu.nccl"]
    assert f.status == "fail" and "undefined symbol: ncclCommRegister" in f.detail


def test_nccl_skip_for_cpu_torch():
    f = by_id(gnccl.check_nccl(h200(nccl={"skipped": "torch 2.13.0+cpu is a CPU build (torch.version.cuda is None): "
                                                "it uses no NCCL"})))["gpu.nccl"]
    assert f.status == "skip" and "CPU build" in f.detail


# -- environment --------------------------------------------------------------------------------------------


def gpu_env(**vars_: str) -> dict:
    return {"vars": dict(vars_), "gpus_per_node": None, "nodes": None}


def test_deprecated_nccl_names_are_renamed_with_quoted_values():
    facts = h200(gpu_env=gpu_env(NCCL_ASYNC_ERROR_HANDLING="1", NCCL_BLOCKING_WAIT="1 ; rm -rf /",
                                 TORCH_NCCL_BLOCKING_WAIT="0"))
    f = by_id(gpuenv.check_env(facts))["gpu.env.deprecated"]
    assert f.status == "warn"
    assert f.remedies[0].commands == ["export TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "unset NCCL_ASYNC_ERROR_HANDLING",
                                      "unset NCCL_BLOCKING_WAIT"]
    rows = f.evidence[0].table.rows
    assert rows[1][4] == "ignored (the new name wins)" and rows[1][1] == "1 ; rm -rf /"
    assert branch("diag-deprecated-env", facts)
    f = by_id(gpuenv.check_env(h200(gpu_env=gpu_env(NCCL_DESYNC_DEBUG="a b"))))["gpu.env.deprecated"]
    assert f.remedies[0].commands[0] == "export TORCH_NCCL_DESYNC_DEBUG=" + shlex.quote("a b")


def test_nccl_debug_advice():
    f = by_id(gpuenv.check_env(h200()))["gpu.env.nccl-debug"]
    assert f.status == "ok" and f.remedies[0].commands == ["export NCCL_DEBUG=INFO",
                                                           "export NCCL_DEBUG_SUBSYS=INIT,NET,GRAPH"]
    f = by_id(gpuenv.check_env(h200(gpu_env=gpu_env(NCCL_DEBUG="TRACE"))))["gpu.env.nccl-debug"]
    assert f.status == "warn" and "huge logs" in f.detail
    f = by_id(gpuenv.check_env(h200(gpu_env=gpu_env(NCCL_DEBUG="info"))))["gpu.env.nccl-debug"]
    assert f.status == "ok" and "NCCL_DEBUG_FILE" in f.detail and not f.remedies


def eight(name: str) -> dict:
    nv = base("nvml")
    one = nv["gpus"][0]
    nv["gpus"] = [dict(copy.deepcopy(one), index=i, name=name, uuid=f"GPU-{i:08x}-aaaa") for i in range(8)]
    nv["count"] = 8
    return nv


def test_consumer_gpus_get_the_p2p_workaround_and_datacenter_gpus_keep_p2p():
    facts = h200(nvml=eight("NVIDIA GeForce RTX 4090"))
    f = by_id(gpuenv.check_env(facts))["gpu.env.p2p"]
    assert f.status == "warn" and f.remedies[0].commands == ["export NCCL_P2P_DISABLE=1"]
    assert branch("diag-p2p", facts)
    f = by_id(gpuenv.check_env(h200(nvml=eight("NVIDIA H200"), gpu_env=gpu_env(NCCL_P2P_DISABLE="1"))))["gpu.env.p2p"]
    assert f.status == "warn" and f.remedies[0].commands == ["unset NCCL_P2P_DISABLE"]
    assert by_id(gpuenv.check_env(h200()))["gpu.env.p2p"].status == "ok"  # one GPU


@pytest.mark.parametrize("value,status,words", [
    ("0,9,1", "warn", "entry '9' is invalid (there is no GPU 9 (this node has 8: 0-7)). CUDA keeps only the "
                      "devices listed before the first invalid entry (0), and drops 1 silently."),
    ("", "fail", "set to an empty string"),
    ("9", "fail", "no GPU is visible"),
    ("0,0", "warn", "GPU 0 is listed twice"),
    ("GPU-00000003", "ok", "1 of 8 GPUs visible"),
    ("GPU-ffff", "fail", "no GPU has this UUID"),
    ("-1", "fail", "hides every GPU"),
])
def test_cuda_visible_devices(value, status, words):
    facts = h200(nvml=eight("NVIDIA H100 80GB HBM3"), gpu_env=gpu_env(CUDA_VISIBLE_DEVICES=value))
    f = by_id(gpuenv.check_env(facts))["gpu.env.visible-devices"]
    assert f.status == status and words in f.detail
    assert branch("diag-visible-devices", facts) == (status != "ok")
    if status != "ok":
        assert f.remedies[0].commands == ["unset CUDA_VISIBLE_DEVICES"]


def test_visible_devices_against_the_jobs_gpus_per_node_and_the_h200_uuid():
    env = {"vars": {"CUDA_VISIBLE_DEVICES": UUID[:12]}, "gpus_per_node": 1, "nodes": 1}
    assert by_id(gpuenv.check_env(h200(gpu_env=env)))["gpu.env.visible-devices"].status == "ok"
    env = {"vars": {"CUDA_VISIBLE_DEVICES": "0,1"}, "gpus_per_node": 8, "nodes": 1}
    f = by_id(gpuenv.check_env(h200(nvml=eight("NVIDIA H200"), gpu_env=env)))["gpu.env.visible-devices"]
    assert f.status == "fail" and "expects 8 GPUs per node but only 2 are visible" in f.detail


def test_launch_blocking():
    f = by_id(gpuenv.check_env(h200(gpu_env=gpu_env(CUDA_LAUNCH_BLOCKING="1"))))["gpu.env.launch-blocking"]
    assert f.status == "warn" and f.remedies[0].commands == ["unset CUDA_LAUNCH_BLOCKING"]
    assert "gpu.env.launch-blocking" not in by_id(gpuenv.check_env(h200()))


# -- host limits --------------------------------------------------------------------------------------------


def limits_with(**target) -> dict:
    lf = base("host_limits")
    lf["target"].update(target)
    return lf


def test_dockers_64mb_shm_fails_on_a_multi_gpu_node():
    lf = base("host_limits")
    lf["shm"].update(total=64 * 1024 ** 2, free=64 * 1024 ** 2)
    lf["container"] = {"in_container": True, "kind": "docker", "clues": ["/.dockerenv exists"]}
    facts = h200(host_limits=lf, nvml=eight("NVIDIA H200"))
    f = by_id(glimits.check_limits(facts))["gpu.limits.shm"]
    assert f.status == "fail" and f.title == "/dev/shm is only 64 MiB" and "(docker's default)" in f.detail
    assert "--shm-size=16g" in f.remedies[0].commands[0] and "--ipc=host" in f.remedies[0].commands[0]
    assert f.remedies[1].commands == ["export NCCL_SHM_DISABLE=1"]
    assert branch("diag-shm", facts)
    lf["container"] = {"in_container": False, "kind": None, "clues": []}
    f = by_id(glimits.check_limits(h200(host_limits=lf)))["gpu.limits.shm"]
    assert f.status == "warn"  # one GPU: no intra-node NCCL traffic
    assert f.remedies[0].commands == ["mount -o remount,size=16G /dev/shm"] and f.remedies[0].requires_root


def test_memlock_limit_and_its_remedies():
    facts = h200(host_limits=limits_with(memlock_soft_kb=64, memlock_hard_kb="unlimited"))
    f = by_id(glimits.check_limits(facts))["gpu.limits.memlock"]
    assert f.status == "warn" and "64 KiB" in f.title and "0.19.5" in f.detail
    assert f.remedies[0].commands == ["ulimit -l unlimited"]
    # A new drop-in through the careful create (a recording without the folder's names: the default name,
    # and the first line stops if it is taken), never a tee over a file of that name.
    drop_in = f.remedies[1]
    assert drop_in.action == {"kind": "file-create", "path": "/etc/security/limits.d/90-zdoctor-memlock.conf",
                              "text": "# Written by zdoctor: memlock for every PAM login.\n* - memlock unlimited\n",
                              "check": "limits.conf"}
    assert drop_in.commands[0].startswith("test ! -e /etc/security/limits.d/90-zdoctor-memlock.conf")
    assert not any("tee" in c for c in drop_in.commands)
    assert drop_in.requires_root and "memlock=-1:-1" in drop_in.explanation
    assert branch("diag-memlock", facts)
    f = by_id(glimits.check_limits(h200(host_limits=limits_with(memlock_soft_kb=64, memlock_hard_kb=64))))
    assert [r.action["path"] for r in f["gpu.limits.memlock"].remedies] == [
        "/etc/security/limits.d/90-zdoctor-memlock.conf"]


def test_nofile_limit():
    f = by_id(glimits.check_limits(h200(host_limits=limits_with(nofile_soft=1024, nofile_hard=1048576))))
    assert f["gpu.limits.nofile"].status == "warn"
    assert f["gpu.limits.nofile"].remedies[0].commands == ["ulimit -n 65536"]
    f = by_id(glimits.check_limits(h200(host_limits=limits_with(nofile_soft=1024, nofile_hard=4096))))
    assert f["gpu.limits.nofile"].remedies[0].commands == ["ulimit -n 4096"]


# -- health -------------------------------------------------------------------------------------------------


def test_uncorrectable_ecc_and_prohibited_compute_fail():
    nv = base("nvml")
    nv["gpus"][0]["ecc"].update(volatile_uncorrected=3)
    nv["gpus"][0]["compute_mode"] = "prohibited"
    facts = h200(nvml=nv)
    f = by_id(g.check_health(facts))
    assert f["gpu.health.ecc"].status == "fail" and f["gpu.health.ecc"].remedies[0].commands == ["nvidia-smi -r -i 0"]
    assert f["gpu.health.compute-mode"].status == "fail"
    assert f["gpu.health.compute-mode"].remedies[0].commands == ["nvidia-smi -i 0 -c DEFAULT"]
    assert g.gpu_unhealthy(facts)


def test_persistence_off_and_narrow_link():
    nv = base("nvml")
    nv["gpus"][0].update(persistence=False)
    nv["gpus"][0]["pcie"].update(gen=1, width=4)
    facts = h200(nvml=nv)
    f = by_id(g.check_health(facts))["gpu.health.persistence"]
    assert f.status == "warn" and f.remedies[0].commands == ["nvidia-smi -pm 1"]
    p = by_id(g.check_pcie(facts))["gpu.pcie"]
    assert p.status == "warn" and "width x4 of x16" in p.evidence[0].table.rows[0][5]
    assert p.evidence[0].table.highlight == [0] and branch("diag-pcie", facts)


def test_idle_gen_downshift_is_not_a_finding_but_says_how_to_confirm():
    nv = base("nvml")
    nv["gpus"][0]["pcie"]["gen"] = 1
    p = by_id(g.check_pcie(h200(nvml=nv)))["gpu.pcie"]
    assert p.status == "ok" and "idle GPUs lower the link generation" in p.detail
    assert "--gpu-sample 10" in p.detail
    nv["gpus"][0]["utilization"]["gpu"] = 95
    assert by_id(g.check_pcie(h200(nvml=nv)))["gpu.pcie"].status == "warn"


def test_visible_devices_and_p2p_evidence_tables():
    facts = h200(nvml=eight("NVIDIA GeForce RTX 4090"), gpu_env=gpu_env(CUDA_VISIBLE_DEVICES="0,9,1"))
    f = by_id(gpuenv.check_env(facts))
    t = f["gpu.env.visible-devices"].evidence[0].table
    assert t.rows[:3] == [["0", "visible"], ["9", "there is no GPU 9 (this node has 8: 0-7)"],
                          ["1", "dropped (after the invalid entry)"]]
    assert t.highlight == [1] and len(t.rows) == 3 + 8
    p = f["gpu.env.p2p"].evidence[0].table
    assert p.rows[0] == ["0", "NVIDIA GeForce RTX 4090", "consumer"]
    assert p.rows[-1] == ["NCCL_P2P_DISABLE", "unset", "-"]


def test_pcie_downshift_with_unknown_load_is_not_called_a_fault():
    nv = base("nvml")
    gpu = nv["gpus"][0]
    gpu["pcie"]["gen"] = 3
    gpu["utilization"] = {"gpu": None, "memory": None}
    gpu["throttle"] = {"mask": None, "reasons": []}
    p = by_id(g.check_pcie(h200(nvml=nv)))["gpu.pcie"]
    assert p.status == "ok" and "idle (or of unknown load)" in p.detail
    assert p.evidence[0].table.rows[0][5] == "Gen3 of Gen5 while unknown load"


def test_hostile_paths_stay_one_quoted_word():
    evil = "/opt/my env $(touch /tmp/pwned)/bin/python3"
    py = ds_pyenv("13.0")
    py["target"]["resolved"] = evil
    nf = base("nccl")
    nf["wheels"].append({"dist": "nvidia-nccl-cu12", "version": "2.21.5", "cuda_major": 12, "site": SITE,
                         "dist_info": "x", "record_size": 2})
    cs = with_nvcc("12.4")
    cs["toolkits"][0]["path"] = "/opt/cuda `id`/cuda-13.0"
    facts = h200(pyenv=py, nccl=nf, cuda_stack=cs)
    homes, pips = [], 0
    for f in gnccl.check_nccl(facts) + gcuda.check_toolkit(facts) + gcuda.check_runtime(h200(pyenv={**py, "torch": {
            **py["torch"], "cuda": None}})):
        for cmd in all_commands(f):
            words = shlex.split(cmd)
            assert "$(touch" not in " ".join(w for w in words if w != evil), cmd
            if "pip" in cmd:
                assert words[0] == evil
                pips += 1
            if cmd.startswith("export CUDA_HOME="):
                homes.append(words[1])
    assert pips == 3 and "CUDA_HOME=/opt/cuda `id`/cuda-13.0" in homes


def test_failed_import_without_a_wheel_tag_is_a_skip():
    py = base("pyenv")
    py["torch"]["import"] = {"state": "failed"}
    py["torch"]["dist_version"] = "2.11.0"
    f = by_id(gcuda.check_runtime(h200(pyenv=py)))["gpu.runtime"]
    assert f.status == "skip" and "wheel tag names no CUDA version" in f.detail


def branch(to: str, facts) -> bool:
    """Whether the gpu-stack playbook's edge to ``to`` holds for ``facts`` (its condition, as the walk
    evaluates it)."""
    from zdoctor.walk.engine import Walk
    from zdoctor.walk.playbook import load_all

    edge = next(e for n in load_all()["gpu-stack"].nodes.values() for e in n.next if e.to == to)
    value, error = Walk._condition(edge, facts)
    assert error is None, error
    return value != edge.negate


def test_the_nccl_p2p_setting_and_the_pcie_p2p_check_have_different_titles():
    """gpu.env.p2p judges NCCL_P2P_DISABLE against the GPU models; gpu.p2p (the PCIe path: IOMMU, ACS) says
    "GPU peer-to-peer: ...: not checked" when it cannot look. With no driver both were skipped under the same
    title, two identical lines in one report; the part of gpu.env that could not look is named."""
    nv = {"skipped": "no usable NVIDIA driver: NVML did not initialise", "source": None, "gpus": []}
    env = by_id(gpuenv.check_env(h200(nvml=nv)))["gpu.env.p2p"]
    assert env.status == "skip" and env.title == ("NCCL / CUDA environment of the training (NCCL peer-to-peer "
                                                  "setting for these GPUs): not checked")
    assert by_id(gpuenv.check_env(h200()))["gpu.env.p2p"].title.startswith("NCCL peer-to-peer: ")
