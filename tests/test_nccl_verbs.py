"""InfiniBand inside a container: the ports in sysfs are ACTIVE (recorded real trees), but the verbs library,
its provider or the /dev/infiniband device files are not there for the process. The states are built for real:
a libibverbs.so.1 and an mlx5 provider compiled here with their sonames and rdma-core's symbol versions, the
driver file, real character devices made with mknod, and a private mount namespace (``unshare -m``) whose bind
mounts hide the device files and the library as a container started without them shows them. The real dynamic
loader agrees with zdoctor on whether the library loads, and zdoctor names the cause, the remedy for the image
or the runtime, and explains NCCL's message through the catalogue."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from test_gpu_facts import facts_of
from test_nccl_network import evaluate_check, ib_facts

from zdoctor.layers.nccl_network import check_ibverbs as cv
from zdoctor.layers.nccl_network import verbs
from zdoctor.layers.nccl_network.probe_ibverbs import collect_verbs
from zdoctor.readers.containerdetect import detect
from zdoctor.readers.loader import LoaderConfig
from zdoctor.symptoms.extract import from_text
from zdoctor.symptoms.links import Said, derive

ROOT = Path(__file__).resolve().parent.parent
IB_TREES = ROOT / "tests" / "fixtures" / "infiniband"
PABI = "34"
#: What NCCL prints in each case (its own format strings: src/misc/ibvsymbols.cc, src/transport/net_ib).
NO_LIBRARY = "node1:2001:2001 [0] NCCL INFO Failed to open libibverbs.so[.1]"
NO_DEVICE = "node1:2001:2001 [0] NCCL INFO NET/IB : No device found."
CANNOT_OPEN = "node1:2001:2001 [0] transport/net_ib.cc:426 NCCL WARN NET/IB : Unable to open device mlx5_0"
DLOPEN = "import ctypes, sys\ntry:\n    ctypes.CDLL('libibverbs.so.1')\nexcept OSError as e:\n    sys.exit(str(e))\n"


def _gcc(out: Path, soname: str, source: str, script: str | None = None) -> None:
    src = out.with_suffix(".c")
    src.write_text(source)
    argv = ["gcc", "-shared", "-fPIC", "-o", str(out), str(src), f"-Wl,-soname,{soname}"]
    if script:
        ver = out.with_suffix(".map")
        ver.write_text(script)
        argv.append(f"-Wl,--version-script={ver}")
    subprocess.run(argv, check=True, capture_output=True)


def _node(tmp: Path, *, library: bool = True, provider: bool = True, driver_file: bool = True,
          device_files: bool = True) -> dict[str, Path]:
    """A node's RDMA state under ``tmp``: the recorded HDR sysfs tree (mlx5_0 ACTIVE, mlx5_1 DOWN) with the
    kernel's infiniband_verbs entries, /dev/infiniband, /etc/libibverbs.d and the library directory."""
    sysfs, dev, etc, lib = tmp / "sys", tmp / "dev", tmp / "etc" / "libibverbs.d", tmp / "lib"
    shutil.copytree(IB_TREES / "ib-hdr", sysfs / "class" / "infiniband")
    for n, ibdev in enumerate(("mlx5_0", "mlx5_1")):  # drivers/infiniband/core/uverbs_main.c: ibdev_show
        (sysfs / "class" / "infiniband_verbs" / f"uverbs{n}").mkdir(parents=True)
        (sysfs / "class" / "infiniband_verbs" / f"uverbs{n}" / "ibdev").write_text(ibdev + "\n")
    (dev / "infiniband").mkdir(parents=True)
    if device_files:
        for n in range(2):  # the uverbs character devices: major 231, minors from 192 (ib_uverbs)
            os.mknod(dev / "infiniband" / f"uverbs{n}", 0o20666, os.makedev(231, 192 + n))
    etc.mkdir(parents=True)
    if driver_file:
        (etc / "mlx5.driver").write_text("driver mlx5\n")
    (lib / "libibverbs").mkdir(parents=True)
    if library:
        _gcc(lib / "libibverbs.so.1", "libibverbs.so.1", "int ibv_get_device_list(void) { return 0; }\n"
             "int ibv_x_private(void) { return 0; }\n",
             "IBVERBS_1.1 { global: ibv_get_device_list; local: *; };\n"
             f"IBVERBS_PRIVATE_{PABI} {{ global: ibv_x_private; }};\n")
    if provider:  # as rdma-core installs it: libmlx5.so.1 and the provider directory's link to it
        _gcc(lib / "libmlx5.so.1", "libmlx5.so.1", "int mlx5dv_query_device(void) { return 0; }\n")
        os.symlink("../libmlx5.so.1", lib / "libibverbs" / f"libmlx5-rdmav{PABI}.so")
    return {"sysfs": sysfs, "dev": dev, "etc": etc, "lib": lib}


