"""NCCL's network: the interface NCCL would choose (by its own rules) and its state, whether it routes to
MASTER_ADDR and the hostfile's hosts, and the InfiniBand / RoCE ports against the NCCL_IB_* variables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from zdoctor.core.factstypes import NcclNetFacts
from zdoctor.core.model import Evidence, Finding, Remedy
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Concluded, Facts, check
from zdoctor.core.shellquote import shell_quote
from zdoctor.layers.nccl_network import infiniband, nccllog, ncclnet
from zdoctor.symptoms.match import ids_for, symptoms_of

NO_PEERS = ("not examined: no hostfile or MASTER_ADDR given (name the job's nodes with --hostfile FILE, or set "
            "MASTER_ADDR in the training environment)")


def _ifname_value(name: str, interfaces: Sequence[Mapping[str, Any]]) -> str:
    """The NCCL_SOCKET_IFNAME value that selects exactly ``name``: the name itself, or ``=name`` when another
    interface starts with it (a prefix would select both)."""
    others = [i["ifname"] for i in interfaces if i["ifname"] != name and i["ifname"].startswith(name)]
    return f"={name}" if others else name


def _ifname_remedy(name: str, interfaces: Sequence[Mapping[str, Any]], why: str, current: str | None) -> Remedy:
    value = _ifname_value(name, interfaces)
    return Remedy(title=f"Point NCCL at {name}: export NCCL_SOCKET_IFNAME={value}",
                  commands=[f"export NCCL_SOCKET_IFNAME={shell_quote(value)}"],
                  undo=[f"export NCCL_SOCKET_IFNAME={shell_quote(current)}" if current else "unset NCCL_SOCKET_IFNAME"],
                  verified=None, note="not tried, because it changes the launch of every rank: set it in the "
                                      "environment the launcher passes to all nodes",
                  explanation=why)


def _iface(nf: Mapping[str, Any], name: str | None) -> dict[str, Any] | None:
    return next((i for i in nf.get("interfaces") or [] if i["ifname"] == name), None)


def _route_devs(nf: Mapping[str, Any]) -> list[str]:
    """The interfaces the routes to the peers use (most common first), local deliveries left out."""
    counts: dict[str, int] = {}
    for p in nf.get("peers") or []:
        r = p.get("route") or {}
        if r.get("dev") and r.get("type") != "local" and r.get("dev") != "lo":
            counts[r["dev"]] = counts.get(r["dev"], 0) + 1
    return sorted(counts, key=lambda d: -counts[d])


def _masters_with_address(interfaces: Sequence[Mapping[str, Any]], ports: list[str]) -> list[tuple[str, str]]:
    """(port, master) for each of ``ports`` enslaved to a bond or bridge that has an address."""
    out = []
    for port in ports:
        i = next((x for x in interfaces if x["ifname"] == port), {})
        master = i.get("master") or i.get("sysfs_master")
        m = next((x for x in interfaces if x["ifname"] == master), None)
        if m is not None and m.get("addrs"):
            out.append((port, str(master)))
    return out


def _multi_node(nf: Mapping[str, Any]) -> bool:
    return any((p.get("route") or {}).get("type") != "local" for p in nf.get("peers") or [] if p.get("route"))


def _at_probe_time(facts: Facts, probe: str, ev: Evidence) -> Evidence:
    """``ev`` dated when the probe it is built from ran (a replay then gives the same evidence)."""
    res = facts.get(probe)
    ev.started = res.started if res is not None else 0.0
    return ev


def _table(nf: Mapping[str, Any], chosen: Sequence[Mapping[str, Any]]) -> Evidence:
    names = [c["ifname"] for c in chosen]
    rows, hl = [], []
    for n, i in enumerate(nf.get("interfaces") or []):
        if i["ifname"] in names:
            hl.append(n)
        rows.append([i["ifname"], "chosen" if i["ifname"] in names[:1] else "also used" if i["ifname"] in names else "",
                     i.get("operstate") or "?", str(i.get("mtu") or "?"),
                     ", ".join(f"{a['local']}/{a['prefixlen']}" for a in i["addrs"]) or "(no address)",
                     i.get("master") or i.get("sysfs_master") or "",
                     " ".join(i.get("bond_slaves") or i.get("bridge_ports") or [])])
    return Evidence.of_table("interfaces against NCCL's choice", ["interface", "NCCL", "state", "MTU", "addresses",
                                                                  "master", "members"], rows, hl)


def _env_note(nf: Mapping[str, Any]) -> Evidence:
    env = nf.get("env") or {}
    rules = nf.get("choice") or {}
    text = "\n".join(f"{k}={v}" for k, v in sorted(env.items())) or "(no NCCL variable set)"
    if rules.get("source") == "NCCL_SOCKET_IFNAME":
        rule = (f"NCCL_SOCKET_IFNAME={rules.get('rule')} (prefix match unless it starts with '=', excluded when it "
                "starts with '^')")
    else:
        rule = ("unset, so the default order ib*, the NCCL_COMM_ID subnet, anything but docker*/lo*/virbr*, "
                f"docker*, lo* picked: {rules.get('rule') or 'nothing'}")
    text += "\n\nNCCL's rule: " + rule
    return Evidence.note("the training's NCCL variables", text + "\nsource: " + "; ".join(ncclnet.SOURCES[:2]))


def _log_lines(log: Mapping[str, Any] | None, predicted: str | None) -> tuple[list[str], str | None]:
    """What NCCL's own output said, and whether it disagrees with the rules' prediction."""
    if not log or not log.get("seen"):
        where = " in " + ", ".join(log["sources"]) if log and log.get("sources") else ""
        return [f"NCCL's own choice was not read: no NCCL INFO line{where} (run once with NCCL_DEBUG=INFO "
                "NCCL_DEBUG_SUBSYS=INIT,NET and give its output with --log)."], None
    said = nccllog.chosen_interface(log)
    lines = []
    if log.get("bootstrap"):
        lines.append(f"NCCL's output: bootstrap on {log['bootstrap']['ifname']} ({log['bootstrap']['address']}).")
    if log.get("network"):
        lines.append(f"NCCL's output: network {log['network']}.")
    if log.get("socket"):
        used = ", ".join(f"{s['ifname']} ({s['address']})" for s in log["socket"])
        lines.append(f"NCCL's output: NET/Socket on {used}.")
    if log.get("ib"):
        lines.append("NCCL's output: NET/IB on " + ", ".join(f"{d['device']}:{d['port']}/{d['link_layer']}"
                                                            for d in log["ib"]) + ".")
    if log.get("ib_none"):
        lines.append("NCCL's output: NET/IB found no device (it falls back to sockets).")
    for w in log.get("warns") or []:
        lines.append(f"NCCL WARN {w}")
    differs = said if said and predicted and said != predicted else None
    return lines, differs



def _network(facts: Facts, me: CheckSpec) -> NcclNetFacts:
    """The network's facts; the check ends not checked where the probe gave none or skipped (and why)."""
    nf = facts.of("nccl_net")
    if nf is None or nf.get("skipped"):
        raise Concluded(me.not_checked((nf or {}).get("skipped") or facts.why_not("nccl_net"), sub="not-checked"))
    return nf

