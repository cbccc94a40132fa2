"""Which launcher a command line runs, and the options of it that decide the ranks, devices and binding.

``parse_launch("CUDA_VISIBLE_DEVICES=0,2 deepspeed --num_gpus 2 train.py --deepspeed ds.json")`` ->
``{"launcher": "deepspeed", "options": {"num_gpus": "2"}, "script": "train.py", "assigned": {...}, ...}``.
Pure: it reads nothing but the text.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Any

#: The launchers told apart, as ``launcher`` names them.
LAUNCHERS = ("deepspeed", "torchrun", "accelerate", "mpirun", "srun", "python")
#: Commands that run the next words as the command (their own options first).
WRAPPERS = {"env", "nohup", "nice", "time", "timeout", "stdbuf", "exec", "ionice", "chrt"}
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?\Z")
_ASSIGN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
#: ``python -m MODULE`` modules that are launchers.
MODULE_LAUNCHERS = {"torch.distributed.run": "torchrun", "torch.distributed.launch": "torchrun",
                    "deepspeed.launcher.runner": "deepspeed", "accelerate.commands.launch": "accelerate"}
#: Options (with a value) of each launcher that zdoctor reads; flags without a value are in FLAGS.
VALUED: dict[str, dict[str, str | None]] = {
    "deepspeed": {"--num_gpus": "num_gpus", "--num_accelerators": "num_gpus", "--num_nodes": "num_nodes",
                  "-H": "hostfile", "--hostfile": "hostfile", "-i": "include", "--include": "include",
                  "-e": "exclude", "--exclude": "exclude", "--master_addr": "master_addr",
                  "--master_port": "master_port", "--launcher": "multinode_launcher",
                  "--bind_core_list": "bind_core_list", "--ssh_port": "ssh_port", "--node_rank": "node_rank",
                  "--launcher_args": "launcher_args", "--venv_script": "venv_script",
                  "--enable_each_rank_log": "enable_each_rank_log", "--log_level": "log_level",
                  "--autotuning": "autotuning", "--elastic_training": None, "--min_elastic_nodes": None,
                  "--max_elastic_nodes": None, "--comment": None, "--account": None},
    "torchrun": {"--nproc_per_node": "nproc_per_node", "--nproc-per-node": "nproc_per_node",
                 "--nnodes": "num_nodes", "--node_rank": "node_rank", "--node-rank": "node_rank",
                 "--master_addr": "master_addr", "--master-addr": "master_addr", "--master_port": "master_port",
                 "--master-port": "master_port", "--rdzv_endpoint": "rdzv_endpoint",
                 "--rdzv-endpoint": "rdzv_endpoint", "--rdzv_backend": "rdzv_backend",
                 "--rdzv-backend": "rdzv_backend", "--rdzv_id": None, "--rdzv-id": None, "--max_restarts": None,
                 "--max-restarts": None, "--log_dir": None, "--log-dir": None, "--local_addr": None,
                 "--local-addr": None, "-r": None, "--redirects": None, "-t": None, "--tee": None},
    "accelerate": {"--num_processes": "nproc_per_node", "--num_machines": "num_nodes",
                   "--main_process_ip": "master_addr", "--main_process_port": "master_port",
                   "--machine_rank": "node_rank", "--config_file": "config_file", "--gpu_ids": "gpu_ids",
                   "--mixed_precision": None, "--deepspeed_config_file": None, "--deepspeed_hostfile": "hostfile",
                   "--num_cpu_threads_per_process": "omp_threads"},
    "mpirun": {"-np": "np", "-n": "np", "--np": "np", "-N": "npernode", "--npernode": "npernode",
               "-npernode": "npernode", "--hostfile": "hostfile", "-hostfile": "hostfile",
               "--machinefile": "hostfile", "-machinefile": "hostfile", "-H": "hosts", "--host": "hosts",
               "-host": "hosts", "-x": "export", "--bind-to": "bind_to", "-bind-to": "bind_to",
               "--map-by": "map_by", "-map-by": "map_by", "--mca": None, "-mca": None},
    "srun": {"-n": "np", "--ntasks": "np", "-N": "num_nodes", "--nodes": "num_nodes",
             "--ntasks-per-node": "npernode", "-c": "cpus_per_task", "--cpus-per-task": "cpus_per_task",
             "--cpu-bind": "bind_to", "-w": "hosts", "--nodelist": "hosts", "--gpus-per-node": None,
             "-p": None, "--partition": None, "-A": None, "--account": None, "-t": None, "--time": None},
}
FLAGS: dict[str, dict[str, str | None]] = {
    "deepspeed": {"--bind_cores_to_rank": "bind_cores_to_rank", "--no_ssh": "no_ssh",
                  "--no_ssh_check": "no_ssh_check", "--force_multi": "force_multi", "--no_python": "no_python",
                  "--module": "module", "--no_local_rank": "no_local_rank", "--save_pid": "save_pid",
                  "--quiet": "quiet", "-q": "quiet"},
    "torchrun": {"--standalone": "standalone", "--no_python": "no_python", "--no-python": "no_python",
                 "-m": "module", "--module": "module"},
    "accelerate": {"--multi_gpu": "multi_gpu", "--use_deepspeed": "use_deepspeed", "--cpu": "cpu"},
    "mpirun": {"--allow-run-as-root": None, "--oversubscribe": None},
    "srun": {"--exclusive": None},
}
#: numactl and taskset options that bind what they run (value-taking).
BINDERS: dict[str, set[str]] = {
    "numactl": {"-C", "--physcpubind", "-N", "--cpunodebind", "-m", "--membind", "-l", "--localalloc", "-i",
                "--interleave", "-p", "--preferred"},
    "taskset": {"-c", "--cpu-list"}}


def _split(command: str) -> tuple[list[str] | None, str | None]:
    try:
        return shlex.split(command), None
    except ValueError as exc:
        return None, f"the command line cannot be split as the shell would: {exc}"


def _strip_wrappers(words: list[str], out: dict[str, Any]) -> list[str]:
    """Drop ``VAR=value`` assignments, wrappers (env, nohup, timeout ...) and numactl/taskset in front of the
    command; record the assignments and the binders."""
    i = 0
    while i < len(words):
        w = words[i]
        base = os.path.basename(w)
        if _ASSIGN.match(w):
            key, _, value = w.partition("=")
            out["assigned"][key] = value
            i += 1
        elif base in WRAPPERS:
            i += 1
            while i < len(words) and words[i].startswith("-"):
                i += 1
            if base == "timeout" and i < len(words) and re.match(r"\d", words[i]):
                i += 1  # the duration
        elif base in BINDERS:
            args: list[str] = []
            binder: dict[str, Any] = {"tool": base, "args": args}
            i += 1
            while i < len(words) and words[i].startswith("-"):
                opt = words[i]
                args.append(opt)
                name = opt.split("=", 1)[0]
                if "=" not in opt and name in BINDERS[base] and name not in ("-l", "--localalloc") \
                        and i + 1 < len(words):
                    i += 1
                    args.append(words[i])
                i += 1
            if base == "taskset" and i < len(words) and not args:
                args.append(words[i])  # taskset MASK command
                i += 1
            out["binders"].append(binder)
        else:
            break
    return words[i:]


def _options(kind: str, words: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The launcher's own options up to its program, and the words from the program on."""
    valued, flags = VALUED.get(kind, {}), FLAGS.get(kind, {})
    opts: dict[str, Any] = {}
    i = 0
    while i < len(words):
        w = words[i]
        if w == "--":
            return opts, words[i + 1:]
        if not w.startswith("-"):
            return opts, words[i:]
        name, eq, value = w.partition("=")
        if name in flags:
            flag = flags[name]
            if flag:
                opts[flag] = True
            i += 1
            continue
        if name in valued:
            if not eq:
                value = words[i + 1] if i + 1 < len(words) else ""
                i += 1
            key = valued[name]
            if key:
                if key == "export":
                    opts.setdefault("export", []).append(value)
                else:
                    opts[key] = value
            i += 1
            continue
        # An option zdoctor does not know: a value follows unless it is written with '=' or the next word
        # is another option; guessing wrong only shifts where the program is thought to start.
        opts.setdefault("unknown", []).append(w)
        i += 1
    return opts, []


