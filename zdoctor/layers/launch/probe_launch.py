"""Probes of the launch: ``launch`` (the launcher a --command or a running job uses, the environment each
rank gets, what the script calls, the DeepSpeed launcher's rules for the installed release) and
``hostfile`` (each host of the job's hostfile resolves here, and the ssh the launcher uses reaches it).

``launch`` facts: ``source`` (command | pid | none), ``launch`` (:func:`zdoctor.layers.launch.command.parse_launch`),
``env`` (the rank variables, CUDA_VISIBLE_DEVICES and OMP_NUM_THREADS the launch starts with: the training
environment with the command's ``VAR=value`` over it), ``rank_env`` (:func:`zdoctor.layers.launch.rankenv.rank_env`),
``script`` {path, calls (init_distributed | initialize), error}, ``mpi4py`` (installed: true/false/None),
``deepspeed`` {version, location}, ``rules`` (:func:`zdoctor.layers.launch.dslauncher.installed_launcher_rules`),
``processes`` (a running job's tree: pid, cmdline, launcher, rank variables).
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import shlex
from typing import Any

import psutil

from zdoctor.core.errors import InputError
from zdoctor.core.factstypes import HostfileFacts, LaunchFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import facts_of, probe
from zdoctor.layers.launch import hostcheck
from zdoctor.layers.launch.command import parse_launch, python_script
from zdoctor.layers.launch.dslauncher import installed_launcher_rules
from zdoctor.layers.launch.hosts import read_hostfile
from zdoctor.layers.launch.rankenv import MPI_PREFIXES, REQUIRED, SLURM_KEYS, rank_env
from zdoctor.proc.privilege import runs_as_of
from zdoctor.proc.runner import run
from zdoctor.proc.systools import system_tool_or_name
from zdoctor.proc.target import target_of
from zdoctor.proc.userfile import open_regular
from zdoctor.readers import processes as pr

#: The variables of the launch zdoctor reads and shows.
LAUNCH_KEYS = (*REQUIRED, "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "LOCAL_SIZE", *SLURM_KEYS,
               "PDSH_SSH_ARGS_APPEND")
SCRIPT_CAP = 2 * 1024 * 1024
_CALLS = (("init_distributed", re.compile(r"\binit_distributed\s*\(")),
          ("initialize", re.compile(r"\bdeepspeed\s*\.\s*initialize\s*\(")))
#: DeepSpeed's launcher reads this hostfile when none is named (runner.py DLTS_HOSTFILE).
DEEPSPEED_DEFAULT_HOSTFILE = "/job/hostfile"
SSH_CONNECT_TIMEOUT = 3
SSH_PARALLEL = 8
#: Hosts ssh is tried on at most (the first ones of the hostfile).
SSH_MAX_HOSTS = 32
#: What of ssh's stderr is kept (its host-key warning is a screenful).
SSH_STDERR_CAP = 4000


def _launch_env(env: dict[str, str], launch: dict[str, Any]) -> dict[str, str]:
    merged = {k: v for k, v in env.items() if k in LAUNCH_KEYS or k.startswith(MPI_PREFIXES)}
    merged.update({k: v for k, v in (launch.get("assigned") or {}).items()
                   if k in LAUNCH_KEYS or k.startswith(MPI_PREFIXES)})
    return merged


def script_calls(path: str) -> dict[str, Any]:
    """Which of DeepSpeed's distributed entry points the file ``path`` calls (by its text)."""
    rec: dict[str, Any] = {"path": path, "calls": [], "error": None}
    try:
        with open_regular(path) as fh:
            text = fh.read(SCRIPT_CAP).decode("utf-8", "replace")
    except OSError as exc:
        rec["error"] = exc.strerror or str(exc)
        return rec
    rec["calls"] = [name for name, rx in _CALLS if rx.search(text)]
    return rec


def _tree(pid: int) -> list[dict[str, Any]]:
    """The running job's processes: each one's command line, the launcher it is, and its rank variables."""
    out = []
    for p in sorted(pr.process_tree([pid]))[:256]:
        try:
            proc = psutil.Process(p)
            cmd, ppid = proc.cmdline(), proc.ppid()
        except psutil.Error:
            continue
        rec: dict[str, Any] = {"pid": p, "ppid": ppid, "cmdline": cmd[:40],
                               "launcher": parse_launch(shlex.join(cmd)).get("launcher") if cmd else None}
        try:
            rec["env"] = pr.read_environ(p, LAUNCH_KEYS)
        except OSError as exc:
            rec["env"], rec["env_error"] = {}, exc.strerror or str(exc)
        out.append(rec)
    return out