@check("nccl.socket", title="The interface NCCL chooses", probes=("nccl_net",), optional=("nccl_log",),
       explains=("nccl-interface",), layer="nccl-network")
def check_socket(facts: Facts, me: CheckSpec) -> list[Finding]:
    nf = _network(facts, me)
    choice = nf.get("choice") or {}
    chosen = choice.get("chosen") or []
    interfaces = nf.get("interfaces") or []
    env = nf.get("env") or {}
    current = env.get("NCCL_SOCKET_IFNAME")
    ev = [_at_probe_time(facts, "nccl_net", e) for e in (_table(nf, chosen), _env_note(nf))]
    log = facts.of("nccl_log")
    log_lines, differs = _log_lines(log, chosen[0]["ifname"] if chosen else None)
    devs = _route_devs(nf)
    explained = ids_for(facts, "nccl-interface")
    if not chosen:
        without = choice.get("matched_without_address") or []
        if choice.get("source") == "NCCL_SOCKET_IFNAME":
            what = (f"NCCL_SOCKET_IFNAME={current} matches {', '.join(without)}, which "
                    f"{'has' if len(without) == 1 else 'have'} no IPv4 or IPv6 address: NCCL lists only interfaces "
                    "with an address, finds none, and fails with 'Bootstrap : no socket interface found'"
                    if without else f"NCCL_SOCKET_IFNAME={current} matches no interface of this node (its names: "
                                    f"{', '.join(i['ifname'] for i in interfaces)})")
        else:
            what = "no interface of this node has an address NCCL can use"
        masters = _masters_with_address(interfaces, without)
        if masters:
            what += "; " + "; ".join(f"{port} is a port of {m}, which holds the address" for port, m in masters)
        target = masters[0][1] if masters else devs[0] if devs else ncclnet.choose(
            interfaces, {k: v for k, v in env.items() if k != "NCCL_SOCKET_IFNAME"}).get("chosen")
        name = target if isinstance(target, str) else (target[0]["ifname"] if target else None)
        why_name = (" and is the bond or bridge the selected interface belongs to" if masters else
                    " and is the interface the route to the other nodes uses" if devs else
                    " and is what NCCL picks with the variable unset")
        rem = [_ifname_remedy(name, interfaces, f"{name} has an address{why_name}", current)] if name else []
        return [me.finding(status="fail", title="NCCL finds no interface to use" if not without else
                           f"NCCL_SOCKET_IFNAME selects {', '.join(without)}, which has no address",
                           detail="\n".join([what + ".", *log_lines]), evidence=ev, remedies=rem, explains=explained)]
    first: Mapping[str, Any] = chosen[0]
    iface = _iface(nf, first["ifname"]) or {}
    problems: list[str] = []
    status = "ok"
    flags = iface.get("flags") or ["UP"]
    if (iface.get("operstate") or "").upper() == "DOWN" or "UP" not in flags:
        status = "fail"
        problems.append(f"{first['ifname']} is down (state {iface.get('operstate')}): NCCL binds to its address "
                        f"{first['address']}, and nothing reaches it")
    elif "NO-CARRIER" in flags or (iface.get("operstate") or "").upper() == "LOWERLAYERDOWN":
        status = "fail"
        problems.append(f"{first['ifname']} has no carrier (state {iface.get('operstate')}): its link (cable, "
                        "switch port or the device under it) is down, and nothing reaches its address "
                        f"{first['address']}")
    if ncclnet.is_local_only(first["ifname"]) and _multi_node(nf):
        status = "fail"
        problems.append(f"{first['ifname']} ({first['address']}) is reachable only from this node, and the job "
                        "has other nodes: they cannot connect to it")
    if first.get("family") == "inet6" and str(first.get("address", "")).lower().startswith("fe80") and _multi_node(nf):
        status = "fail" if status == "fail" else "warn"
        problems.append(f"{first['ifname']}'s only usable address is the link-local {first['address']}: it reaches "
                        "only the same link, and only with its scope, which the other nodes do not have")
    if differs:
        status = "fail" if status == "fail" else "warn"
        problems.append(f"NCCL's own output says it used {differs}, the rules on this node's interfaces give "
                        f"{first['ifname']}: the run's environment or node differs from the one examined")
    if choice.get("ignored"):
        problems.append(choice["ignored"])
    how = (f"set by NCCL_SOCKET_IFNAME={current}" if choice.get("source") == "NCCL_SOCKET_IFNAME"
           else f"chosen by NCCL's default order: {choice.get('rule')}")
    head = f"NCCL bootstraps on {first['ifname']} ({first['address']}, {how})"
    if len(chosen) > 1:
        head += "; its socket transport also uses " + ", ".join(c["ifname"] for c in chosen[1:])
    lines = [head + ".", *problems, *log_lines]
    rem = []
    if status != "ok":
        good = next((d for d in devs if d != first["ifname"]), None)
        if good:
            rem.append(_ifname_remedy(good, interfaces, "the route to the other nodes goes through it", current))
    title = (f"NCCL would use {first['ifname']} ({first['address']})" if status == "ok" else
             f"NCCL's interface {first['ifname']}: " + problems[0].split(":")[0])
    return [me.finding(status=status, title=title, detail="\n".join(lines), evidence=ev, remedies=rem,
                       explains=explained if status == "fail" else [])]


