"""The node's package manager and package names: one source for every remedy that installs a package.

The distribution is read from ``/etc/os-release`` (``ID``, ``ID_LIKE``, ``VERSION_ID``, as
``layers.toolchain.probe_toolchain.read_os_release`` records it). Package names differ per family: the C++ compiler is
``g++`` on Debian/Ubuntu and ``gcc-c++`` on RHEL and SUSE; Python 3.11's headers are ``python3.11-dev``,
``python3.11-devel`` and ``python311-devel``.

Sources of the names: NVIDIA's CUDA installation guide (``cuda-toolkit-X-Y`` and ``cuda-drivers-<branch>``
from NVIDIA's repository on apt, dnf and zypper alike), the Fabric Manager user guide
(``nvidia-fabricmanager-<branch>=<version>`` on apt, ``nvidia-fabric-manager-<version>`` on dnf; zypper
pins with ``name=version``), Ubuntu's archive (``nvidia-driver-<branch>``, ``gcc-N``/``g++-N``), Red Hat's
GCC Toolset (``gcc-toolset-N``, enabled with ``source /opt/rh/gcc-toolset-N/enable``; devtoolset-N on
RHEL 7) and openSUSE's ``gccN``/``gccN-c++`` (``/usr/bin/gcc-N``).
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
    "libaio headers": {"apt": "libaio-dev", "dnf": "libaio-devel", "zypper": "libaio-devel", "pacman": "libaio",
                       "apk": "libaio-dev"},
    "ninja": {"apt": "ninja-build", "dnf": "ninja-build", "zypper": "ninja"},
    # pdsh is in EPEL on RHEL and its rebuilds (Fedora has it itself)
    "pdsh": {"apt": "pdsh", "dnf": "pdsh", "zypper": "pdsh", "pacman": "pdsh"},
    "openmpi": {"apt": "openmpi-bin", "dnf": "openmpi", "zypper": "openmpi4", "pacman": "openmpi", "apk": "openmpi"},
    # rdma-core's user space: libibverbs.so.1 and the providers with their /etc/libibverbs.d files (Debian splits
    # them into libibverbs1 and ibverbs-providers; RHEL ships both in libibverbs, the config in rdma-core)
    "rdma verbs": {"apt": "libibverbs1 ibverbs-providers", "dnf": "rdma-core libibverbs"},
}


#: How each manager installs an installed package again or upgrades it (``{}``: the package names). pacman has
#: no partial upgrade (Arch supports only the whole system's, ``-Syu``); apk's ``fix --reinstall`` installs again.
_AGAIN = {
    "apt": {"reinstall": "apt-get install -y --reinstall {}", "upgrade": "apt-get install -y --only-upgrade {}"},
    "zypper": {"reinstall": "zypper install -y --force {}", "upgrade": "zypper update -y {}"},
    "pacman": {"reinstall": "pacman -S --noconfirm {}", "upgrade": "pacman -Syu --noconfirm {}"},
    "apk": {"reinstall": "apk fix --reinstall {}", "upgrade": "apk add --upgrade {}"},
}
#: How each manager removes a package (dnf and yum: ``remove -y``).
_REMOVE = {"apt": "apt-get remove -y {}", "zypper": "zypper remove -y {}", "pacman": "pacman -R --noconfirm {}",
           "apk": "apk del {}"}


@dataclass(frozen=True)
class PackageManager:
    """How this node installs a package: ``family`` (apt | dnf | zypper) and the tool to run."""

    family: str
    tool: str
    label: str

    def install(self, package: str) -> list[str]:
        """The commands (steps) that install ``package`` (one or more names, already shell-quoted)."""
        if self.family == "pacman":
            return [f"pacman -S --noconfirm {package}"]
        if self.family == "apk":
            return [f"apk add {package}"]
        refresh = ["apt-get update"] if self.family == "apt" else []
        return [*refresh, f"{self.tool} install -y {package}"]

    def reinstall(self, package: str) -> list[str]:
        """The commands that install ``package`` again from this distribution's repositories."""
        return self._installed_again("reinstall", package)

    def upgrade(self, package: str) -> list[str]:
        """The commands that upgrade the installed ``package`` only (nothing new is installed)."""
        return self._installed_again("upgrade", package)

    def _installed_again(self, action: str, package: str) -> list[str]:
        """``action`` (reinstall | upgrade) on an installed package, in this manager's own words (apt
        refreshes its lists first)."""
        refresh = ["apt-get update"] if self.family == "apt" else []
        line = _AGAIN.get(self.family, {}).get(action, f"{self.tool} {action} -y {{}}")
        return [*refresh, line.format(package)]

    def remove(self, package: str) -> list[str]:
        return [_REMOVE.get(self.family, f"{self.tool} remove -y {{}}").format(package)]

    def hold(self, packages: str) -> str:
        """The line that keeps upgrades off ``packages``, and the plugin it needs, if any."""
        if self.family == "apt":
            return f"`apt-mark hold {packages}`"
        if self.family == "zypper":
            return f"`zypper addlock {packages}`"
        if self.family == "pacman":
            return f"`IgnorePkg = {packages}` in /etc/pacman.conf"
        if self.family == "apk":
            return f"`apk add` of each of {packages} pinned to its installed version (`name=version`)"
        plugin = "yum-plugin-versionlock" if self.tool == "yum" else "python3-dnf-plugin-versionlock"
        return f"`{self.tool} versionlock add {packages}` (package {plugin})"