def collect_launch(command: str | None, env: dict[str, str], pyenv: dict[str, Any], pid: int | None = None,
                   cwd: str | None = None) -> tuple[dict[str, Any], list[Evidence]]:
    """The ``launch`` facts for ``command`` (or the job under ``pid``) started from ``env``."""
    facts: dict[str, Any] = {"source": "none", "launch": parse_launch(None), "env": {}, "rank_env": None,
                             "script": None, "mpi4py": None, "deepspeed": {}, "rules": {}, "processes": []}
    ds = (pyenv or {}).get("deepspeed") or {}
    pkgs = (pyenv or {}).get("packages") or {}
    loc = ds.get("location") or (pkgs.get("deepspeed") or {}).get("location")
    version = ds.get("version") or (pkgs.get("deepspeed") or {}).get("version")
    if ds.get("installed") or (pkgs.get("deepspeed") or {}).get("installed"):
        facts["deepspeed"] = {"version": version, "location": loc}
        facts["rules"] = installed_launcher_rules(loc, version)
    if "mpi4py" in pkgs:
        facts["mpi4py"] = (pkgs.get("mpi4py") or {}).get("installed")
    ev: list[Evidence] = []
    if pid:
        facts["processes"] = _tree(pid)
        launcher = next((p for p in facts["processes"] if p["launcher"] not in (None, "python", "other")), None)
        top = launcher or (facts["processes"][0] if facts["processes"] else None)
        if top is not None:
            facts["source"] = "pid"
            facts["launch"] = parse_launch(shlex.join(top["cmdline"]))
            facts["env"] = top.get("env") or {}
        ev.append(Evidence.of_table(f"The job under pid {pid}: its processes", ["pid", "launcher", "command",
                                    "RANK", "LOCAL_RANK", "WORLD_SIZE"],
                                    [[str(p["pid"]), p["launcher"] or "-", " ".join(p["cmdline"])[:80],
                                      *(p["env"].get(k, "-") for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))]
                                     for p in facts["processes"]]))
    elif command:
        facts["source"] = "command"
        facts["launch"] = parse_launch(command)
        facts["env"] = _launch_env(env, facts["launch"])
    else:
        return facts, ev
    launch = facts["launch"]
    facts["rank_env"] = rank_env(launch.get("launcher"), facts["env"])
    script = python_script(launch)
    if script and facts["source"] == "command":
        path = script if os.path.isabs(script) else os.path.join(cwd or os.getcwd(), script)
        facts["script"] = script_calls(path)
    rows = [[k, facts["env"].get(k, "(not set)"),
             "the launcher" if k in facts["rank_env"]["launcher_sets"] else "-"] for k in REQUIRED]
    rows += [[k, facts["env"][k], "-"] for k in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS") if k in facts["env"]]
    ev.insert(0, Evidence.of_table(f"The launch: {launch.get('launcher') or 'unknown'} "
                                   f"({launch.get('executable') or '-'})", ["variable", "the launch starts with",
                                                                             "set for each rank by"], rows,
                                   [i for i, r in enumerate(rows) if r[1] == "(not set)" and r[2] == "-"]))
    return facts, ev


@probe("launch", title="The launcher and the environment each rank gets", timeout=30, needs=("pyenv",),
       facts=LaunchFacts)
def launch_probe(host) -> tuple[dict[str, Any], list[Evidence]]:
    target = target_of(host)
    pid = target.options.get("pid")
    if not target.command and not pid:
        return {"skipped": "no --command or --pid given: zdoctor does not know how the job is launched"}, []
    return collect_launch(target.command, target.env, facts_of(host, "pyenv"), pid=pid)


def hostfile_of(options: dict[str, Any], launch: dict[str, Any]) -> tuple[str | None, str]:
    """The hostfile the launch uses and where that was learned: --hostfile, the command's own option, or
    DeepSpeed's default /job/hostfile when it exists."""
    if options.get("hostfile"):
        return str(options["hostfile"]), "--hostfile"
    named = (launch.get("options") or {}).get("hostfile")
    if named:
        return str(named), f"the command's hostfile option ({launch.get('launcher')})"
    if launch.get("launcher") == "deepspeed" and os.path.isfile(DEEPSPEED_DEFAULT_HOSTFILE):
        return DEEPSPEED_DEFAULT_HOSTFILE, "DeepSpeed's default hostfile (none named on the command line)"
    return None, ""


def ssh_reaches(names: list[str], run_as: Any = None, port: str | None = None) -> list[dict[str, Any]]:
    """``ssh -o BatchMode=yes -o ConnectTimeout=3 HOST true`` for each host, concurrently and bounded, as
    the training user: ``[{host, ok, exit_code, said (its last line), stderr}]``."""
    ssh = system_tool_or_name("ssh")

    def one(name: str) -> dict[str, Any]:
        argv = [ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT}",
                *(["-p", str(port)] if port else []), "--", name, "true"]
        ev = run(argv, timeout=SSH_CONNECT_TIMEOUT + 5, run_as=run_as, label=f"ssh {name} true")
        text = (ev.stderr or ev.error or "").strip()
        said = text.splitlines()
        return {"host": name, "ok": ev.exit_code == 0, "exit_code": ev.exit_code,
                "said": said[-1][:300] if said else "", "stderr": text[-SSH_STDERR_CAP:], "argv": argv}

    with concurrent.futures.ThreadPoolExecutor(max_workers=SSH_PARALLEL) as pool:
        return list(pool.map(one, names))


