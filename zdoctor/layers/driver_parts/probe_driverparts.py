"""Probe ``driver_parts``: the driver's parts side by side, as this node has them.

- ``module``: the loaded kernel module's release from both files (``/proc/driver/nvidia/version``,
  ``/sys/module/nvidia/version``), the NVIDIA modules of ``/proc/modules`` and their unload order.
- ``libraries``: the libnvidia-ml.so.1 the loader's cache gives, and the libcuda.so.1 the training process
  resolves (the ld.so emulation with the training interpreter and environment: LD_LIBRARY_PATH, the ld
  cache, a compat directory), each with its real file and release; ``mounted``: driver libraries mounted
  onto this file system one by one (what a container runtime does).
- ``packages``: the driver packages the package manager records (dpkg's status file, else ``rpm -qa``);
  ``history``: the newest transaction that changed one (apt's history.log and its rotated copies, dnf's
  rpm log) against ``boot_time`` (``/proc/stat``).
- ``fabric``: only on NVSwitch systems: the Fabric Manager unit's state (``systemctl show``), its release
  (the package record, else ``nv-fabricmanager --version``) and a version mismatch in its log.

No module loaded: ``skipped`` with why (the package record still comes along).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Mapping
from typing import Any

from zdoctor.core.factstypes import DriverPartsFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import probe
from zdoctor.layers.driver_parts import driverpkg, fabricmanager
from zdoctor.layers.gpu.probe_gpu import nvml_library_paths
from zdoctor.layers.toolchain.probe_toolchain import read_os_release
from zdoctor.proc.runner import run, which_all
from zdoctor.proc.target import target_of
from zdoctor.proc.userfile import read_prefix
from zdoctor.readers import kmod
from zdoctor.readers.mounts import mount_for, read_mountinfo
from zdoctor.readers.owner import owner_of

PROC_VERSION = "/proc/driver/nvidia/version"
SYS_VERSION = "/sys/module/nvidia/version"
DPKG_STATUS = "/var/lib/dpkg/status"
APT_HISTORY = "/var/log/apt/history.log"
DNF_RPM_LOG = "/var/log/dnf.rpm.log"
#: Rotated apt logs read (history.log.1.gz ...): enough for months of unattended upgrades.
ROTATED = 6
LOG_CAP = 4 * 1024 * 1024
COMMAND_TIMEOUT = 10.0
#: The unit properties read; LoadState tells "not installed" from "stopped".
UNIT_PROPERTIES = "LoadState,ActiveState,SubState,ExecMainStatus,ExecMainStartTimestamp"
#: Files of the driver's user-space half a container runtime mounts one by one.
DRIVER_LIB_PREFIXES = ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so", "libcudadebugger.so")


def _text(path: str, cap: int = LOG_CAP) -> tuple[str | None, str | None]:
    """(text, error): a plain text file or a gzip one (rotated logs), read capped."""
    try:
        data, _cut = read_prefix(path, cap)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path}: {exc.strerror or exc}"
    if path.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            return None, f"{path}: not a readable gzip file ({exc})"
    return data.decode("utf-8", "replace"), None


def collect_module(proc_version: str = PROC_VERSION, sys_version: str = SYS_VERSION,
                   proc_modules: str = "/proc/modules") -> dict[str, Any]:
    """``loaded``, each file's release, the release, the loaded modules and their unload order."""
    ptext, stext = kmod.read_text(proc_version), kmod.read_text(sys_version)
    mods = kmod.collect(proc_modules=proc_modules, proc_version=proc_version, sys_version=sys_version)
    return {"loaded": ptext is not None or stext is not None,
            "proc_version": (ptext or "").strip().splitlines()[0][:300] if ptext else None,
            "proc_release": kmod.kernel_version(ptext, None), "sys_release": kmod.kernel_version(None, stext),
            "release": kmod.kernel_version(ptext, stext), "modules": mods["modules"],
            "unload_order": mods["unload_order"], "modules_error": mods["modules_error"],
            "paths": [proc_version, sys_version]}


def _library(path: str | None) -> dict[str, Any]:
    real = os.path.realpath(path) if path else None
    return {"path": path, "realpath": real, "release": driverpkg.upstream_version(
        os.path.basename(real or "").partition(".so.")[2]) if real else None}


