"""Parsers of the GPU stack on the real H200 capture, and the probe facts that capture stands for.

The builders here (``h200_*``, ``facts_of``, ``h200``) turn the recorded files of a real H200 node into the
facts each GPU probe would have produced there; the other GPU tests vary them for each mismatch.
"""

from __future__ import annotations

import copy
import gzip
import json
import re
from pathlib import Path
from typing import Any

from test_cuda_lookup import h200_cudalookup

from zdoctor.core.model import ProbeResult
from zdoctor.core.registry import Facts
from zdoctor.layers.gpu import cuda, envreview, nccl, nvml, smi
from zdoctor.readers import hostlimits as limits
from zdoctor.readers.gccver import parse_torch_config, parse_version_output
from zdoctor.readers.ldcache import lookup, read_ld_so_cache

H200 = Path(__file__).parent / "fixtures" / "gpu-node-h200"
SITE = "/opt/torch/.venv/lib/python3.12/site-packages"
UUID = "GPU-b6c81e45-f0f9-676b-dc11-842f9c19a18e"


def read(name: str) -> str:
    data = (H200 / name).read_bytes()
    return (gzip.decompress(data) if name.endswith(".gz") else data).decode("utf-8", "replace")


def env_txt() -> dict[str, str]:
    return dict(line.split("=", 1) for line in read("env.txt").splitlines() if "=" in line)


def banners() -> dict[str, str]:
    """The gcc, g++ and nvcc --version banners at the end of which.txt."""
    text = read("which.txt")
    out = {}
    for key, start in (("gcc", "gcc ("), ("g++", "g++ ("), ("nvcc", "nvcc: NVIDIA")):
        i = text.index(start)
        out[key] = text[i:text.index("\n\n", i)]
    return out


# -- builders: what each probe found on the H200 --------------------------------------------------------


def h200_nvml() -> dict[str, Any]:
    facts = nvml.from_capture(json.loads(read("nvml.json")))
    xml = smi.parse_smi_xml(read("nvidia-smi-q.xml"))
    facts.update(library={"available": True, "error_kind": None, "error": None}, source="nvml", sampled_s=0.0,
                 smi={"ran": True, "path": "/usr/bin/nvidia-smi", "error": None, "driver": xml["driver"],
                      "cuda_version": xml["cuda_version"], "count": xml["count"],
                      "disagree": smi.cross_check(facts, xml)})
    # fields the dump did not record, from the XML of the same moment
    assert len(facts["gpus"]) == len(xml["gpus"])
    for g, x in zip(facts["gpus"], xml["gpus"]):
        for key in ("ecc", "throttle", "perf_state", "compute_mode", "mig", "power_limit_w"):
            g[key] = x[key]
    return facts


def h200_pyenv() -> dict[str, Any]:
    pj = json.loads(read("python.json"))
    t = pj["torch"]
    return {
        "target": {"requested": pj["executable"], "explicit": True, "resolved": pj["executable"],
                   "realpath": pj["executable"]},
        "error": None, "error_kind": None,
        "python": {"executable": pj["executable"], "version": pj["version"], "prefix": pj["prefix"],
                   "sys_path": ["/usr/lib/python312.zip", "/usr/lib/python3.12", SITE],
                   "sysconfig": {"CC": pj["cc"], "CXX": pj["cxx"]}},
        "env": {k: v for k, v in env_txt().items() if k in ("PATH", "LD_LIBRARY_PATH", "CUDA_HOME")},
        "packages": {},
        "torch": {"installed": True, "dist_version": t["version"], "location": f"{SITE}/torch",
                  "import": {"state": "ok", "seconds": pj["torch_import_s"]}, "version": t["version"],
                  "file": t["file"], "cuda": t["cuda"], "hip": None, "git_version": t["git"], "config": t["config"],
                  "cxx11_abi": t["cxx11_abi"],
                  "cuda_check": {"state": "ok", "available": t["cuda_available"], "device_count": 1,
                                 "cudnn": t["cudnn"], "nccl": t["nccl"]},
                  "mapped_libs": [f"{SITE}/nvidia/nccl/lib/libnccl.so.2"]},
        "deepspeed": {"installed": False},
    }


