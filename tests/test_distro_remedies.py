"""Every package remedy is written for the node's distribution: read from real os-release files (Fedora 40,
Rocky 9, Ubuntu 22.04, Debian 12, openSUSE Leap 15), each call site's commands use that node's package
manager and package name, never apt on an rpm distribution; and a DeepSpeed release that asks dpkg alone
for libaio is not offered libaio-devel alone on an rpm node."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from zdoctor.core import packages
from zdoctor.core.model import ProbeResult, Remedy
from zdoctor.core.registry import Facts
from zdoctor.layers.driver_parts import check_driverparts as driverparts
from zdoctor.layers.gpu import check_cuda as gcuda
from zdoctor.layers.gpu import cuda
from zdoctor.layers.libraries import check_glibc as glibc
from zdoctor.layers.libraries import check_symbols as symbols
from zdoctor.layers.offload import check_storage as storage
from zdoctor.layers.offload import iotest
from zdoctor.layers.python_env import check_dsrelease as dsrelease
from zdoctor.layers.toolchain.probe_toolchain import read_os_release

OS_RELEASE = Path(__file__).parent / "fixtures" / "os-release"

#: os-release file -> the package tool its remedies must run, and the tools they must never run.
NODES = {
    "fedora-40": "dnf",
    "rocky-9": "dnf",
    "ubuntu-22.04": "apt-get",
    "debian-12": "apt-get",
    "opensuse-leap-15": "zypper",
}
TOOLS = ("apt-get", "apt", "dnf", "yum", "zypper")


def distro(node: str) -> dict[str, Any]:
    return read_os_release(str(OS_RELEASE / node))


def tools_used(remedies: list[Remedy]) -> set[str]:
    """The package tools the remedies' command lines run (first word of each line, or after && / sudo)."""
    used = set()
    for line in (c for r in remedies for c in r.commands):
        for word in re.findall(r"(?:^|&&\s*|sudo\s+)([\w-]+)", line):
            if word in TOOLS:
                used.add(word)
    return used


def facts(**results: dict[str, Any]) -> Facts:
    return Facts({name: ProbeResult(name, facts=f) for name, f in results.items()})


@pytest.mark.parametrize("node", sorted(NODES))
def test_the_os_release_fixtures_are_read_as_the_distribution(node):
    d = distro(node)
    assert d["id"] == {"fedora-40": "fedora", "rocky-9": "rocky", "ubuntu-22.04": "ubuntu", "debian-12": "debian",
                       "opensuse-leap-15": "opensuse-leap"}[node]
    assert d["version_id"]


@pytest.mark.parametrize("node", sorted(NODES))
def test_libaio_install_uses_the_nodes_manager(node):
    got = iotest.libaio_package(iotest.os_release(str(OS_RELEASE / node)))
    assert got == {"apt-get": {"package": "libaio-dev", "install": "apt-get install -y libaio-dev"},
                   "dnf": {"package": "libaio-devel", "install": "dnf install -y libaio-devel"},
                   "zypper": {"package": "libaio-devel", "install": "zypper install -y libaio-devel"}}[NODES[node]]


@pytest.mark.parametrize("node", sorted(NODES))
def test_cuda_toolkit_install_uses_the_nodes_manager(node):
    rems = gcuda._install_toolkit_remedy("12.4", distro(node))
    assert len(rems) == 1 and tools_used(rems) == {NODES[node]}
    assert f"{NODES[node]} install -y cuda-toolkit-12-4" in rems[0].commands
    assert rems[0].commands[-1] == "export CUDA_HOME=/usr/local/cuda-12.4"
    assert cuda.toolkit_install("12.4", distro(node))["package"] == "cuda-toolkit-12-4"


@pytest.mark.parametrize("node", sorted(NODES))
def test_driver_upgrade_uses_the_nodes_manager_and_package(node):
    rems = gcuda._driver_remedy([{"name": "NVIDIA H200"}], distro(node))
    assert len(rems) == 1 and tools_used(rems) == {NODES[node]}
    want = "nvidia-driver-580" if node.startswith("ubuntu") else "cuda-drivers-580"
    assert rems[0].commands[-1] == f"{NODES[node]} install -y {want}"
    # a Kepler GPU keeps its last branch on every distribution
    (kepler,) = gcuda._driver_remedy([{"name": "Tesla K80"}], distro(node))
    assert kepler.commands[-1].endswith("-470") and tools_used([kepler]) == {NODES[node]}


