"""Probes ``jitcache`` and ``processes``: what can make a launch wait forever before training starts.

``jitcache`` facts (plain JSON):

- ``base``, ``source``: the extension root torch uses for the training environment and what chose it
  (``TORCH_EXTENSIONS_DIR`` | ``XDG_CACHE_HOME`` | ``HOME``); ``env``: those variables as set.
- ``roots``: [{path, exists, tag, mount: {point, fstype, source} | None, network}], the dirs holding op dirs.
- ``python_version`` ("3.11.7" | None), ``abiflags``, ``expected_tag`` ("py311_cu121" | None when torch
  did not import): the tag dir this interpreter's torch would use.
- ``ops``: [JitOp.to_dict()]: name, dir, tag, root, so_path, so_files, lock_path, lock_age_s, lock_ino,
  lock_uid, lock_owner, lock_regular, lock_kind, dir_writable, build_cxx, build_compiler, build_compiler_path,
  build_compiler_realpath, so_info {kind, error, size, soname, needed, glibcxx_newest, cxxabi_newest,
  compilers, compiler_version}, python_tag_mismatch, in_use, errors.
- ``truncated``: more op dirs than were read; ``unscanned``: what was not read, one line each (a directory
  that could not be listed or whose listing hit its cap, the op dirs past the cap, an op dir whose lock
  could not be looked up); ``locks``: lock paths; ``corrupt``: op dirs whose .so is bad.
- ``deepspeed``: {installed, location, prebuilt_ops (paths of .so files shipped in the package)}.

``processes`` facts:

- ``processes``: [ProcInfo.to_dict()]: pid, ppid, name, cmdline, username, state, state_letter, wchan,
  elapsed_s, cpu_s, cpu_delta_s, children, open_files, open_files_truncated, cwd, libstdcxx, libgcc_s
  ([{path, dev, inode, deleted}]), environ (LD_LIBRARY_PATH, LD_PRELOAD, TORCH_EXTENSIONS_DIR,
  XDG_CACHE_HOME, HOME, CXX; None when unreadable), matched, errors {field: why}.
- ``sample_s``: seconds over which ``cpu_delta_s`` was measured; ``self_pid``: zdoctor's pid (left out).
- ``locks``: one per JIT lock: {path, op, dir, tag, in_use, age_s, network, holders [pids with the lock
  itself open: the FileBaton owner], builders [ninja/compiler pids working in the op dir], orphans
  (the builders, when the lock has no owner), others [other pids with their cwd or a file in the op
  dir], uncertain [pids whose open files could not be read], waiters [pids that look like
  FileBaton.wait], present (still there, same inode, after the process scan), stale (present and no
  owner)}.
- ``scope``: which processes are the job: {kind (pid | command | node), roots, pids (the job's tree), how,
  missing (why no process of the job was found, or None)}; with ``node`` nothing names the job, and the
  processes are only those on this node.
- ``jitcache``: the status of the jitcache probe it read.
"""

from __future__ import annotations

import os
import re
from typing import Any

from zdoctor.core.factstypes import JitcacheFacts, JitcacheRoots, LocktrialFacts, ProcessesFacts
from zdoctor.core.model import Evidence
from zdoctor.core.redact import redact_text
from zdoctor.core.registry import probe
from zdoctor.layers.libraries.importrun import target_python
from zdoctor.layers.python_env.probe_pyenv import TARGET_TIMEOUT
from zdoctor.proc import scratch
from zdoctor.proc.privilege import RunAs, runs_as_of
from zdoctor.proc.target import target_of
from zdoctor.readers import jitcache as jc
from zdoctor.readers import processes as pr
from zdoctor.readers.mounts import is_network_fs, mount_of
from zdoctor.trials.jitguard import run_guarded

#: Seconds between the two CPU-time readings of each training process.
CPU_SAMPLE_S = 0.5
_SOABI_FLAGS = re.compile(r"^cpython-\d+([a-z]*)-")