def _compiler(banner: str, path: str, command: str) -> dict[str, Any]:
    info = parse_version_output(banner)
    return {"value": None, "command": command, "path": path, "realpath": path, "family": info["family"],
            "version": info["version"], "major": info["major"], "vendor": info["vendor"], "source": "default",
            "toolset": None, "error": None}


def h200_toolchain() -> dict[str, Any]:
    b = banners()
    return {"cuda_host": _compiler(b["gcc"], "/usr/bin/gcc", "gcc"),
            "jit": _compiler(b["g++"], "/usr/bin/c++", "c++"), "compilers": [], "distro": {"id": "ubuntu"}}


def h200_cuda_stack() -> dict[str, Any]:
    nv = cuda.parse_nvcc_version(banners()["nvcc"])
    home = cuda.find_cuda_home(env_txt(), exists=lambda p: True, which=lambda n, p: [])
    return {"cuda_home": {**home, "headers": True, "exists": True},
            "nvcc": {"path": home["nvcc"], "exists": True, **nv},
            "nvcc_on_path": ["/usr/local/cuda/bin/nvcc"],
            "host_config": {"path": None, "gcc_max": None, "gcc_min": None, "error_line": None,
                            "error": "not in the capture"},
            "toolkits": [{"path": "/usr/local/cuda-13.0", "realpath": "/usr/local/cuda-13.0", "version": "13.0",
                          "source": "nvcc --version", "nvcc": "/usr/local/cuda-13.0/bin/nvcc", "headers": True}],
            "versioned_compilers": [], "distro": {"id": "ubuntu", "id_like": ["debian"], "version_id": "24.04"},
            "env": {k: v for k, v in env_txt().items() if k in ("CUDA_HOME", "CUDAHOSTCXX")}}


def h200_system_nccl() -> tuple[str, str]:
    """(path ld.so.cache gives for libnccl.so.2, the real file it points at per the capture's file list)."""
    entry = lookup(read_ld_so_cache(str(H200 / "ld.so.cache")), nccl.NCCL_SONAME)
    assert entry is not None
    real = next(line for line in read("libstdcxx-copies.txt").splitlines()
                if nccl.version_from_filename(line) and line.startswith("/usr/lib/"))
    return entry.path, real


def provider(path: str, kind: str, version: str | None, *, loaded: bool = False, dist: str | None = None,
             realpath: str | None = None) -> dict[str, Any]:
    return {"path": path, "realpath": realpath or path, "kind": kind, "via": kind, "size": 1, "version": version,
            "version_source": "test", "dist": dist, "soname": nccl.NCCL_SONAME, "elf_error": None, "loaded": loaded}


def h200_nccl() -> dict[str, Any]:
    cache_path, real = h200_system_nccl()
    pip = re.search(r"nvidia-nccl-cu(\d+)==(\S+)", read("collect_env.txt"))
    assert pip is not None
    dist, ver = f"nvidia-nccl-cu{pip.group(1)}", pip.group(2)
    wheel_lib = f"{read('nccl-path.txt').strip()}/nccl/lib/libnccl.so.2"
    return {"python": h200_pyenv()["target"]["resolved"], "torch_version": "2.11.0+cu130", "torch_cuda": "13.0",
            "torch_nccl": nccl.version_str(json.loads(read("python.json"))["torch"]["nccl"]),
            "torch_nccl_source": "torch.cuda.nccl.version() in the pyenv probe", "torch_nccl_error": None,
            "import_error_nccl": None,
            "providers": [provider(wheel_lib, "pip", ver, loaded=True, dist=dist),
                          provider(cache_path, "system", nccl.version_from_filename(real), realpath=real)],
            "wheels": [{"dist": dist, "version": ver, "cuda_major": int(pip.group(1)), "site": SITE,
                        "dist_info": f"{SITE}/{dist.replace('-', '_')}-{ver}.dist-info", "record_size": 1}],
            "loaded": [wheel_lib], "sites": [SITE],
            "torch_requires": {"dist": dist, "version": ver, "cuda_major": int(pip.group(1)), "metadata": None}}


def h200_gpu_env() -> dict[str, Any]:
    return {"vars": envreview.relevant(env_txt()), "gpus_per_node": None, "nodes": None}


