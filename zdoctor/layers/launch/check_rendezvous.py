"""Check ``launcher.port``: the rendezvous port the launch's rank 0 binds is not already held on this node
(torch's TCPStore fails with EADDRINUSE when it is)."""

from __future__ import annotations

import shlex
from typing import Any

from zdoctor.core.model import Finding, Remedy
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.layers.launch.command import parse_launch
from zdoctor.layers.launch.probe_rendezvous import PORT_IN_USE
from zdoctor.symptoms.match import ids_for

CID = "launcher.port"
#: The option of each launcher that sets the rendezvous port.
PORT_OPTION = {"deepspeed": "--master_port", "torchrun": "--master_port", "accelerate": "--main_process_port"}


def _with_port(command: str | None, launcher: str | None, port: int) -> str:
    """The launch command with its rendezvous port set to ``port`` (the launcher's option replaced or added),
    or an ``export MASTER_PORT`` line for a launch that reads the variable."""
    option = PORT_OPTION.get(launcher or "")
    launch = parse_launch(command)
    if not command or option is None or launch.get("error"):
        return f"export MASTER_PORT={port}"
    words = shlex.split(command)
    names = (option, option.replace("_", "-"))
    at = words.index(launch["executable"]) + 1
    if launcher == "accelerate" and words[at:at + 1] == ["launch"]:
        at += 1
    program_at = len(words) - len(launch.get("program") or [])
    own: list[str] = []
    i = at
    while i < program_at:
        name, eq, _ = words[i].partition("=")
        if name in names:
            i += 1 if eq else 2
            continue
        own.append(words[i])
        i += 1
    return shlex.join([*words[:at], f"{option}={port}", *own, *words[program_at:]])


def _short(command: str | None) -> str:
    """A command line by its words' file names (``python3 hold.py 29701``), for a title."""
    words = (command or "?").split()[:4]
    return " ".join(w.rsplit("/", 1)[-1] or w for w in words)[:80]


def _who(p: dict[str, Any]) -> str:
    return (f"pid {p['pid']} ({p.get('command') or '?'}; user {p.get('user') or '?'}, started "
            f"{p.get('started') or '?'})")


@check(CID, title="The rendezvous port is free on this node", probes=("rendezvous",), explains=(PORT_IN_USE,),
       optional=("launch",), layer="launch")
def check_port(facts: Facts, me: CheckSpec) -> list[Finding]:
    rf = me.require(facts.of("rendezvous"), facts.why_not("rendezvous"), sub="not-checked")
    ev = facts.evidence("rendezvous")
    job = set(rf.get("job_pids") or [])
    launch = (facts.of("launch") or {}).get("launch") or {}
    launcher, command = launch.get("launcher") or rf.get("launcher"), launch.get("command")
    out: list[Finding] = []
    for rec in rf.get("ports") or []:
        port = rec["port"]
        explains = ids_for(facts, PORT_IN_USE, port=port)
        holders = [p for ls in rec.get("listeners") or [] for p in ls.get("processes") or []]
        strangers = [p for p in holders if p["pid"] not in job]
        if not rec.get("listeners"):
            if explains:
                out.append(me.finding(status="warn", title=f"Nothing listens on port {port} now",
                                   detail=f"Port {port} ({rec['source']}) was taken when the error was printed, and "
                                          "what held it has ended since: a second launch that ran at the same time, "
                                          "or an earlier run's rank 0 that was still ending. Launch again, or give "
                                          "each launch its own port.", evidence=ev))
            else:
                out.append(me.finding(status="ok", title=f"Nothing listens on port {port} here",
                                   detail=f"Port {port} ({rec['source']}) is free on this node: rank 0 can bind it.",
                                   evidence=ev))
            continue
        if holders and not strangers:
            out.append(me.finding(status="ok", title=f"Port {port} is held by the job itself",
                               detail="The listener is one of the job's own processes (its rank 0's store).",
                               evidence=ev))
            continue
        unknown = not holders
        who = "; ".join(_who(p) for p in strangers) if strangers else (
            "a process zdoctor may not read (another user's, or another network namespace's)")
        remedies = [Remedy(title=f"End pid {p['pid']} ({_short(p.get('command'))})",
                           commands=[f"kill {int(p['pid'])}"], requires_root=p.get("user") not in (None, "root"),
                           note="not tried, because it ends a process of this node: only on your yes",
                           explanation=f"It listens on port {port}: {_who(p)}. If it is a leftover rank 0 of an "
                                       "earlier run, ending it frees the port (kill -9 if it does not end).")
                    for p in strangers]
        free = rf.get("free_port")
        if free:
            remedies.append(Remedy(title=f"Or use a free port: {free}", commands=[_with_port(command, launcher, free)],
                                   note="not tried, because trying it starts the training",
                                   explanation=f"Nothing listens on port {free} on this node (checked now). Every "
                                               "node of the job must be given the same port."))
        if rf.get("slurm"):
            remedies.append(Remedy(
                title="Or, under Slurm, start one launcher per node",
                commands=["srun --ntasks-per-node=1 " + (command or "deepspeed train.py")],
                note="not tried, because trying it starts the training",
                explanation="With srun --ntasks=N each task runs its own launcher, and the second one on a node "
                            "binds the port the first holds: one launcher per node starts the node's ranks once."))
        out.append(me.finding(
            status="fail" if explains or not unknown else "warn",
            title=f"Port {port} is already taken on this node"
                  + (f" by pid {strangers[0]['pid']}" if strangers else ""),
            detail=f"The launch's rank 0 binds port {port} ({rec['source']}) for torch's rendezvous store; it is "
                   f"held by {who}. torch then fails with 'The server socket has failed to listen on any local "
                   "network address ... EADDRINUSE' (errno 98, Address already in use).",
            evidence=ev, remedies=remedies, explains=explains))
    return out or [me.not_checked("no port to look at", sub="not-checked")]
