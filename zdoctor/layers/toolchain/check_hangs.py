"""Checks and predicates over the ``jitcache`` and ``processes`` probes: the silent hang at start (a stale
JIT build lock), processes stuck in the kernel, and JIT-built ops that are damaged or were built by a
newer compiler than this node's."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from zdoctor.core.model import Finding, Remedy
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check, predicate
from zdoctor.core.shellquote import shell_quote
from zdoctor.layers.toolchain.probe_hangs import duration, show
from zdoctor.readers.gccver import version_tuple
from zdoctor.readers.versions import gcc_release_for
from zdoctor.symptoms.match import ids_for

#: The processes the hang check counts, as a counted noun.
JOB_PROCESS = "python, launcher or compiler process"

#: On a network file system a lock younger than this may belong to a build running on another node.
NETWORK_GRACE_S = 30 * 60

FILEBATON = (
    "torch.utils.cpp_extension builds an op under a lock: the first process creates `lock` in the op "
    "dir (O_CREAT|O_EXCL), keeps it open while ninja compiles, and deletes it when done. Every other "
    "process that needs the op polls every 0.1 s until the file is gone, with no time limit and no "
    "message. If the builder was killed (Ctrl-C in the wrong moment, OOM killer, a job scheduler's "
    "timeout, a node reboot), nobody deletes the lock and every later launch waits forever, before "
    "training even starts."
)








def _slug(text: str, used: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_.") or "op"
    slug, n = base[:60], 2
    while slug in used:
        slug, n = f"{base[:56]}-{n}", n + 1
    used.add(slug)
    return slug


def _op_key(op: dict[str, Any]) -> str:
    """``tag.name`` of an op (or of a lock record, which names its op under ``op``)."""
    name = op.get("name", op.get("op"))
    return f"{op['tag']}.{name}" if op.get("tag") else str(name)


def _procs_by_pid(procs: Mapping[str, Any] | None) -> dict[int, dict[str, Any]]:
    return {p["pid"]: p for p in (procs or {}).get("processes") or []}


def _describe(p: Mapping[str, Any] | None, pid: int) -> str:
    if p is None:
        return f"pid {pid}"
    cmd = " ".join(p.get("cmdline") or []) or p.get("name") or "?"
    return (f"pid {pid} ({show(cmd, 100)}; state {p.get('state_letter') or '?'}, wchan "
            f"{p.get('wchan') or '?'}, running {duration(p.get('elapsed_s'))})")


def _trial_text(trial: dict[str, Any] | None) -> tuple[bool, str]:
    """(verified, sentence) from the lock-free trial of this lock."""
    if not trial:
        return False, (" Not tried in advance (no trial was made); `zdoctor check` afterwards shows the lock "
                       "gone.")
    if not trial.get("tried"):
        return False, f" Not tried in advance, because {trial.get('reason') or 'no trial could be made'}."
    if trial.get("fixed"):
        return True, (f" Tried without changing the node: {trial.get('how')} worked (exit 0 in "
                      f"{trial.get('seconds')} s), so the lock is the only thing in the way; the copy was "
                      "removed again and the real lock left in place.")
    tail = " ".join(str(trial.get("output_tail") or "").strip().splitlines()[-3:])
    return False, (f" Tried without changing the node: {trial.get('how')} did not work either "
                   f"({trial.get('error') or 'exit ' + str(trial.get('exit_code'))}"
                   + (f": {show(tail, 300)}" if tail else "") + "): removing the lock will stop the wait, "
                   "but the op will still fail to load.")


def lock_remedy(lock: dict[str, Any], op: dict[str, Any] | None, orphans: list[int],
                trial: dict[str, Any] | None = None) -> Remedy:
    """Remove exactly this lock (after any orphaned compilers of the dead build have exited)."""
    commands = []
    if orphans:
        commands.append(f"while kill -0 {' '.join(str(p) for p in orphans)} 2>/dev/null; do sleep 1; done")
    # torch's O_CREAT|O_EXCL fails on a directory named `lock` just as on a file; rm -f cannot remove one.
    kind = "dir" if (op or {}).get("lock_kind") == "dir" else "file"
    rm = "rm -rf --" if kind == "dir" else "rm -f --"
    op_dir, name = os.path.split(os.path.abspath(lock["path"]))
    parent, op_name = os.path.split(op_dir)
    # One line that refuses a link on the way (a subshell: the caller's directory stays).
    commands.append(f"(cd -P -- {shell_quote(parent)} && test ! -L {shell_quote(op_name)} && cd -- "
                    f"{shell_quote(op_name)} && test ! -L {shell_quote(name)} && {rm} {shell_quote(name)})")
    expl = ("Deletes only the lock file (never through a link: an op dir or lock swapped for one is left "
            "alone); the op dir and whatever was already compiled stay. Stop the "
            "launches that are waiting first: once the lock is gone they stop waiting and try to load an "
            "op that was never finished (ImportError: cannot open shared object file). The next launch "
            "takes the lock and builds the op again (ninja redoes whatever the dead build left unfinished).")
    if orphans:
        expl += (" The first line waits until the compilers the dead build started have exited, so a new "
                 "build does not write the same object files at the same time.")
    verified, tried = _trial_text(trial)
    expl += tried
    return Remedy(title=f"Remove the stale lock of op {show(lock.get('op'), 60)}", commands=commands,
                  verified=verified, requires_root=bool(op and op.get("dir_writable") is False), undo=[],
                  action={"kind": "remove-lock", "path": lock["path"], "lock_kind": kind, "wait_pids": list(orphans)},
                  explanation=expl, tried=bool(trial and trial.get("tried")),
                  note=(trial or {}).get("reason") or "" if not (trial and trial.get("tried")) else tried.strip())


def _hangs_on(facts: Facts, lock_path: str) -> list[str]:
    """The hung runs (``hang`` symptoms) that found this lock taken: the traced command tried to create it
    exclusively and it was there (torch's FileBaton), and then it waited."""
    refused = (facts.of("livetrace") or {}).get("refused_locks") or []
    if not any(os.path.realpath(str(p)) == os.path.realpath(lock_path) for p in refused):
        return []
    return ids_for(facts, "hang")


@check("hangs.stale-lock", title="Stale JIT build locks", probes=("jitcache", "processes", "locktrial"),
       findings=("hangs.stale-lock.*",), optional=("livetrace",), explains=("hang",))
def check_stale_lock(facts: Facts, me: CheckSpec) -> list[Finding]:
    cid = me.name
    jit, procs = facts.of("jitcache"), facts.of("processes")
    if jit is None or procs is None:
        return [me.not_checked("the jitcache or processes probe gave no facts")]
    ev = facts.evidence("jitcache", "processes")
    locks = procs.get("locks") or []
    ops = {o["lock_path"]: o for o in jit.get("ops") or [] if o.get("lock_path")}
    by_pid = _procs_by_pid(procs)
    stale = [lk for lk in locks if lk.get("stale")]
    trials = {t.get("lock"): t for t in ((facts.of("locktrial") or {}).get("trials") or [])}
    unscanned = list(jit.get("unscanned") or [])
    if jit.get("truncated") and not unscanned:  # facts recorded before the list was kept
        unscanned = [f"op dirs after the first {len(jit.get('ops') or [])} were not read"]
    gaps = (["", f"Not scanned ({len(unscanned)}), so a lock there would not be seen:"]
            + [f"- {show(x, 300)}" for x in unscanned[:20]]
            + ([f"- ... and {len(unscanned) - 20} more"] if len(unscanned) > 20 else [])) if unscanned else []
    if not stale:
        live = [lk for lk in locks if lk.get("present")]
        if unscanned and not live:
            return [me.finding(status="warn",
                            title=f"JIT build locks: {count_of(len(unscanned), 'place')} not scanned; no lock in the "
                                  f"{count_of(len(jit.get('ops') or []), 'op dir')} read",
                            detail="\n".join([f"Looked in {jit.get('base')} (from {jit.get('source')}). A stale lock "
                                              "in a place that was not read would make launches wait forever "
                                              "unseen; read it as its owner (or as root) to be sure.", *gaps]),
                            evidence=ev)]
        if not live:
            if not jit.get("ops") and not any(r.get("exists") for r in jit.get("roots") or []):
                return [me.finding(status="skip", title="JIT build locks: nothing to check (no op has been "
                                   f"built here: {jit.get('base')} does not exist)",
                                   detail=f"torch builds JIT ops under {jit.get('base')} (from {jit.get('source')}); "
                                          "that directory is absent, so no lock can be left in it.", evidence=ev)]
            return [me.finding(status="ok", title="No JIT build locks", detail=f"Looked in {jit.get('base')} "
                               f"(from {jit.get('source')}); no op dir holds a `lock` file.", evidence=ev)]
        lines = [f"{lk['path']}: held by " + ", ".join(_describe(by_pid.get(p), p) for p in lk["holders"])
                 for lk in live]
        return [me.finding(status="warn" if unscanned else "ok",
                           title=f"{count_of(len(live), 'JIT build')} in progress"
                                 + (f"; {count_of(len(unscanned), 'place')} not scanned" if unscanned else ""),
                           detail="A live process holds each lock; launches that need the op wait for it.\n"
                                  + "\n".join(lines + gaps), evidence=ev)]
    out: list[Finding] = []
    used: set[str] = set()
    for lk in stale:
        op = ops.get(lk["path"])
        status, why = "fail", []
        if lk.get("in_use") is False:
            status = "warn"
            why.append(f"It lies in the tag dir {lk.get('tag')}, which this interpreter's torch does not use "
                       f"(it uses {jit.get('expected_tag') or 'another tag'}): it blocks only launches "
                       "with another Python or torch build.")
        if lk.get("network") and (lk.get("age_s") or 0) < NETWORK_GRACE_S:
            status = "warn"
            why.append("The cache is on a network file system and the lock is recent: a build running on "
                       "another node sharing this directory would hold it without any process here. "
                       "Check the other nodes before removing it.")
        if lk.get("uncertain"):
            status = "warn"
            why.append("The open files of these processes could not be read (run zdoctor as their user or "
                       "as root to be sure): " + ", ".join(_describe(by_pid.get(p), p) for p in lk["uncertain"]))
        owner = (op or {}).get("lock_owner") or (op or {}).get("lock_uid")
        made = f"lock created {duration(lk.get('age_s'))} ago" + (f" by {owner}" if owner is not None else "")
        lines = [f"Lock: {show(lk['path'], 300)}",
                 f"Op: {show(lk.get('op'), 100)} (tag {lk.get('tag') or 'none'}), {made}",
                 "No live process has the lock open, so nothing will ever delete it.", "", FILEBATON]
        if lk.get("orphans"):
            lines += ["", "Compilers of the dead build are still running in the op dir (ninja starts each "
                      "command in its own process group, so killing the launcher's group leaves them). "
                      "They will finish and exit without deleting the lock:"]
            lines += [f"- {_describe(by_pid.get(p), p)}" for p in lk["orphans"]]
        if lk.get("others"):
            lines += ["", "Other processes have their working directory or a file in the op dir (they do not "
                      "hold the lock):"]
            lines += [f"- {_describe(by_pid.get(p), p)}" for p in lk["others"]]
        if lk.get("waiters"):
            lines += ["", "Python processes sleeping in a poll loop, as launches waiting on this lock do:"]
            lines += [f"- {_describe(by_pid.get(p), p)}" for p in lk["waiters"]]
        if op and not op.get("so_path"):
            lines += ["", "The op was never finished: there is no built .so in its dir."]
        if why:
            lines += [""] + why
        lines += gaps
        out.append(Finding(id=f"{cid}.{_slug(_op_key(lk), used)}", status=status,
                           title=f"Stale JIT build lock for op {show(lk.get('op'), 60)}: launches that need it "
                                 "wait forever", detail="\n".join(lines), evidence=ev,
                           remedies=[lock_remedy(lk, op, lk.get("orphans") or [], trials.get(lk["path"]))],
                           explains=_hangs_on(facts, lk["path"]) if status == "fail" else []))
    return out


@check("hangs.processes", title="Training processes stuck in the kernel", probes=("processes",))
def check_processes(facts: Facts, me: CheckSpec) -> list[Finding]:
    procs = me.require(facts.of("processes"), "the processes probe gave no facts")
    ev = facts.evidence("processes")
    scope = procs.get("scope") or {"kind": "node"}
    allp = procs.get("processes") or []
    if scope.get("kind") in ("pid", "command"):
        job = set(scope.get("pids") or [])
        plist = [p for p in allp if p["pid"] in job]
        others_stuck = [p for p in allp if p["pid"] not in job and p.get("state_letter") == "D"]
        if not plist:
            return [me.finding(status="skip", title="The job's processes: none found",
                            detail=f"The job is {scope.get('how')}: {scope.get('missing') or 'none of them runs now'}. "
                                   "Nothing was judged about other processes on this node.", evidence=ev)]
        what = f"the job's {count_of(len(plist), 'process')}"
        where = f"The job is {scope.get('how')}."
    else:
        plist, others_stuck = allp, []
        what = f"{count_of(len(plist), JOB_PROCESS)} on this node"
        where = ("Which of them belong to the training job is not known (no --pid or --command): these are the "
                 "python, launcher and compiler processes on this node, whoever started them.")
    if not plist:
        return [me.finding(status="ok", title="No python, launcher or compiler process running on this node",
                           detail="No python, deepspeed, torchrun, accelerate, ninja or compiler process was found "
                                  "(zdoctor's own are left out).", evidence=ev)]
    lines: list[str] = []
    copies: dict[str, list[int]] = {}
    for p in plist:
        for m in p.get("libstdcxx") or []:
            copies.setdefault(m["path"] + (" (deleted on disk)" if m.get("deleted") else ""), []).append(p["pid"])
    if len(copies) > 1:
        lines.append("These processes map different libstdc++ copies:")
        lines += [f"- {path}: pids {', '.join(map(str, pids))}" for path, pids in sorted(copies.items())]
    elif copies:
        lines.append(f"libstdc++ mapped: {next(iter(copies))}")
    zombies = [p for p in plist if p.get("state_letter") == "Z"]
    if zombies:
        lines.append("Exited but not reaped by their parent (zombies): "
                     + ", ".join(_describe(p, p["pid"]) for p in zombies))
    denied = [p["pid"] for p in plist if p.get("errors") and any(v == "AccessDenied" for v in p["errors"].values())]
    if denied:
        lines.append(f"Some details of pids {', '.join(map(str, denied))} could not be read (another user's "
                     "processes; run zdoctor as root to see them).")
    waiting = sorted({pid for lk in procs.get("locks") or [] for pid in lk.get("waiters") or []})
    if waiting:
        lines.append(f"Pids {', '.join(map(str, waiting))} sleep in a poll loop like launches waiting on a stale "
                     "JIT build lock (see the stale-lock finding).")
    if others_stuck:
        lines.append(f"{count_of(len(others_stuck), 'other process', 'other processes')} on this node, not part of "
                     "the job, in state D: "
                     + ", ".join(_describe(p, p["pid"]) for p in others_stuck))
    stuck = [p for p in plist if p.get("state_letter") == "D"]
    if not stuck:
        return [me.finding(status="ok", title=f"{what[0].upper()}{what[1:]}, none stuck in the kernel",
                           detail="\n".join([where, *lines] if lines else
                                            [where, "All of them are running or sleeping interruptibly."]),
                           evidence=ev)]
    detail = [where, f"{count_of(len(stuck), 'process')} in state D (uninterruptible sleep): they wait inside the "
              "kernel, for a disk or network file system (NFS, Lustre), the GPU driver or pinned-memory allocation, "
              "and cannot even be killed until that wait ends. The wait channel names the kernel function "
              "they wait in.", ""]
    for p in stuck:
        detail.append(f"- {_describe(p, p['pid'])}")
        for m in p.get("libstdcxx") or []:
            detail.append(f"  libstdc++: {m['path']}{' (deleted on disk)' if m.get('deleted') else ''}")
        env = p.get("environ") or {}
        for k in ("LD_LIBRARY_PATH", "LD_PRELOAD"):
            if env.get(k):
                detail.append(f"  {k}={show(env[k], 200)}")
    detail += ["", "Next: as root, `cat /proc/PID/stack` shows the whole kernel stack, and `dmesg` shows "
               "'task ... blocked for more than 120 seconds' reports for the same processes."]
    if lines:
        detail += [""] + lines
    of = "of the job's processes" if scope.get("kind") in ("pid", "command") else \
        f"{JOB_PROCESS}{'es' if len(stuck) != 1 else ''} on this node"
    return [me.finding(status="warn", title=f"{len(stuck)} {of} stuck in "
                       f"uninterruptible sleep (wchan {', '.join(sorted({p.get('wchan') or '?' for p in stuck}))})",
                       detail="\n".join(detail), evidence=ev)]


def _corrupt_remedy(op: dict[str, Any]) -> Remedy:
    return Remedy(
        title=f"Remove op dir {show(op.get('name'), 60)} so the next launch rebuilds it",
        commands=[f"rm -rf -- {shell_quote(op['dir'])}"], verified=False,
        requires_root=op.get("dir_writable") is False, undo=[],
        explanation="Deletes this op's build directory only (sources live in the DeepSpeed package). The next "
                    "launch that needs the op recreates the directory and builds it from scratch, which takes "
                    "a minute or more. Not verified in advance: `zdoctor check` afterwards shows the dir gone.")


@check("jit.corrupt-ops", title="Damaged JIT-built ops", probes=("jitcache",),
       findings=("jit.corrupt-ops.*",))
def check_corrupt_ops(facts: Facts, me: CheckSpec) -> list[Finding]:
    cid = me.name
    jit = me.require(facts.of("jitcache"), "the jitcache probe gave no facts")
    ev = facts.evidence("jitcache")
    procs = facts.of("processes")
    held = {lk["path"] for lk in (procs or {}).get("locks") or [] if lk.get("holders")}
    ops = jit.get("ops") or []
    bad = [o for o in ops if o.get("so_path") and (o.get("so_info") or {}).get("kind") not in (None, "elf")]
    built = [o for o in ops if o.get("so_path")]
    if not built:
        return [me.finding(status="skip", title="Damaged JIT-built ops: nothing to check (no op has been "
                           "built here yet)", detail=f"No built op .so in {jit.get('base')}.", evidence=ev)]
    if not bad:
        return [me.finding(status="ok", title=f"{count_of(len(built), 'JIT-built op')}, none damaged",
                           detail="Every built .so in the extension cache is a readable ELF file.", evidence=ev)]
    out: list[Finding] = []
    used: set[str] = set()
    for o in bad:
        info = o.get("so_info") or {}
        building = o.get("lock_path") in held
        status = "warn" if building or o.get("in_use") is False else "fail"
        detail = [f"{show(o['so_path'], 300)}: {info.get('error') or info.get('kind')} ({info.get('size')} bytes)",
                  "torch loads this file for the op without checking it; loading fails with 'file too short', "
                  "'invalid ELF header' or a crash. Ninja rebuilds only outputs that are missing, older than "
                  "their inputs or built by another command, so a damaged file that looks up to date (a full "
                  "disk, a copied home directory, a killed link) stays damaged."]
        if building:
            detail.append("A live build holds this op's lock right now: the file may simply be half-written. "
                          "Check again when the build is done.")
        if o.get("in_use") is False:
            detail.append(f"It lies in the tag dir {o.get('tag')}, which this interpreter's torch does not use.")
        out.append(Finding(id=f"{cid}.{_slug(_op_key(o), used)}", status=status,
                           title=f"JIT op {show(o.get('name'), 60)}: built .so is {info.get('kind')}",
                           detail="\n".join(detail), evidence=ev,
                           remedies=[] if building else [_corrupt_remedy(o)]))
    return out


def _mm(v: str | None) -> tuple[int, ...]:
    return version_tuple(v)[:2]


@check("jit.foreign-toolchain", title="JIT ops built by a newer compiler", probes=("jitcache", "toolchain"),
       findings=("jit.foreign-toolchain.*",))
def check_foreign_toolchain(facts: Facts, me: CheckSpec) -> list[Finding]:
    cid = me.name
    jit, tc = facts.of("jitcache"), facts.of("toolchain")
    if jit is None or tc is None or not (tc.get("jit") or {}).get("path"):
        return [me.not_checked("the jitcache probe or the JIT compiler (toolchain probe) is missing")]
    cur = tc["jit"]
    cur_ver = cur.get("version") if cur.get("family") == "gcc" else None
    ev = facts.evidence("jitcache")
    out: list[Finding] = []
    notes: list[str] = []
    used: set[str] = set()
    for o in jit.get("ops") or []:
        info = o.get("so_info") or {}
        if info.get("kind") != "elf" or o.get("in_use") is False:
            continue
        same_cmd = bool(o.get("build_compiler_realpath")) and o["build_compiler_realpath"] == cur.get("realpath")
        built_ver = info.get("compiler_version")
        if not same_cmd and o.get("build_cxx"):
            notes.append(f"{show(o['name'], 60)}: build.ninja runs {show(o['build_cxx'], 100)}, not {cur['path']}; "
                         "torch rewrites build.ninja at the next load and ninja rebuilds because the command "
                         "changed (the first launch takes longer).")
            continue
        if not (built_ver and cur_ver and _mm(built_ver) > _mm(cur_ver)):
            continue
        need = info.get("glibcxx_newest")
        detail = [f"{show(o['so_path'], 300)} was compiled by GCC {built_ver} (its .comment section); this node's "
                  f"JIT compiler is {cur['path']} (GCC {cur_ver}).",
                  "The compile command in build.ninja is the same here, so ninja considers the op up to date and "
                  "never rebuilds it: typical of a home directory or TORCH_EXTENSIONS_DIR shared by nodes with "
                  "different images."]
        if need:
            rel = gcc_release_for(need)
            detail.append(f"It needs libstdc++ version {need}" + (f" (GCC {rel} or newer)" if rel else "")
                          + "; an older libstdc++.so.6 loaded at run time fails with "
                            f"\"version `{need}' not found\".")
        out.append(Finding(id=f"{cid}.{_slug(_op_key(o), used)}", status="warn",
                           title=f"JIT op {show(o.get('name'), 60)} was built by GCC {built_ver}, newer than this "
                                 f"node's GCC {cur_ver}", detail="\n".join(detail), evidence=ev,
                           remedies=[_corrupt_remedy(o)]))
    if not out and not any((o.get("so_info") or {}).get("kind") == "elf" for o in jit.get("ops") or []):
        return [me.finding(status="skip", title="JIT ops and this node's compiler: nothing to check (no "
                        "op has been built here yet)", detail="\n".join(notes) or f"No built op in {jit.get('base')}.",
                        evidence=ev)]
    if not out:
        return [me.finding(status="ok", title="No JIT op was built by a newer compiler than this node's",
                           detail="\n".join(notes) or f"JIT compiler: {cur['path']}" + (f" (GCC {cur_ver})"
                                                                                           if cur_ver else ""),
                           evidence=ev)]
    return out


# -- predicates ------------------------------------------------------------------------------------

@predicate("stale_jit_lock", doc="a JIT build lock that this interpreter's launches wait on has no live owner",
           probes=("jitcache", "processes"))
def stale_jit_lock(facts: Facts) -> bool:
    procs = facts.of("processes")
    return any(lk.get("stale") and lk.get("in_use") is not False for lk in (procs or {}).get("locks") or [])


@predicate("jit_op_corrupt", doc="a JIT-built op .so is truncated, corrupt or not an ELF file",
           probes=("jitcache",))
def jit_op_corrupt(facts: Facts) -> bool:
    jit = facts.of("jitcache")
    return any(o.get("so_path") and (o.get("so_info") or {}).get("kind") not in (None, "elf")
               and o.get("in_use") is not False for o in (jit or {}).get("ops") or [])