def h200_limits() -> dict[str, Any]:
    df = next(line for line in read("df.txt").splitlines() if line.endswith("/dev/shm")) \
        if (H200 / "df.txt").exists() else "tmpfs tmpfs 134217728 0 134217728 0% /dev/shm"
    total = int(df.split()[2]) * 1024
    mount = limits.parse_mounts(read("mounts.txt"))
    return {"shm": {"path": "/dev/shm", "exists": True, "total": total, "free": total, "fstype": mount["fstype"],
                    "options": mount["options"], "error": None},
            "container": {"in_container": False, "kind": None, "clues": []},
            "target": {**limits.parse_ulimit_a(read("ulimit.txt")), "error": None},
            "own": {}, "gpus_per_node": None, "nodes": None}


def facts_of(**probes: dict[str, Any]) -> Facts:
    """A Facts mapping as the host would give it: a probe whose facts say ``skipped`` has status skip."""
    out = {}
    for name, f in probes.items():
        status = "skip" if f.get("skipped") else "ok"
        out[name] = ProbeResult(probe=name, status=status, facts=json.loads(json.dumps(f)), error=f.get("skipped"))
    return Facts(out)


def h200_p2p() -> dict[str, Any]:
    """The p2p facts of the one-GPU H200: its PCI address from the capture; its sysfs was not captured, so
    the IOMMU state is unknown and no pair exists."""
    from zdoctor.layers.gpu.probe_p2p import collect_p2p

    facts, _ = collect_p2p(h200_nvml()["gpus"], {}, sys_root="/nonexistent-sysfs", cmdline="/nonexistent-cmdline",
                           pairs={}, acs={})
    return facts


def h200_driver_parts() -> dict[str, Any]:
    """The driver's parts as the capture shows them: the loader took libcuda.so.1 and libnvidia-ml.so.1 from
    /usr/local/nvidia/lib64 through LD_LIBRARY_PATH (the LD_DEBUG trace), a squashfs the container runtime
    mounted there (mounts.txt); the module's two files, the real files behind the libraries and the package
    record were not recorded, so their releases are unknown (the module's comes from NVML); one H200 whose
    fabric state is N/A: no NVSwitch."""
    trace = read("ld-debug-torch-cuda.txt.gz")
    lib_dir = "/usr/local/nvidia/lib64"
    assert f"trying file={lib_dir}/libcuda.so.1" in trace and f"trying file={lib_dir}/libnvidia-ml.so.1" in trace
    env = env_txt()
    mount = next(line.split() for line in read("mounts.txt").splitlines() if " /usr/local/nvidia " in line)
    return {"module": {"loaded": True, "proc_version": None, "proc_release": None, "sys_release": None,
                       "release": None, "modules": None, "unload_order": None,
                       "modules_error": "/proc/modules was not recorded",
                       "paths": ["/proc/driver/nvidia/version", "/sys/module/nvidia/version"]},
            "packages": {"manager": None, "source": None, "installed": [], "release": None,
                         "error": "the package record was not recorded"},
            "distro": {"id": "ubuntu", "id_like": ["debian"], "version_id": "24.04"}, "boot_time": None,
            "libraries": {"nvml": {"path": f"{lib_dir}/libnvidia-ml.so.1", "realpath": f"{lib_dir}/libnvidia-ml.so.1",
                                   "release": None},
                          "libcuda": {"name": "libcuda.so.1", "process": "/opt/torch/.venv/bin/python",
                                      "path": f"{lib_dir}/libcuda.so.1", "realpath": f"{lib_dir}/libcuda.so.1",
                                      "release": None, "error": None, "via": "LD_LIBRARY_PATH",
                                      "label": "[LD_LIBRARY_PATH]", "dir": lib_dir, "tried": [],
                                      "cache": "/etc/ld.so.cache", "cache_error": None,
                                      "mount": {"point": mount[1], "fstype": mount[2], "source": mount[0]}},
                          "env": {"LD_LIBRARY_PATH": env.get("LD_LIBRARY_PATH"), "LD_PRELOAD": env.get("LD_PRELOAD")}},
            "mounted": [], "history": {"read": [], "errors": [], "transactions": 0, "last_change": None},
            "fabric": {"nvswitch": [], "unit": None, "unit_error": None, "version": None, "version_source": None,
                       "log_mismatch": None, "log_error": None}}


