"""Checks of the launch: the launcher and the variables each rank needs (``launcher.env``), the DeepSpeed
launcher's device selection for the installed release (``launcher.devices``), and the hostfile's hosts
(``launcher.hostfile``)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from zdoctor.core.factstypes import HostfileFacts, LaunchLaunch
from zdoctor.core.model import Evidence, Finding, Remedy
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.layers.launch import sshfail
from zdoctor.layers.launch.dslauncher import RULES_BY_ID
from zdoctor.layers.launch.rankenv import REQUIRED, SETS
from zdoctor.symptoms.match import ids_for

#: The variables set by hand for a single process (what a launcher would give rank 0 of 1).
ONE_PROCESS = (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
               ("MASTER_PORT", "29500"))


def _program(launch: Mapping[str, Any]) -> list[str]:
    inner = launch.get("inner")
    return list((inner or launch).get("program") or [])


def _relaunch_remedies(launch: LaunchLaunch) -> list[Remedy]:
    """Relaunch the program with a launcher (every GPU of the node), or as one rank of one."""
    program = _program(launch)
    if not program:
        return []
    python = launch.get("executable") if launch.get("launcher") == "python" else "python"
    return [
        Remedy(title="Launch with the DeepSpeed launcher", commands=[shlex.join(["deepspeed", *program])],
               explanation="deepspeed starts one process per GPU (--num_gpus N for fewer) and gives each RANK, "
                           "LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; it passes --local_rank to the "
                           "script too."),
        Remedy(title="Or launch with torchrun",
               commands=[shlex.join(["torchrun", "--nproc_per_node", "gpu", *program])],
               explanation="torchrun sets the same variables (and OMP_NUM_THREADS=1 when it is unset); "
                           "'gpu' starts one process per GPU."),
        Remedy(title="Or, for one process, set the variables yourself",
               commands=[" ".join(f"{k}={v}" for k, v in ONE_PROCESS) + " " + shlex.join([str(python), *program])],
               explanation="A single rank of a world of one: DeepSpeed then skips MPI discovery."),
    ]


@check("launcher.env", title="The launcher and the environment each rank needs", probes=("launch",),
       explains=("no-launcher", "module-missing"), layer="launch")
def check_launcher(facts: Facts, me: CheckSpec) -> list[Finding]:
    lf = me.require(facts.of("launch"), facts.why_not("launch"), sub="not-checked")
    if lf.get("source") == "none":
        return [me.not_checked("no --command or --pid given: zdoctor does not know how the job "
                                               "is launched", sub="not-checked")]
    ev = facts.evidence("launch")
    launch = lf.get("launch") or {}
    if launch.get("error"):
        return [me.finding(status="warn", title="The launch command cannot be read", detail=launch["error"],
                           evidence=ev)]
    kind = launch.get("launcher")
    renv = lf.get("rank_env") or {}
    script = lf.get("script") or {}
    calls = script.get("calls") or []
    mpi4py = lf.get("mpi4py")
    if kind == "other":
        return [me.not_checked(f"{launch.get('executable')} is not a launcher zdoctor knows "
                               "(deepspeed, torchrun, accelerate, mpirun, srun, python): what it sets for each "
                               "rank is unknown", sub="not-checked")]
    sets = SETS.get(kind or "", {})
    how = sets.get("how", "")
    detail = [f"The launch runs {kind} ({launch.get('executable')}). {how[:1].upper()}{how[1:]}."]
    if renv.get("given"):
        detail.append("The environment already has " + ", ".join(renv["given"]) + ".")
    if not renv.get("falls_back_to_mpi"):
        by_launcher = all(k in (renv.get("launcher_sets") or ()) for k in REQUIRED)
        who = f"{kind} gives each rank" if by_launcher else "The launch's environment has"
        return [me.finding(status="ok", title=f"{who} RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and "
                           "MASTER_PORT", detail=" ".join(detail), evidence=ev)]
    missing = ", ".join(renv.get("missing") or REQUIRED)
    mpi_line = ("mpi4py is not installed in the training environment" if mpi4py is False else
                "mpi4py is installed in the training environment" if mpi4py else
                "whether mpi4py is installed is unknown (the training interpreter's packages were not read)")
    explains = [*ids_for(facts, "no-launcher"), *ids_for(facts, "module-missing", module="mpi4py")]
    uses_ds = bool(calls)
    if script.get("path") and not script.get("error") and not uses_ds and not explains:
        return [me.finding(status="ok", title=f"A plain {kind} launch; the script does not call DeepSpeed's "
                           "init_distributed", detail=" ".join(detail) + f" {missing} are not set: no rank "
                           f"rendezvous is asked for by {script['path']}.", evidence=ev)]
    why = (f"{script['path']} calls deepspeed.{' and '.join(calls)}" if uses_ds else
           "the run printed DeepSpeed's fallback message" if explains else
           "if the script calls deepspeed.init_distributed or deepspeed.initialize")
    detail.append(f"{missing} {'is' if len(renv.get('missing') or []) == 1 else 'are'} not set, and {why}: "
                  "DeepSpeed's init_distributed then runs mpi_discovery, whose first line is 'from mpi4py import "
                  "MPI' (deepspeed/comm/comm.py; its log line 'Not using the DeepSpeed or dist launchers, "
                  "attempting to detect MPI environment...' is at INFO level, which not every release prints). "
                  f"Here {mpi_line}.")
    if kind in ("mpirun", "srun"):
        if mpi4py:
            return [me.finding(status="ok", title=f"{kind} gives MPI's variables and mpi4py maps them",
                               detail=" ".join(detail), evidence=ev, explains=explains)]
        pip = shlex.join(["python", "-m", "pip", "install", "mpi4py"])
        return [me.finding(status="fail" if mpi4py is False or explains else "warn",
                        title=f"Under {kind}, DeepSpeed needs mpi4py to learn each rank's place",
                        detail=" ".join(detail), evidence=ev, explains=explains,
                        remedies=[Remedy(title="Install mpi4py against this MPI", commands=[pip],
                                         explanation="mpi4py builds against the mpicc on PATH: the MPI mpirun is.")])]
    status = "fail" if (uses_ds or explains) and not mpi4py else "warn"
    if mpi4py and not explains:
        detail.append("With mpi4py and no mpirun, MPI discovery makes this process rank 0 of a world of 1.")
    return [me.finding(status=status, title=f"A plain {kind} launch without the launcher's variables: "
                       "DeepSpeed falls back to MPI discovery and asks for mpi4py", detail=" ".join(detail),
                       evidence=ev, explains=explains,
                       remedies=_relaunch_remedies(launch))]


def _indices(cvd: str) -> list[int] | None:
    out = []
    for part in cvd.split(","):
        part = part.strip()
        if not part.isdigit():
            return None  # GPU UUIDs or MIG names: the launcher's int() fails on them anyway
        out.append(int(part))
    return out


@check("launcher.devices", title="The GPUs the DeepSpeed launcher selects", probes=("launch",),
       explains=("hostfile-slot", "launcher-options"), optional=("hostfile",), layer="launch")
def check_devices(facts: Facts, me: CheckSpec) -> list[Finding]:
    lf = me.require(facts.of("launch"), facts.why_not("launch"), sub="not-checked")
    launch = lf.get("launch") or {}
    if launch.get("launcher") != "deepspeed":
        return [me.not_checked("the launch does not use the DeepSpeed launcher" if lf.get("source") != "none" else
                               "no --command or --pid given", sub="not-checked")]
    ev = facts.evidence("launch")
    opts = launch.get("options") or {}
    cvd = (lf.get("env") or {}).get("CUDA_VISIBLE_DEVICES")
    rule = (lf.get("rules") or {}).get("visible-devices") or {"state": "unknown"}
    data = RULES_BY_ID["visible-devices"]
    sources = "; ".join(data["sources"])
    ver = (lf.get("deepspeed") or {}).get("version") or "?"
    hf = facts.of("hostfile") or {}
    filtered = [k for k in ("include", "exclude", "num_gpus") if opts.get(k)]
    if (opts.get("num_gpus") or opts.get("num_nodes")) and (opts.get("include") or opts.get("exclude")):
        both = [f"--{k} {opts[k]}" for k in ("num_gpus", "num_nodes", "include", "exclude") if opts.get(k)]
        return [me.finding(status="fail", title="--num_gpus/--num_nodes and --include/--exclude together: the "
                        "DeepSpeed launcher refuses them", detail=f"The command gives {', '.join(both)}. The launcher "
                        "stops with 'Cannot specify num_nodes/gpus with include/exclude' (deepspeed/launcher/"
                        "runner.py main, in every release read: 0.5.6 to 0.19.8). Keep one of the two ways of "
                        "choosing GPUs.", evidence=ev, explains=ids_for(facts, "launcher-options"))]
    slot_findings = _filter_slots(me, facts, opts, hf, ev)
    if slot_findings:
        return slot_findings
    if not cvd:
        return [me.finding(status="ok", title="The DeepSpeed launcher picks the GPUs itself",
                           detail="CUDA_VISIBLE_DEVICES is not set on the launching node: the launcher counts the GPUs "
                                  "(or takes --num_gpus / --include) and sets CUDA_VISIBLE_DEVICES for each rank.",
                           evidence=ev)]
    if filtered or opts.get("hostfile") or hf.get("nodes"):
        given = ", ".join(f"--{k}" for k in filtered) or "a hostfile"
        return [me.finding(status="warn", title=f"CUDA_VISIBLE_DEVICES={cvd} is not what selects the GPUs",
                           detail=f"With {given}, the DeepSpeed launcher ignores the launching node's "
                                  "CUDA_VISIBLE_DEVICES (it prints 'Detected VISIBLE_DEVICES=... but ignoring it') "
                                  "and sets its own for each rank from the resource options. Select GPUs with "
                                  f"--include host:0,2 instead. Sources: {sources}.", evidence=ev)]
    idx = _indices(cvd)
    state = rule.get("state")
    how = rule.get("how") or rule.get("why") or "unknown"
    if state == "ignored":
        return [me.finding(status="warn", title=f"DeepSpeed {ver}'s launcher ignores CUDA_VISIBLE_DEVICES={cvd}",
                           detail=f"This release ({how}): {data['states']['ignored']}. Sources: {sources}.",
                           evidence=ev, remedies=[_include_remedy(cvd, launch)])]
    if state == "index-seeded" or (idx is not None and idx == list(range(len(idx)))):
        return [me.finding(status="ok", title=f"CUDA_VISIBLE_DEVICES={cvd} becomes --include=localhost:{cvd}",
                        detail=f"DeepSpeed {ver} ({how}): "
                               f"{data['states'].get(state or '', 'the list starts at 0 with no gap')}.", evidence=ev)]
    if state == "count-checked":
        bad = [i for i in idx or [] if i >= len(idx or [])]
        explains = [s for i in bad for s in ids_for(facts, "hostfile-slot", host="localhost", slot=str(i))]
        return [me.finding(status="fail" if explains else "warn",
                           title=f"DeepSpeed {ver}'s launcher can refuse CUDA_VISIBLE_DEVICES={cvd}: "
                                 f"\"No slot '{bad[0] if bad else '?'}' specified on host 'localhost'\"",
                           detail=f"This release ({how}): {data['states']['count-checked']}. {cvd} is not "
                                  f"0..{len(idx or []) - 1}. Sources: {sources}.", evidence=ev, explains=explains,
                           remedies=[_include_remedy(cvd, launch)])]
    return [me.not_checked(f"how DeepSpeed {ver}'s launcher treats "
                           f"CUDA_VISIBLE_DEVICES is unknown ({how})", ev, sub="not-checked")]


def _include_remedy(cvd: str, launch: LaunchLaunch) -> Remedy:
    words = ["env", "-u", "CUDA_VISIBLE_DEVICES", "deepspeed", "--include", f"localhost:{cvd}",
             *(launch.get("program") or ["train.py"])]
    return Remedy(title="Name the GPUs with --include and leave CUDA_VISIBLE_DEVICES unset for the launcher",
                  commands=[shlex.join(words)],
                  explanation="The launcher then counts every GPU, checks the --include list against them and "
                              "sets CUDA_VISIBLE_DEVICES for each rank itself (the workaround of DeepSpeed issue "
                              "5818).")


def _filter_slots(me: CheckSpec, facts: Facts, opts: dict[str, Any], hf: HostfileFacts,
                  ev: list[Evidence]) -> list[Finding]:
    """--include/--exclude slots the hostfile does not give its host: the launcher's "No slot" error."""
    spec = opts.get("include") or opts.get("exclude")
    nodes = {n["name"]: n.get("slots") for n in hf.get("nodes") or []}
    if not spec or not nodes:
        return []
    bad: list[tuple[str, str]] = []
    for part in str(spec).split("@"):
        host, _, slots = part.partition(":")
        have = nodes.get(host)
        for s in (slots.split(",") if slots else []):
            if s.strip().isdigit() and have is not None and int(s) >= have:
                bad.append((host, s.strip()))
    if not bad:
        return []
    explains = [i for h, s in bad for i in ids_for(facts, "hostfile-slot", host=h, slot=s)]
    return [Finding(id=me.name, status="fail",
                    title=f"--include/--exclude names {count_of(len(bad), 'slot')} the hostfile does not give",
                    detail="; ".join(f"{h} has slots={nodes[h]} (0..{int(nodes[h] or 0) - 1}), not slot {s}"
                                     for h, s in bad)
                    + f". The launcher stops with \"No slot '{bad[0][1]}' specified on host '{bad[0][0]}'\" "
                      "(deepspeed/launcher/runner.py parse_resource_filter).",
                    evidence=ev + facts.evidence("hostfile"), explains=explains)]


