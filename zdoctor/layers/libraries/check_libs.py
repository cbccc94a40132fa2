"""Checks and predicates over ``libs``, ``livetrace`` and ``libfix``: the libstdc++ investigation."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from zdoctor.core.factstypes import LibsFacts, LivetraceFacts, ShellinitFacts
from zdoctor.core.model import Evidence, Finding, Remedy
from zdoctor.core.packages import managers
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check, predicate
from zdoctor.edit.filefix import replace_remedy
from zdoctor.layers.libraries.fixes import best_copy
from zdoctor.layers.libraries.rebuildop import jit_dir_of, rebuild_remedy, serving_compilers
from zdoctor.layers.libraries.runneeds import has_every, is_libstdcxx_version, needed_versions
from zdoctor.layers.libraries.runtables import failure_tables
from zdoctor.layers.libraries.shellinit import COMMENT_NOTE, commented_out, lines_for_entry
from zdoctor.layers.libraries.sources import live_source, static_source
from zdoctor.readers.jitcache import gcc_version_of
from zdoctor.readers.stuck import hung_at_limit
from zdoctor.readers.versions import gcc_release_for, gcc_series, newest, sort_key
from zdoctor.symptoms.match import ids_for
from zdoctor.trials.remedies import Plan

LIBSTDCXX = "libstdc++.so.6"
_OPENS_COPY = "libstdc++.so"






def _same(a: str | None, b: str | None) -> bool:
    """Paths equal as written (normalised); checks compare recorded facts, never this machine's files."""
    if not a or not b:
        return False
    return os.path.normpath(a) == os.path.normpath(b)


def _recorded_copy(libs: LibsFacts, path: str | None) -> Mapping[str, Any] | None:
    """The inventory record of the libstdc++ at ``path`` (by path as written or real file)."""
    if not path:
        return None
    for c in libs.get("inventory") or []:
        if _same(c.get("path"), path) or _same(c.get("realpath"), path):
            return c
    return None


def _realpath_of(libs: LibsFacts, path: str, recorded: str | None = None) -> str:
    """The real file behind ``path``, from what was recorded (never by looking at this machine)."""
    if recorded:
        return recorded
    c = _recorded_copy(libs, path)
    return c["realpath"] if c and c.get("realpath") else os.path.normpath(path)


def _static_target_for(libs: LibsFacts, required_by: str) -> dict[str, Any] | None:
    for t in libs.get("targets") or []:
        if _same(t["target"]["path"], required_by) or any(_same(p, required_by) for p in t.get("new_objects") or []):
            return t
    return None


def failure_groups(facts: Facts) -> list[dict[str, Any]]:
    """Version failures grouped by (provider, required_by), each with its source and origin (live/static)."""
    libs = facts.of("libs") or {}
    live = facts.of("livetrace") or {}
    interp = (libs.get("interpreter") or {})
    exe, exe_rpath = interp.get("path"), interp.get("rpath")
    live_errors = live.get("version_errors") or []
    origin = "live" if live_errors else "static"
    raw = live_errors or libs.get("failures") or []
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for f in raw:
        if not is_libstdcxx_version(str(f.get("version", ""))):
            continue  # glibc's (libs.glibc speaks for it) or another library's node: no libstdc++ copy lacks it
        key = (_realpath_of(libs, f["provider"], f.get("provider_realpath")),
               f.get("required_by_realpath") or os.path.normpath(f["required_by"]))
        g = groups.setdefault(key, {"provider": f["provider"], "required_by": f["required_by"], "versions": [],
                                    "messages": [], "origin": origin, "provider_realpath": key[0],
                                    "provider_max": f.get("provider_max"),
                                    "provider_error": f.get("provider_error")})
        if f["version"] not in g["versions"]:
            g["versions"].append(f["version"])
            g["messages"].append(f.get("message") or "")
    for g in groups.values():
        g["versions"].sort(key=sort_key)
        source = None
        t = _static_target_for(libs, g["required_by"])
        served = ((t or {}).get("served") or {}).get(LIBSTDCXX)
        if served and _same(served.get("path"), g["provider"]):
            source = static_source(served, (t or {})["target"]["path"], exe, exe_rpath)
        if source is None:
            for x in live.get("libstdcxx") or []:
                if _same(x["path"], g["provider"]) or _same(x.get("realpath"), g["provider_realpath"]):
                    source = live_source(x["via"], x["path"], x.get("needed_by"), g["required_by"], exe, exe_rpath)
                    break
        g["source"] = source or {"kind": "unknown", "text": "how this copy was found is not known"}
        if not g["provider_max"] and not g["provider_error"]:
            c = _recorded_copy(libs, g["provider"]) or _recorded_copy(libs, g["provider_realpath"])
            g["provider_max"] = (c or {}).get("glibcxx_max")
            if c is None:
                g["provider_error"] = "not recorded"
    return list(groups.values())


def source_kinds(facts: Facts) -> set[str]:
    """Every source kind (and inner kind of an earlier import) behind the failures."""
    kinds: set[str] = set()
    for g in failure_groups(facts):
        s = g["source"]
        kinds.add(s["kind"])
        if s.get("how"):
            kinds.add(s["how"]["kind"])
    return kinds