def resolve_libcuda(executable: str | None, env: dict[str, str]) -> dict[str, Any]:
    """The libcuda.so.1 ``dlopen("libcuda.so.1")`` gives the training process (ld.so emulated)."""
    from zdoctor.readers.loader import LoaderConfig, Process

    if not executable:
        return {"name": "libcuda.so.1", "path": None, "error": "the training interpreter was not found"}
    config = LoaderConfig.detect()
    proc = Process(executable, env, config)
    res = proc.dlopen("libcuda.so.1")
    r = res.resolution
    out: dict[str, Any] = {"name": "libcuda.so.1", "process": executable, "path": None, "error": res.error,
           "via": r.via if r else None, "label": r.label() if r else None, "dir": r.dir if r else None,
           "tried": [c.path + (f" ({c.reason})" if c.reason else "") for c in (r.tried if r else [])][:12],
           "cache": config.cache_path, "cache_error": config.cache_error}
    if r is not None and r.path and not res.error:
        out.update(_library(r.path))
        m = mount_for(out["realpath"], read_mountinfo())
        out["mount"] = {"point": m.point, "fstype": m.fstype, "source": m.source} if m else None
        out["owner"] = owner_of(out["realpath"], env=env)
    return out


def driver_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[dict[str, Any]]:
    """Driver libraries mounted one by one (a container runtime's bind mounts of the host's driver)."""
    return [{"point": m.point, "source": m.source, "root": m.root, "fstype": m.fstype}
            for m in read_mountinfo(mountinfo)
            if os.path.basename(m.point).startswith(DRIVER_LIB_PREFIXES)][:20]


def collect_packages(env: dict[str, str], dpkg_status: str = DPKG_STATUS) -> tuple[dict[str, Any], list[Evidence]]:
    """The driver packages installed: dpkg's status file, else ``rpm -qa`` (shown to run)."""
    text, err = _text(dpkg_status, 32 * 1024 * 1024)
    if text is not None:
        pkgs = driverpkg.parse_dpkg_status(text)
        return {"manager": "dpkg", "source": dpkg_status, "installed": pkgs,
                "release": driverpkg.installed_release(pkgs), "error": None}, []
    rpm = which_all("rpm", env.get("PATH") or os.environ.get("PATH"))
    if not rpm:
        return {"manager": None, "source": None, "installed": [], "release": None,
                "error": err or f"no package record: {dpkg_status} is absent and rpm is not on PATH"}, []
    ev = run([rpm[0], "-qa", "--qf", driverpkg.RPM_QUERY_FORMAT], env=env, timeout=COMMAND_TIMEOUT * 3,
             label="rpm -qa (driver packages)")
    if ev.error or ev.exit_code != 0:
        return {"manager": "rpm", "source": "rpm -qa", "installed": [], "release": None,
                "error": ev.error or f"rpm -qa exited {ev.exit_code}: {(ev.stderr or '').strip()[:200]}"}, [ev]
    pkgs = driverpkg.parse_rpm_query(ev.stdout)
    ev.stdout = "\n".join(f"{p['name']} {p['version']}" for p in pkgs)
    return {"manager": "rpm", "source": "rpm -qa", "installed": pkgs, "release": driverpkg.installed_release(pkgs),
            "error": None}, [ev]


def collect_history(apt_history: str = APT_HISTORY, dnf_log: str = DNF_RPM_LOG) -> dict[str, Any]:
    """The newest driver change in apt's history (with its rotated copies) or dnf's rpm log."""
    read, errors, transactions = [], [], []
    paths = [apt_history] + [f"{apt_history}.{i}" + (".gz" if i > 1 else "") for i in range(1, ROTATED + 1)] \
        + [f"{apt_history}.1.gz"]
    logs = [(path, driverpkg.parse_apt_history) for path in dict.fromkeys(paths)]
    logs += [(path, driverpkg.parse_dnf_rpm_log) for path in (dnf_log, f"{dnf_log}.1")]
    for path, parse in logs:
        text, err = _text(path)
        if err:
            errors.append(err)
        if text is not None:
            read.append(path)
            transactions += parse(text)
    return {"read": read, "errors": errors, "transactions": len(transactions),
            "last_change": driverpkg.last_driver_change(transactions)}