APT = PackageManager("apt", "apt-get", "Debian/Ubuntu")
ZYPPER = PackageManager("zypper", "zypper", "SUSE")
PACMAN = PackageManager("pacman", "pacman", "Arch")
APK = PackageManager("apk", "apk", "Alpine")
ARCH = {"arch", "archlinux", "manjaro"}


def _ids(distro: Mapping[str, Any] | None) -> set[str]:
    d = distro or {}
    return {str(d.get("id") or ""), *(str(x) for x in d.get("id_like") or [])} - {""}


def managers(distro: Mapping[str, Any] | None) -> list[PackageManager]:
    """The package manager of this node's distribution; apt and dnf both when the distribution is unknown."""
    ids = _ids(distro)
    major = str((distro or {}).get("version_id") or "").split(".")[0]
    yum = (bool(ids & {"rhel", "centos", "ol"}) and major in ("5", "6", "7")) or ("amzn" in ids and major == "2")
    dnf = PackageManager("dnf", "yum" if yum else "dnf", f"RHEL/Rocky/Fedora, {'yum' if yum else 'dnf'}")
    if ids & DEBIAN:
        return [APT]
    if ids & RHEL:
        return [dnf]
    if ids & SUSE:
        return [ZYPPER]
    return [APT, dnf]


def node_manager(distro: Mapping[str, Any] | None) -> PackageManager | None:
    """The one package manager of this node (also Arch's pacman and Alpine's apk); None when unknown."""
    ids = _ids(distro)
    if ids & ARCH:
        return PACMAN
    if "alpine" in ids:
        return APK
    found = managers(distro)
    return found[0] if len(found) == 1 else None


def managers_of_owner(kind: str | None, distro: Mapping[str, Any] | None) -> list[PackageManager]:
    """The managers that can act on a package the ``kind`` database (dpkg | rpm) owns: apt for dpkg, the
    distribution's dnf or zypper for rpm (dnf when the distribution is unknown)."""
    if kind == "dpkg":
        return [APT]
    if kind == "rpm":
        rpm = [m for m in managers(distro) if m.family in ("dnf", "zypper")]
        return rpm[:1] or [managers(None)[1]]
    return managers(distro)


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


def is_ubuntu(distro: Mapping[str, Any] | None) -> bool:
    return "ubuntu" in _ids(distro)


def nvidia_driver_package(branch: str | int, family: str, ubuntu: bool = False) -> str:
    """The NVIDIA driver of ``branch``: Ubuntu's ``nvidia-driver-<branch>``, elsewhere the
    ``cuda-drivers-<branch>`` meta-package of NVIDIA's CUDA repository."""
    return f"nvidia-driver-{branch}" if family == "apt" and ubuntu else f"cuda-drivers-{branch}"