def _plans(facts: Facts) -> list[Plan]:
    return [Plan.from_dict(p) for p in (facts.of("libfix") or {}).get("plans") or []]


def _remedies(facts: Facts) -> list[Remedy]:
    return [p.to_remedy() for p in _plans(facts)]


def _needs_line(needs: list[str]) -> str:
    """``13 versions, up to GLIBCXX_3.4.30 and CXXABI_1.3.13``: the needs a copy was checked against."""
    tops = [v for v in (newest(needs, "GLIBCXX"), newest(needs, "CXXABI")) if v]
    return f"{len(needs)} version{'s' if len(needs) != 1 else ''}" + (f", up to {' and '.join(tops)}" if tops else "")


def _good_copy_line(facts: Facts) -> str:
    """The sentence naming a copy that defines every version the training needs (every object the failing
    run loaded included), checked against those needs; or that no copy found does."""
    libs = facts.of("libs") or {}
    needs = needed_versions(libs, facts.of("livetrace") or {})
    good = best_copy(libs, needs)
    checked = f"({_needs_line(needs)}, those of the training's libraries and of every object the run loaded)"
    if good:
        return f"A copy with every needed version {checked}: {good}."
    return f"No libstdc++ copy zdoctor found defines every needed version {checked}."


def _has_good_copy(facts: Facts) -> bool:
    """Whether some libstdc++ copy on the node defines every version the training needs."""
    libs = facts.of("libs") or {}
    return best_copy(libs, needed_versions(libs, facts.of("livetrace") or {})) is not None


def _rebuild_remedies(facts: Facts, group: dict[str, Any]) -> list[Remedy]:
    """With no copy new enough on the node: rebuild the op with each g++ on the training PATH that the loaded
    libstdc++ serves."""
    toolchain = facts.of("toolchain") or {}
    have = group.get("provider_max")
    if not have:  # what the loaded copy provides is unknown: which compiler it serves is too
        return []
    op = str(group["required_by"])
    jit_dir = jit_dir_of(op, (facts.of("libs") or {}).get("targets") or [])
    return [rebuild_remedy(op, jit_dir, c, str(have))
            for c in serving_compilers(toolchain.get("compilers") or [], str(have))]


def _no_newer_runtime_lines(facts: Facts) -> list[str]:
    """What the distribution's packages cannot do here, said rather than offered."""
    distro = (facts.of("toolchain") or {}).get("distro")
    if [m.family for m in managers(distro)] == ["dnf"]:  # a RHEL-family node, known from its os-release
        return ["No gcc-toolset-N-runtime package helps: gcc-toolset links the C++ parts newer than the "
                "system's libstdc++ statically into what it builds and ships no newer libstdc++.so.6, so the "
                "loader would still find this copy. A gcc-toolset g++ is a compiler this libstdc++ serves."]
    return []


_TARGET_KINDS = (("torch", "torch librar{}", "y", "ies"), ("deepspeed-op", "prebuilt DeepSpeed op{}", "", "s"),
                 ("jit-op", "JIT-built op{}", "", "s"), ("ext", "extension{} named with --ext", "", "s"))


def _what_was_read(targets: list[dict[str, Any]]) -> str:
    """``2 torch libraries, no prebuilt DeepSpeed op, no JIT-built op``: what the static audit read, by kind
    (--ext only when given), so an ok never covers ops that were not there to read."""
    kinds = [str((t.get("target") or {}).get("kind")) for t in targets]
    parts = []
    for kind, noun, one, many in _TARGET_KINDS:
        n = kinds.count(kind)
        if n or kind != "ext":
            parts.append(f"{n} {noun.format(one if n == 1 else many)}" if n else f"no {noun.format(one)}")
    return ", ".join(parts)


@check("libs.glibcxx", title="GLIBCXX/CXXABI versions needed vs provided",
       probes=("libs", "livetrace", "libfix"), optional=("toolchain",), explains=("version-not-found",))