@check("nccl.peers", title="NCCL's interface routes to the other nodes", probes=("nccl_net",),
       explains=("nccl-connect",), layer="nccl-network")
def check_peers(facts: Facts, me: CheckSpec) -> list[Finding]:
    nf = _network(facts, me)
    peers = nf.get("peers") or []
    hf = nf.get("hostfile") or {}
    if not peers:
        why = f"the hostfile could not be read: {hf['error']}" if hf.get("error") else NO_PEERS
        return [me.not_checked(why, sub="not-checked")]
    chosen = (nf.get("choice") or {}).get("chosen") or []
    if not chosen:
        return [me.not_checked("NCCL has no interface to route from (see nccl.socket)", sub="not-checked")]
    mine = chosen[0]["ifname"]
    rows: list[list[str]] = []
    hl, bad = [], []
    for n, p in enumerate(peers):
        r = p.get("route") or {}
        if p.get("address") is None:
            verdict = f"does not resolve: {p.get('resolve_error')}"
        elif p.get("route_error"):
            verdict = f"no route: {p['route_error']}"
        elif r.get("type") == "local":
            verdict = "this node"
        elif r.get("dev") != mine:
            verdict = f"routed through {r.get('dev')}, not {mine}"
        else:
            verdict = f"through {mine}"
        if verdict not in ("this node", f"through {mine}"):
            bad.append((p, verdict))
            hl.append(n)
        rows.append([p["name"], p["source"], p.get("address") or "?", r.get("dev") or "?", r.get("gateway") or "",
                     r.get("prefsrc") or "", verdict])
    ev = [_at_probe_time(facts, "nccl_net", Evidence.of_table(
        f"routes to the job's nodes (NCCL uses {mine})",
        ["peer", "from", "address", "route via", "gateway", "source address", "verdict"], rows, hl))]
    more = nf.get("peers_total", len(peers)) - len(peers)
    tail = [f"{count_of(more, 'more host')} of the hostfile were not looked up."] if more > 0 else []
    if hf.get("error"):
        tail.append(f"The hostfile could not be read: {hf['error']}")
    if not bad:
        return [me.finding(status="ok", title=f"{mine} routes to all {count_of(len(peers), 'peer address')}",
                           detail="\n".join([f"Every peer's address routes through {mine}, the interface NCCL uses "
                                             "(ip route get; no traffic sent).", *tail]), evidence=ev)]
    lines = [f"NCCL uses {mine} ({chosen[0]['address']}), but:"] + [f"  {p['name']} ({p.get('address') or '?'}): {v}"
                                                                     for p, v in bad]
    lines.append("A rank that listens and connects on an interface the other nodes' addresses are not routed "
                 "through hangs in the bootstrap or fails with 'Connect to ... failed'.")
    devs = [d for d in _route_devs(nf) if d != mine]
    rem = [_ifname_remedy(devs[0], nf.get("interfaces") or [], f"the routes to {', '.join(p['name'] for p, _ in bad)} "
                          f"go through {devs[0]}", (nf.get("env") or {}).get("NCCL_SOCKET_IFNAME"))] if devs else []
    explained = [i for p, _ in bad for i in ids_for(facts, "nccl-connect", address=p.get("address"))]
    return [me.finding(status="fail", title=f"NCCL's interface {mine} does not route to "
                       + ", ".join(p["name"] for p, _ in bad[:3]) + (" ..." if len(bad) > 3 else ""),
                       detail="\n".join(lines + tail), evidence=ev, remedies=rem, explains=explained)]