def _collect(node: dict[str, Path], env: dict[str, str] | None = None) -> tuple[dict, list]:
    env = {"LD_LIBRARY_PATH": str(node["lib"])} if env is None else env
    return collect_verbs(env, sys.executable, sysfs=str(node["sysfs"]), dev=str(node["dev"]),
                         config_dir=str(node["etc"]), loader=LoaderConfig.detect(), extra_provider_dirs=(),
                         root=str(node["sysfs"].parent))


def _real_dlopen(node: dict[str, Path]) -> subprocess.CompletedProcess[str]:
    """The real loader's dlopen of libibverbs.so.1, as NCCL calls it, with the same library path."""
    env = {"PATH": os.environ.get("PATH", ""), "LD_LIBRARY_PATH": str(node["lib"])}
    return subprocess.run([sys.executable, "-c", DLOPEN], env=env, capture_output=True, text=True, timeout=60)


def _check(facts: dict, text: str) -> tuple[object, dict[str, list[str]]]:
    symptoms = from_text(text, "log")
    (f,) = cv.check_verbs(facts_of(ibverbs=facts, symptoms={"symptoms": [s.to_dict() for s in symptoms]}))
    return f, derive(symptoms, [Said(f.id, f.status, tuple(f.explains))])


def _os_release(tmp: Path, distro: str) -> str:
    path = tmp / "os-release"
    path.write_text({"ubuntu": 'ID=ubuntu\nID_LIKE=debian\nVERSION_ID="22.04"\n',
                     "rocky": 'ID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.3"\n'}[distro])
    return str(path)


def test_an_image_without_libibverbs(tmp_path):
    node = _node(tmp_path, library=False, provider=False, driver_file=False)
    assert "libibverbs.so.1" in _real_dlopen(node).stderr  # the real loader cannot open it either
    facts, ev = _collect(node)
    assert [p["kind"] for p in facts["problems"]] == ["libibverbs-missing"]
    assert facts["ports"] == [{"device": "mlx5_0", "port": 1, "link_layer": "InfiniBand"}]  # mlx5_1 is DOWN
    (dockerenv := node["sysfs"].parent / ".dockerenv").write_text("")
    facts["container"] = detect({}, root=str(dockerenv.parent))
    facts["distro"] = {"id": "ubuntu", "id_like": ["debian"], "version_id": "22.04"}
    f, explained = _check(facts, NO_LIBRARY)
    assert f.status == "fail" and f.title == ("The InfiniBand ports are ACTIVE, but libibverbs.so.1 is missing in "
                                              "this docker container")
    assert explained[from_text(NO_LIBRARY, "log")[0].id] == [f.id]
    (rem,) = f.remedies  # Ubuntu: apt only, for the image
    assert rem.title == ("Add the verbs library and its providers to the image (Debian/Ubuntu: libibverbs1 "
                         "ibverbs-providers)")
    assert rem.commands == ["# in the image's Dockerfile: RUN apt-get update && apt-get install -y libibverbs1 "
                            "ibverbs-providers"]
    assert rem.verified is None and rem.note.startswith("not tried, because")


