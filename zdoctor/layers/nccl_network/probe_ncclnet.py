"""Probes of NCCL's network: ``nccl_net`` (interfaces, the one NCCL would choose, routes to the other nodes),
``infiniband`` (the IB/RoCE ports and GID tables) and ``nccl_log`` (what NCCL_DEBUG=INFO output said).

- ``nccl_net``: ``env`` (the training's NCCL_* variables, MASTER_ADDR, MASTER_PORT), ``ip`` {path, ran, error},
  ``interfaces`` [{ifname, ifindex, operstate, mtu, mac, master, flags, addrs, kind, bond_slaves,
  bridge_ports}], ``choice`` (see :func:`zdoctor.layers.nccl_network.ncclnet.choose`), ``routes`` (the main tables,
  IPv4 and
  IPv6), ``peers`` [{name, source, address, resolve_error, route {dev, gateway, prefsrc, type}, route_error}],
  ``hostfile`` {path, error, hosts}, ``rules`` (NCCL's interface rules, with their sources).
- ``infiniband``: see :func:`zdoctor.layers.nccl_network.infiniband.read_devices`.
- ``nccl_log``: the parse of :func:`zdoctor.layers.nccl_network.nccllog.parse` over the --command output and the --log
  tail, with ``sources`` [where each was read].
"""

from __future__ import annotations

import ipaddress
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from zdoctor.core.errors import InputError
from zdoctor.core.factstypes import InfinibandFacts, NcclLogFacts, NcclNetFacts
from zdoctor.core.model import Evidence, cap_text
from zdoctor.core.registry import probe
from zdoctor.layers.launch.hosts import host_problem, read_hostfile
from zdoctor.layers.nccl_network import infiniband, nccllog, ncclnet
from zdoctor.proc.runner import run
from zdoctor.proc.systools import system_tool
from zdoctor.proc.target import target_of
from zdoctor.symptoms.probe_symptoms import command_ran, read_log

#: The training's variables this layer reads.
ENV_NAMES = ("NCCL_SOCKET_IFNAME", "NCCL_SOCKET_FAMILY", "NCCL_COMM_ID", "NCCL_IB_DISABLE", "NCCL_IB_HCA",
             "NCCL_IB_GID_INDEX", "NCCL_IB_TC", "NCCL_P2P_DISABLE", "NCCL_NET", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS",
             "MASTER_ADDR", "MASTER_PORT")
IP_TIMEOUT = 5.0
RESOLVE_TIMEOUT = 5.0
#: Peers resolved and routed at most (a hostfile of a thousand nodes is judged on its first ones).
MAX_PEERS = 64


def _ip(args: list[str], label: str) -> tuple[str | None, Evidence | None, str | None]:
    path = system_tool("ip")
    if path is None:
        return None, None, "the ip tool (iproute2) is not installed in the system directories"
    ev = run([path, *args], timeout=IP_TIMEOUT, label=label)
    if ev.error or ev.exit_code != 0:
        return None, ev, ev.error or f"exit code {ev.exit_code}: {(ev.stderr or ev.stdout).strip()[:200]}"
    return ev.stdout, ev, None


def _resolve(name: str) -> tuple[str | None, str | None]:
    """The first address ``getent ahosts`` gives ``name`` (bounded), or why none."""
    try:
        return str(ipaddress.ip_address(name)), None
    except ValueError:
        pass
    problem = host_problem(name)  # MASTER_ADDR is free text: never an option to getent
    if problem:
        return None, f"not a host name: {problem}"
    path = system_tool("getent")
    if path is None:
        return None, "getent is not installed"
    ev = run([path, "ahosts", name], timeout=RESOLVE_TIMEOUT, label=f"getent ahosts {name}")
    if ev.error:
        return None, ev.error
    if ev.exit_code != 0:
        return None, "does not resolve (getent ahosts found nothing)"
    for line in ev.stdout.splitlines():
        first = line.split()[0] if line.split() else ""
        try:
            return str(ipaddress.ip_address(first)), None
        except ValueError:
            continue
    return None, "does not resolve"


def _route(peer: dict[str, Any]) -> dict[str, Any]:
    addr, why = _resolve(peer["name"])
    peer.update(address=addr, resolve_error=why, route=None, route_error=None)
    if addr is None:
        return peer
    out, _, err = _ip(["-j", "route", "get", addr], f"ip -j route get {addr}")
    if err:
        peer["route_error"] = err
    else:
        peer["route"] = ncclnet.parse_route_get(out or "")
        if peer["route"] is None:
            peer["route_error"] = "ip route get gave no route"
    return peer