def check_glibcxx(facts: Facts, me: CheckSpec) -> list[Finding]:
    libs = facts.of("libs") or {}
    if not libs:
        res = facts.get("libs")
        return [me.not_checked((res.error if res else None) or "no static audit")]
    groups = failure_groups(facts)
    ev = facts.evidence("libs", kinds=("table",))
    if not groups:
        winner = libs.get("libstdcxx") or {}
        n = len(libs.get("needs") or [])
        if not libs.get("targets"):
            return [me.finding(status="skip", title="Library versions: nothing to check (no torch library, "
                               "JIT-built op or --ext was found)",
                               detail="No C++ library of the training was found in the probed interpreter, so no "
                                      "GLIBCXX need was read. If the training runs another interpreter, name it "
                                      "with --python.", evidence=ev)]
        return [me.finding(status="ok",
                           title=f"{winner.get('path', 'libstdc++.so.6')} {winner.get('label', '')} provides all "
                                 f"{n} libstdc++ versions the training's libraries need".replace("  ", " "),
                           detail="Checked by set membership of each needed version node (never by sorting "
                                  f"strings), in what the audit read: {_what_was_read(libs['targets'])}.",
                           evidence=ev)]
    remedies = _remedies(facts)
    good_line = _good_copy_line(facts)
    failing = {p for g in groups for p in (os.path.normpath(g["provider"]), g["provider_realpath"])}
    ev = failure_tables(ev, libs, facts.of("livetrace") or {}, failing)
    out = []
    for g in groups:
        versions = ", ".join(g["versions"])
        rel = gcc_release_for(g["versions"][-1])
        have = g["provider_max"]
        title = (f"{os.path.basename(g['required_by'])} needs {versions}, which the loaded "
                 f"{g['provider']} lacks")
        lines = [
            f"Needed: {versions} (by {g['required_by']}){f'; first in GCC {rel} libstdc++' if rel else ''}.",
            f"Loaded copy: {g['provider']} -> {g['provider_realpath']}, "
            + (f"provides up to {have} (the libstdc++ of GCC {gcc_series(have) or '?'})." if have else
               f"unreadable: {g['provider_error']}."),
            f"Why this copy: {g['source']['text']}.",
            ("Seen by the real loader (LD_DEBUG trace of the command)." if g["origin"] == "live"
             else "Predicted by the loader emulation (the command was not run, or did not reach this import)."),
        ]
        lines.append(good_line)
        lines.append("libstdc++ is backward compatible: a newer copy satisfies older needs. Never replace "
                     "the system libstdc++ to fix this; change which copy the training loads.")
        for m in g["messages"][:3]:
            if m:
                lines.append(m)
        explains = [sid for v in g["versions"]
                    for sid in ids_for(facts, "version-not-found", version=v, object=g["required_by"])]
        own = remedies
        if not _has_good_copy(facts):
            own = remedies + _rebuild_remedies(facts, g)
            lines += _no_newer_runtime_lines(facts)
        out.append(me.finding(status="fail", title=title, detail="\n".join(lines), evidence=ev,
                              remedies=own, explains=list(dict.fromkeys(explains))))
    return out


def probe_steps(live: LivetraceFacts) -> tuple[list[str], list[str]]:
    """The default import probe's steps that loaded (``import torch``...) and those skipped, with why."""
    loaded = [str(s.get("step")) for s in live.get("steps") or [] if s.get("ok") is True]
    skipped = [f"{str(s.get('step')).replace('import ', '')} ({s.get('skipped')})"
               for s in live.get("steps") or [] if s.get("skipped")]
    return loaded, skipped


def live_unchecked(facts: Facts) -> str | None:
    """Why the live run exercised nothing the training loads (None when it did: a command ran, or the import
    probe loaded something: torch, an --ext extension or a JIT-built op)."""
    res = facts.get("livetrace")
    live = facts.of("livetrace") or {}
    if not live:
        return (res.facts.get("skipped") if res is not None and res.facts else None) or \
            (res.error if res is not None else None) or "the live trace did not run"
    if live.get("command") or live.get("timed_out") or not live.get("ok"):
        return None
    loaded, _ = probe_steps(live)
    python = (live.get("argv") or ["the probed interpreter"])[0]
    if loaded:
        return None
    return (f"torch is not installed in {python}: nothing the training loads was imported; name the "
            "training interpreter with --python")


def _longer_timeout(limit: Any) -> int:
    """The ``--timeout`` to rerun with after a run was still at work at ``limit`` seconds: four times it,
    at least 600 s."""
    return max(600, int(float(limit) * 4)) if isinstance(limit, (int, float)) else 600


def _loaded_before_limit(loaded: bool) -> str:
    """What a run stopped at its limit had loaded, as far as what is listed above says."""
    return ("What it loaded before the limit is listed above; what it had not reached was never loaded" if loaded
            else "It loaded no libstdc++ before the limit")


def _still_compiling(me: CheckSpec, facts: Facts, what: str, building: list[dict[str, Any]], lines: list[str],
                     ev: list[Evidence]) -> Finding:
    """The run reached its time limit while the JIT build was still at work: a slow first build, not a hang."""
    live = facts.of("livetrace") or {}
    limit = live.get("timeout")
    rows = [[str(c.get("pid") or "?"), str(c.get("comm")), str(c.get("file") or "unknown"),
             f"{c['running_s']} s" if c.get("running_s") else "unknown"] for c in building]
    table = Evidence.of_table("build tools at work when the time limit ended the run",
                              ["pid", "tool", "working on", "running for"], rows)
    longer = _longer_timeout(limit)
    rerun = Remedy(
        title="Let the build finish: run the check again with a longer time limit",
        commands=[], explanation=f"The first launch compiles each JIT op (minutes for cpu_adam, more for CUDA "
                                 f"ops); once built, the op is kept in its dir and later launches load it. Run "
                                 f"`zdoctor check` again with `--timeout {longer}` (or the launch itself with no "
                                 "limit) and let the compilers finish.",
        note=f"the build needs more time than this run's limit ({limit:g} s)" if isinstance(limit, (int, float))
        else "the build needs more time than this run's limit")
    return Finding(id=me.name, status="warn",
                   title=f"{what} was still compiling its JIT op when the time limit ended it: not a hang",
                   detail="\n".join([*lines, "", "Build tools were at work when the limit came: "
                                      + "; ".join(f"{r[1]} on {r[2]} ({r[3]})" for r in rows)
                                      + ". The run was building, not waiting; rerun with a longer --timeout."]),
                   evidence=[table, *ev], remedies=[rerun], explains=ids_for(facts, "still-compiling"))