def test_the_library_added_loads_for_real_and_the_check_is_ok(tmp_path):
    node = _node(tmp_path)
    run = _real_dlopen(node)
    assert run.returncode == 0, run.stderr  # what the packages put in place: the real loader opens it
    facts, _ = _collect(node)
    assert facts["problems"] == []
    assert facts["libibverbs"]["path"] == str(node["lib"] / "libibverbs.so.1")
    assert facts["libibverbs"]["via"] == "LD_LIBRARY_PATH" and facts["libibverbs"]["pabi"] == PABI
    assert facts["providers"][0]["path"] == str(node["lib"] / "libibverbs" / f"libmlx5-rdmav{PABI}.so")
    f, explained = _check(facts, NO_DEVICE)
    assert f.status == "ok" and "not tried" in f.detail
    assert explained[from_text(NO_DEVICE, "log")[0].id] == []  # an ok finding explains nothing


def test_a_library_whose_own_dependency_is_missing_does_not_load(tmp_path):
    """rdma-core's libibverbs.so.1 needs libnl-route-3.so.200: an image that copied the library alone has it,
    and it does not load. Built here the same way: the stand-in links a libnl-route-3.so.200, then loses it."""
    node = _node(tmp_path)
    nl = node["lib"] / "libnl-route-3.so.200"
    _gcc(nl, "libnl-route-3.so.200", "int rtnl_link_get_name(void) { return 0; }\n")
    lib = node["lib"] / "libibverbs.so.1"
    src = lib.with_suffix(".c")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src), "-Wl,-soname,libibverbs.so.1",
                    f"-Wl,--version-script={lib.with_suffix('.map')}", "-Wl,--no-as-needed", str(nl)], check=True)
    assert _real_dlopen(node).returncode == 0  # with its dependency, it loads
    nl.unlink()
    real = _real_dlopen(node)
    assert "libnl-route-3.so.200: cannot open shared object file" in real.stderr  # what the real loader says
    facts, _ = _collect(node)
    (p,) = facts["problems"]
    assert p["kind"] == "libibverbs-missing" and p["short"] == "libibverbs.so.1 does not load"
    assert "libnl-route-3.so.200: cannot open shared object file" in p["text"]
    assert facts["libibverbs"]["path"] == str(lib) and facts["libibverbs"]["loads"] is False


def test_a_provider_missing_or_unconfigured_or_built_for_another_abi(tmp_path):
    node = _node(tmp_path / "a", provider=False)
    facts, _ = _collect(node)
    (p,) = facts["problems"]
    assert p["kind"] == "provider-missing" and f"libmlx5-rdmav{PABI}.so" in p["text"]
    facts["distro"] = {"id": "rocky", "id_like": ["rhel"], "version_id": "9.3"}
    f, explained = _check(facts, "libibverbs: Warning: couldn't load driver 'libmlx5-rdmav34.so': "
                                 "libmlx5-rdmav34.so: cannot open shared object file: No such file or directory")
    assert f.status == "fail" and list(explained.values()) == [[f.id]]
    assert [r.commands for r in f.remedies] == [["dnf install -y rdma-core libibverbs"]]  # not a container here
    assert f.remedies[0].requires_root
    node = _node(tmp_path / "b", driver_file=False)
    facts, _ = _collect(node)
    assert [p["kind"] for p in facts["problems"]] == ["provider-unconfigured"]
    # a provider built for another libibverbs ABI is not the one libibverbs loads
    node = _node(tmp_path / "c")
    os.rename(node["lib"] / "libibverbs" / f"libmlx5-rdmav{PABI}.so", node["lib"] / "libibverbs" / "libmlx5-rdmav25.so")
    facts, _ = _collect(node)
    (p,) = facts["problems"]
    assert p["kind"] == "provider-missing" and facts["providers"][0]["others"][0].endswith("libmlx5-rdmav25.so")