def show(text: Any, limit: int = 80) -> str:
    """A cell-safe rendering: control and undecodable characters escaped, long text cut in the middle."""
    s = "" if text is None else str(text)
    if not s.isprintable():
        s = "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)
    if len(s) > limit:
        s = s[: limit // 2 - 1] + "…" + s[-(limit // 2):]
    return s


def duration(seconds: float | None) -> str:
    """``3725`` -> ``"1h02m"``; ``"?"`` when unknown."""
    if seconds is None:
        return "?"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def interpreter_facts(pyenv: dict[str, Any] | None) -> dict[str, Any]:
    """From the pyenv facts: python version, abiflags, torch's cuda/hip, and deepspeed's location."""
    pyenv = pyenv or {}
    python = pyenv.get("python") or {}
    vi = python.get("version_info")
    version = None
    if isinstance(vi, (list, tuple)) and len(vi) >= 2 and all(isinstance(x, int) for x in vi[:3]):
        version = ".".join(str(x) for x in vi[:3])
    elif isinstance(python.get("version"), str):
        version = python["version"].split()[0] if python["version"].split() else None
    soabi = ((python.get("sysconfig") or {}).get("SOABI") or "") if isinstance(python.get("sysconfig"), dict) \
        else ""
    m = _SOABI_FLAGS.match(soabi if isinstance(soabi, str) else "")
    torch = pyenv.get("torch") or {}
    imported = isinstance(torch, dict) and (torch.get("import") or {}).get("state") == "ok"
    ds = pyenv.get("deepspeed") or {}
    return {
        "python_version": version,
        "abiflags": m.group(1) if m else "",
        "torch_known": bool(imported),
        "cuda": torch.get("cuda") if imported and isinstance(torch.get("cuda"), str) else None,
        "hip": torch.get("hip") if imported and isinstance(torch.get("hip"), str) else None,
        "deepspeed": ds if isinstance(ds, dict) else {},
    }


def ops_table(ops: list[jc.JitOp]) -> Evidence:
    """name | tag | built .so | compiler | lock, stale-looking and broken rows highlighted."""
    rows, hl = [], []
    for i, op in enumerate(ops):
        if op.so_path:
            info = op.so_info or {}
            built = os.path.basename(op.so_path)
            built += f" ({info.get('size', 0)} B)" if info.get("kind") == "elf" else f" [{info.get('kind')}]"
        else:
            built = "not built"
        comp = op.build_cxx or "-"
        ver = (op.so_info or {}).get("compiler_version")
        if ver:
            comp += f" [.so: {ver}]"
        lock = f"lock, {duration(op.lock_age_s)} old" if op.lock_path else "-"
        tag = op.tag or "-"
        if op.in_use is False:
            tag += " (other interpreter)"
        if op.lock_path or op.corrupt:
            hl.append(i)
        rows.append([show(op.name, 40), tag, show(built, 60), show(comp, 60), lock])
    return Evidence.of_table("JIT-built ops", ["op", "tag", "built .so", "compiler", "lock"], rows, hl)


def collect_jitcache(env: dict[str, str], pyenv: dict[str, Any] | None) -> tuple[JitcacheFacts, list[Evidence]]:
    """The jitcache facts for training environment ``env`` (and the pyenv facts, when there are any)."""
    it = interpreter_facts(pyenv)
    base, source = jc.cache_base(env)
    expected = jc.expected_tag(it["python_version"], it["abiflags"], it["cuda"], it["hip"], it["torch_known"])
    roots: list[JitcacheRoots] = []
    for root in jc.extension_roots(env):
        mount = mount_of(root) if os.path.isdir(root) else None
        leaf = os.path.basename(root.rstrip("/"))
        roots.append({"path": root, "exists": os.path.isdir(root),
                      "tag": leaf if source != "TORCH_EXTENSIONS_DIR" and jc.TAG_RE.match(leaf) else None,
                      "mount": mount, "network": is_network_fs((mount or {}).get("fstype"))})
    unscanned: list[str] = []
    ops = jc.scan_jit_cache(env, it["python_version"], expected=expected, unscanned=unscanned)
    ds = it["deepspeed"]
    loc = ds.get("location") if isinstance(ds.get("location"), str) else None
    facts: JitcacheFacts = {
        "env": {k: env[k] for k in ("TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME", "HOME") if k in env},
        "base": base,
        "source": source,
        "roots": roots,
        "python_version": it["python_version"],
        "abiflags": it["abiflags"],
        "expected_tag": expected,
        "ops": [op.to_dict() for op in ops],
        "truncated": len(ops) >= jc.MAX_OPS,
        "unscanned": unscanned,
        "locks": [op.lock_path for op in ops if op.lock_path],
        "corrupt": [op.dir for op in ops if op.corrupt],
        "deepspeed": {"installed": ds.get("installed"), "location": loc, "prebuilt_ops": jc.prebuilt_ops(loc)},
    }
    where = "\n".join(f"{r['path']}: {'present' if r['exists'] else 'absent'}"
                      + (f" ({r['mount']['fstype']} at {r['mount']['point']})" if r.get("mount") else "")
                      for r in roots)
    note = Evidence.note("where torch builds JIT ops",
                         f"extension root: {base} (from {source})\n{where}"
                         + (f"\nthis interpreter's tag: {expected}" if expected else ""))
    note.paths = [r["path"] for r in roots]
    return facts, [ops_table(ops), note]


@probe("jitcache", title="JIT-built DeepSpeed ops", timeout=TARGET_TIMEOUT + 60, needs=("pyenv",), facts=JitcacheFacts)
def jitcache_probe(host) -> tuple[JitcacheFacts, list[Evidence]]:
    """torch's extension cache for the training environment: op dirs, built .so files, locks."""
    env = dict(target_of(host).env)
    pyenv = None
    try:
        res = host.result("pyenv")
        pyenv = res.facts if res.status == "ok" else None
    except Exception:  # noqa: BLE001 - the interpreter's version only refines the facts
        pyenv = None
    return collect_jitcache(env, pyenv)


def processes_table(procs: list[pr.ProcInfo], stress: set[int], title: str = "training processes") -> Evidence:
    """pid | command | state | wchan | elapsed | libstdc++ mapped."""
    rows, hl = [], []
    for i, p in enumerate(procs):
        if p.pid in stress or p.state_letter == "D":
            hl.append(i)
        cmd = " ".join(p.cmdline) if p.cmdline else (p.name or "?")
        state = p.state_letter or "?"
        if p.state:
            state += f" ({p.state})"
        if p.cpu_delta_s is not None:
            state += f", {p.cpu_delta_s:g}s CPU in sample"
        libs = ", ".join(m["path"] + (" (deleted)" if m.get("deleted") else "") for m in p.libstdcxx)
        if not libs:
            libs = "unreadable" if "maps" in p.errors else "not mapped"
        rows.append([str(p.pid), show(cmd, 60), state, show(p.wchan or p.errors.get("wchan") or "?", 32),
                     duration(p.elapsed_s), show(libs, 70)])
    return Evidence.of_table(title, ["pid", "command", "state", "wchan", "elapsed",
                                                    "libstdc++ mapped"], rows, hl)


def lock_report(ops: list[jc.JitOp], procs: list[pr.ProcInfo], roots: list[dict[str, Any]]
                ) -> list[dict[str, Any]]:
    """One record per lock: holders, possible holders, likely waiters, and whether it is stale."""
    network = {r["path"]: bool(r.get("network")) for r in roots}
    unsure = [p.pid for p in pr.uncertain_for(procs)]
    out = []
    for op in ops:
        if not op.lock_path:
            continue
        owners = [p.pid for p in pr.lock_owners(op.lock_path, procs)]
        near = [p for p in pr.lock_holders(op.lock_path, procs) if p.pid not in owners]
        builders = [p.pid for p in near if pr.is_build_process(p)]
        others = [p.pid for p in near if not pr.is_build_process(p)]
        try:
            present = os.lstat(op.lock_path).st_ino == op.lock_ino if op.lock_ino is not None else True
        except OSError:
            present = False
        stale = present and not owners
        waiters = [p.pid for p in pr.likely_waiters(procs, [op.root])] if stale else []
        out.append({"path": op.lock_path, "op": op.name, "dir": op.dir, "tag": op.tag, "in_use": op.in_use,
                    "age_s": op.lock_age_s, "network": network.get(op.root, False), "holders": owners,
                    "orphans": [] if owners else builders, "builders": builders, "others": others,
                    "uncertain": [] if owners else unsure, "waiters": waiters, "present": present,
                    "stale": stale})
    return out


def job_scope(pid: int | None = None, command: str | None = None) -> dict[str, Any]:
    """Which processes are the training job: ``pid`` and its descendants, else the processes that run
    ``command`` and theirs, else nothing is known (``kind`` node: the scan is of this node's processes)."""
    if pid:
        roots = [pid] if pr.process_tree([pid]) else []
        return {"kind": "pid", "roots": roots, "pids": sorted(pr.process_tree(roots)),
                "how": f"pid {pid} and its descendants (--pid)",
                "missing": None if roots else f"no process {pid} runs on this node"}
    if command:
        roots = pr.command_roots(command)
        return {"kind": "command", "roots": roots, "pids": sorted(pr.process_tree(roots)),
                # redacted before it is cut: a cut could split "--password" from its value
                "how": f"the processes running --command {show(redact_text(command), 120)} and their descendants",
                "missing": None if roots else "no process runs the command now (it is not running on this node, "
                                              "or it already ended)"}
    return {"kind": "node", "roots": [], "pids": [], "missing": None,
            "how": "not known: python, launcher and compiler processes on this node, whoever started them "
                   "(give --pid or --command to name the job)"}


def collect_processes(jit: dict[str, Any] | None, sample_s: float = CPU_SAMPLE_S, *, pid: int | None = None,
                      command: str | None = None) -> tuple[dict[str, Any], list[Evidence]]:
    """The processes facts; ``jit`` (the jitcache facts) supplies the locks to attribute; ``pid`` or
    ``command`` names the job (see :func:`job_scope`)."""
    ops = [jc.JitOp.from_dict(d) for d in (jit or {}).get("ops") or []]
    watch = sorted({op.dir for op in ops if op.lock_path} | {os.path.realpath(op.dir) for op in ops if op.lock_path})
    scope = job_scope(pid, command)
    procs = pr.training_processes(watch=watch, include=scope["pids"])
    running = [p for p in procs if not p.gone and p.state_letter != "Z"]  # a zombie uses no CPU: no wait for it
    pr.sample_cpu(running, sample_s)
    locks = lock_report(ops, procs, (jit or {}).get("roots") or [])
    stress = {pid for lk in locks for pid in lk["holders"] + lk["waiters"] + lk["orphans"]}
    facts = {
        "processes": [p.to_dict() for p in procs],
        "sample_s": sample_s if running else 0.0,
        "self_pid": os.getpid(),
        "locks": locks,
        "scope": scope,
    }
    job = set(scope["pids"])
    if scope["kind"] == "node":
        return facts, [processes_table(procs, stress, "processes on this node (which are the job's is not known)")]
    return facts, [processes_table([p for p in procs if p.pid in job], stress, f"the job's processes: {scope['how']}"),
                   processes_table([p for p in procs if p.pid not in job], stress,
                                   "other python, launcher and compiler processes on this node (not the job)")]


@probe("processes", title="Running training processes", timeout=TARGET_TIMEOUT + 90, needs=("jitcache",),
       facts=ProcessesFacts)
def processes_probe(host) -> tuple[dict[str, Any], list[Evidence]]:
    """Python/DeepSpeed/torchrun/ninja/compiler processes: state, wait channel, libstdc++, lock holders."""
    jit = None
    try:
        res = host.result("jitcache")
        jit = res.facts if res.status == "ok" else None
    except Exception:  # noqa: BLE001 - the processes are worth listing without the locks
        jit = None
    job = target_of(host)
    pid = job.options.get("pid")
    facts, evidence = collect_processes(jit, pid=int(pid) if pid else None, command=job.command)
    facts["jitcache"] = "ok" if jit is not None else "unavailable"
    return facts, evidence


# ------------------------------------------------------------------------------ the lock-free trial
#: What a trial may copy: an op cache larger than this is not copied (the trial is then not made).
TRIAL_MAX_BYTES = 1 << 30
TRIAL_TIMEOUT = 120.0
# Load op NAME the way a launch would: through DeepSpeed's builder when DeepSpeed has one by that name
# (torch's FileBaton and ninja included), else by importing the built .so.
TRIAL_CODE = r"""
import importlib.util, sys
name, so = sys.argv[1], sys.argv[2]
import torch
try:
    from deepspeed.ops.op_builder.all_ops import ALL_OPS
except Exception:
    ALL_OPS = {}
builder = ALL_OPS.get(name)
if builder is not None:
    builder.load()
    print("loaded op", name, "through DeepSpeed's builder")
else:
    spec = importlib.util.spec_from_file_location(name, so)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    print("loaded", so)
"""


def _tree_bytes(path: str, limit: int) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                continue
            if total > limit:
                return total
    return total


def _copy_without_locks(root: str, dest: str) -> None:
    """Every op dir of ``root`` into ``dest``, each without its ``lock`` file (symlinks kept as links)."""
    import shutil

    for entry in os.scandir(root):
        if not entry.is_dir(follow_symlinks=False):
            continue
        op_dir = entry.path

        def skip(directory: str, names: list[str], top: str = op_dir) -> list[str]:
            return [jc.LOCK_NAME] if os.path.samefile(directory, top) and jc.LOCK_NAME in names else []

        shutil.copytree(op_dir, os.path.join(dest, entry.name), symlinks=True, ignore=skip)


def _give_tree(top: str, run_as: RunAs | None) -> None:
    """Hand the copy zdoctor made to the account the trial runs as (links not followed)."""
    if run_as is None:
        return
    for directory, dirs, files in os.walk(top):
        for name in [*dirs, *files]:
            os.chown(os.path.join(directory, name), run_as.uid, run_as.gid, follow_symlinks=False)
    os.chown(top, run_as.uid, run_as.gid)


def try_without_lock(lock: dict[str, Any], op: dict[str, Any] | None, host: Any) -> dict[str, Any]:
    """Load the op (or run ``--command``) from a lock-free copy of the op cache; nothing on the node changes."""
    import shutil


    out: dict[str, Any] = {"lock": lock.get("path"), "op": lock.get("op"), "tried": False, "fixed": False}
    if getattr(host, "kind", "") != "live":
        out["reason"] = "a recorded node: nothing can be run here"
        return out
    if lock.get("in_use") is False:
        out["reason"] = "the lock is in a tag dir this interpreter's torch does not use"
        return out
    command = target_of(host).command
    root = (op or {}).get("root") or os.path.dirname(str(lock.get("dir") or ""))
    so = (op or {}).get("so_path")
    python = target_python(host)
    if not command and not so:
        out["reason"] = "the op was never built (no .so): a copy of its dir has nothing to load"
        return out
    if not command and not python:
        out["reason"] = "the training interpreter was not found"
        return out
    if not root or not os.path.isdir(root):
        out["reason"] = f"the op cache {root or '?'} cannot be read"
        return out
    size = _tree_bytes(root, TRIAL_MAX_BYTES)
    if size > TRIAL_MAX_BYTES:
        out["reason"] = f"the op cache {root} is larger than {TRIAL_MAX_BYTES >> 20} MiB: not copied"
        return out
    run_as = runs_as_of(host)
    try:
        tmp = scratch.private_dir("locktrial-")
    except OSError as exc:
        out["reason"] = f"no temporary folder for a copy of {root}: {exc.strerror or exc}"
        return out
    try:
        try:
            _copy_without_locks(root, tmp)
            _give_tree(tmp, run_as)
        except (OSError, shutil.Error) as exc:
            out["reason"] = f"could not copy {root}: {exc}"
            return out
        env = dict(target_of(host).env)
        env["TORCH_EXTENSIONS_DIR"] = tmp
        if command:
            argv = ["/bin/sh", "-c", command]
            out["how"] = "the launch command, with TORCH_EXTENSIONS_DIR on a lock-free copy of the op cache"
        else:
            copied_so = os.path.join(tmp, os.path.relpath(so, root)) if so else ""
            argv = [str(python), "-c", TRIAL_CODE, str(lock.get("op")), copied_so]
            out["how"] = ("the op loaded by the training interpreter, with TORCH_EXTENSIONS_DIR on a lock-free copy "
                          "of the op cache")
        ev = run_guarded(argv, env, timeout=target_of(host).limit(TRIAL_TIMEOUT),
                         label=f"trial without the lock: {lock.get('op')}", run_as=run_as)
        out.update(tried=True, fixed=ev.exit_code == 0 and not ev.error, seconds=round(ev.duration_s, 1),
                   exit_code=ev.exit_code, error=ev.error, output_tail=(ev.stderr or ev.stdout or "")[-1500:])
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@probe("locktrial", title="Stale JIT locks: the op loaded from a lock-free copy", timeout=TRIAL_TIMEOUT + 120,
       needs=("jitcache", "processes"), facts=LocktrialFacts)
def locktrial_probe(host) -> tuple[LocktrialFacts, list[Evidence]]:
    """For each stale lock, prove (or disprove) that removing it is the fix, without removing it."""
    procs = host.result("processes")
    jit = host.result("jitcache")
    locks = [lk for lk in ((procs.facts or {}).get("locks") or []) if lk.get("stale")] \
        if procs.status == "ok" else []
    if not locks:
        return {"skipped": "no stale JIT build lock", "trials": []}, []
    ops = {o.get("lock_path"): o for o in ((jit.facts or {}).get("ops") or [])} if jit.status == "ok" else {}
    trials = [try_without_lock(lk, ops.get(lk["path"]), host) for lk in locks]
    return {"trials": trials}, []