def _still_working(me: CheckSpec, facts: Facts, what: str, loaded: bool, lines: list[str],
                   ev: list[Evidence]) -> Finding:
    """The user's command reached its time limit while every process of it was working: too short a limit
    (or a loop), not a hang; what it would have done is not known."""
    limit = (facts.of("livetrace") or {}).get("timeout")
    within = f"{limit:g} s" if isinstance(limit, (int, float)) else "its time limit"
    longer = _longer_timeout(limit)
    rerun = Remedy(
        title="See how it ends: run the check again with a longer time limit",
        commands=[], explanation=f"Run `zdoctor check` again with `--timeout {longer}` (or the command itself with "
                                 "no limit). If it is still working then, it loops or waits on work that never "
                                 "ends: name a rank or its launcher with --pid to read where each one is.",
        note=f"how long the command needs is not known: it was still working at {within}")
    return Finding(id=me.name, status="warn",
                   title=f"{what} was still working when the time limit ({within}) came: not a hang",
                   detail="\n".join([*lines, "", "Every process of the run was on a CPU when the limit came: it was "
                                      f"working, not waiting. {_loaded_before_limit(loaded)}, so how it would have "
                                      "ended is not known."]),
                   evidence=ev, remedies=[rerun], explains=ids_for(facts, "still-working"))


@check("libs.live", title="The command under the real loader", probes=("livetrace", "libs"),
       explains=("version-not-found", "still-compiling", "still-working"),
       findings=("libs.prediction",),
       no_remedy="it states what the command did under the real loader; the findings that name why (libs.glibcxx, "
                 "libs.symbols, libs.broken-files, the hang and build findings) carry the fixes")
def check_live(facts: Facts, me: CheckSpec) -> list[Finding]:
    live = facts.of("livetrace") or {}
    ev = facts.evidence("livetrace", kinds=None)
    if not live:
        return [me.finding(status="skip", title=f"Live loader trace: {live_unchecked(facts)}")]
    what = live.get("command") or "the import probe (torch, deepspeed, JIT-built ops)"
    if not live.get("command"):
        loaded_steps, skipped_steps = probe_steps(live)
        what = "the import probe (" + (", ".join(s.replace("import ", "") for s in loaded_steps) or "nothing") + ")"
        unchecked = live_unchecked(facts)
        if unchecked:
            return [me.finding(status="skip", title=f"Live loader trace: not checked: {unchecked}",
                               detail=f"Ran {what}; not loaded: {', '.join(skipped_steps) or 'nothing'}. Nothing of "
                                      "the training was loaded, so nothing was checked under the real loader.",
                               evidence=ev)]
        not_loaded = f"; not loaded: {', '.join(skipped_steps)}" if skipped_steps else ""
    else:
        not_loaded = ""
    notes = list(live.get("notes") or [])
    loaded = live.get("libstdcxx") or []
    lines = [f"Ran: {what}"]
    traced = [str(x) for x in live.get("strace_lines") or []]
    opened = [x for x in traced if _OPENS_COPY in x and "unfinished" not in x]
    if opened:
        lines += ["strace saw the copy opened:", *(f"  {x}" for x in opened[:3])]
    pids = sorted({x["pid"] for x in loaded})
    for x in loaded[:4]:
        who = "it" if len(pids) < 2 else f"process {pids.index(x['pid']) + 1}"
        lines.append(f"{who} loaded {x['path']} {x['via']}" + (f" (needed by {x['needed_by']})"
                                                               if x.get("needed_by") else ""))
    lines += notes
    out: list[Finding] = []
    if live.get("timed_out"):
        files = live.get("last_files") or []
        waits = [x for x in traced if x not in opened]
        if waits:
            lines += ["strace saw it wait in:", *(f"  {x}" for x in waits[:3])]
        lines.append("Last files opened before the time limit:" if files else
                     "No strace record of the files it opened (strace unavailable).")
        lines += [f"  {f}" for f in files[-10:]] if files and isinstance(files[0], str) else \
            [f"  {f}" for f in files[-10:]]
        building = [c for c in live.get("compiling") or [] if isinstance(c, dict) and c.get("comm")]
        if building:
            out.append(_still_compiling(me, facts, what, building, lines, ev))
        elif not hang_evidence(live) and live.get("source") == "command":  # the user's limit on a working run
            out.append(_still_working(me, facts, what, bool(loaded), lines, ev))
        elif not hang_evidence(live):  # zdoctor's own probe was late on a busy or slow node: no verdict
            out.append(me.finding(status="skip", title=f"{what}: not examined: it ran out of time ("
                                  f"{live.get('timeout') or '?'} s), its processes still running: slow, not hung",
                                  detail="\n".join([*lines, "", "Every process of the run was running on a CPU "
                                                     "when the limit came: the interpreter was slow (a busy node, a "
                                                     "slow file system), not waiting. "
                                                     f"{_loaded_before_limit(bool(loaded))}, so nothing is "
                                                     "concluded; run again with a longer --timeout."]),
                                  evidence=ev))
        else:
            out.append(me.finding(status="fail", title=f"{what} did not finish within the time limit (hang?)",
                                  detail="\n".join(lines), evidence=ev))
    elif not live.get("ok"):
        errs = live.get("version_errors") or []
        failed_step = next((s for s in live.get("steps") or [] if s.get("ok") is False), None)
        first = errs[0]["message"] if errs else (live.get("stderr_tail") or "").strip().splitlines()[-1:] or [""]
        first = first if isinstance(first, str) else first[0]
        title = f"{what} fails (exit code {live.get('exit_code')})"
        if failed_step is not None and not errs:
            # the probe's own first failing step, not whatever the last line of its output came from
            title = f"{what}: {failed_step.get('step')} fails (exit code {live.get('exit_code')})"
            first = f"{failed_step.get('step')}: {failed_step.get('error')}"
            _, skipped_steps = probe_steps(live)
            if skipped_steps:
                first += f"\nNot loaded: {', '.join(skipped_steps)}."
        # Only a version the real loader reported missing explains a symptom: "it fails" explains nothing.
        explains = [sid for e in errs for sid in ids_for(facts, "version-not-found", version=e.get("version"),
                                                          object=e.get("required_by"))]
        out.append(me.finding(status="fail", title=title, detail="\n".join([*lines, first]), evidence=ev,
                              explains=list(dict.fromkeys(explains))))
    else:
        out.append(me.finding(status="ok", title=f"{what} loads cleanly under the real loader{not_loaded}",
                              detail="\n".join(lines), evidence=ev))
    if agreement(facts) is False:
        out.append(Finding(id="libs.prediction", status="warn",
                           title="The emulation and the real loader disagree on libstdc++",
                           detail=f"Predicted {((facts.of('libs') or {}).get('libstdcxx') or {}).get('path')}; "
                                  "the real run loaded "
                                  f"{', '.join(sorted({x['path'] for x in loaded}))}. Something the emulation "
                                  "does not see decided it (a dlopen in Python code, an import order, a "
                                  "preload); the live trace is the truth.", evidence=ev))
    return out


