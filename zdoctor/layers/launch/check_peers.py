"""Check ``launcher.peers``: the job's hosts answer on their ssh port and rank 0's store answers on the
rendezvous port, told apart as refused, timed out, reset or unreachable; and (``launcher.peers.own-name``)
on a job of more than one node, this node's name does not resolve to a loopback address."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from zdoctor.core.model import Finding, Remedy
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.layers.launch.probe_peers import RENDEZVOUS_CONNECT
from zdoctor.symptoms.match import ids_for

CID = "launcher.peers"
OWN_NAME = f"{CID}.own-name"
SSH_CONNECT = "ssh-connect"

#: What each state of a TCP connect means, for an ssh port and for the rendezvous port.
MEANS = {
    "refused": "the host answered, but nothing listens on that port",
    "timed out": "no answer at all: a firewall drops the packets, or the host is down",
    "reset": "it accepted the connection, then reset it (a server refusing clients: tcp wrappers, sshd's "
             "MaxStartups, a proxy)",
    "unreachable": "this node has no route to it (or its neighbour lookup failed)",
    "error": "the connect failed",
}


def _ssh_remedy(h: dict[str, Any]) -> Remedy:
    state, host, port = h["ssh"]["state"], h["host"], h["ssh_port"]
    if state == "refused":
        return Remedy(title=f"Start sshd on {host}, or give the launcher the port it listens on",
                      commands=[f"ssh -p {port} {shlex.quote(host)} true   # after, on {host}: systemctl start "
                                "sshd (or ssh on Debian/Ubuntu)"],
                      note="not tried, because it changes another node",
                      explanation=f"Nothing listens on {host}:{port}. Start the ssh server there, or, if it listens "
                                  "on another port, give deepspeed --ssh_port PORT (or a Port line in ~/.ssh/config "
                                  "for the host).")
    if state == "timed out":
        return Remedy(title=f"Let this node reach {host}:{port} through the firewall",
                      commands=[f"# on {host}: allow TCP {port} from this node (firewall-cmd --add-service=ssh, "
                                f"ufw allow {port}/tcp, or the cloud's security group)"],
                      note="not tried, because it changes another node's firewall",
                      explanation="No answer came within the time limit: the packets are dropped on the way "
                                  f"or {host} is down. Check it answers ping, then the firewalls on both sides.")
    return Remedy(title=f"Look at {host}'s network and sshd",
                  commands=[f"ssh -v -p {port} {shlex.quote(host)} true"],
                  note="not tried, because it only shows more of the failure",
                  explanation=MEANS.get(state, "the connect failed") + ".")


def _hosts_finding(facts: Facts, me: CheckSpec, pf: Mapping[str, Any]) -> Finding | None:
    ev = facts.evidence("peers")
    hosts = pf.get("hosts") or []
    if not hosts:
        return None
    bad = [h for h in hosts if h["ssh"]["state"] != "connected"]
    if not bad:
        silent = [h for h in hosts if not (h["ssh"].get("banner") or "").startswith("SSH-")]
        return me.finding(status="warn" if silent else "ok",
                       title=f"All {count_of(len(hosts), 'host')} answer on their ssh port"
                             + (f"; {len(silent)} did not greet as an ssh server" if silent else ""),
                       detail="; ".join(f"{h['host']}:{h['ssh_port']} ({h['ssh_port_source']}): "
                                        f"{h['ssh'].get('banner') or h['ssh'].get('error') or 'no greeting'}"
                                        for h in hosts), evidence=ev)
    explains = [i for h in bad for name in dict.fromkeys((h["host"], h["address"]))
                for i in ids_for(facts, SSH_CONNECT, host=name, port=h["ssh_port"])]
    return me.finding(status="fail",
                   title=f"{count_of(len(bad), 'host')} of the job do not answer on the ssh port: "
                         + ", ".join(f"{h['host']} ({h['ssh']['state']})" for h in bad),
                   detail="; ".join(f"{h['host']} ({h['address']}) port {h['ssh_port']} ({h['ssh_port_source']}): "
                                    f"{h['ssh']['state']}, {MEANS.get(h['ssh']['state'], '')} "
                                    f"[{h['ssh'].get('error') or ''}]" for h in bad)
                          + ". The DeepSpeed launcher (pdsh), mpirun and the fleet all start the ranks there "
                            "through ssh.",
                   evidence=ev, explains=explains, remedies=[_ssh_remedy(h) for h in bad[:4]])


def _master_finding(facts: Facts, me: CheckSpec, pf: Mapping[str, Any]) -> Finding | None:
    m = pf.get("master")
    if not m:
        return None
    ev = facts.evidence("peers")
    where = f"{m['address']}:{m['port']}"
    explains = [i for name in dict.fromkeys(x for x in (m["address"], m.get("resolved")) if x)
                for i in ids_for(facts, RENDEZVOUS_CONNECT, host=name, port=m["port"])]
    reach = m.get("reach")
    if reach is None:
        return me.finding(status="fail" if explains else "warn",
                       title=f"The rendezvous address {m['address']} does not resolve here",
                       detail=f"Rank 0's store is looked for at {where} ({m['source']}); this node cannot resolve "
                              "the name, so no rank here can join.", evidence=ev, explains=explains)
    state = reach["state"]
    if state == "connected":
        detail = (f"Something listens on {where} ({m['source']}) now."
                  + (" When the message was printed it did not: rank 0 started later than this rank's timeout, "
                     "or was restarted." if explains else ""))
        return me.finding(status="warn" if explains else "ok",
                       title=f"The rendezvous address {where} answers from this node", detail=detail, evidence=ev)
    if not explains:
        return me.finding(status="ok", title=f"Nothing answers on {where} yet ({state})",
                       detail=f"{where} ({m['source']}): {state}. Rank 0 listens there only while the job runs; "
                              "no rank reported failing to reach it.", evidence=ev)
    why = {"refused": "rank 0 is not running there (it failed or exited first), or listens on another port "
                      "(each node must get the same --master_port)",
           "timed out": "the packets are dropped between the nodes (a firewall) or the host is down",
           "unreachable": "this node has no route to that address: MASTER_ADDR may be an address of another "
                          "network (or a loopback address of rank 0's node)"}.get(state, MEANS.get(state, ""))
    return me.finding(status="fail", title=f"The rendezvous address {where} is {state} from this node",
                   detail=f"{where} ({m['source']}): {state} [{reach.get('error') or ''}]: {why}. Ranks wait there "
                          "for rank 0's store until their timeout, then fail.",
                   evidence=ev, explains=explains,
                   remedies=[Remedy(title="Read rank 0's own output first, then check the address",
                                    commands=[f"ssh {shlex.quote(m['address'])} ss -ltnp 'sport = :{m['port']}'"],
                                    note="not tried, because it runs on another node",
                                    explanation="If rank 0 failed, its error is the cause; if it runs, the port "
                                                "it listens on must be the one every node was given.")])


def _own_name_finding(facts: Facts, me: CheckSpec, pf: Mapping[str, Any]) -> Finding:
    on = pf.get("own_name") or {}
    nodes = pf.get("nodes")
    ev = facts.evidence("peers", labels=("this node's name",))
    loop = [x for x in on.get("names") or [] if x.get("loopback_only")]
    if not isinstance(nodes, int) or nodes < 2:
        return me.not_checked("the job's node count is not known to be more than one", ev, sub="own-name",
                              part="this node's name")
    if not loop:
        names = "; ".join(f"{x['name']} -> {', '.join(x['addresses']) or x['error']}" for x in on.get("names") or [])
        return me.finding(sub="own-name", status="ok", title="This node's name resolves to an address peers can use",
                       detail=names, evidence=ev)
    src = on.get("route_source")
    name = on.get("hostname") or loop[0]["name"]
    line = f"{src or 'ADDRESS'} {name}"
    return me.finding(
        sub="own-name", status="fail",
        title=f"This node's name {loop[0]['name']} resolves to {', '.join(loop[0]['addresses'])} on a "
              f"{nodes}-node job",
        detail="Ranks that advertise their host by name (torchrun's rendezvous, gloo's default interface, "
               "DeepSpeed's launcher when it asks a node for its address) give the peers a loopback address, "
               "which on the peers is themselves: they never connect, or wait until the timeout."
               + (f" This node sends to its peers from {src}." if src else ""),
        evidence=ev,
        remedies=[Remedy(title=f"Map {name} to the node's address in /etc/hosts",
                         commands=[f"sed -i.bak '/^127\\.0\\.1\\.1[[:space:]]/d' /etc/hosts && "
                                   f"echo {shlex.quote(line)} >> /etc/hosts"],
                         requires_root=True, undo=["mv /etc/hosts.bak /etc/hosts"],
                         note="not tried, because it changes /etc/hosts of this node: only on your yes",
                         explanation="Debian and Ubuntu write `127.0.1.1 HOSTNAME` at install; a cluster node "
                                     "needs its name to resolve to the address its peers reach."),
                   Remedy(title="Or name the address and interface for this run",
                          commands=[f"export MASTER_ADDR={src or 'ADDRESS'} GLOO_SOCKET_IFNAME=IFACE "
                                    "NCCL_SOCKET_IFNAME=IFACE"],
                          note="not tried, because trying it starts the training",
                          explanation="IFACE is the interface holding that address (ip -br addr).")])


@check(CID, title="The job's hosts answer on the ssh and rendezvous ports; this node's name is not loopback",
       probes=("peers",), findings=(OWN_NAME,), explains=(SSH_CONNECT, RENDEZVOUS_CONNECT), layer="launch")
def check_peers(facts: Facts, me: CheckSpec) -> list[Finding]:
    pf = me.require(facts.of("peers"), facts.why_not("peers"), sub="not-checked")
    out = [f for f in (_hosts_finding(facts, me, pf), _master_finding(facts, me, pf)) if f is not None]
    return [*out, _own_name_finding(facts, me, pf)]