def h200_all() -> dict[str, dict[str, Any]]:
    return {"nvml": h200_nvml(), "pyenv": h200_pyenv(), "toolchain": h200_toolchain(),
            "cuda_stack": h200_cuda_stack(), "nccl": h200_nccl(), "gpu_env": h200_gpu_env(),
            "host_limits": h200_limits(), "p2p": h200_p2p(), "driver_parts": h200_driver_parts(),
            "cudalookup": h200_cudalookup()}


def h200(**changes: dict[str, Any]) -> Facts:
    """The H200's facts with whole probes replaced."""
    base = h200_all()
    base.update({k: copy.deepcopy(v) for k, v in changes.items()})
    return facts_of(**base)


# -- parsers on the real capture ------------------------------------------------------------------------


def test_smi_xml_of_the_h200():
    d = smi.parse_smi_xml(read("nvidia-smi-q.xml"))
    assert (d["driver"], d["cuda_version"], d["count"]) == ("580.159.04", "13.0", 1)
    g = d["gpus"][0]
    assert g["name"] == "NVIDIA H200" and g["uuid"] == UUID and g["pci_bus_id"] == "00000000:00:06.0"
    assert g["pcie"] == {"gen": 5, "gen_max": 5, "width": 16, "width_max": 16}
    assert g["memory"]["total"] == 143771 * 1024 ** 2 and g["memory"]["used"] == 0
    assert g["ecc"]["current"] is True and g["ecc"]["volatile_uncorrected"] == 0
    assert g["ecc"]["aggregate_corrected"] == 0 and g["ecc"]["remap_pending"] is False
    assert g["persistence"] is True and g["temperature_c"] == 45 and g["perf_state"] == "P0"
    assert g["power_w"] == 94.18 and g["power_limit_w"] == 700.0
    assert g["throttle"]["reasons"] == ["gpu_idle"]  # the one "Active" clock event reason
    assert g["compute_mode"] == "default" and g["mig"] is False and g["processes"] == []


def test_smi_xml_old_layout_and_processes():
    xml = read("nvidia-smi-q.xml")
    old = re.sub(r"<ecc_errors>.*?</ecc_errors>",
                 "<ecc_errors><volatile><single_bit><total>3</total></single_bit><double_bit><total>2</total>"
                 "</double_bit></volatile></ecc_errors>", xml, flags=re.S)
    old = old.replace("clocks_event_reason", "clocks_throttle_reason")
    old = old.replace("<processes>\n\t\t</processes>", "<processes><process_info><pid>4242</pid><type>C</type>"
                      "<process_name>python</process_name><used_memory>81920 MiB</used_memory></process_info>"
                      "</processes>")
    g = smi.parse_smi_xml(old)["gpus"][0]
    assert (g["ecc"]["volatile_uncorrected"], g["ecc"]["volatile_corrected"]) == (2, 3)
    assert g["throttle"]["reasons"] == ["gpu_idle"]
    assert g["processes"] == [{"pid": 4242, "used_bytes": 81920 * 1024 ** 2, "type": "compute", "name": "python"}]


def test_smi_xml_truncated_is_a_clear_error():
    try:
        smi.parse_smi_xml(read("nvidia-smi-q.xml")[:5000])
    except smi.SmiParseError as exc:
        assert "malformed XML" in str(exc)
    else:
        raise AssertionError("truncated XML must not parse")


def test_query_csv_and_banner_of_the_h200():
    rows = smi.parse_query_csv(read("nvidia-smi-query.csv"))
    assert len(rows) == 1
    g = rows[0]
    assert (g["name"], g["uuid"], g["driver"]) == ("NVIDIA H200", UUID, "580.159.04")
    assert g["pcie"] == {"gen": 5, "gen_max": 5, "width": 16, "width_max": 16}
    assert g["memory"]["total"] == 143771 * 1024 ** 2 and g["power_w"] == 129.8
    assert g["ecc"]["current"] is True and g["persistence"] is True
    assert smi.parse_smi_banner(read("nvidia-smi.txt")) == {"driver": "580.159.04", "cuda_version": "13.0"}