@check("launcher.hostfile", title="The hostfile's hosts resolve and ssh reaches them", probes=("hostfile",),
       explains=("host-unresolved", "host-unreachable", "ssh-auth", "ssh-hostkey"), layer="launch")
def check_hostfile(facts: Facts, me: CheckSpec) -> list[Finding]:
    hf = me.require(facts.of("hostfile"), facts.why_not("hostfile"), sub="not-checked")
    ev = facts.evidence("hostfile")
    error = hf.get("error")
    if error:
        return [me.finding(status="fail", title="The hostfile cannot be used", detail=error, evidence=ev)]
    unresolved = [r for r in hf.get("resolve") or [] if not r.get("addresses")]
    failing = [s for s in hf.get("ssh") or [] if not s.get("ok")]
    total = count_of(len(hf.get("nodes") or []), "host")
    if unresolved:
        names = ", ".join(r["host"] for r in unresolved)
        explains = [i for r in unresolved for kind in ("host-unresolved", "host-unreachable")
                    for i in ids_for(facts, kind, host=r["host"])]
        return [me.finding(status="fail", title=f"{count_of(len(unresolved), 'host')} of {hf['path']} "
                           f"{'does' if len(unresolved) == 1 else 'do'} not resolve here: {names}",
                           detail="; ".join(f"{r['host']}: {r['error']}" for r in unresolved) + ". The launcher "
                                  "reaches each host by its name through ssh or pdsh: ssh says 'Could not resolve "
                                  "hostname', and DeepSpeed's launcher 'host=... was not reachable via ssh'. Fix the "
                                  "name in the hostfile, or add it to DNS or /etc/hosts on this node "
                                  f"(`getent hosts {shlex.quote(unresolved[0]['host'])}` must print an address).",
                           evidence=ev, explains=explains)]
    if failing:
        return [_ssh_failing(facts, me, hf, failing, ev)]
    said = "resolve here and ssh reaches them" if hf.get("ssh") else f"resolve here ({hf.get('ssh_skipped')})"
    return [me.finding(status="ok" if hf.get("ssh") else "warn", title=f"All {total} of {hf['path']} {said}",
                       detail=f"Read from {hf.get('source')}." + (f" {hf['ssh_skipped']}." if hf.get("ssh_skipped")
                                                                    else ""), evidence=ev)]


