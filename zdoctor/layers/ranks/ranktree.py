"""Which processes are a hung job, and which of them are its ranks.

The job of a pid is that pid and its descendants; when the pid is a rank (or a launcher) started by a
launcher (DeepSpeed's runner or per-node launch, torchrun, mpirun, srun, accelerate), it is the tree of the
outermost launcher of that chain. Its ranks are the Python processes of the tree that are no launcher; a
process below a rank with the same rank variables is that rank's helper (a data-loader worker, a compiler),
not another rank. Nothing but that tree is looked at: not every python on the node."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import psutil

from zdoctor.layers.ranks.rankstate import rank_numbers

#: How a launcher shows in a command line: a program name, or ``-m module`` / a script path of one.
LAUNCHER_PROGRAMS = {"deepspeed": "deepspeed", "torchrun": "torchrun", "mpirun": "mpirun", "mpiexec": "mpirun",
                     "orterun": "mpirun", "prterun": "mpirun", "srun": "srun", "accelerate": "accelerate",
                     "hydra_pmi_proxy": "mpirun", "pdsh": "deepspeed"}
LAUNCHER_MODULES = {"deepspeed.launcher.runner": "deepspeed", "deepspeed.launcher.launch": "deepspeed",
                    "torch.distributed.run": "torchrun", "torch.distributed.launch": "torchrun",
                    "accelerate.commands.launch": "accelerate"}
#: Ancestors never walked past: they start everything, not the job.
BOUNDARIES = ("systemd", "init", "sshd", "slurmstepd", "containerd-shim", "tmux: server", "screen")
MAX_TREE = 512


def launcher_of(cmdline: Sequence[str]) -> str | None:
    """``deepspeed`` | ``torchrun`` | ``mpirun`` | ``srun`` | ``accelerate`` when the command line is one of
    those launchers (also run through an interpreter), else None."""
    if not cmdline:
        return None
    words = list(cmdline[:6])
    base = [os.path.basename(w) for w in words]
    if base[0] in LAUNCHER_PROGRAMS:
        return LAUNCHER_PROGRAMS[base[0]]
    if base[0].startswith("python"):
        if "-m" in words:
            i = words.index("-m")
            if i + 1 < len(words) and words[i + 1] in LAUNCHER_MODULES:
                return LAUNCHER_MODULES[words[i + 1]]
        script = next((b for w, b in zip(words[1:], base[1:]) if not w.startswith("-")), None)
        if script in LAUNCHER_PROGRAMS:
            return LAUNCHER_PROGRAMS[script]
    return None


def is_python(name: str | None, cmdline: Sequence[str]) -> bool:
    """Whether a process runs a Python interpreter (its name or argv[0])."""
    words = [name or ""] + [os.path.basename(cmdline[0])] if cmdline else [name or ""]
    return any(w.startswith("python") or w == "pt_main_thread" for w in words if w)


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:
        return ""


def job_root(pid: int) -> tuple[int, str | None, str]:
    """The root of ``pid``'s job: the outermost launcher of the chain of launchers above it (or ``pid`` itself),
    that launcher's kind, and how the root was chosen."""
    try:
        proc = psutil.Process(pid)
    except psutil.Error:
        return pid, None, f"pid {pid}"
    root, kind = pid, launcher_of(_cmdline(proc))
    how = f"pid {pid}"
    try:
        parents = proc.parents()
    except psutil.Error:
        parents = []
    for parent in parents:
        if parent.pid <= 1 or _name(parent).startswith(BOUNDARIES):
            break
        found = launcher_of(_cmdline(parent))
        if found is None:
            break
        root, kind = parent.pid, found
        how = f"pid {pid} and its launcher ({found}, pid {parent.pid})"
    return root, kind, how


def job_processes(pid: int) -> dict[str, Any]:
    """``{named, root, launcher, how, processes: [{pid, ppid, name, cmdline, launcher, python}], missing}``:
    the job's tree as it is now."""
    def nothing(why: str) -> dict[str, Any]:
        return {"named": pid, "root": None, "launcher": None, "how": f"pid {pid}", "processes": [], "missing": why}

    if pid < 1:
        return nothing(f"{pid} is not a process id")
    try:
        named = psutil.Process(pid)
    except (psutil.Error, ValueError):
        return nothing(f"no process {pid} runs on this node")
    name = _name(named)
    if pid == 1 or name.startswith(BOUNDARIES):
        return nothing(f"pid {pid} ({name or '?'}) starts the node's processes, not one job: give the pid of a "
                       "rank or of its launcher")
    root, kind, how = job_root(pid)
    try:
        top = psutil.Process(root)
        tree = [top, *top.children(recursive=True)][:MAX_TREE]
    except psutil.Error:
        tree = []
    procs = []
    for p in tree:
        try:
            ppid = p.ppid()
        except psutil.Error:
            continue
        cmd = _cmdline(p)
        name = _name(p)
        procs.append({"pid": p.pid, "ppid": ppid, "name": name, "cmdline": [a[:300] for a in cmd[:24]],
                      "launcher": launcher_of(cmd), "python": is_python(name, cmd)})
    return {"named": pid, "root": root, "launcher": kind, "how": how + " and the descendants",
            "processes": procs, "missing": None if procs else f"process {pid} ended while it was read"}


def rank_pids(procs: list[dict[str, Any]], env_of: dict[int, dict[str, str] | None]) -> tuple[list[int], list[int]]:
    """``(ranks, helpers)`` among the job's processes: Python processes that are no launcher; one below a rank
    whose rank variables are the same (inherited) is that rank's helper, and one without a rank of its own
    above other candidates starts them (a launcher script of its own) and is neither."""
    by_pid = {p["pid"]: p for p in procs}
    candidates = [p["pid"] for p in procs if p["python"] and not p["launcher"]]
    ranks: list[int] = []
    helpers: list[int] = []
    for pid in candidates:
        env = env_of.get(pid)
        up = by_pid.get(pid, {}).get("ppid")
        helper = False
        while isinstance(up, int) and up in by_pid:
            if up in candidates and env is not None and env_of.get(up) == env:
                helper = True
                break
            up = by_pid[up].get("ppid")
        (helpers if helper else ranks).append(pid)
    parents = {by_pid[c].get("ppid") for c in candidates}
    ranks = [r for r in ranks if not (r in parents and rank_numbers(env_of.get(r))[0] == "unknown")]
    return ranks, helpers
