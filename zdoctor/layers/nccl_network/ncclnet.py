"""The interface NCCL's socket code would choose, by NCCL's own rules, from a node's interfaces and addresses.

Rules as data (:data:`IFNAME_RULES`), read from NCCL's source:

- ``NCCL_SOCKET_IFNAME`` is used when it is longer than one character (``strlen(env) > 1``); a leading ``^``
  excludes, then a leading ``=`` asks for exact names; the rest is a comma list of ``name[:port]`` entries,
  each a *prefix* of an interface name unless ``=`` was given (``matchIfList``, ``parseStringList``).
- Candidates are the addresses ``getifaddrs()`` lists, in its order (every IPv4 address by interface index,
  then every IPv6 one), IPv6 loopback skipped, ``NCCL_SOCKET_FAMILY`` (``AF_INET`` / ``AF_INET6``) filtering
  them; each interface counts once, with its first address. An interface with no address is never chosen.
- Unset: interfaces starting with ``ib``; else the interface in the subnet of ``NCCL_COMM_ID``'s address;
  else anything but ``docker*``, ``lo*`` (and ``virbr*`` in recent releases; older ones exclude only the first
  two); else ``docker*``; else ``lo*`` (then ``virbr*``).
- The bootstrap uses the first interface found; the socket transport (``NET/Socket``) up to 16 of them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from zdoctor.readers.sysread import read_value

SOURCES = (
    "NCCL src/misc/socket.cc (findInterfaces, ncclFindInterfaces, ncclFindInterfaceMatchSubnet)",
    "NCCL src/misc/utils.cc (parseStringList, matchIfList: prefix match unless exact)",
    "NCCL src/bootstrap.cc (bootstrapNetInit: one interface, \"Bootstrap : Using\")",
    "NCCL src/transport/net_socket.cc (ncclNetSocketInit: up to MAX_IFS interfaces, \"NET/Socket : Using\")",
)

#: The interface lists NCCL tries in turn when NCCL_SOCKET_IFNAME is unset (``comm_id``: the subnet of
#: NCCL_COMM_ID's address), in NCCL's order (current socket.cc; older releases lack the ``virbr`` steps).
DEFAULT_STEPS: tuple[str, ...] = ("ib", "comm_id", "^docker,lo,virbr", "docker", "lo", "virbr")
IFNAME_RULES: dict[str, Any] = {
    "min_length": 2, "exclude_mark": "^", "exact_mark": "=", "separator": ",", "port_mark": ":",
    "default_steps": DEFAULT_STEPS, "bootstrap_interfaces": 1, "socket_max_interfaces": 16,
    "sources": SOURCES,
}
#: Interfaces whose addresses only this node reaches.
LOCAL_ONLY_PREFIXES = ("lo", "docker", "virbr")


def parse_list(value: str) -> dict[str, Any]:
    """``^=eth0,ib:1`` -> ``{"exclude": True, "exact": True, "entries": [["eth0", -1], ["ib", 1]]}``."""
    text = value or ""
    exclude = text.startswith("^")
    if exclude:
        text = text[1:]
    exact = text.startswith("=")
    if exact:
        text = text[1:]
    entries: list[list[Any]] = []
    for item in text.split(","):
        name, sep, port = item.partition(":")
        if not name:
            continue
        entries.append([name, int(port) if sep and port.isdigit() else -1])
    return {"exclude": exclude, "exact": exact, "entries": entries}


def matches(name: str, spec: Mapping[str, Any], port: int = -1) -> bool:
    """Whether interface (or HCA) ``name`` passes the parsed list ``spec`` as NCCL's matchIfList ^ searchNot."""
    entries = spec.get("entries") or []
    hit = not entries  # an empty list matches everything
    for prefix, want_port in entries:
        same = name == prefix if spec.get("exact") else name.startswith(prefix)
        if same and (port == -1 or want_port == -1 or port == want_port):
            hit = True
            break
    return hit != bool(spec.get("exclude"))