def _hostfile(path: str | None) -> dict[str, Any] | None:
    if not path:
        return None


    try:
        return {"path": path, "error": None, "hosts": [n.name for n in read_hostfile(path)]}
    except InputError as exc:
        return {"path": path, "error": str(exc), "hosts": []}


@probe("nccl_net", title="NCCL's network: interfaces, the one NCCL chooses, routes to the other nodes", timeout=60.0,
       background=True, facts=NcclNetFacts)
def nccl_net_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    target = target_of(host)
    env = {k: target.env[k] for k in ENV_NAMES if k in target.env}
    text, ev, err = _ip(["-j", "addr"], "ip -j addr")
    facts: dict[str, Any] = {"env": env, "ip": {"path": system_tool("ip"), "ran": err is None, "error": err},
                             "rules": {k: list(v) if isinstance(v, tuple) else v
                                       for k, v in ncclnet.IFNAME_RULES.items()}}
    evidence: list[Evidence] = []
    if ev is not None:
        ev.stdout, ev.truncated = cap_text(ev.stdout)
        evidence.append(ev)
    if err is not None:
        facts["skipped"] = f"the interfaces could not be listed: {err}"
        return facts, evidence
    interfaces = ncclnet.parse_ip_addr(text or "")
    for iface in interfaces:
        iface.update(ncclnet.sysfs_membership(iface["ifname"]))
    facts["interfaces"] = interfaces
    facts["choice"] = ncclnet.choose(interfaces, env)
    routes: list[dict[str, Any]] = []
    for flag, family in (("-4", "inet"), ("-6", "inet6")):
        out, _, rerr = _ip(["-j", flag, "route", "show"], f"ip -j {flag} route show")
        routes += ncclnet.parse_routes(out or "", family) if rerr is None else []
    facts["routes"] = routes
    hf = _hostfile(target.options.get("hostfile"))
    facts["hostfile"] = hf
    peers: list[dict[str, Any]] = []
    if env.get("MASTER_ADDR"):
        peers.append({"name": env["MASTER_ADDR"], "source": "MASTER_ADDR"})
    for name in (hf or {}).get("hosts") or []:
        if all(p["name"] != name for p in peers):
            peers.append({"name": name, "source": "hostfile"})
    facts["peers_total"] = len(peers)
    with ThreadPoolExecutor(max_workers=8) as pool:
        facts["peers"] = list(pool.map(_route, peers[:MAX_PEERS]))
    rows = [[i["ifname"], i.get("operstate") or "?", str(i.get("mtu") or "?"),
             ", ".join(f"{a['local']}/{a['prefixlen']}" for a in i["addrs"]) or "(no address)",
             i.get("master") or "", i.get("kind") or "", " ".join(i.get("bond_slaves") or i.get("bridge_ports") or [])]
            for i in interfaces]
    evidence.append(Evidence.of_table("network interfaces", ["interface", "state", "MTU", "addresses", "master",
                                                              "kind", "members"], rows))
    return facts, evidence


@probe("infiniband", title="InfiniBand / RoCE ports and their GID tables", timeout=15.0, facts=InfinibandFacts)
def infiniband_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    facts = infiniband.read_devices()
    if not facts["present"]:
        return facts, []
    rows = [[d["name"], str(p["port"]), p.get("state") or "?", p.get("phys_state") or "?", p.get("rate") or "?",
             p.get("link_layer") or "?"] for d in facts["devices"] for p in d["ports"]]
    return facts, [Evidence.of_table("InfiniBand ports", ["device", "port", "state", "physical", "rate",
                                                          "link layer"], rows),
                   Evidence.of_table("GID tables", ["device", "port", "index", "GID", "address", "type", "net device"],
                                     infiniband.gid_rows(facts))]


@probe("nccl_log", title="What NCCL's own output said it chose (NCCL_DEBUG=INFO)", timeout=30.0,
       needs=("livetrace",), derived=True, facts=NcclLogFacts)
def nccl_log_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    target = target_of(host)
    parts: list[str] = []
    sources: list[str] = []
    unread: list[str] = []
    if command_ran(host):
        res = host.result("livetrace")
        if res.status == "ok" and (res.facts or {}).get("source") == "command" and res.evidence:
            parts += [res.evidence[0].stdout or "", res.evidence[0].stderr or ""]
            sources.append("--command output")
        else:
            unread.append("the --command run gave no output to read")
    log = target.options.get("train_log")
    tail = read_log(str(log), unread) if log else None
    if tail is not None:
        parts.append(tail[0])
        sources.append(f"--log {log}")
    facts = nccllog.parse("\n".join(parts))
    facts.update(sources=sources, unread=unread)
    return facts, []