@pytest.mark.parametrize("node,commands", [
    ("ubuntu-22.04", ["apt-get update", "apt-get install -y gcc-12 g++-12", "export CC=/usr/bin/gcc-12",
                      "export CXX=/usr/bin/g++-12"]),
    ("debian-12", ["apt-get update", "apt-get install -y gcc-12 g++-12", "export CC=/usr/bin/gcc-12",
                   "export CXX=/usr/bin/g++-12"]),
    ("rocky-9", ["dnf install -y gcc-toolset-12-gcc gcc-toolset-12-gcc-c++", "source /opt/rh/gcc-toolset-12/enable",
                 "export CC=/opt/rh/gcc-toolset-12/root/usr/bin/gcc",
                 "export CXX=/opt/rh/gcc-toolset-12/root/usr/bin/g++"]),
    ("opensuse-leap-15", ["zypper install -y gcc12 gcc12-c++", "export CC=/usr/bin/gcc-12",
                          "export CXX=/usr/bin/g++-12"]),
])
def test_host_compiler_install_fits_the_distribution(node, commands):
    (rem,) = gcuda._compiler_remedy({"distro": distro(node), "versioned_compilers": []}, 9, 12)
    assert rem.commands == commands and rem.requires_root


def test_fedora_has_no_versioned_gcc_so_no_apt_or_toolset_line_is_offered():
    (rem,) = gcuda._compiler_remedy({"distro": distro("fedora-40"), "versioned_compilers": []}, 9, 12)
    assert tools_used([rem]) == set() and not any("gcc-toolset" in c for c in rem.commands)
    assert rem.commands == ["conda install -y -c conda-forge gcc_linux-64=12 gxx_linux-64=12"]


@pytest.mark.parametrize("node", sorted(NODES))
def test_fabric_manager_is_pinned_to_the_driver_release_with_the_nodes_manager(node):
    dp = {"distro": distro(node),
          "packages": {"installed": [{"name": "nvidia-driver-550", "release": "550.54.15",
                                      "version": "550.54.15-0ubuntu1"}]}}
    (rem,) = driverparts._fm_remedies(dp, "550.54.15")
    assert tools_used([rem]) == {NODES[node]}
    line = next(c for c in rem.commands if " install " in c)
    assert line == {"apt-get": "apt-get install -y nvidia-fabricmanager-550=550.54.15-0ubuntu1",
                    "dnf": "dnf install -y nvidia-fabric-manager-550.54.15",
                    "zypper": "zypper install -y nvidia-fabric-manager=550.54.15"}[NODES[node]]


@pytest.mark.parametrize("node,how", [
    ("ubuntu-22.04", "`apt-mark hold nvidia-driver-550`"),
    ("debian-12", "`apt-mark hold nvidia-driver-550`"),
    ("fedora-40", "`dnf versionlock add nvidia-driver-550`"),
    ("rocky-9", "`dnf versionlock add nvidia-driver-550`"),
    ("opensuse-leap-15", "`zypper addlock nvidia-driver-550`"),
])
def test_driver_hold_advice_uses_the_nodes_manager(node, how):
    manager = "dpkg" if NODES[node] == "apt-get" else "rpm"
    change = {"changes": [{"name": "nvidia-driver-550", "new": "550.127"}]}
    advice = driverparts.hold_advice({"distro": distro(node), "packages": {"manager": manager}}, change)
    assert advice is not None and how in advice


@pytest.mark.parametrize("node", sorted(NODES))
def test_glibc_reinstall_of_an_os_package_uses_the_nodes_manager(node):
    kind = "dpkg" if NODES[node] == "apt-get" else "rpm"
    owners = [{"manager": kind, "name": "libzdbar1", "path": "/usr/lib64/libzdbar.so.1"}]
    rem = glibc._build_remedy(facts(toolchain={"distro": distro(node)}), "libzdbar.so.1", owners)
    assert tools_used([rem]) == {NODES[node]}
    assert rem.commands[-1] == {"apt-get": "apt-get install -y --reinstall libzdbar1",
                                "dnf": "dnf reinstall -y libzdbar1",
                                "zypper": "zypper install -y --force libzdbar1"}[NODES[node]]


@pytest.mark.parametrize("node", sorted(NODES))
def test_library_upgrade_for_a_missing_version_node_uses_the_nodes_manager(node):
    kind = "dpkg" if NODES[node] == "apt-get" else "rpm"
    pkg = {"manager": kind, "name": "libzdbar1", "version": "2.4-1"}
    rems = symbols._package_remedies(pkg, "op.so", "defines ZDBAR_2.5", "libzdbar.so.1", distro(node))
    upgrade = rems[0]
    assert tools_used([upgrade]) == {NODES[node]}
    assert upgrade.commands[-1] == {"apt-get": "apt-get install -y --only-upgrade libzdbar1",
                                    "dnf": "dnf upgrade -y libzdbar1",
                                    "zypper": "zypper update -y libzdbar1"}[NODES[node]]