def agreement(facts: Facts) -> bool | None:
    """Whether the emulation's libstdc++ is the one the real run loaded (None: nothing to compare)."""
    libs = facts.of("libs") or {}
    predicted = (libs.get("libstdcxx") or {}).get("realpath")
    loaded = (facts.of("livetrace") or {}).get("libstdcxx") or []
    live = {_realpath_of(libs, x["path"], x.get("realpath")) for x in loaded}
    if not predicted or not live:
        return None
    return predicted in live


def _lacking(copy: dict[str, Any], needs: list[str]) -> str:
    """``; lacks GLIBCXX_3.4.11`` for an inventory copy that misses a needed version ('' otherwise)."""
    if copy.get("versions") is None:
        return ""
    lack = [n for n in needs if n not in set(copy["versions"])]
    return f"; lacks {', '.join(lack)}" if lack else ""


@check("libs.inventory", title="Every libstdc++ on the node", probes=("libs", "livetrace"))
def check_inventory(facts: Facts, me: CheckSpec) -> list[Finding]:
    libs = facts.of("libs") or {}
    if not libs:
        return [me.finding(status="skip", title="libstdc++ inventory: not taken")]
    needs = needed_versions(libs, facts.of("livetrace") or {})
    copies: list[dict[str, Any]] = [dict(c, has_every_need=has_every(c, needs)) for c in libs.get("inventory") or []]
    ev = [e for e in facts.evidence("libs", kinds=("table",)) if e.label.startswith("every libstdc++")]
    # the copy the run loaded (or failed with) may sit where the inventory does not look (an extension's
    # RUNPATH, a dlopen by path): count it too
    known = {c.get("realpath") or os.path.realpath(c["path"]) for c in copies}
    for g in failure_groups(facts):
        if g["provider_realpath"] not in known:
            known.add(g["provider_realpath"])
            copies.append({"path": g["provider"], "glibcxx_max": g.get("provider_max"), "has_every_need": False,
                           "found_as": [f"loaded, and lacks {', '.join(g['versions'])} (needed by "
                                        f"{os.path.basename(g['required_by'])})"]})
    for x in (facts.of("livetrace") or {}).get("libstdcxx") or []:
        real = x.get("realpath") or os.path.realpath(x["path"])
        if real not in known:
            known.add(real)
            copies.append({"path": x["path"], "found_as": [f"loaded by the live run {x.get('via') or ''}".strip()]})
    short = [c for c in copies if c.get("has_every_need") is False and not c.get("error")]
    title = f"{len(copies)} libstdc++.so.6 cop{'y' if len(copies) == 1 else 'ies'} found"
    if short and needs:
        title += f"; {len(short)} lack{'s' if len(short) == 1 else ''} a version the training needs"
    detail = "\n".join(f"{c['path']}: up to {c.get('glibcxx_max') or '?'}"
                       + (f" (GCC {c.get('gcc_series') or c['gcc_release']})" if c.get("gcc_release") else "")
                       + f"; {', '.join(c['found_as'])}" + _lacking(c, needs) for c in copies if not c.get("error"))
    damaged = [c for c in copies if c.get("error")]
    if damaged:
        # A copy the ELF reader refused (hostile counts, truncated by a crashed copy) is not evidence of
        # anything it provides; where the loader may pick it, the training fails in ways no version explains.
        title += f"; {len(damaged)} damaged"
        lines = [f"{c['path']}: damaged, {c['error']}; {', '.join(c.get('found_as') or [])}" for c in damaged]
        detail = "\n".join(filter(None, [detail, *lines]))
        return [me.finding(status="warn", title=title, detail=detail, evidence=ev)]
    # a title that states a problem (a copy lacks a needed version) is a warning, never under a check mark
    lacking = "lack" in title
    return [me.finding(status="warn" if lacking else "ok", title=title, detail=detail, evidence=ev)]