def test_device_files_not_passed_in(tmp_path):
    node = _node(tmp_path, device_files=False)
    facts, ev = _collect(node)
    (p,) = facts["problems"]
    assert p["kind"] == "uverbs-missing" and p["files"] == ["uverbs0"]  # mlx5_1's port is down: not needed
    for runtime, titles in (("docker", ["Start the container with the RDMA device files (docker)"]),
                            ("kubernetes", ["Give the pod the RDMA devices (Kubernetes)"])):
        facts["container"] = {"in_container": True, "kind": runtime, "clues": [f"{runtime} sign"]}
        f, explained = _check(facts, CANNOT_OPEN)
        assert f.status == "fail" and [r.title for r in f.remedies] == titles
        assert list(explained.values()) == [[f.id]]
    # a pod on nodes whose runtime is docker: the pod spec decides what is passed in
    (node["sysfs"].parent / ".dockerenv").write_text("")
    facts["container"] = detect({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, root=str(node["sysfs"].parent))
    assert facts["container"]["kind"] == "docker"
    f, _ = _check(facts, CANNOT_OPEN)
    assert [r.title for r in f.remedies] == ["Give the pod the RDMA devices (Kubernetes)"]
    facts["container"] = {"in_container": True, "kind": "docker", "clues": []}
    f, _ = _check(facts, CANNOT_OPEN)
    assert f.remedies[0].commands == ["# add to `docker run`: --device=/dev/infiniband/uverbs0 "
                                      "--device=/dev/infiniband/rdma_cm --cap-add=IPC_LOCK --ulimit memlock=-1:-1"]
    facts["container"] = {"in_container": False, "kind": None, "signs": []}
    f, _ = _check(facts, CANNOT_OPEN)
    assert [r.commands for r in f.remedies] == [["modprobe ib_uverbs"]]


NAMESPACE = textwrap.dedent("""
    import json, subprocess, sys
    from zdoctor.layers.nccl_network.probe_ibverbs import collect_verbs
    from zdoctor.readers.loader import LoaderConfig
    top, empty = sys.argv[1], sys.argv[2]
    # what a container started without --device and from an image without rdma-core shows: the host's sysfs,
    # an empty /dev/infiniband and no verbs library
    for hidden in (top + "/dev/infiniband", top + "/lib"):
        subprocess.run(["mount", "--bind", empty, hidden], check=True)
    facts, _ = collect_verbs({"LD_LIBRARY_PATH": top + "/lib"}, sys.executable, sysfs=top + "/sys",
                             dev=top + "/dev", config_dir=top + "/etc/libibverbs.d", loader=LoaderConfig.detect(),
                             extra_provider_dirs=(), root=top)
    print(json.dumps([p["kind"] for p in facts["problems"]]))
""")


def test_bind_mounts_that_hide_the_devices_and_the_library_as_a_container_does(tmp_path):
    node = _node(tmp_path / "node")
    (empty := tmp_path / "empty").mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    inside = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", NAMESPACE,
                             str(tmp_path / "node"), str(empty)], env=env, capture_output=True, text=True, timeout=120)
    assert inside.returncode == 0, inside.stderr
    assert json.loads(inside.stdout) == ["libibverbs-missing", "uverbs-missing"]
    facts, _ = _collect(node)  # the same tree outside the namespace: nothing hidden
    assert facts["problems"] == []
    assert (node["dev"] / "infiniband" / "uverbs0").is_char_device()


def test_no_active_port_is_not_examined(tmp_path):
    node = _node(tmp_path)
    for d in ("mlx5_0", "mlx5_1"):
        (node["sysfs"] / "class" / "infiniband" / d / "ports" / "1" / "state").write_text("1: DOWN\n")
    facts, ev = _collect(node)
    assert facts["skipped"].startswith("no ACTIVE InfiniBand / RoCE port under") and ev == []
    f, explained = _check(facts, NO_DEVICE)
    assert f.status == "skip" and list(explained.values()) == [[]]
    facts, _ = collect_verbs({}, sys.executable, sysfs=str(tmp_path / "nothing"), dev=str(tmp_path),
                             config_dir=str(tmp_path), loader=LoaderConfig.detect())
    assert facts["skipped"].startswith("no InfiniBand / RoCE device under")