@check("nccl.ib", title="InfiniBand / RoCE ports against NCCL_IB_*", probes=("infiniband", "nccl_net"),
       explains=("nccl-ib", "nccl-ib-verbs"), layer="nccl-network")
def check_ib(facts: Facts, me: CheckSpec) -> list[Finding]:
    ib = facts.of("infiniband")
    nf = facts.of("nccl_net") or {}
    env = nf.get("env") or {}
    if ib is None:
        return [me.not_checked(facts.why_not("infiniband"), sub="not-checked")]
    if not ib.get("present") or not ib.get("devices"):
        if (env.get("NCCL_NET") or "").upper() == "IB":
            return [me.finding(status="fail", title="NCCL_NET=IB, and this node has no InfiniBand device",
                               detail=f"{ib.get('root')} lists no device: NCCL cannot initialise the IB network it is "
                                      "told to use.",
                               remedies=[Remedy("Let NCCL use sockets", ["unset NCCL_NET"],
                                                undo=[f"export NCCL_NET={shell_quote(env['NCCL_NET'])}"], verified=None,
                                                note="not tried, because it changes every rank's launch")])]
        why = ib.get("error") or (f"no device under {ib.get('root')}" if ib.get("present") else
                                  f"no {ib.get('root')}: no InfiniBand or RoCE device on this node")
        return [me.not_checked(f"not examined: {why}", sub="not-checked")]
    a = infiniband.analyze(ib, env)
    ev = facts.evidence("infiniband")
    probs = a["problems"]
    status = "fail" if any(p["status"] == "fail" for p in probs) else "warn" if probs else "ok"
    lines = [p["text"] for p in probs]
    if a["ib_disabled"]:
        lines.append("NCCL_IB_DISABLE is set: NCCL does not use these ports and moves inter-node data over sockets.")
    usable = ", ".join(f"{u['device']}:{u['port']} ({u['link_layer']}, {u['rate']})" for u in a["usable"]) or "none"
    lines.insert(0, f"Ports NCCL would use: {usable}.")
    rem: list[Remedy] = []
    v2 = _roce_v2_index(ib, a)
    if any(p["kind"] in ("gid-empty", "gid-roce-v1", "gid-link-local") for p in probs) and v2 is not None:
        rem.append(Remedy(f"Use the RoCE v2 GID at index {v2}", [f"export NCCL_IB_GID_INDEX={v2}"],
                          undo=[f"export NCCL_IB_GID_INDEX={shell_quote(env.get('NCCL_IB_GID_INDEX', ''))}"],
                          verified=None, note="not tried, because it changes every rank's launch; every node "
                                              "needs a RoCE v2 GID at the same index",
                          explanation="the GID with the interface's routable address, as RoCE v2 (show_gids lists "
                                      "the table)"))
    if any(p["kind"] == "hca-none" for p in probs) and a["usable"] == [] and ib.get("devices"):
        names = sorted({d["name"] for d in ib["devices"]})
        rem.append(Remedy("Name a device this node has", [f"export NCCL_IB_HCA={shell_quote(','.join(names))}"],
                          undo=[f"export NCCL_IB_HCA={shell_quote(env.get('NCCL_IB_HCA', ''))}"], verified=None,
                          note="not tried, because it changes every rank's launch"))
    gid_kinds = {"gid-empty", "gid-roce-v1", "gid-link-local", "port-down", "hca-none"}
    explained = ids_for(facts, "nccl-ib") if any(p["kind"] in gid_kinds for p in probs) else []
    if not a["usable"] and any(p["kind"] in ("port-down", "hca-none") for p in probs):
        # no port NCCL may use is up: that is its "NET/IB : No device found."
        explained += [x.id for x in symptoms_of(facts) if x.signature == "nccl.ib-no-device"]
    title = ("InfiniBand / RoCE ports as NCCL_IB_* asks" if status == "ok" else
             probs[0]["text"].split(":")[0] if probs else "InfiniBand / RoCE ports")
    return [me.finding(status=status, title=title, detail="\n".join(lines), evidence=ev, remedies=rem,
                       explains=explained)]


def _roce_v2_index(ib: Mapping[str, Any], a: dict[str, Any]) -> int | None:
    """The index of a RoCE v2 GID with a routable address that every usable RoCE port has."""
    common: set[int] | None = None
    for d in ib.get("devices") or []:
        for p in d.get("ports") or []:
            if not any(u["device"] == d["name"] and u["port"] == p["port"] for u in a["usable"]):
                continue
            if p.get("link_layer") != "Ethernet":
                continue
            idx = {g["index"] for g in p.get("gids") or [] if "v2" in (g.get("type") or "") and not g.get("link_local")}
            common = idx if common is None else common & idx
    return min(common) if common else None
