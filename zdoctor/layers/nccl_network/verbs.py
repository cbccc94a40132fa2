"""The RDMA user space a process needs to use the node's InfiniBand / RoCE ports: libibverbs, the provider
library of each device, and the device files. Inside a container the ports in sysfs are the host's, while
the libraries are the image's and the device files are only those the runtime passed in.

How each part is used (rdma-core and NCCL sources):

- NCCL (src/misc/ibvsymbols.cc, buildIbvSymbols) dlopens ``NCCL_IBVERBS_LIB``, else ``libibverbs.so``, else
  ``libibverbs.so.1``; when none loads it prints "Failed to open libibverbs.so[.1]" (2.12 to 2.29, INFO;
  WARN before) or "Count not open <name>" per name (2.30), and the IB transport is off: NCCL uses sockets.
- libibverbs (libibverbs/dynamic_driver.c, read_config and load_driver) reads every ``*.driver`` file of
  ``/etc/libibverbs.d`` (``driver mlx5``) and dlopens ``<provider dir>/lib<name>-rdmav<PABI>.so``, then
  ``lib<name>-rdmav<PABI>.so`` on the library path; the PABI is the private ABI the library was built with
  (its ``IBVERBS_PRIVATE_<PABI>`` symbol version). A device whose provider did not load is left out of
  ``ibv_get_device_list`` (libibverbs/init.c), so NCCL says "NET/IB : No device found."
- ``ibv_open_device`` opens ``/dev/infiniband/uverbsN`` (util/open_cdev.c); the N of each device is in
  ``/sys/class/infiniband_verbs/uverbsN/ibdev``. Without the file NCCL warns "NET/IB : Unable to open device
  <name>" and leaves the device out (src/transport/net_ib, ncclIbInitDevices).
"""

from __future__ import annotations

import glob
import os
import re
import stat
from collections.abc import Mapping, Sequence
from typing import Any

from zdoctor.layers.nccl_network.infiniband import folder_names
from zdoctor.readers.elf import read_elf
from zdoctor.readers.loader import LoaderConfig, Process
from zdoctor.readers.sysread import read_small, read_value

SYSFS = "/sys"
DEV = "/dev"
CONFIG_DIR = "/etc/libibverbs.d"
LIBIBVERBS = "libibverbs.so.1"
#: Where distributions install the providers (rdma-core's VERBS_PROVIDER_DIR, ``<libdir>/libibverbs``).
PROVIDER_DIRS = ("/usr/lib/x86_64-linux-gnu/libibverbs", "/usr/lib64/libibverbs", "/usr/lib/libibverbs",
                 "/usr/lib/aarch64-linux-gnu/libibverbs")
#: The kernel's name of an RDMA device (its driver's naming) -> the rdma-core provider that drives it.
PROVIDERS = (("mlx5_", "mlx5"), ("mlx4_", "mlx4"), ("irdma", "irdma"), ("bnxt_re", "bnxt_re"), ("efa_", "efa"),
             ("rxe", "rxe"), ("siw", "siw"), ("hfi1_", "hfi1verbs"), ("qedr", "qedr"), ("hns_", "hns"),
             ("erdma_", "erdma"), ("mana_", "mana"), ("ionic_", "ionic"), ("vmw_pvrdma", "vmw_pvrdma"))
#: Driver files and device files read at most.
MAX_ENTRIES = 128
SOURCES = (
    "NCCL src/misc/ibvsymbols.cc (buildIbvSymbols: dlopen NCCL_IBVERBS_LIB, libibverbs.so, libibverbs.so.1; "
    "\"Failed to open libibverbs.so[.1]\", \"Count not open %s\")",
    "NCCL src/transport/net_ib (ncclIbInitDevices: \"NET/IB : Unable to open device %s\", \"NET/IB : No device "
    "found.\")",
    "rdma-core libibverbs/dynamic_driver.c (read_config of IBV_CONFIG_DIR, load_driver: VERBS_PROVIDER_DIR/"
    "lib<name>-rdmav<PABI>.so, \"couldn't load driver\")",
    "rdma-core libibverbs/init.c (devices without a provider are left out of ibv_get_device_list), "
    "util/open_cdev.c (/dev/infiniband/<uverbs>)",
)