def test_the_provider_of_each_kernel_device_name():
    assert verbs.provider_for("mlx5_3") == "mlx5" and verbs.provider_for("irdma0") == "irdma"
    assert verbs.provider_for("rxe0") == "rxe" and verbs.provider_for("unknown0") is None
    assert verbs.private_abi(["IBVERBS_1.0", "IBVERBS_1.1", "IBVERBS_PRIVATE_34"]) == "34"
    assert verbs.private_abi(["IBVERBS_1.1"]) is None


#: Inside a private mount namespace: this machine's /sys/class kept entry by entry on a fresh tmpfs, and the
#: recorded HDR tree with its infiniband_verbs entries added, as a container on an InfiniBand node sees it.
SYSFS_WITH_IB = textwrap.dedent("""
    set -e
    top=$1; shift
    mkdir -p "$top/orig"
    mount --bind /sys/class "$top/orig"
    mount -t tmpfs none /sys/class
    for d in "$top"/orig/*; do n=$(basename "$d"); mkdir "/sys/class/$n"; mount --bind "$d" "/sys/class/$n"; done
    cp -r "$top/tree/infiniband" "$top/tree/infiniband_verbs" /sys/class/
    # on a machine that has them, hidden as an image without rdma-core and a runtime without --device hide them
    [ -d /dev/infiniband ] && mount -t tmpfs none /dev/infiniband
    for lib in $(/sbin/ldconfig -p | awk '$1 == "libibverbs.so.1" {print $NF}'); do mount --bind /dev/null "$lib"; done
    exec "$@"
""")


def test_the_cli_on_ib_ports_without_the_verbs_library_or_the_devices(tmp_path):
    """The real zdoctor process on ACTIVE ports (the recorded tree in sysfs), without libibverbs.so.1 and
    /dev/infiniband (this machine has neither; one that has them gets them hidden): NCCL's message is explained
    by nccl.verbs, and the two fixes are steps of one."""
    tree = tmp_path / "tree"
    shutil.copytree(IB_TREES / "ib-hdr", tree / "infiniband")
    (tree / "infiniband_verbs" / "uverbs0").mkdir(parents=True)
    (tree / "infiniband_verbs" / "uverbs0" / "ibdev").write_text("mlx5_0\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    run = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", SYSFS_WITH_IB, "sysfs",
                          str(tmp_path), sys.executable, "-m", "zdoctor", "check", "--symptom", NO_LIBRARY,
                          "--playbook", "multinode", "--no-log", "--json"],
                         env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=300,
                         stdin=subprocess.DEVNULL)
    doc = json.loads(run.stdout)
    (sym,) = doc["symptoms"]
    assert sym["signature"] == "nccl.ibverbs-not-loaded" and sym["explained_by"] == ["nccl.verbs"]
    (f,) = [x for x in doc["findings"] if x["id"] == "nccl.verbs"]
    assert f["status"] == "fail" and f["title"].startswith("The InfiniBand ports are ACTIVE, but libibverbs.so.1 "
                                                           "is missing")
    assert "/dev/infiniband/uverbs0 (mlx5_0): not a device file here" in f["detail"]
    assert [r["step"] for r in f["remedies"]] == [True, True]



def test_the_glossary_explains_a_verbs_provider():
    from zdoctor.core.glossary import find_term, load_glossary

    term = find_term(load_glossary(), "verbs provider")
    assert term is not None and "/etc/libibverbs.d" in term.text and "uverbsN" in term.text


def test_no_device_found_is_the_port_down_when_no_port_nccl_may_use_is_up():
    # NCCL_IB_HCA=mlx5_1 selects only the recorded DOWN port: that is NCCL's "No device found"
    (f,) = evaluate_check("nccl.ib", ib_facts("ib-hdr", {"NCCL_IB_HCA": "=mlx5_1"}, log=NO_DEVICE))
    assert f.status == "fail" and len(f.explains) == 1
    # a RoCE v1 GID index is a problem of a port NCCL uses: it is not why NCCL found no device
    (f,) = evaluate_check("nccl.ib", ib_facts("roce-connectx6", {"NCCL_IB_GID_INDEX": "0"}, log=NO_DEVICE))
    assert f.status == "warn" and f.explains == []