def parse_ip_addr(text: str) -> list[dict[str, Any]]:
    """``ip -j addr`` -> one record per interface: ifname, ifindex, operstate, mtu, mac, master, flags, addrs."""
    try:
        doc = json.loads(text or "[]")
    except ValueError:
        return []
    out = []
    for item in doc if isinstance(doc, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("ifname"), str):
            continue
        addrs = [{"family": a.get("family"), "local": a.get("local"), "prefixlen": a.get("prefixlen"),
                  "scope": a.get("scope")}
                 for a in item.get("addr_info") or [] if isinstance(a, dict) and a.get("local")
                 and a.get("family") in ("inet", "inet6")]
        out.append({"ifname": item["ifname"], "ifindex": item.get("ifindex"), "operstate": item.get("operstate"),
                    "mtu": item.get("mtu"), "mac": item.get("address"), "master": item.get("master"),
                    "flags": list(item.get("flags") or []), "addrs": addrs})
    return out


def sysfs_membership(name: str, root: str = "/sys/class/net") -> dict[str, Any]:
    """A bond's slaves, a bridge's ports, and the master an interface is enslaved to, from sysfs."""
    base = os.path.join(root, name)
    slaves = (read_value(os.path.join(base, "bonding", "slaves")) or "").split()
    try:
        ports = sorted(os.listdir(os.path.join(base, "brif")))
    except OSError:
        ports = []
    master = None
    with contextlib.suppress(OSError):
        master = os.path.basename(os.readlink(os.path.join(base, "master")))
    kind = "bond" if os.path.isdir(os.path.join(base, "bonding")) else \
        "bridge" if os.path.isdir(os.path.join(base, "bridge")) else None
    return {"kind": kind, "bond_slaves": slaves, "bridge_ports": ports, "sysfs_master": master,
            "operstate_sysfs": read_value(os.path.join(base, "operstate")),
            "carrier": read_value(os.path.join(base, "carrier"))}


def candidates(interfaces: Sequence[Mapping[str, Any]], family: str | None = None) -> list[dict[str, Any]]:
    """The (interface, address) pairs in getifaddrs() order: every IPv4 address by interface index, then
    every IPv6 one; IPv6 loopback skipped; ``family`` ``AF_INET`` / ``AF_INET6`` keeps one family."""
    order = sorted(interfaces, key=lambda i: i.get("ifindex") or 0)
    out = []
    for fam in ("inet", "inet6"):
        if family == "AF_INET" and fam != "inet" or family == "AF_INET6" and fam != "inet6":
            continue
        for iface in order:
            for a in iface.get("addrs") or []:
                if a.get("family") != fam or (fam == "inet6" and a.get("local") == "::1"):
                    continue
                out.append({"ifname": iface["ifname"], "address": a["local"], "prefixlen": a.get("prefixlen"),
                            "family": fam})
    return out