def _ssh_failing(facts: Facts, me: CheckSpec, hf: Mapping[str, Any], failing: Sequence[Mapping[str, Any]],
                 ev: list[Evidence]) -> Finding:
    """ssh does not log in to some hosts: each failure told apart (:mod:`zdoctor.layers.launch.sshfail`), with
    the commands that fix it for the training user."""
    kinds = {s["host"]: sshfail.classify(s.get("stderr") or s.get("said") or "") for s in failing}
    explains = [i for s in failing for i in ids_for(facts, "host-unreachable", host=s["host"])]
    explains += [i for s in failing if kinds[s["host"]] in ("publickey", "password")
                 for i in ids_for(facts, "ssh-auth", host=s["host"])]
    explains += [i for s in failing if kinds[s["host"]].startswith("host key")
                 for i in ids_for(facts, "ssh-hostkey", host=s["host"])]
    port = next((s["argv"][s["argv"].index("-p") + 1] for s in failing if "-p" in (s.get("argv") or [])), None)
    remedies = []
    for kind in dict.fromkeys(kinds.values()):
        hosts = [h for h, k in kinds.items() if k == kind]
        steps = [c for h in hosts for c in sshfail.remedy_commands(kind, h, port, next(
            (s.get("stderr") or "" for s in failing if s["host"] == h), ""))]
        if steps:
            remedies.append(Remedy(title=f"{sshfail.MEANING[kind][:1].upper()}{sshfail.MEANING[kind][1:]}: fix it "
                                         f"for {', '.join(hosts)}", commands=list(dict.fromkeys(steps)),
                                   note="not tried, because it changes this user's ssh keys or known hosts",
                                   explanation="Run as the user the training runs as (the launcher logs in as it)."
                                               + (" Accept a changed key only once you know why it changed."
                                                  if kind == "host key changed" else "")))
    return me.finding(status="fail",
                   title=f"ssh does not log in to {count_of(len(failing), 'host')} of {hf['path']}: "
                         + ", ".join(f"{h} ({k})" for h, k in kinds.items()),
                   detail="; ".join(f"{s['host']}: {sshfail.MEANING.get(kinds[s['host']], 'ssh failed')} "
                                    f"[{s['said'] or 'exit ' + str(s['exit_code'])}]" for s in failing)
                   + ". The DeepSpeed launcher (pdsh) and mpirun log in to each host with ssh, without a "
                     "password prompt; DeepSpeed's --no_ssh_check skips only its own first check, not these "
                     "logins.", evidence=ev, explains=explains, remedies=remedies)
