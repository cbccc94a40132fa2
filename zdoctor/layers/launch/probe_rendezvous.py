"""Probe ``rendezvous``: the port the launch's rank 0 listens on (``--master_port``, MASTER_PORT, the port an
EADDRINUSE message names, else 29500), who already listens on it on this node, and a free one.

Facts: ``ports`` [{port, source, listeners: :func:`zdoctor.layers.launch.ports.port_listeners`}], ``free_port``,
``launcher``, ``slurm`` (SLURM_* variables in the training environment: the job runs under Slurm),
``job_pids`` (the running job's own processes, when ``--pid`` names it: its own listener is no stranger).
"""

from __future__ import annotations

from typing import Any

from zdoctor.core.factstypes import RendezvousFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import facts_of, probe
from zdoctor.layers.launch.ports import DEFAULT_MASTER_PORT, free_port, port_listeners
from zdoctor.proc.target import target_of

#: The symptom kind of a rendezvous port another socket holds (the catalogue's ``port-in-use``).
PORT_IN_USE = "port-in-use"


def _port(text: Any) -> int | None:
    s = str(text or "").strip().rpartition(":")[2]
    return int(s) if s.isdigit() and 0 < int(s) < 65536 else None


def rendezvous_ports(launch: dict[str, Any], env: dict[str, str],
                     symptoms: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """``[(port, where it was learned)]``: the launch's own option, the environment's MASTER_PORT, each port
    an EADDRINUSE message names; DeepSpeed's and torch's default when none is given."""
    opts = (launch or {}).get("options") or {}
    found: list[tuple[int, str]] = []
    for key, where in (("master_port", "the launch's --master_port"),
                       ("rdzv_endpoint", "the launch's --rdzv_endpoint")):
        p = _port(opts.get(key))
        if p:
            found.append((p, where))
    p = _port(env.get("MASTER_PORT"))
    if p and not found:
        found.append((p, "MASTER_PORT"))
    for s in symptoms:
        p = _port((s.get("fields") or {}).get("port")) if s.get("kind") == PORT_IN_USE else None
        if p and p not in [x for x, _ in found]:
            found.append((p, f"the message {s.get('id')}"))
    if not found and (launch or {}).get("launcher"):
        found.append((DEFAULT_MASTER_PORT, "the launchers' default (no --master_port or MASTER_PORT given)"))
    return found


def collect_rendezvous(ports: list[tuple[int, str]], env: dict[str, str], launcher: str | None = None,
                       job_pids: list[int] | None = None) -> tuple[RendezvousFacts, list[Evidence]]:
    """The ``rendezvous`` facts for ``ports``."""
    facts: RendezvousFacts = {"ports": [], "free_port": None, "launcher": launcher,
                              "slurm": any(k.startswith("SLURM_") for k in env), "job_pids": list(job_pids or [])}
    rows = []
    for port, where in ports:
        listeners = port_listeners(port)
        facts["ports"].append({"port": port, "source": where, "listeners": listeners})
        for ls in listeners or [{"address": "-", "processes": []}]:
            procs = ls["processes"] or [{"pid": "-", "user": "-", "started": "-", "command": "-"}]
            for p in procs:
                rows.append([str(port), where, ls["address"] if listeners else "nothing listens",
                             str(p["pid"]), str(p["user"] or "?"), str(p["started"] or "?"),
                             str(p["command"] or "?")[:100]])
    if ports:
        facts["free_port"] = free_port(max(p for p, _ in ports))
    ev = [Evidence.of_table("The rendezvous port on this node", ["port", "from", "listening on", "pid", "user",
                                                                 "started", "command"], rows,
                            [i for i, r in enumerate(rows) if r[2] != "nothing listens"])] if rows else []
    return facts, ev


@probe("rendezvous", title="The rendezvous port: who listens on it here", timeout=20, needs=("launch", "symptoms"),
       facts=RendezvousFacts)
def rendezvous_probe(host: Any) -> tuple[RendezvousFacts, list[Evidence]]:
    target = target_of(host)
    lf = facts_of(host, "launch")
    symptoms = (facts_of(host, "symptoms").get("symptoms")) or []
    env = {**target.env, **(lf.get("env") or {})}
    ports = rendezvous_ports(lf.get("launch") or {}, env, symptoms)
    if not ports:
        return {"skipped": "no launch command, no MASTER_PORT and no port named by an error: the rendezvous port "
                           "is unknown"}, []
    pids = [int(p["pid"]) for p in lf.get("processes") or [] if isinstance(p.get("pid"), int)]
    return collect_rendezvous(ports, env, (lf.get("launch") or {}).get("launcher"), pids)