def kernel_headers_package(release: str, family: str) -> str | None:
    """The headers (build tree) of kernel ``release`` (``uname -r``), which DKMS builds a module against:
    ``linux-headers-<release>`` on Debian/Ubuntu, ``kernel-devel-<release>`` on RHEL-likes,
    ``kernel-<flavour>-devel-<version>`` on SUSE; None where the family names them otherwise."""
    if family == "apt":
        return f"linux-headers-{release}"
    if family == "dnf":
        return f"kernel-devel-{release}"
    if family == "zypper":
        version, _, flavour = release.rpartition("-")
        return f"kernel-{flavour}-devel-{version}" if version and flavour else None
    return None


def cuda_toolkit_package(major: int | None, minor: int | None) -> str:
    """NVIDIA's CUDA toolkit package (``cuda-toolkit-12-4``), the same name on apt, dnf and zypper."""
    return f"cuda-toolkit-{major}-{minor}" if major is not None and minor is not None else "cuda-toolkit"


def fabricmanager_pinned(branch: str, module: str, deb_version: str | None, family: str) -> str:
    """Fabric Manager of exactly the driver's release ``module``: on apt the driver package's own version
    (``nvidia-fabricmanager-550=550.54.15-1``), on dnf ``nvidia-fabric-manager-550.54.15``, on zypper
    ``nvidia-fabric-manager=550.54.15``."""
    if family == "apt":
        return f"nvidia-fabricmanager-{branch}={deb_version or module + '-1'}"
    if family == "zypper":  # zypper's capability syntax: name=edition
        return f"nvidia-fabric-manager={module}"
    return f"nvidia-fabric-manager-{module}"


def cxx_back_end_package(major: int | None, family: str, driver: str = "") -> str:
    """The package that holds GCC's C++ back end (``cc1plus``) for the driver of GCC ``major`` (None: the
    distribution's default GCC): ``g++-N`` on Debian/Ubuntu, ``gccN-c++`` on SUSE, ``gcc-c++`` on RHEL and
    Fedora (``gcc-toolset-N-gcc-c++`` for a driver under ``/opt/rh/gcc-toolset-N``), ``gcc`` on Arch,
    ``g++`` on Alpine."""
    if family == "apt":
        return f"g++-{major}" if major else "g++"
    if family == "zypper":
        return f"gcc{major}-c++" if major else "gcc-c++"
    if family == "dnf":
        for kit in ("gcc-toolset", "devtoolset"):
            marker = f"/opt/rh/{kit}-"
            if driver.startswith(marker):
                return f"{kit}-{driver[len(marker):].split('/')[0]}-gcc-c++"
        return "gcc-c++"
    return "gcc" if family == "pacman" else "g++"


@dataclass(frozen=True)
class VersionedGcc:
    """GCC ``major`` beside the system compiler: the packages to install, the compilers' paths and the
    line that puts them first (empty when the paths alone do)."""

    packages: str
    gcc: str
    gxx: str
    enable: str


def versioned_gcc(major: int, distro: Mapping[str, Any] | None, family: str) -> VersionedGcc | None:
    """How ``family`` installs GCC ``major`` next to the system compiler on this distribution; None where the
    distribution ships no such package (Fedora carries one GCC per release)."""
    if family == "apt":
        return VersionedGcc(f"gcc-{major} g++-{major}", f"/usr/bin/gcc-{major}", f"/usr/bin/g++-{major}", "")
    if family == "zypper":
        return VersionedGcc(f"gcc{major} gcc{major}-c++", f"/usr/bin/gcc-{major}", f"/usr/bin/g++-{major}", "")
    if family == "dnf" and str((distro or {}).get("id") or "") != "fedora":  # Rocky's ID_LIKE names fedora too
        release = str((distro or {}).get("version_id") or "").split(".")[0]
        kit = "devtoolset" if release == "7" else "gcc-toolset"
        root = f"/opt/rh/{kit}-{major}"
        return VersionedGcc(f"{kit}-{major}-gcc {kit}-{major}-gcc-c++", f"{root}/root/usr/bin/gcc",
                            f"{root}/root/usr/bin/g++", f"source {root}/enable")
    return None