def test_nvml_dump_of_the_h200_agrees_with_nvidia_smi():
    f = nvml.from_capture(json.loads(read("nvml.json")))
    assert (f["driver"], f["cuda_driver"], f["cuda_driver_version"]) == ("580.159.04", 13000, "13.0")
    g = f["gpus"][0]
    assert g["uuid"] == UUID and g["memory"]["total"] == 150754820096 and g["power_w"] == 83.3
    assert g["ecc"]["current"] is True and g["persistence"] is True and g["pcie"]["gen_max"] == 5
    assert smi.cross_check(f, smi.parse_smi_xml(read("nvidia-smi-q.xml"))) == []
    other = copy.deepcopy(f)
    other["driver"] = "550.54.15"
    other["gpus"][0]["uuid"] = "GPU-00000000"
    diff = smi.cross_check(other, smi.parse_smi_xml(read("nvidia-smi-q.xml")))
    assert any("driver: NVML 550.54.15, nvidia-smi 580.159.04" in d for d in diff)
    assert any("UUIDs differ" in d for d in diff)


def test_torch_config_of_the_h200_names_its_cuda_runtime():
    t = json.loads(read("python.json"))["torch"]
    cfg = parse_torch_config(t["config"])
    assert cfg["cuda_runtime"] == "13.0" == t["cuda"]
    assert cfg["settings"]["USE_NCCL"] == "1" and cfg["settings"]["CUDA_VERSION"] == "13.0"
    assert nccl.version_str(t["nccl"]) == "2.28.9"


def test_collect_env_of_the_h200():
    ce = cuda.parse_collect_env(read("collect_env.txt"))
    assert ce["torch_version"] == "2.11.0+cu130" and ce["torch_cuda"] == "13.0"
    assert ce["cuda_runtime"] == "13.0.88" and ce["driver"] == "580.159.04"
    assert ce["gcc_version"] == "13.3.0" and ce["cuda_available"] == "True"
    assert ce["packages"]["nvidia-nccl-cu13"] == "2.28.9" and ce["packages"]["torch"] == "2.11.0"
    assert "deepspeed" not in ce["packages"]


def test_readelf_of_nccl_on_the_h200():
    sections = nccl.parse_readelf_dynamic(read("readelf-nccl.txt.gz"))
    lib = [s for s in sections if s["soname"] == "libnccl.so.2"]
    assert len(lib) == 1
    # NCCL carries the CUDA runtime inside: it needs no libcudart (the seed's "NCCL needs a libcudart
    # symbol" is wrong), only the C/C++ runtime.
    assert not any("cudart" in n for n in lib[0]["needed"])
    assert {"libstdc++.so.6", "libc.so.6", "libpthread.so.0"} <= set(lib[0]["needed"])
    heur = next(s for s in sections if s["soname"] == "libcudnn_heuristic.so.9")
    assert heur["runpath"].startswith("$ORIGIN")


def test_nvcc_banner_and_nccl_versions():
    assert cuda.parse_nvcc_version(banners()["nvcc"]) == {"release": "13.0", "build": "V13.0.88", "error": None}
    assert cuda.parse_nvcc_version("nvcc: no release here")["error"]
    path, real = h200_system_nccl()
    assert path == "/lib/x86_64-linux-gnu/libnccl.so.2" and nccl.version_from_filename(real) == "2.28.3"
    assert nccl.version_str(22809) == "2.28.9" and nccl.version_str(2708) == "2.7.8"
    assert nccl.version_str((2, 21, 5)) == "2.21.5" and nccl.version_str("garbage") is None


def test_ulimit_mounts_and_env_of_the_h200():
    lim = limits.parse_ulimit_a(read("ulimit.txt"))
    assert lim["memlock_soft_kb"] == "unlimited" and lim["nofile_soft"] == 20000
    m = limits.parse_mounts(read("mounts.txt"))
    assert m["options"] == "rw,relatime,size=134217728k"  # the last of the two /dev/shm mounts is the live one
    rel = envreview.relevant(env_txt())
    assert rel["NVIDIA_VISIBLE_DEVICES"] == "0" and "PATH" not in rel


def test_builders_are_plain_json():
    for name, f in h200_all().items():
        assert json.loads(json.dumps(f)) == f, name