def collect_hostfile(path: str, source: str, *, ssh: bool = True, run_as: Any = None,
                     port: str | None = None) -> tuple[dict[str, Any], list[Evidence]]:
    """The ``hostfile`` facts: its nodes, each one's name lookup here and (``ssh``) whether ssh reaches it."""
    facts: dict[str, Any] = {"path": path, "source": source, "nodes": [], "error": None, "resolve": [],
                             "ssh": [], "ssh_skipped": None}
    try:
        nodes = read_hostfile(path)
    except InputError as exc:
        facts["error"] = str(exc)
        return facts, [Evidence.note(f"hostfile {path}", str(exc))]
    facts["nodes"] = [{"name": n.name, "slots": n.slots, "line": n.line} for n in nodes]
    facts["resolve"] = hostcheck.resolve_all([n.name for n in nodes])
    resolved = [r["host"] for r in facts["resolve"] if r["addresses"]]
    if not ssh:
        facts["ssh_skipped"] = "ssh was not tried"
    elif not resolved:
        facts["ssh_skipped"] = "no host of the hostfile resolves"
    else:
        facts["ssh"] = ssh_reaches(resolved[:SSH_MAX_HOSTS], run_as, port)
        if len(resolved) > SSH_MAX_HOSTS:
            facts["ssh_skipped"] = f"ssh was tried on the first {SSH_MAX_HOSTS} of {len(resolved)} hosts"
    by_ssh = {s["host"]: s for s in facts["ssh"]}
    rows = []
    for n, r in zip(facts["nodes"], facts["resolve"]):
        s = by_ssh.get(n["name"])
        rows.append([n["name"], "-" if n["slots"] is None else str(n["slots"]),
                     ", ".join(r["addresses"][:3]) or f"does not resolve: {r['error']}",
                     "not tried" if s is None else "reaches it" if s["ok"]
                     else f"fails: {s['said'] or s['exit_code']}"])
    ev = [Evidence.of_table(f"Hosts of {path}", ["host", "slots", "addresses here", "ssh (BatchMode)"], rows,
                            [i for i, r in enumerate(rows) if r[2].startswith("does not") or r[3].startswith("fails")])]
    return facts, ev


@probe("hostfile", title="The hostfile's hosts: resolved here, reached by ssh", timeout=90, needs=("launch",),
       facts=HostfileFacts)
def hostfile_probe(host) -> tuple[dict[str, Any], list[Evidence]]:
    target = target_of(host)
    launch = (facts_of(host, "launch").get("launch")) or parse_launch(target.command)
    path, source = hostfile_of(target.options, launch)
    if path is None:
        return {"skipped": "no hostfile given (--hostfile, or the launch command's own hostfile option): the "
                           "cross-node parts of the launch were not examined"}, []
    port = (launch.get("options") or {}).get("ssh_port")
    return collect_hostfile(path, source, run_as=runs_as_of(host), port=port)
