"""InfiniBand / RoCE ports from sysfs, judged against NCCL_IB_HCA, NCCL_IB_GID_INDEX and NCCL_IB_TC.

sysfs (Linux drivers/infiniband/core/sysfs.c): ``/sys/class/infiniband/<hca>/ports/<n>/`` holds ``state``
(``4: ACTIVE``), ``phys_state`` (``5: LinkUp``), ``rate`` (``200 Gb/sec (4X HDR)``), ``link_layer``
(``InfiniBand`` | ``Ethernet``), ``gids/<i>`` (``fe80:0000:...``; all zeros when empty) and
``gid_attrs/types/<i>`` (``IB/RoCE v1`` | ``RoCE v2``; reading an empty entry fails), ``gid_attrs/ndevs/<i>``
(the Ethernet device of a RoCE GID). NCCL (src/transport/net_ib.cc) keeps only ACTIVE ports whose link layer
is InfiniBand or Ethernet, filters devices with NCCL_IB_HCA (``^`` exclude, ``=`` exact, ``mlx5_0:1``
names a port; prefix match otherwise), and on RoCE uses the GID at NCCL_IB_GID_INDEX (in current releases an
unset index (-1) lets ncclIbGetGidIndex pick a RoCE v2 GID itself; older releases defaulted to index 0, the
link-local RoCE v1 GID: an unset index is judged by nothing here).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from typing import Any

from zdoctor.layers.nccl_network.ncclnet import matches, parse_list
from zdoctor.readers.sysread import read_value

ROOT = "/sys/class/infiniband"
#: GID table entries read per port at most (hardware tables hold up to 128, usually a few are used).
MAX_GIDS = 256
EMPTY_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
SOURCES = (
    "Linux drivers/infiniband/core/sysfs.c (state_show \"%d: %s\", rate_show, show_port_gid, "
    "gid_attr types and ndevs)",
    "Linux drivers/infiniband/core/cache.c (gid type names \"IB/RoCE v1\", \"RoCE v2\")",
    "NCCL src/transport/net_ib.cc (ncclIbInit: NCCL_IB_HCA with ^ and =, ACTIVE ports only; "
    "ncclIbGetGidIndex, NCCL_IB_GID_INDEX, NCCL_IB_TC)",
    "NVIDIA MLNX_OFED documentation, RDMA over Converged Ethernet: the GID table in sysfs and show_gids",
)


def _numbered(text: str | None) -> tuple[int | None, str | None]:
    """``4: ACTIVE`` -> (4, "ACTIVE")."""
    m = re.match(r"\s*(\d+)\s*:\s*(\S.*)$", text or "")
    return (int(m.group(1)), m.group(2).strip()) if m else (None, text or None)


def gid_address(gid: str) -> str | None:
    """The IP address a RoCE GID stands for: an IPv4-mapped GID gives the IPv4 address, another the IPv6."""
    try:
        ip = ipaddress.IPv6Address(gid)
    except ValueError:
        return None
    return str(ip.ipv4_mapped) if ip.ipv4_mapped else str(ip)


def read_port(path: str) -> dict[str, Any]:
    state_n, state = _numbered(read_value(os.path.join(path, "state")))
    phys_n, phys = _numbered(read_value(os.path.join(path, "phys_state")))
    gids = []
    gdir = os.path.join(path, "gids")
    try:
        names = sorted((n for n in os.listdir(gdir) if n.isdigit()), key=int)[:MAX_GIDS]
    except OSError:
        names = []
    for n in names:
        gid = read_value(os.path.join(gdir, n))
        if gid is None:
            continue
        if gid == EMPTY_GID:
            gids.append({"index": int(n), "gid": gid, "empty": True})
            continue
        gtype = read_value(os.path.join(path, "gid_attrs", "types", n))
        ndev = read_value(os.path.join(path, "gid_attrs", "ndevs", n))
        gids.append({"index": int(n), "gid": gid, "empty": False, "type": gtype, "ndev": ndev,
                     "address": gid_address(gid),
                     "link_local": gid.lower().startswith("fe80:")})
    used = [g for g in gids if not g["empty"]]
    return {"state": state, "state_code": state_n, "phys_state": phys, "phys_state_code": phys_n,
            "rate": read_value(os.path.join(path, "rate")), "link_layer": read_value(os.path.join(path, "link_layer")),
            "gids": used, "gid_table_size": len(gids)}


def folder_names(path: str) -> tuple[list[str] | None, str | None]:
    """The sorted names in folder ``path``, or None with why: ``None`` when it does not exist, the error's
    words when it cannot be read."""
    try:
        return sorted(os.listdir(path)), None
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, exc.strerror or str(exc)


def read_devices(root: str = ROOT) -> dict[str, Any]:
    """``{"root", "present", "devices": [{name, ports: [{port, state, ...}]}], "error"}``."""
    names, error = folder_names(root)
    if names is None:
        return {"root": root, "present": False, "devices": [], "error": error}
    devices = []
    for name in names:
        pdir = os.path.join(root, name, "ports")
        try:
            ports = sorted((p for p in os.listdir(pdir) if p.isdigit()), key=int)
        except OSError:
            ports = []
        devices.append({"name": name, "ports": [{"port": int(p), **read_port(os.path.join(pdir, p))}
                                                for p in ports]})
    return {"root": root, "present": True, "devices": devices, "error": None}


def _flag(env: Mapping[str, str], name: str) -> bool:
    return (env.get(name) or "").strip() not in ("", "0")


def analyze(ib: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """The ports NCCL would use and the problems with them: ``{"usable": [...], "problems": [{status, kind,
    text}], "selected": [...], "gid_index"}``."""
    problems: list[dict[str, Any]] = []
    hca = env.get("NCCL_IB_HCA")
    spec = parse_list(hca) if hca else None
    ports = [(d["name"], p) for d in ib.get("devices") or [] for p in d.get("ports") or []]
    selected = [(n, p) for n, p in ports if spec is None or matches(n, spec, p["port"])]
    usable = [(n, p) for n, p in selected if p.get("state") == "ACTIVE"
              and p.get("link_layer") in ("InfiniBand", "Ethernet")]
    if hca and not selected:
        problems.append({"status": "fail", "kind": "hca-none",
                         "text": f"NCCL_IB_HCA={hca} names no device and port here (devices: "
                                 + (", ".join(sorted({n for n, _ in ports})) or "none") + ")"})
    for n, p in selected:
        if p.get("state") != "ACTIVE":
            problems.append({"status": "fail" if hca else "warn", "kind": "port-down", "device": n, "port": p["port"],
                             "text": f"{n} port {p['port']} is {p.get('state') or 'in an unknown state'} "
                                     f"(physical: {p.get('phys_state') or 'unknown'}): NCCL skips it"})
    raw_index = env.get("NCCL_IB_GID_INDEX")
    index: int | None = None
    if raw_index is not None:
        try:
            index = int(raw_index.strip())
        except ValueError:
            problems.append({"status": "warn", "kind": "gid-index-value",
                             "text": f"NCCL_IB_GID_INDEX={raw_index!r} is not a number"})
    for n, p in usable:
        if p.get("link_layer") != "Ethernet" or index is None or index < 0:
            continue
        gid = next((g for g in p.get("gids") or [] if g["index"] == index), None)
        where = f"{n} port {p['port']}"
        if gid is None:
            problems.append({"status": "fail", "kind": "gid-empty", "device": n, "port": p["port"], "index": index,
                             "text": f"NCCL_IB_GID_INDEX={index}: the GID table of {where} has no entry {index} "
                                     "(empty): the queue pairs cannot be set up"})
        elif gid.get("type") and "v2" not in gid["type"]:
            problems.append({"status": "warn", "kind": "gid-roce-v1", "device": n, "port": p["port"], "index": index,
                             "text": f"NCCL_IB_GID_INDEX={index} is a {gid['type']} GID on {where}: RoCE v1 is "
                                     "not routed across subnets, and peers using RoCE v2 never connect "
                                     "('Got completion with error 12')"})
        elif gid.get("link_local"):
            problems.append({"status": "warn", "kind": "gid-link-local", "device": n, "port": p["port"],
                             "index": index,
                             "text": f"NCCL_IB_GID_INDEX={index} is the link-local GID {gid['gid']} on {where}: "
                                     "it reaches only the same Layer-2 segment"})
    tc = env.get("NCCL_IB_TC")
    if tc is not None and not (tc.strip().isdigit() and 0 <= int(tc.strip()) <= 255):
        problems.append({"status": "warn", "kind": "tc-value",
                         "text": f"NCCL_IB_TC={tc!r} is not a traffic class (0-255)"})
    net = (env.get("NCCL_NET") or "").strip()
    if net.upper() == "IB" and not usable and not _flag(env, "NCCL_IB_DISABLE"):
        problems.append({"status": "fail", "kind": "net-ib-none",
                         "text": "NCCL_NET=IB asks for InfiniBand, and no ACTIVE port is usable: NCCL fails to "
                                 "initialise the network"})
    if net.upper() == "IB" and _flag(env, "NCCL_IB_DISABLE"):
        problems.append({"status": "fail", "kind": "net-ib-disabled",
                         "text": "NCCL_NET=IB together with NCCL_IB_DISABLE=1: the network NCCL is told to use is "
                                 "disabled"})
    return {"usable": [{"device": n, "port": p["port"], "link_layer": p.get("link_layer"), "rate": p.get("rate")}
                       for n, p in usable],
            "selected": [f"{n}:{p['port']}" for n, p in selected], "gid_index": index, "problems": problems,
            "ib_disabled": _flag(env, "NCCL_IB_DISABLE")}


def gid_rows(ib: Mapping[str, Any]) -> list[list[str]]:
    """show_gids-style rows: device, port, index, GID, address, type, net device."""
    rows = []
    for d in ib.get("devices") or []:
        for p in d.get("ports") or []:
            for g in p.get("gids") or []:
                rows.append([d["name"], str(p["port"]), str(g["index"]), g["gid"], g.get("address") or "",
                             g.get("type") or "?", g.get("ndev") or ""])
    return rows