def test_an_unknown_distribution_gets_one_remedy_per_manager_never_mixed_steps():
    unknown = {"id": "plan9", "id_like": [], "version_id": "4"}
    for rems in (gcuda._install_toolkit_remedy("12.4", unknown), gcuda._driver_remedy([], unknown),
                 gcuda._compiler_remedy({"distro": unknown, "versioned_compilers": []}, 9, 12)):
        assert len(rems) == 2
        assert [tools_used([r]) for r in rems] == [{"apt-get"}, {"dnf"}]


# -- libaio vs a DeepSpeed release whose async_io asks dpkg alone ---------------------------------------------

OLD_RELEASE = {"installed": True, "version": "0.4.0", "location": "/site/deepspeed",
               "rules": {"libaio-detection": {"state": "old", "file": "/site/deepspeed/ops/op_builder/async_io.py"}}}


@pytest.mark.parametrize("node", sorted(NODES))
def test_a_dpkg_only_release_is_not_offered_libaio_devel_alone_on_an_rpm_node(node):
    found = dsrelease.check_release(facts(dsrelease=OLD_RELEASE, toolchain={"distro": distro(node)}))
    f = next(x for x in found if x.id == "pyenv.deepspeed-release.libaio-dpkg")
    first = f.remedies[0]
    if NODES[node] == "apt-get":
        assert first.commands == ["apt-get update", "apt-get install -y libaio-dev"]
        assert "Not offered" not in f.detail
        return
    # installing libaio-devel alone leaves async_io incompatible: the upgrade comes first, as a step
    assert not any(r.commands and r.commands[-1].endswith("install -y libaio-devel") and len(r.commands) == 1
                   for r in f.remedies)
    assert first.commands == ["python -m pip install --upgrade 'deepspeed>=0.4.4'",
                              f"{NODES[node]} install -y libaio-devel"]
    assert "Not offered: installing libaio-devel alone" in f.detail
    assert "this DeepSpeed release only checks dpkg" in f.detail and "jit_load" in f.detail
    assert tools_used(f.remedies) == {NODES[node]}


def test_the_libaio_check_follows_the_release_rule_on_an_rpm_node():
    la = {"ok": False, "runtime": None, "header": None, "dev_library": None, "link_test": {"ran": False},
          **iotest.libaio_package(iotest.os_release(str(OS_RELEASE / "rocky-9"))), "distro": "rocky"}
    plain = storage.check_libaio(facts(storage={"libaio": la}))
    assert plain[0].remedies[0].commands == ["dnf install -y libaio-devel"]
    (f,) = storage.check_libaio(facts(storage={"libaio": la}, dsrelease=OLD_RELEASE,
                                      toolchain={"distro": distro("rocky-9")}))
    assert [r.commands for r in f.remedies] == [["python -m pip install --upgrade 'deepspeed>=0.4.4'",
                                                 "dnf install -y libaio-devel"]]
    assert "Not offered: installing libaio-devel alone" in f.detail


#: The operations each manager documents (pacman(8): -S, -Syu, -R; apk(8): add, del, fix): a command line
#: of zdoctor's for Arch or Alpine starts with one of them, never with a verb the tool does not have.
DOCUMENTED = {"pacman": (r"pacman -S --noconfirm \S", r"pacman -Syu --noconfirm \S", r"pacman -R --noconfirm \S"),
              "apk": (r"apk add \S", r"apk add --upgrade \S", r"apk fix --reinstall \S", r"apk del \S")}


@pytest.mark.parametrize("manager", [packages.PACMAN, packages.APK], ids=lambda m: m.family)
def test_arch_and_alpine_commands_are_their_managers_own(manager):
    lines = [*manager.install("libaio"), *manager.reinstall("glibc"), *manager.upgrade("gcc-libs"),
             *manager.remove("nvidia-utils")]
    for line in lines:
        assert any(re.fullmatch(form + r".*", line) for form in DOCUMENTED[manager.family]), line
    assert not any(f" {verb} -y" in line for line in lines for verb in ("reinstall", "upgrade", "remove"))
    assert "versionlock" not in manager.hold("nvidia-utils")