def collect_fabric(env: dict[str, str], packages: dict[str, Any], *, nvswitch: list[str] | None = None
                   ) -> tuple[dict[str, Any], list[Evidence]]:
    """Fabric Manager on an NVSwitch system: unit state, release and a mismatch in its log."""
    found = fabricmanager.nvswitch_evidence() if nvswitch is None else nvswitch
    out: dict[str, Any] = {"nvswitch": found, "unit": None, "unit_error": None, "version": None,
                           "version_source": None, "log_mismatch": None, "log_error": None}
    if not found:
        return out, []
    evidence: list[Evidence] = []
    path = env.get("PATH") or os.environ.get("PATH")
    pkg = driverpkg.fabric_manager_package(packages.get("installed") or [])
    if pkg and pkg.get("release"):
        out.update(version=pkg["release"], version_source=f"package {pkg['name']} {pkg['version']}")
    systemctl = which_all("systemctl", path)
    if not systemctl:
        out["unit_error"] = "systemctl not available"
    else:
        ev = run([systemctl[0], "show", fabricmanager.UNIT, "-p", UNIT_PROPERTIES], env=env,
                 timeout=COMMAND_TIMEOUT, label=f"systemctl show {fabricmanager.UNIT}")
        evidence.append(ev)
        if ev.error or ev.exit_code != 0:
            out["unit_error"] = ev.error or f"systemctl show exited {ev.exit_code}: {(ev.stderr or '').strip()[:200]}"
        else:
            out["unit"] = fabricmanager.unit_state(fabricmanager.parse_systemctl_show(ev.stdout))
            journal = which_all("journalctl", path)
            if journal:
                log = run([journal[0], "-u", fabricmanager.UNIT, "-n", "200", "--no-pager", "-o", "cat"], env=env,
                          timeout=COMMAND_TIMEOUT, label=f"journalctl -u {fabricmanager.UNIT}")
                evidence.append(log)
                if log.error or log.exit_code != 0:
                    out["log_error"] = log.error or f"journalctl exited {log.exit_code}"
                else:
                    out["log_mismatch"] = fabricmanager.log_mismatch(log.stdout)
    if out["version"] is None:
        fm = which_all("nv-fabricmanager", path)
        if fm:
            ev = run([fm[0], "--version"], env=env, timeout=COMMAND_TIMEOUT, label="nv-fabricmanager --version")
            evidence.append(ev)
            version = fabricmanager.parse_version_output(ev.stdout + "\n" + ev.stderr) if ev.exit_code == 0 else None
            if version:
                out.update(version=version, version_source=f"{fm[0]} --version")
    return out, evidence


def _table(facts: Mapping[str, Any]) -> Evidence:
    m, libs, pk = facts["module"], facts["libraries"], facts["packages"]
    lc, nv = libs["libcuda"], libs["nvml"]
    last = (facts["history"] or {}).get("last_change") or {}
    rows = [["kernel module (sys)", SYS_VERSION, m.get("sys_release") or "absent"],
            ["kernel module (proc)", PROC_VERSION, m.get("proc_release") or "absent"],
            ["libnvidia-ml.so.1", nv.get("realpath") or "not in the ld cache", nv.get("release") or "unknown"],
            ["libcuda.so.1 (training process)",
             f"{lc.get('realpath') or lc.get('error') or '-'} {lc.get('label') or ''}", lc.get("release") or "unknown"],
            ["package record", pk.get("source") or pk.get("error") or "-", pk.get("release") or "unknown"],
            ["last driver change", last.get("start") or "none recorded",
             ", ".join(f"{c['name']} {c.get('new') or c['action']}" for c in last.get("changes") or [])[:200] or "-"]]
    return Evidence.of_table("The driver's parts", ["part", "from", "release"], rows)


def collect_driver_parts(env: dict[str, str], executable: str | None, *, proc_version: str = PROC_VERSION,
                         sys_version: str = SYS_VERSION, nvswitch: list[str] | None = None
                         ) -> tuple[DriverPartsFacts, list[Evidence]]:
    """Every part (see the module docstring); ``skipped`` when no NVIDIA kernel module is loaded."""
    packages, evidence = collect_packages(env)
    module = collect_module(proc_version, sys_version)
    stat = kmod.read_text("/proc/stat")
    facts: DriverPartsFacts = {"module": module, "packages": packages, "distro": read_os_release(),
                               "boot_time": driverpkg.boot_time(stat)}
    if not module["loaded"]:
        why = f"no NVIDIA kernel module loaded ({proc_version} absent)"
        if packages.get("release"):
            why += (f"; the package record lists driver {packages['release']}: the module did not load "
                    "(`modprobe nvidia`, `dmesg | grep -i nvrm`)")
        facts["skipped"] = why
        return facts, evidence
    nvml_libs = nvml_library_paths()
    facts["libraries"] = {"nvml": _library(nvml_libs[0] if nvml_libs else None),
                          "libcuda": resolve_libcuda(executable, env),
                          "env": {k: env.get(k) for k in ("LD_LIBRARY_PATH", "LD_PRELOAD")}}
    facts["mounted"] = driver_mounts()
    facts["history"] = collect_history()
    fabric, fev = collect_fabric(env, packages, nvswitch=nvswitch)
    facts["fabric"] = fabric
    return facts, [_table(facts), *evidence, *fev]


@probe("driver_parts", title="The driver's parts: kernel module, libraries, packages, Fabric Manager", timeout=60,
       background=True, facts=DriverPartsFacts)
def driver_parts_probe(host: Any) -> tuple[DriverPartsFacts, list[Evidence]]:
    """The loaded module, the libraries the training process takes, the package record and Fabric Manager."""
    target = target_of(host)
    return collect_driver_parts(dict(target.env), target.resolve_python()[0])
