"""Probe ``peers``: from this node, a bounded TCP connect to each host of the job on its ssh port (the
launch's --ssh_port, else what ``ssh -G HOST`` says, else 22) and on the rendezvous port (MASTER_PORT), to
the rendezvous address, and whether this node's own name resolves to a loopback address on a job of more
than one node.

Facts: ``hosts`` [{host, address, ssh_port, ssh_port_source, ssh, rendezvous}] (each a
:func:`zdoctor.layers.launch.peers.tcp_reach` record), ``master`` {address, port, source, resolved, reach},
``own_name`` (:func:`zdoctor.layers.launch.peers.own_name`, with ``route_source``), ``nodes`` (how many nodes
the job spans, when known), ``skipped_hosts``.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

from zdoctor.core.factstypes import PeersFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import facts_of, probe
from zdoctor.layers.launch.hostcheck import resolve_all
from zdoctor.layers.launch.peers import own_name, reach_all, route_source
from zdoctor.layers.launch.ports import DEFAULT_MASTER_PORT
from zdoctor.layers.launch.probe_launch import SSH_MAX_HOSTS, SSH_PARALLEL
from zdoctor.proc.privilege import runs_as_of
from zdoctor.proc.runner import run
from zdoctor.proc.systools import system_tool_or_name
from zdoctor.proc.target import target_of

SSH_PORT = 22
#: The symptom kind of a rank that could not reach the rendezvous store (torch's client socket).
RENDEZVOUS_CONNECT = "rendezvous-connect"


def ssh_config_port(host: str, run_as: Any = None) -> int | None:
    """The port ssh would use for ``host`` (``ssh -G HOST``: the client's configuration, nothing is sent)."""
    ev = run([system_tool_or_name("ssh"), "-G", "--", host], timeout=5, run_as=run_as, label=f"ssh -G {host}")
    for line in (ev.stdout or "").splitlines():
        key, _, value = line.partition(" ")
        if key == "port" and value.strip().isdigit():
            return int(value)
    return None


def _port(text: Any) -> int | None:
    s = str(text or "").strip().rpartition(":")[2]
    return int(s) if s.isdigit() and 0 < int(s) < 65536 else None


def nodes_of(launch: dict[str, Any], hostfile_nodes: int) -> int | None:
    """How many nodes the launch spans: its --num_nodes / --nnodes, else the hostfile's hosts."""
    n = str((launch.get("options") or {}).get("num_nodes") or "").split(":")[-1]
    if n.isdigit():
        return int(n)
    return hostfile_nodes or None


def master_of(launch: dict[str, Any], env: dict[str, str], hosts: list[str],
              symptoms: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Where rank 0's store listens: the launch's options, MASTER_ADDR/MASTER_PORT, the address a rank's
    connect error names, else the hostfile's first host (DeepSpeed's launcher's choice) on 29500."""
    opts = launch.get("options") or {}
    endpoint = str(opts.get("rdzv_endpoint") or "")
    addr = opts.get("master_addr") or (endpoint.rpartition(":")[0] if ":" in endpoint else endpoint) or \
        env.get("MASTER_ADDR")
    port = _port(opts.get("master_port")) or _port(endpoint) or _port(env.get("MASTER_PORT"))
    source = "the launch's options and MASTER_ADDR/MASTER_PORT"
    for s in symptoms:
        f = s.get("fields") or {}
        if s.get("kind") == RENDEZVOUS_CONNECT and f.get("host"):
            addr, port, source = addr or f["host"], port or _port(f.get("port")), f"the message {s.get('id')}"
    if not addr and hosts:
        addr, source = hosts[0], "the hostfile's first host (DeepSpeed's launcher makes it rank 0's node)"
    if not addr:
        return None
    return {"address": str(addr), "port": port or DEFAULT_MASTER_PORT, "source": source}


def collect_peers(hosts: list[dict[str, Any]], master: dict[str, Any] | None, *, ssh_port: int | None = None,
                  run_as: Any = None, nodes: int | None = None) -> tuple[PeersFacts, list[Evidence]]:
    """The ``peers`` facts: ``hosts`` are ``{host, addresses}`` (the hostfile's name lookups)."""
    facts: PeersFacts = {"hosts": [], "master": None, "own_name": own_name(), "nodes": nodes,
                         "skipped_hosts": max(0, len(hosts) - SSH_MAX_HOSTS)}
    todo = [h for h in hosts[:SSH_MAX_HOSTS] if h.get("addresses")]

    def port_for(name: str) -> tuple[int, str]:
        if ssh_port:
            return ssh_port, "the launch's --ssh_port"
        p = ssh_config_port(name, run_as)
        return (p, "ssh -G (the client's configuration)") if p else (SSH_PORT, "ssh's default")

    with concurrent.futures.ThreadPoolExecutor(max_workers=SSH_PARALLEL) as pool:
        ports = list(pool.map(lambda h: port_for(h["host"]), todo))
    rdzv_port = (master or {}).get("port") or DEFAULT_MASTER_PORT
    targets = [(h["addresses"][0], p, True) for h, (p, _) in zip(todo, ports)]
    targets += [(h["addresses"][0], rdzv_port, False) for h in todo]
    maddr = None
    if master:
        found = next((h["addresses"] for h in hosts if h["host"] == master["address"]), None) or \
            (resolve_all([master["address"]])[0]["addresses"])
        maddr = found[0] if found else None
        if maddr:
            targets.append((maddr, master["port"], False))
    reached = reach_all(targets)
    n = len(todo)
    for i, (h, (p, src)) in enumerate(zip(todo, ports)):
        facts["hosts"].append({"host": h["host"], "address": h["addresses"][0], "ssh_port": p,
                               "ssh_port_source": src, "ssh": reached[i], "rendezvous": reached[n + i]})
    if master:
        facts["master"] = {**master, "resolved": maddr, "reach": reached[2 * n] if maddr else None}
    rows = [[h["host"], h["address"], f"{h['ssh_port']}: {h['ssh']['state']}" + (
        f" ({h['ssh']['banner']})" if h["ssh"].get("banner") else ""),
        f"{rdzv_port}: {h['rendezvous']['state']}"] for h in facts["hosts"]]
    ev = [Evidence.of_table("TCP from this node to the job's hosts", ["host", "address", "ssh port",
                                                                     "rendezvous port"], rows,
                            [i for i, r in enumerate(rows) if ": connected" not in r[2]])]
    m = facts["master"]
    if m:
        ev.append(Evidence.note("rendezvous address", f"{m['address']}:{m['port']} ({m['source']}): "
                                + (m["reach"]["state"] if m.get("reach") else "does not resolve here")))
    on = facts["own_name"]
    first_peer = next((h["address"] for h in facts["hosts"]), None) or maddr
    on["route_source"] = route_source(first_peer) if first_peer else None
    ev.append(Evidence.note("this node's name", "; ".join(
        f"{x['name']} -> {', '.join(x['addresses']) or x['error']}" for x in on["names"])))
    return facts, ev


@probe("peers", title="TCP from this node to the job's hosts: ssh and rendezvous ports", timeout=60,
       needs=("launch", "hostfile", "symptoms"), facts=PeersFacts)
def peers_probe(host: Any) -> tuple[PeersFacts, list[Evidence]]:
    target = target_of(host)
    lf, hf = facts_of(host, "launch"), facts_of(host, "hostfile")
    launch = lf.get("launch") or {}
    env = {**target.env, **(lf.get("env") or {})}
    symptoms = facts_of(host, "symptoms").get("symptoms") or []
    hosts = [{"host": r["host"], "addresses": r["addresses"]} for r in hf.get("resolve") or []]
    master = master_of(launch, env, [h["host"] for h in hosts], symptoms)
    if not hosts and master is None:
        return {"skipped": "no hostfile and no rendezvous address (MASTER_ADDR): no peer to connect to"}, []
    return collect_peers(hosts, master, ssh_port=_port((launch.get("options") or {}).get("ssh_port")),
                         run_as=runs_as_of(host), nodes=nodes_of(launch, len(hf.get("nodes") or [])))