@check("libs.interpreter-rpath", title="The interpreter's DT_RPATH", probes=("libs", "livetrace"))
def check_interpreter_rpath(facts: Facts, me: CheckSpec) -> list[Finding]:
    libs = facts.of("libs") or {}
    interp = libs.get("interpreter") or {}
    if not libs:
        return [me.not_checked(facts.why_not("libs"))]
    if not interp.get("rpath"):
        return [me.finding(status="ok", title="The interpreter carries no DT_RPATH")]
    needs = needed_versions(libs, facts.of("livetrace") or {})
    old = [(c["path"], c.get("glibcxx_max")) for c in interp.get("rpath_copies") or []
           if needs and not set(needs) <= set(c.get("versions") or [])]
    if not old:
        return [me.finding(status="ok", title=f"The interpreter's DT_RPATH ({interp['rpath']}) holds no "
                           "libstdc++ older than the training needs")]
    cand, have = old[0]
    return [me.finding(status="warn",
                       title=f"The interpreter's DT_RPATH puts an older libstdc++ in reach: {cand} ({have})",
                       detail=(f"{interp.get('path')} carries DT_RPATH {interp['rpath']} (conda builds its python "
                               "this way). Any extension without its own RUNPATH that loads libstdc++.so.6 "
                               "first - imported before torch - gets this copy, and every later library then "
                               "shares it, whatever its own RUNPATH says."))]


def _gcc_of(comment: str) -> str | None:
    """``GCC: (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0`` -> ``11.4.0``; ``GCC: (GNU) 13.3.1 20240611 (Red Hat
    13.3.1-2)`` -> ``13.3.1`` (the release, not the vendor's package suffix)."""

    return gcc_version_of([comment]) if comment.startswith("GCC:") else None


@check("libs.ext-compilers", title="The compiler that built each extension, beside the toolchain layers",
       probes=("libs", "toolchain"))
def check_ext_compilers(facts: Facts, me: CheckSpec) -> list[Finding]:
    """The fourth toolchain layer, from each extension's .comment, in one table with the other three."""
    libs = facts.of("libs") or {}
    if not libs or not libs.get("targets"):
        return [me.finding(status="skip", title="Extension compilers: no extension to read")]
    tool = facts.get("toolchain")
    rows: list[list[str]] = []
    if tool is not None and tool.status == "ok":
        for piece in tool.evidence:
            if piece.kind == "table" and piece.table is not None and len(piece.table.columns) == 4:
                rows += [list(r) for r in piece.table.rows]
    winner = libs.get("libstdcxx") or {}
    have = winner.get("glibcxx_max")
    hl: list[int] = []
    newer: list[str] = []
    for t in libs["targets"]:
        comps = [c for c in t.get("compilers") or [] if c.startswith("GCC:")]
        gcc = next((g for g in map(_gcc_of, comps) if g), None)
        needs = [n for n in t.get("needs") or [] if n.startswith("GLIBCXX_")]
        if needs and have and any(n not in (winner.get("versions") or []) for n in needs):
            hl.append(len(rows))
            newer.append(t["target"]["name"])
        rows.append([f"extension {t['target']['name']}", t["target"]["path"],
                     f"GCC {gcc}" if gcc else (comps[0] if comps else "unknown (no .comment)"),
                     ".comment" + (f"; needs up to {needs[-1]}" if needs else "")])
    ev = [Evidence.of_table("the four toolchain layers", ["layer", "compiler", "version", "source"], rows, hl)]
    lines = ["The version nodes an extension needs were fixed by the compiler that built it (its .comment "
             "names it); the libstdc++ loaded at run time must be at least as new."]
    tf = tool.facts if tool is not None and tool.status == "ok" else {}
    if tf.get("devtoolset_on_path"):
        lines.append("A devtoolset / gcc-toolset is on PATH: it links newer C++ pieces statically into what it "
                     "builds and still loads the system libstdc++.so.6 at run time; it never satisfies a "
                     "runtime GLIBCXX need.")
    if newer:
        return [me.finding(status="warn",
                           title=f"Built by a newer GCC than the loaded libstdc++ ({have}) serves: {', '.join(newer)}",
                           detail="\n".join(lines), evidence=ev)]
    return [me.finding(status="ok",
                       title=f"{count_of(len(libs['targets']), 'extension')}: compilers read from .comment",
                    detail="\n".join(lines), evidence=ev)]