def _python_module(words: list[str]) -> tuple[str | None, list[str]]:
    """``python [-u ...] -m MODULE args`` -> (MODULE, args); (None, words after the interpreter's options)."""
    i = 1
    while i < len(words) and words[i].startswith("-"):
        w = words[i]
        if w == "-m" and i + 1 < len(words):
            return words[i + 1], words[i + 2:]
        if w.startswith("-m") and len(w) > 2:
            return w[2:], words[i + 1:]
        if w in ("-c",):
            return None, []
        if w in ("-W", "-X"):
            i += 1
        i += 1
    return None, words[i:]


def parse_launch(command: str | None) -> dict[str, Any]:
    """What ``command`` launches: ``launcher`` (one of :data:`LAUNCHERS`, ``other`` or None without a
    command), its ``options``, the ``program`` words it starts (``script``: the first), ``assigned``
    (``VAR=value`` given in front), ``binders`` (numactl/taskset in front of the launcher or of the program),
    ``inner`` (what mpirun or srun starts, parsed the same way) and ``error``."""
    out: dict[str, Any] = {"command": command, "launcher": None, "executable": None, "options": {},
                           "program": [], "script": None, "assigned": {}, "binders": [], "inner": None,
                           "error": None}
    if not command:
        return out
    words, err = _split(command)
    if words is None:
        out["error"] = err
        return out
    words = _strip_wrappers(words, out)
    if not words:
        out["error"] = "the command line names no program"
        return out
    exe = os.path.basename(words[0])
    out["executable"] = words[0]
    rest = words[1:]
    kind: str
    if exe in ("deepspeed", "ds"):
        kind = "deepspeed"
    elif exe == "torchrun":
        kind = "torchrun"
    elif exe == "accelerate":
        kind = "accelerate"
        if rest[:1] == ["launch"]:
            rest = rest[1:]
    elif exe in ("mpirun", "mpiexec", "orterun", "mpiexec.hydra"):
        kind = "mpirun"
    elif exe == "srun":
        kind = "srun"
    elif _PYTHON.match(exe):
        module, rest = _python_module(words)
        kind = MODULE_LAUNCHERS.get(module or "", "python")
        if kind == "python":
            out.update(launcher="python", program=rest if module is None else ["-m", module, *rest],
                       script=rest[0] if module is None and rest else None, module=module)
            return out
    else:
        out.update(launcher="other", program=words, script=words[0])
        return out
    opts, program = _options(kind, rest)
    out.update(launcher=kind, options=opts, program=program, script=program[0] if program else None)
    if kind in ("mpirun", "srun") and program:
        inner = parse_launch(shlex.join(program))
        out["inner"] = inner
        out["binders"] += inner.get("binders") or []
    elif program:
        sub: dict[str, Any] = {"assigned": {}, "binders": []}
        left = _strip_wrappers(list(program), sub)
        if sub["binders"]:
            out["binders"] += sub["binders"]
            out["program"], out["script"] = left, left[0] if left else None
    return out


def python_script(launch: dict[str, Any]) -> str | None:
    """The Python file the ranks run (``train.py``), when the command names one; None for ``-m`` modules
    and programs that are not Python files."""
    inner = launch.get("inner")
    if inner:
        return python_script(inner)
    if launch.get("options", {}).get("module") or launch.get("options", {}).get("no_python"):
        return None
    script = launch.get("script")
    if launch.get("launcher") == "other" or not script or script.startswith("-"):
        return None
    return script
