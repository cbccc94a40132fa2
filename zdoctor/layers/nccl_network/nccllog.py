"""What NCCL_DEBUG=INFO output says NCCL chose: the bootstrap interface, the network (Socket or IB), the
socket transport's interfaces, the IB devices and their out-of-band interface, and its WARN lines.

The formats, from NCCL's source:

- ``NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>`` (src/bootstrap.cc, bootstrapNetInit)
- ``NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0> [1]eth1:...`` (src/transport/net_socket.cc)
- ``NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/IB [RO]; OOB eth0:10.0.0.1<0>``
  (src/transport/net_ib.cc, ncclIbInit)
- ``NCCL INFO NET/IB : No device found.`` (net_ib.cc)
- ``NCCL INFO Using network Socket`` / ``IB`` (src/init.cc)
- ``NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0`` (src/misc/socket.cc)
- ``NCCL WARN ...`` (src/include/debug.h: every WARN line)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_PREFIX = r"NCCL INFO "
_BOOTSTRAP = re.compile(_PREFIX + r"Bootstrap ?: Using (?:\[\d+\])?(?P<ifname>[^\s:]+):(?P<addr>\S+?)<\d+>")
_SOCKET = re.compile(_PREFIX + r"NET/Socket ?: Using(?P<rest>(?: \[\d+\][^\s:]+:\S+)+)")
_IF_ENTRY = re.compile(r"\[(?P<i>\d+)\](?P<ifname>[^\s:]+):(?P<addr>\S+?)<\d+>")
_IB = re.compile(_PREFIX + r"NET/IB ?: Using(?P<rest>.*?);\s*OOB (?P<ifname>[^\s:]+):(?P<addr>\S+?)<\d+>")
_IB_ENTRY = re.compile(r"\[(?P<i>\d+)\](?P<dev>[^\s:]+):(?P<port>\d+)/(?P<ll>\w+)")
_IB_NONE = re.compile(r"NET/IB ?: No device found")
_NETWORK = re.compile(_PREFIX + r"Using network (?P<name>\S.*?)\s*$")
_IFNAME_ENV = re.compile(_PREFIX + r"NCCL_SOCKET_IFNAME set (?:by environment )?to (?P<value>\S+)")
_WARN = re.compile(r"NCCL WARN (?P<text>.+?)\s*$")
MAX_WARNS = 20


def parse(text: str) -> dict[str, Any]:
    """``{"seen": whether any NCCL INFO line was read, "bootstrap": {ifname, address}, "network",
    "socket": [{ifname, address}], "ib": [{device, port, link_layer}], "ib_oob": {ifname, address},
    "ib_none": bool, "ifname_env", "warns": [text]}``; the last value of each wins (a log holds many runs)."""
    out: dict[str, Any] = {"seen": False, "bootstrap": None, "network": None, "socket": [], "ib": [],
                           "ib_oob": None, "ib_none": False, "ifname_env": None, "warns": []}
    for raw in (text or "").splitlines():
        line = raw.strip()
        if "NCCL INFO" in line:
            out["seen"] = True
        m = _BOOTSTRAP.search(line)
        if m:
            out["bootstrap"] = {"ifname": m.group("ifname"), "address": m.group("addr")}
            continue
        m = _SOCKET.search(line)
        if m:
            out["socket"] = [{"ifname": e.group("ifname"), "address": e.group("addr")}
                             for e in _IF_ENTRY.finditer(m.group("rest"))]
            continue
        m = _IB.search(line)
        if m:
            out["ib"] = [{"device": e.group("dev"), "port": int(e.group("port")), "link_layer": e.group("ll")}
                         for e in _IB_ENTRY.finditer(m.group("rest"))]
            out["ib_oob"] = {"ifname": m.group("ifname"), "address": m.group("addr")}
            continue
        if _IB_NONE.search(line):
            out["ib_none"] = True
            continue
        m = _NETWORK.search(line)
        if m:
            out["network"] = m.group("name")
            continue
        m = _IFNAME_ENV.search(line)
        if m:
            out["ifname_env"] = m.group("value")
            continue
        m = _WARN.search(line)
        if m and len(out["warns"]) < MAX_WARNS and m.group("text") not in out["warns"]:
            out["warns"].append(m.group("text")[:400])
    return out


def chosen_interface(log: Mapping[str, Any]) -> str | None:
    """The interface NCCL said it bootstraps on (else the first socket / OOB one)."""
    for key in ("bootstrap", "ib_oob"):
        if log.get(key):
            return str(log[key]["ifname"])
    return str(log["socket"][0]["ifname"]) if log.get("socket") else None
