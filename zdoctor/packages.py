"""The node's package manager and package names: one source for every remedy that installs a package.

The distribution is read from ``/etc/os-release`` (``ID``, ``ID_LIKE``, ``VERSION_ID``, as
``probes.toolchain.read_os_release`` records it). Package names differ per family: the C++ compiler is
``g++`` on Debian/Ubuntu and ``gcc-c++`` on RHEL and SUSE; Python 3.11's headers are ``python3.11-dev``,
``python3.11-devel`` and ``python311-devel``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEBIAN = {"debian", "ubuntu"}
RHEL = {"rhel", "centos", "fedora", "rocky", "almalinux", "ol", "amzn"}
SUSE = {"suse", "opensuse", "sles", "opensuse-leap", "opensuse-tumbleweed"}

#: Logical package -> name per package family.
NAMES: dict[str, dict[str, str]] = {
    "c++ compiler": {"apt": "g++", "dnf": "gcc-c++", "zypper": "gcc-c++"},
    "libaio headers": {"apt": "libaio-dev", "dnf": "libaio-devel", "zypper": "libaio-devel"},
    "ninja": {"apt": "ninja-build", "dnf": "ninja-build", "zypper": "ninja"},
}


@dataclass(frozen=True)
class PackageManager:
    """How this node installs a package: ``family`` (apt | dnf | zypper) and the tool to run."""

    family: str
    tool: str
    label: str

    def install(self, package: str) -> list[str]:
        """The commands (steps) that install ``package``."""
        refresh = ["apt-get update"] if self.family == "apt" else []
        return [*refresh, f"{self.tool} install -y {package}"]

    def remove(self, package: str) -> list[str]:
        return [f"{self.tool} remove -y {package}"]


APT = PackageManager("apt", "apt-get", "Debian/Ubuntu")
ZYPPER = PackageManager("zypper", "zypper", "SUSE")


def _ids(distro: Mapping[str, Any] | None) -> set[str]:
    d = distro or {}
    return {str(d.get("id") or ""), *(str(x) for x in d.get("id_like") or [])} - {""}


def managers(distro: Mapping[str, Any] | None) -> list[PackageManager]:
    """The package manager of this node's distribution; apt and dnf both when the distribution is unknown."""
    ids = _ids(distro)
    major = str((distro or {}).get("version_id") or "").split(".")[0]
    yum = bool(ids & {"rhel", "centos"}) and major == "7"
    dnf = PackageManager("dnf", "yum" if yum else "dnf", f"RHEL/Rocky/Fedora, {'yum' if yum else 'dnf'}")
    if ids & DEBIAN:
        return [APT]
    if ids & RHEL:
        return [dnf]
    if ids & SUSE:
        return [ZYPPER]
    return [APT, dnf]


def package_name(logical: str, family: str) -> str:
    """The distribution's name for ``logical`` (a key of :data:`NAMES`)."""
    return NAMES[logical][family]


def python_headers_package(version: str, family: str, system_default: bool = False) -> str:
    """The package with Python ``version``'s headers (``3.11``): python3.11-dev, python3.11-devel (or
    python3-devel for RHEL's own python3), python311-devel."""
    if family == "apt":
        return f"python{version}-dev"
    if family == "zypper":
        return f"python{version.replace('.', '')}-devel"
    return "python3-devel" if system_default else f"python{version}-devel"