def provider_for(ibdev: str) -> str | None:
    """The rdma-core provider of the kernel RDMA device ``ibdev`` (``mlx5_0`` -> ``mlx5``), or None."""
    return next((p for prefix, p in PROVIDERS if ibdev.startswith(prefix)), None)


def read_uverbs(sysfs: str = SYSFS) -> dict[str, Any]:
    """``{"uverbs": [{"uverbs", "ibdev"}], "error"}`` from ``<sysfs>/class/infiniband_verbs``."""
    top = os.path.join(sysfs, "class", "infiniband_verbs")
    try:
        names = sorted(n for n in os.listdir(top) if n.startswith("uverbs"))[:MAX_ENTRIES]
    except OSError as exc:
        return {"uverbs": [], "error": f"{top}: {exc.strerror or exc}"}
    return {"uverbs": [{"uverbs": n, "ibdev": read_value(os.path.join(top, n, "ibdev"))} for n in names],
            "error": None}


def read_device_files(dev: str, names: Sequence[str]) -> dict[str, Any]:
    """Each of ``names`` under ``<dev>/infiniband``: ``{"dir", "dir_exists", "files": [{name, state}]}`` with
    state ``char`` (a character device), ``missing`` or ``not a character device``."""
    top = os.path.join(dev, "infiniband")
    files = []
    for name in names:
        try:
            mode = os.stat(os.path.join(top, name)).st_mode
        except OSError:
            files.append({"name": name, "state": "missing"})
            continue
        files.append({"name": name, "state": "char" if stat.S_ISCHR(mode) else "not a character device"})
    return {"dir": top, "dir_exists": os.path.isdir(top), "files": files}


def read_driver_config(config_dir: str = CONFIG_DIR) -> dict[str, Any]:
    """The providers libibverbs is told to load: ``{"dir", "exists", "files": [{file, drivers}], "error"}``."""
    names, error = folder_names(config_dir)
    if names is None:
        return {"dir": config_dir, "exists": error is not None, "files": [], "error": error}
    files = []
    for name in names[:MAX_ENTRIES]:
        path = os.path.join(config_dir, name)
        if not os.path.isfile(path):  # libibverbs reads regular files only
            continue
        text = read_small(path) or ""
        drivers = [m.group(1) for m in re.finditer(r"^\s*driver\s+(\S+)", text, re.M)]
        files.append({"file": name, "drivers": drivers})
    return {"dir": config_dir, "exists": True, "files": files, "error": None}


def resolve_libibverbs(exe: str | None, env: Mapping[str, str], config: LoaderConfig) -> dict[str, Any]:
    """Which file ``dlopen("libibverbs.so.1")`` from the training interpreter gets (the ld.so emulation),
    whether it loads (``loads``: its own dependencies too, libnl among them), and the provider ABI it was built
    with (``IBVERBS_PRIVATE_<PABI>``)."""
    if not exe:
        return {"path": None, "via": None, "error": "the training interpreter was not found", "pabi": None,
                "loads": False}
    result = Process(exe, env, config).dlopen(LIBIBVERBS)
    res = result.resolution
    path = res.path if res is not None and res.found else None
    out: dict[str, Any] = {"path": path, "via": res.via if res is not None else None, "error": result.error,
                           "loads": path is not None and result.error is None, "pabi": None,
                           "tried": [c[0] for c in (res.tried if res is not None else [])][:12]}
    if path:
        out["pabi"] = private_abi(read_elf(path).verdef or [])
    return out


def private_abi(verdef: Sequence[str]) -> str | None:
    """``IBVERBS_PRIVATE_34`` among a libibverbs' defined versions -> ``"34"``."""
    found = [m.group(1) for m in (re.fullmatch(r"IBVERBS_PRIVATE_(\d+)", v) for v in verdef) if m]
    return max(found, key=int) if found else None


