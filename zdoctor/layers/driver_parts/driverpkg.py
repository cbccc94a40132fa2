"""The NVIDIA driver as the package manager records it, and its last change against the boot.

A driver upgraded by the package manager (an unattended upgrade, say) replaces the user-space libraries
at once, while the kernel module already in memory stays the old release until a reboot or a reload:
NVML then refuses to start ("Driver/library version mismatch") and CUDA fails the same way. The record
(``/var/lib/dpkg/status`` or ``rpm -qa``), the history (``/var/log/apt/history.log`` with its rotated
copies, or ``/var/log/dnf.rpm.log``) and the boot time (``btime`` in ``/proc/stat``) say when the driver
changed and whether that was after this boot. Pure parsers of texts a caller read.
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from typing import Any

#: The packages that carry the driver's parts, on Debian/Ubuntu (NVIDIA's and the distribution's names)
#: and on RHEL-like systems (NVIDIA's CUDA repository): the driver, its compute libraries (libcuda,
#: libnvidia-ml), the kernel module, the cuda-drivers meta package and the Fabric Manager.
DRIVER_PACKAGE = re.compile(
    r"^(?:nvidia-driver(?:-[\w.-]+)?|libnvidia-compute-\d+|libnvidia-gl-\d+|nvidia-kernel-(?:common|source)-[\w-]+"
    r"|nvidia-dkms-[\w-]+|linux-modules-nvidia-[\w.-]+|nvidia-utils-\d+(?:-server)?|cuda-drivers(?:-[\w-]+)?"
    r"|nvidia-fabricmanager(?:-\d+)?|nvidia-fabric-manager|cuda-compat-\d+-\d+|kmod-nvidia[\w.-]*"
    r"|nvidia-driver-(?:libs|cuda|cuda-libs|NVML))(?::\w+)?$")
#: A Fabric Manager package (Debian's nvidia-fabricmanager-580, RHEL's nvidia-fabric-manager).
FM_PACKAGE = re.compile(r"^nvidia-fabric-?manager(?:-\d+)?$")
_UPSTREAM = re.compile(r"(?:^|:)(\d+\.\d+(?:\.\d+)?)")


def upstream_version(version: str | None) -> str | None:
    """The driver release inside a package version: ``3:580.95.05-1.el9`` and ``580.95.05-0ubuntu1`` ->
    ``580.95.05``; None when the version names none."""
    m = _UPSTREAM.search(version or "")
    return m.group(1) if m else None


def is_driver_package(name: str) -> bool:
    return bool(DRIVER_PACKAGE.match(name or ""))


def parse_dpkg_status(text: str) -> list[dict[str, Any]]:
    """The installed driver packages in a ``/var/lib/dpkg/status`` text: ``[{name, version, release}]``."""
    out: list[dict[str, Any]] = []
    for stanza in re.split(r"\n\s*\n", text or ""):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line[:1].isspace() or ":" not in line:
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        name = fields.get("package", "")
        if not is_driver_package(name) or "installed" not in fields.get("status", "").split()[-1:]:
            continue
        out.append({"name": name, "version": fields.get("version"), "release": upstream_version(fields.get("version"))})
    return out


#: The ``--qf`` the probe passes to ``rpm -qa``: one ``NAME VERSION`` line per package.
RPM_QUERY_FORMAT = "%{NAME} %{VERSION}-%{RELEASE}\\n"


def parse_rpm_query(text: str) -> list[dict[str, Any]]:
    """The driver packages in ``rpm -qa --qf '%{NAME} %{VERSION}-%{RELEASE}\\n'`` output."""
    out = []
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and is_driver_package(parts[0]):
            out.append({"name": parts[0], "version": parts[1], "release": upstream_version(parts[1])})
    return out


def boot_time(proc_stat: str | None) -> int | None:
    """``btime`` of ``/proc/stat``: the boot, in seconds since the epoch."""
    m = re.search(r"^btime\s+(\d+)\s*$", proc_stat or "", re.MULTILINE)
    return int(m.group(1)) if m else None


_APT_ITEM = re.compile(r"([^\s,()]+) \(([^()]*)\)")


def _local_epoch(text: str) -> float | None:
    """apt's ``2025-01-12  06:25:11`` (the node's local time) as seconds since the epoch."""
    try:
        return time.mktime(time.strptime(" ".join(text.split()), "%Y-%m-%d %H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def parse_apt_history(text: str) -> list[dict[str, Any]]:
    """The transactions of an apt ``history.log`` text, oldest first: ``[{start, when, commandline,
    requested_by, changes: [{action, name, old, new}]}]`` (``when``: seconds since the epoch, local time)."""
    out: list[dict[str, Any]] = []
    for block in re.split(r"\n\s*\n", text or ""):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(": ")
            if sep:
                fields[key.strip()] = value.strip()
        if "Start-Date" not in fields:
            continue
        changes = []
        for action in ("Install", "Upgrade", "Downgrade", "Reinstall", "Remove", "Purge"):
            for name, versions in _APT_ITEM.findall(fields.get(action, "")):
                vs = [v.strip() for v in versions.split(",")]
                vs = [v for v in vs if v != "automatic"]
                old, new = (vs[0], vs[1]) if len(vs) >= 2 else ((vs[0], None) if action in ("Remove", "Purge")
                                                                  else (None, vs[0] if vs else None))
                changes.append({"action": action.lower(), "name": name.split(":")[0], "old": old, "new": new})
        out.append({"start": fields["Start-Date"], "when": _local_epoch(fields["Start-Date"]),
                    "commandline": fields.get("Commandline"), "requested_by": fields.get("Requested-By"),
                    "changes": changes})
    return out


_RPM_LOG = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[+-]\d{4}|Z)?)\s+\S+\s+"
                      r"(?P<action>Upgrade|Install|Downgrade|Reinstall|Erase|Upgraded|Downgraded|Reinstalled|"
                      r"Obsoleted): (?P<nevra>\S+)\s*$")
_NEVRA = re.compile(r"^(?P<name>.+?)-(?:\d+:)?(?P<version>\d[^-]*-[^-]+?)\.(?:x86_64|aarch64|noarch|i686|ppc64le)$")


def _iso_epoch(ts: str) -> float | None:
    """dnf's ``2025-01-12T06:25:11+0000`` as seconds since the epoch (no offset: the node's local time)."""
    text = ts.replace("Z", "+0000")
    try:
        if re.search(r"[+-]\d{4}$", text):
            return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S%z").timestamp()
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def parse_dnf_rpm_log(text: str) -> list[dict[str, Any]]:
    """dnf's ``/var/log/dnf.rpm.log`` as transactions (one per timestamp), oldest first, in the shape of
    :func:`parse_apt_history` (``old`` is the version an ``Upgraded``/``Downgraded`` line names)."""
    by_ts: dict[str, dict[str, Any]] = {}
    for line in (text or "").splitlines():
        m = _RPM_LOG.match(line.strip())
        n = _NEVRA.match(m.group("nevra")) if m else None
        if not m or not n:
            continue
        entry = by_ts.setdefault(m.group("ts"), {"start": m.group("ts"), "when": _iso_epoch(m.group("ts")),
                                                "commandline": None, "requested_by": None, "changes": []})
        action = m.group("action")
        if action in ("Upgraded", "Downgraded", "Reinstalled", "Obsoleted"):
            for c in entry["changes"]:
                if c["name"] == n.group("name") and c["old"] is None:
                    c["old"] = n.group("version")
            continue
        entry["changes"].append({"action": {"Erase": "remove"}.get(action, action.lower()), "name": n.group("name"),
                                 "old": None, "new": None if action == "Erase" else n.group("version")})
    return list(by_ts.values())


def last_driver_change(transactions: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest transaction that changed a driver package: ``{start, when, commandline, requested_by,
    changes}`` with only the driver packages' changes; None when none did."""
    for t in sorted(transactions, key=lambda t: t.get("when") or 0, reverse=True):
        drv = [c for c in t.get("changes") or [] if is_driver_package(c.get("name") or "")]
        if drv:
            return {**t, "changes": drv}
    return None


def installed_release(packages: list[dict[str, Any]]) -> str | None:
    """The driver release the package record says is installed: the compute libraries' (libcuda and
    libnvidia-ml come with them), else the driver package's; None when no such package is installed."""
    for pattern in (r"^libnvidia-compute-\d+", r"^nvidia-driver-(?:cuda-libs|libs)$", r"^nvidia-driver(?:-\d+)?",
                    r"^cuda-drivers"):
        hit = next((p for p in packages if re.match(pattern, p["name"]) and p.get("release")), None)
        if hit:
            return str(hit["release"])
    return None


def fabric_manager_package(packages: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((p for p in packages if FM_PACKAGE.match(p["name"])), None)