@check("libs.env-source", title="Where the offending LD_LIBRARY_PATH / LD_PRELOAD entry is set",
       probes=("libs", "livetrace", "shellinit"))
def check_env_source(facts: Facts, me: CheckSpec) -> list[Finding]:
    """For each LD_LIBRARY_PATH or LD_PRELOAD entry that supplies a failing libstdc++, the shell startup line
    that sets it: the line to change so the fix outlives this shell."""

    kinds = {"ld_library_path": "LD_LIBRARY_PATH", "ld_preload": "LD_PRELOAD"}
    wanted: list[tuple[str, str]] = []
    for g in failure_groups(facts):
        src = g["source"].get("how") or g["source"]
        if src.get("kind") in kinds and src.get("entry") and (kinds[src["kind"]], src["entry"]) not in wanted:
            wanted.append((kinds[src["kind"]], src["entry"]))
    if not wanted:
        return [me.finding(status="skip", title="Where the offending entry is set: nothing to trace (no "
                           "failing libstdc++ came through LD_LIBRARY_PATH or LD_PRELOAD)")]
    init = me.require(facts.of("shellinit"), facts.why_not("shellinit"))
    ev = facts.evidence("shellinit", kinds=("table",))
    out = []
    for var, entry in wanted:
        lines = lines_for_entry(init, var, entry)
        if lines:
            first = lines[0]
            detail = [f"{x['file']} line {x['line']}: {x['text']}" for x in lines]
            detail.append(f"Every login shell and job started from it gets {entry} on {var} from this line; "
                          "removing the entry in one shell does not outlive that shell. Delete or comment out "
                          "the line (or move it into the one script that needs it).")
            fixes = [r for r in (_comment_out_remedy(init, x, var, entry) for x in lines) if r is not None]
            out.append(me.finding(status="warn",
                                  title=f"{var} entry {entry} is set in {first['file']} line {first['line']}: "
                                        f"{first['text']}", detail="\n".join(detail), evidence=ev,
                                  remedies=fixes[:1]))
        else:
            read = init.get("files") or []
            out.append(me.finding(status="warn",
                                  title=f"{var} entry {entry}: no shell startup file zdoctor read sets it",
                                  detail="Files read: " + (", ".join(read) or "none") + ". It may come from a "
                                         "module file, a job script, a scheduler prolog or the launcher's "
                                         "environment.", evidence=ev))
    return out


def _comment_out_remedy(init: ShellinitFacts, line: dict[str, Any], var: str, entry: str) -> Remedy | None:
    """The edit that comments out one recorded startup line, through the safe core (None when the file's
    bytes were not recorded, or the line is no longer what was found)."""
    path, number = str(line["file"]), int(line["line"])
    source = (init.get("sources") or {}).get(path)
    if not isinstance(source, dict) or not isinstance(source.get("text"), str):
        return None
    new = commented_out(source["text"], number, f"it put {entry} on {var}")
    if new is None:
        return None
    uid = source.get("uid") if isinstance(source.get("uid"), int) else None
    rem = replace_remedy(path, source["text"], new, uid=uid, tag="ZDOCTOR_SHELL_STARTUP",
                         title=f"Comment out line {number} of {path}", requires_root=uid == 0, explanation="")
    backup = (rem.action or {}).get("backup")
    rem.explanation = (f"Line {number} becomes a comment (kept in the file, marked '{COMMENT_NOTE}', so it can be "
                       f"read and restored): shells and jobs started after this no longer get {entry} on {var} "
                       "from it; a shell already open keeps it until it exits (unset it there). Applied only while "
                       f"{path} is still the regular file read here (not a link, same owner, byte for byte): the "
                       f"new text is written beside it, the old file kept as {backup} and the new one moved into "
                       f"place in one rename.\n\n- {line['text']}\n+ {new.splitlines()[number - 1]}")
    rem.note = "it edits a shell startup file"
    return rem


@check("libs.broken-files", title="Unreadable or corrupt extension files", probes=("libs",),
       findings=("libs.broken-files.*",))