def _find(cands: Sequence[Mapping[str, Any]], spec: Mapping[str, Any], limit: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for c in cands:
        if len(found) >= limit:
            break
        if matches(c["ifname"], spec) and all(f["ifname"] != c["ifname"] for f in found):
            found.append(dict(c))
    return found


def _subnet_match(cands: Sequence[Mapping[str, Any]], comm_id: str) -> list[dict[str, Any]]:
    host = comm_id.rsplit(":", 1)[0].strip("[]")
    try:
        remote = ipaddress.ip_address(host)
    except ValueError:
        return []
    for c in cands:
        try:
            net = ipaddress.ip_interface(f"{c['address']}/{c['prefixlen']}").network
        except ValueError:
            continue
        if remote in net:
            return [dict(c)]
    return []


def choose(interfaces: Sequence[Mapping[str, Any]], env: Mapping[str, str],
           limit: int = IFNAME_RULES["socket_max_interfaces"]) -> dict[str, Any]:
    """The interfaces NCCL would use, in order (the first is the bootstrap's), and how it got there.

    ``{"source": "NCCL_SOCKET_IFNAME" | "default", "value", "rule": the list that matched, "chosen":
    [{ifname, address, prefixlen, family}], "matched_without_address": names the list matches that have no
    usable address, "ignored": why a set value was not used}``."""
    value = env.get("NCCL_SOCKET_IFNAME")
    family = env.get("NCCL_SOCKET_FAMILY")
    cands = candidates(interfaces, family if family in ("AF_INET", "AF_INET6") else None)
    with_addr = {c["ifname"] for c in cands}
    out: dict[str, Any] = {"value": value, "family": family, "ignored": None}
    if value is not None and len(value) >= IFNAME_RULES["min_length"]:
        spec = parse_list(value)
        chosen = _find(cands, spec, limit)
        out.update(source="NCCL_SOCKET_IFNAME", rule=value, spec=spec, chosen=chosen,
                   matched_without_address=sorted(i["ifname"] for i in interfaces
                                                  if matches(i["ifname"], spec) and i["ifname"] not in with_addr))
        return out
    if value is not None:
        out["ignored"] = f"NCCL_SOCKET_IFNAME={value!r} is shorter than two characters: NCCL ignores it"
    comm_id = env.get("NCCL_COMM_ID")
    for step in DEFAULT_STEPS:
        if step == "comm_id":
            chosen = _subnet_match(cands, comm_id) if comm_id and len(comm_id) > 1 else []
        else:
            chosen = _find(cands, parse_list(step), limit)
        if chosen:
            out.update(source="default", rule=step if step != "comm_id" else f"the subnet of NCCL_COMM_ID {comm_id}",
                       spec=parse_list(step) if step != "comm_id" else None, chosen=chosen,
                       matched_without_address=[])
            return out
    out.update(source="default", rule=None, spec=None, chosen=[], matched_without_address=[])
    return out


def is_local_only(name: str) -> bool:
    return name.startswith(LOCAL_ONLY_PREFIXES)


# -- routes -----------------------------------------------------------------------------------------------


def parse_route_get(text: str) -> dict[str, Any] | None:
    """``ip -j route get ADDR`` -> ``{dst, dev, gateway, prefsrc, type}`` (None when unreadable)."""
    try:
        doc = json.loads(text or "[]")
    except ValueError:
        return None
    first = doc[0] if isinstance(doc, list) and doc and isinstance(doc[0], dict) else None
    if first is None:
        return None
    return {k: first.get(k) for k in ("dst", "dev", "gateway", "prefsrc", "type")}


def parse_routes(text: str, family: str | None = None) -> list[dict[str, Any]]:
    """``ip -j -4|-6 route show`` -> ``[{dst, dev, gateway, metric, type, prefsrc, family}]`` (``default`` kept
    as written; ``family`` inet | inet6 says which table it came from)."""
    try:
        doc = json.loads(text or "[]")
    except ValueError:
        return []
    return [{**{k: r.get(k) for k in ("dst", "dev", "gateway", "metric", "type", "prefsrc")}, "family": family}
            for r in doc if isinstance(r, dict) and r.get("dst")] if isinstance(doc, list) else []


def _route_family(r: Mapping[str, Any]) -> int | None:
    fam = r.get("family")
    if fam in ("inet", "inet6"):
        return 4 if fam == "inet" else 6
    gw = r.get("gateway")
    return (6 if ":" in gw else 4) if isinstance(gw, str) and gw else None


def route_for(routes: Sequence[Mapping[str, Any]], address: str) -> dict[str, Any] | None:
    """The main-table route the kernel would pick for ``address``: the longest matching prefix, then the
    lowest metric (only unicast routes; None when nothing matches, not even a default route)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    best: tuple[int, int] | None = None
    pick = None
    for r in routes:
        if (r.get("type") or "unicast") != "unicast":
            continue
        dst = str(r.get("dst"))
        if dst == "default" and _route_family(r) != ip.version:
            continue  # a default route of the other family (or of no known one)
        try:
            net = ipaddress.ip_network(("0.0.0.0/0" if ip.version == 4 else "::/0") if dst == "default" else dst,
                                       strict=False)
        except ValueError:
            continue
        if net.version != ip.version or ip not in net:
            continue
        key = (net.prefixlen, -(r.get("metric") or 0))
        if best is None or key > best:
            best, pick = key, dict(r)
    return pick