def provider_dirs(libibverbs: str | None, extra: Sequence[str] = PROVIDER_DIRS) -> list[str]:
    """The provider directory beside the libibverbs that loads, then the distributions' ones."""
    first = [os.path.join(os.path.dirname(os.path.realpath(libibverbs)), "libibverbs")] if libibverbs else []
    return list(dict.fromkeys([*first, *extra]))


def find_provider(name: str, dirs: Sequence[str], pabi: str | None) -> dict[str, Any]:
    """``lib<name>-rdmav<pabi>.so`` in ``dirs``: ``{"name", "path", "error", "others"}``; ``others`` are
    providers of the same name built for another ABI (libibverbs does not load them)."""
    want = f"lib{name}-rdmav{pabi}.so" if pabi else None
    others: list[str] = []
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(glob.escape(d), f"lib{glob.escape(name)}-rdmav*.so")))[:8]:
            if want is not None and os.path.basename(path) != want:
                others.append(path)
                continue
            info = read_elf(path)  # a dangling link or a broken file does not load
            if info.ok:
                return {"name": name, "path": path, "error": None, "others": others}
            others.append(f"{path} ({info.error})")
    where = ", ".join(dirs) or "no directory"
    return {"name": name, "path": None, "others": others,
            "error": f"no {want or f'lib{name}-rdmav*.so'} in {where}"}


def judge(ports: Sequence[Mapping[str, Any]], uverbs: Mapping[str, Any], files: Mapping[str, Any],
          config: Mapping[str, Any], lib: Mapping[str, Any], providers: Sequence[Mapping[str, Any]],
          ) -> list[dict[str, Any]]:
    """What stops a process here from using the devices: ``[{kind, short, text, ...}]`` with kind
    ``libibverbs-missing``, ``provider-missing``, ``provider-unconfigured`` or ``uverbs-missing``."""
    problems: list[dict[str, Any]] = []
    devices = sorted({p["device"] for p in ports})
    if not lib.get("loads"):
        found = f"{lib['path']} is there but " if lib.get("path") else ""
        problems.append({"kind": "libibverbs-missing",
                         "short": f"{LIBIBVERBS} does not load" if found else f"{LIBIBVERBS} is missing",
                         "text": f"{found}{LIBIBVERBS} does not load here ({lib.get('error') or 'not found'}): NCCL "
                                 "cannot open the verbs library and turns its InfiniBand transport off"})
    else:
        configured = {d for f in config.get("files") or [] for d in f.get("drivers") or []}
        for p in providers:
            if p["name"] not in configured:
                problems.append({"kind": "provider-unconfigured", "provider": p["name"],
                                 "short": f"no libibverbs driver file names the {p['name']} provider",
                                 "text": f"No {config.get('dir')}/*.driver file names the {p['name']} provider"
                                         + ("" if config.get("exists") else f" ({config.get('dir')} does not exist)")
                                         + ": libibverbs loads no provider for "
                                         + ", ".join(d for d in devices if provider_for(d) == p["name"])
                                         + " and lists no device"})
            elif not p.get("path"):
                problems.append({"kind": "provider-missing", "provider": p["name"],
                                 "short": f"the {p['name']} provider library is missing",
                                 "text": f"The {p['name']} provider library is missing ({p.get('error')}): "
                                         "libibverbs leaves "
                                         + ", ".join(d for d in devices if provider_for(d) == p["name"])
                                         + " out of its device list"})
    by_dev = {u.get("ibdev"): u["uverbs"] for u in uverbs.get("uverbs") or []}
    state = {f["name"]: f["state"] for f in files.get("files") or []}
    absent = [(d, by_dev[d]) for d in devices if d in by_dev and state.get(by_dev[d]) != "char"]
    if absent:
        shown = ", ".join(f"{files.get('dir')}/{u} ({d})" for d, u in absent)
        where = "" if files.get("dir_exists") else f" ({files.get('dir')} does not exist here)"
        problems.append({"kind": "uverbs-missing", "files": [u for _, u in absent],
                         "short": f"{files.get('dir')}/{absent[0][1]} is not passed in",
                         "text": f"{shown}: not a device file here{where}: ibv_open_device fails and NCCL warns "
                                 "'NET/IB : Unable to open device'"})
    return problems