def check_broken(facts: Facts, me: CheckSpec) -> list[Finding]:
    libs = facts.of("libs") or {}
    if not libs.get("targets"):
        return [me.finding(status="skip", title="Extension files: nothing to read (no C++ "
                           "library of the training was found)")]
    errs = [t for t in libs.get("targets") or [] if t.get("error")]
    if not errs:
        return []
    out = []
    for i, t in enumerate(errs):
        detail = ("ld.so refuses a file that is not a valid ELF shared library; importing it fails."
                  if t.get("kind_error") != "not-found" else
                  "A library it needs was found nowhere on its search path.")
        if t.get("tried"):
            detail += "\nPaths considered, in order:\n" + "\n".join(f"  {p}" for p in t["tried"][:40])
        out.append(Finding(id=me.name + (f".{i + 1}" if i else ""), status="fail",
                           title=f"{t['target']['name']}: {t['error']}", detail=detail))
    return out


# ---------------------------------------------------------------------------------------------- predicates
@predicate("glibcxx_missing", doc="a library the training loads needs a GLIBCXX/CXXABI version its libstdc++ lacks",
           probes=("libs", "livetrace"))
def glibcxx_missing(facts: Facts) -> bool:
    return bool(failure_groups(facts))


#: The predicates that say where the failing libstdc++ came from: each one's doc, and the source kinds (of
#: :func:`source_kinds`) it names.
LIBSTDCXX_SOURCES: dict[str, tuple[str, frozenset[str]]] = {
    "libstdcxx_via_ld_library_path": ("the failing libstdc++ came from an LD_LIBRARY_PATH entry",
                                      frozenset({"ld_library_path"})),
    "libstdcxx_via_preload": ("the failing libstdc++ was forced by LD_PRELOAD or /etc/ld.so.preload",
                              frozenset({"ld_preload", "etc_preload"})),
    "libstdcxx_via_interpreter_rpath": ("the failing libstdc++ came through the interpreter's DT_RPATH",
                                        frozenset({"interpreter_rpath"})),
    "libstdcxx_via_earlier_import": ("an earlier import had already loaded the failing libstdc++",
                                     frozenset({"earlier_import"})),
}


def came_through(kinds: frozenset[str]) -> Callable[[Facts], bool]:
    """The predicate that the failing libstdc++ came through one of ``kinds``."""
    def holds(facts: Facts) -> bool:
        return bool(kinds & source_kinds(facts))
    return holds


for _name, (_doc, _kinds) in LIBSTDCXX_SOURCES.items():
    predicate(_name, doc=_doc, probes=("libs", "livetrace"))(came_through(_kinds))


@predicate("extension_file_broken", doc="a library the training imports is not a valid ELF shared library",
           probes=("libs",))
def extension_file_broken(facts: Facts) -> bool:
    return any(t.get("error") for t in (facts.of("libs") or {}).get("targets") or [])


@predicate("live_run_failed", doc="the command (or import probe) failed under the real loader",
           probes=("livetrace",))
def live_failed(facts: Facts) -> bool:
    live = facts.of("livetrace") or {}
    return bool(live) and not live.get("ok") and not late_run(live)


def late_run(live: LivetraceFacts) -> bool:
    """Whether the run reached its time limit with nothing to show a hang or a build: every process of it was
    working on a CPU (or none was sampled, under zdoctor's own limit). zdoctor's time ran out; the run neither
    failed nor hung."""
    return bool(live.get("timed_out")) and not live.get("compiling") and not hang_evidence(live)


def hang_evidence(live: LivetraceFacts) -> bool:
    """Whether a run that reached its time limit shows a wait: a process sleeping or stuck in the kernel when
    sampled. Every process running on a CPU is progress (a slow run on a busy node), not a hang; with no
    sample, only the user's own --command limit counts, never the limit of zdoctor's own import probe."""
    return hung_at_limit([str(x) for x in live.get("stuck_states") or []], live.get("source") == "command")


@predicate("live_run_hung", doc="the command did not finish within the time limit, was not still compiling, and "
           "a process of it was waiting", probes=("livetrace",))
def live_hung(facts: Facts) -> bool:
    live = facts.of("livetrace") or {}
    return bool(live.get("timed_out")) and not live.get("compiling") and hang_evidence(live)


@predicate("live_run_late", doc="the time limit came while every process of the run was still working (not "
           "waiting, not compiling): not examined, neither failed nor hung", probes=("livetrace",))
def live_late(facts: Facts) -> bool:
    return late_run(facts.of("livetrace") or {})


@predicate("live_run_still_compiling", doc="the time limit ended the command while its JIT build was still compiling",
           probes=("livetrace",))
def live_still_compiling(facts: Facts) -> bool:
    live = facts.of("livetrace") or {}
    return bool(live.get("timed_out")) and bool(live.get("compiling"))


@predicate("live_run_checked_nothing", doc="the live run loaded nothing of the training (no --command, torch "
           "is not in the probed interpreter, no --ext, no JIT-built op)",
           probes=("livetrace",))
def live_checked_nothing(facts: Facts) -> bool:
    # a live trace that gave no facts at all is a probe without facts: the playbook's not_checked end says so
    return bool(facts.of("livetrace")) and live_unchecked(facts) is not None
