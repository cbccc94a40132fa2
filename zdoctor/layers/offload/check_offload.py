"""Checks and predicates over the offload probes (``dsconfig``, ``capacity``, ``trainlog``, ``gpusample``):
is the ds_config what DeepSpeed will accept, does the chosen offload fit this node, and where does a
crawling job's time go.

Finding ids: ``offload.config``, ``offload.lint.<rule>`` (one per lint rule: unknown-key, bad-value,
deprecated-key, auto-value, nvme-without-path, nvme-path, aio-thread-count, ratio-below-stage3,
offload-param-below-stage3, bucket-sizes, pin-memory-memlock, stage3-knobs, zero-offload-flag,
hjson-only), ``offload.capacity``, ``offload.breakdown``, ``offload.gpu-util``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

from zdoctor.core.errors import InputError
from zdoctor.core.model import Finding, Remedy
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check, predicate
from zdoctor.edit.filefix import replace_remedy
from zdoctor.layers.offload import planner
from zdoctor.layers.offload.dsconfig import load_config, parse_config
from zdoctor.layers.offload.dspatch import nvme_patch
from zdoctor.layers.rank_cores.check_rankcores import cores_summary

#: GPUs busy less than this share of the time, on average, count as starved.
GPU_STARVED_PCT = 50.0
SEVERITY_STATUS = {"fail": "fail", "warn": "warn", "info": "ok"}
RULE_TITLES = {
    "unknown-key": "Keys DeepSpeed does not know",
    "bad-value": "Values DeepSpeed refuses",
    "deprecated-key": "Deprecated offload keys",
    "auto-value": "\"auto\" values only the HF Trainer fills in",
    "nvme-without-path": "NVMe offload without nvme_path",
    "nvme-path": "The NVMe offload path on this machine",
    "aio-thread-count": "aio.thread_count (renamed in DeepSpeed 0.16.4)",
    "ratio-below-stage3": "Partial optimizer offload below stage 3",
    "offload-param-below-stage3": "Parameter offload below stage 3",
    "bucket-sizes": "Bucket sizes against the model's hidden size",
    "pin-memory-memlock": "Pinned offload memory and the locked-memory limit",
    "stage3-knobs": "ZeRO-3 knobs changed from their defaults",
    "zero-offload-flag": "`--zero-offload` is not a DeepSpeed option",
    "hjson-only": "ds_config is not strict JSON",
}








def _gib(n: float | None) -> str:
    return planner.gib(n)


def _where(ds: Mapping[str, Any], lint: dict[str, Any]) -> str:
    if lint.get("line"):
        return f"{ds.get('path')}:{lint['line']}:{lint.get('col') or 1}"
    return lint.get("key") or ds.get("path") or "?"


# -- remedies ------------------------------------------------------------------------------------------

def config_edit_needs_root(ds: Mapping[str, Any]) -> bool:
    """Whether rewriting the ds_config needs root, from its recorded directory: one owned by root that only
    root may write to. A config owned by the training user, or with no recorded owner, needs no root."""
    own = ds.get("file") or {}
    uid, mode = own.get("dir_owner_uid"), own.get("dir_mode")
    if not isinstance(uid, int) or not isinstance(mode, str):
        return False
    try:
        return uid == 0 and not int(mode, 8) & 0o022
    except ValueError:
        return False


def nvme_patch_remedy(ds_path: str, target: str, block_size: int | None = None,
                      text: str | None = None, uid: int | None = None,
                      requires_root: bool | None = None, requires: list[str] | None = None) -> Remedy | None:
    """A remedy that moves the config's offload to NVMe at ``target``, applied through the safe core.

    The patched text is built by :func:`zdoctor.layers.offload.dspatch.nvme_patch` (only the offload blocks change)
    and checked to read back as a valid config; the unified diff goes into the explanation. The guide
    applies it with :mod:`zdoctor.edit.core_apply` (``action``): only if the file is still the regular file
    whose bytes were shown, backed up under a new name, replaced in one rename. The copyable commands do
    the same in the same order and stop at the first failing line. None when the config cannot be patched
    (unreadable, no zero_optimization block). ``uid`` is the file's owner when it was read (taken from
    the file itself when not given): the fix applies only while the owner is the same.
    """
    try:
        cfg = parse_config(text, ds_path) if text is not None else load_config(ds_path)
        patch = nvme_patch(cfg, target, block_size)
    except (InputError, ValueError):
        return None
    if uid is None:
        try:
            uid = os.stat(ds_path).st_uid
        except OSError:  # a snapshot of another node: the bytes are still checked
            uid = None
    backup = f"{ds_path}.bak.zdoctor-{hashlib.sha256(cfg.text.encode('utf-8', 'surrogateescape')).hexdigest()[:12]}"
    folder = os.path.dirname(os.path.abspath(ds_path))
    return replace_remedy(ds_path, cfg.text, patch.new_text, uid=uid, tag="ZDOCTOR_DS_CONFIG",
                          title=f"Move offload to NVMe at {target} in {os.path.basename(ds_path)}",
                          requires_root=not os.access(folder, os.W_OK) if requires_root is None else requires_root,
                          requires=requires,
                          explanation="Rewrites only " + ", ".join(patch.changed) + " (every other line, "
                          "comments included, stays), keeping the other settings of those blocks. The new text was "
                          "read back through DeepSpeed's reader rules before it was offered. Applied only while the "
                          "file is still the regular file (not a link) shown here, byte for byte: the new text is "
                          f"written beside it, the old file is kept as {backup} (a name no file has; never "
                          "overwritten) and the new one moved into place in one rename, with the old owner and mode, "
                          "so the config is always the old file or the new one, never half-written. Not verified by "
                          "a training run.\n\n" + patch.diff)


#: The finding whose fix (format, mount, create the directory) makes the NVMe inventory's suggested
#: offload directory exist: a config pointed there depends on it.
MOUNT_FIX = "storage.fstab"


def _target_requires(facts: Facts, target: str) -> list[str]:
    """The fixes that must come before the config points at ``target``: the mount of the unused NVMe drive
    when ``target`` is the directory that fix creates."""
    sugg = (facts.of("nvme_inventory") or {}).get("suggestion") or {}
    return [MOUNT_FIX] if sugg.get("offload_dir") == target else []


def _owner_uid(ds: Mapping[str, Any]) -> int | None:
    uid = (ds.get("file") or {}).get("owner_uid") if isinstance(ds.get("file"), dict) else None
    return uid if isinstance(uid, int) else None


def _offload_target(facts: Facts) -> str | None:
    """Where NVMe offload should go: --offload-path when it is a writable local disk, else the storage probe's
    checked path or the NVMe inventory's suggestion when those probes ran."""
    for probe in ("capacity", "dsconfig"):
        t = (facts.of(probe) or {}).get("offload_target")
        if t:
            return t["path"] if t.get("suitable") else None
    st = facts.of("storage") or {}
    if st.get("explicit") and st.get("path") and (st.get("odirect") or {}).get("ok") is not False:
        return str(st["path"])
    sugg = (facts.of("nvme_inventory") or {}).get("suggestion") or {}
    return sugg.get("offload_dir") if isinstance(sugg.get("offload_dir"), str) else None


# -- offload.config and offload.lint.* ------------------------------------------------------------------

@check("offload.config", title="DeepSpeed config as DeepSpeed reads it", probes=("dsconfig",))
def check_config(facts: Facts, me: CheckSpec) -> list[Finding]:
    ds = me.require(facts.of("dsconfig"), facts.why_not("dsconfig"))
    ev = facts.evidence("dsconfig", kinds=None)
    if not ds.get("valid"):
        return [me.finding(status="fail", title="ds_config cannot be read by DeepSpeed",
                           detail=ds.get("error") or "", evidence=ev)]
    dev = ds.get("devices") or {}
    info = ds.get("deepspeed") or {}
    lines = [f"Read {ds['path']} as DeepSpeed {info.get('version') or '(version unknown)'} does "
             f"({'strict JSON' if ds.get('syntax') == 'json' else 'HJSON: only DeepSpeed itself accepts it'}).",
             f"ZeRO stage {ds.get('stage')}; offload_param: {dev.get('offload_param')}; offload_optimizer: "
             f"{dev.get('offload_optimizer')}.",
             f"Field lists and defaults: {info.get('fields_source')}"
             + (f" ({info['static_reason']})" if info.get("static_reason") else "") + "."]
    for p in ds.get("nvme_paths") or []:
        lines.append(f"{p['key']}: {p['path']}")
    fails = sum(1 for x in ds.get("lints") or [] if x["severity"] == "fail")
    warns = sum(1 for x in ds.get("lints") or [] if x["severity"] == "warn")
    if fails or warns:
        lines.append(f"Lints: {fails} failing, {warns} warning: see the offload.lint findings.")
    return [me.finding(status="ok", title=f"ds_config: stage {ds.get('stage')}, offload_param "
                       f"{dev.get('offload_param')}, offload_optimizer {dev.get('offload_optimizer')}",
                       detail="\n".join(lines), evidence=ev)]


def _storage_note(facts: Facts, path: str) -> str | None:
    st = facts.of("storage") or {}
    if not st.get("path") or os.path.realpath(str(st["path"])) != os.path.realpath(path):
        return None
    od = st.get("odirect") or {}
    if od.get("ok") is False:
        return f"The storage probe's O_DIRECT test on {path} failed: {od.get('error') or od.get('errno')}."
    if od.get("ok") is True:
        return f"The storage probe's O_DIRECT test on {path} passed."
    return None


@check("offload.lint", title="ds_config lints", probes=("dsconfig",),
       findings=("offload.lint.*",))
def check_lints(facts: Facts, me: CheckSpec) -> list[Finding]:
    ds = facts.of("dsconfig")
    log = facts.of("trainlog")
    out: list[Finding] = []
    lints = list((ds or {}).get("lints") or []) if ds and ds.get("valid") else []
    if log and log.get("zero_offload_flag") and not any(x["rule"] == "zero-offload-flag" for x in lints):
        line, text = log["zero_offload_flag"][0]
        lints.append({"rule": "zero-offload-flag", "severity": "fail", "key": "log", "value": text, "line": line,
                      "col": None, "detail": "", "message": "DeepSpeed has no --zero-offload option: offload is set in "
                      "the config (zero_optimization.offload_optimizer / offload_param), never on the command line."})
    if not lints:
        return out
    ev = [e for e in facts.evidence("dsconfig", kinds=None) if e.kind == "table"]
    by_rule: dict[str, list[dict[str, Any]]] = {}
    for x in lints:
        by_rule.setdefault(x["rule"], []).append(x)
    target = _offload_target(facts)
    for rule, items in by_rule.items():
        worst = min((SEVERITY_STATUS[x["severity"]] for x in items), key=["fail", "warn", "ok"].index)
        lines = []
        for x in items:
            where = f"{log.get('path')}:{x['line']}" if x["key"] == "log" and log else _where(ds or {}, x)
            lines.append(f"- {where}: {x['message']}")
            if x.get("detail"):
                lines.append(f"  {x['detail']}")
            if rule == "nvme-path" and isinstance(x.get("value"), str):
                note = _storage_note(facts, x["value"])
                if note:
                    lines.append(f"  {note}")
        remedies = []
        if rule in ("nvme-without-path", "nvme-path") and ds and target and worst == "fail":
            patch = nvme_patch_remedy(ds["path"], target, text=ds.get("text"), uid=_owner_uid(ds),
                                      requires_root=config_edit_needs_root(ds),
                                      requires=_target_requires(facts, target))
            if patch:
                remedies.append(patch)
        title = RULE_TITLES.get(rule, rule)
        if worst == "fail":
            title += ": DeepSpeed stops on this" if rule not in ("nvme-path", "zero-offload-flag") else ""
        out.append(me.finding(status=worst, title=f"{title} ({len(items)})", sub=rule,
                              detail="\n".join(lines), evidence=ev, remedies=remedies))
    return out


# -- offload.patch -----------------------------------------------------------------------------------------

@check("offload.patch", title="The ds_config change that moves NVMe offload to the new path",
       probes=("dsconfig", "storage", "nvme_inventory", "capacity"))
def check_patch(facts: Facts, me: CheckSpec) -> list[Finding]:
    """When the config offloads to NVMe and a better place is known (an unused NVMe drive to mount, or
    --offload-path), the exact change to the config: a diff, and a remedy that backs up and rewrites it."""
    ds = facts.of("dsconfig")
    if not ds or not ds.get("valid") or not ds.get("nvme_paths"):
        return []
    target = _offload_target(facts)
    now = sorted({p["path"] for p in ds["nvme_paths"]})
    if not target or now == [target]:
        return []
    r = nvme_patch_remedy(ds["path"], target, text=ds.get("text"), uid=_owner_uid(ds),
                          requires_root=config_edit_needs_root(ds),
                          requires=_target_requires(facts, target))
    if r is None:
        return [me.finding(status="skip", title=f"ds_config patch to {target}: not made",
                           detail=f"{ds['path']} could not be read back to patch it here (it is not in the recorded "
                                  "facts); set nvme_path by hand.")]
    diff = r.explanation.split("\n\n", 1)[-1]
    return [me.finding(status="warn", title=f"ds_config: move nvme_path from {', '.join(now)} to {target}",
                       detail=f"The change to {ds['path']}, as a diff (only the offload blocks change):\n{diff}",
                       remedies=[r])]


# -- offload.capacity ---------------------------------------------------------------------------------------

@check("offload.capacity", title="Offload memory needs against this node", probes=("capacity",))
def check_capacity(facts: Facts, me: CheckSpec) -> list[Finding]:
    cap = facts.of("capacity")
    if cap is None:
        return [me.finding(status="skip", title="Offload capacity: not planned",
                           detail=facts.why_not("capacity"))]
    ev = facts.evidence("capacity", kinds=None)
    m = cap.get("machine") or {}
    layer = f"{cap['largest_layer']:,}" if cap.get("largest_layer") else "unknown"
    head = [f"Model: {cap['params']:,} parameters ({cap['params_source']}); largest layer "
            f"{layer} ({cap['largest_layer_source']}).",
            f"Job: {count_of(cap['nodes'], 'node')} x "
            + (count_of(cap["gpus_per_node"], "GPU") if cap["gpus_per_node"] else "an unknown number of GPUs") + " "
            f"({cap['gpus_per_node_source']}).",
            (f"This node: the job can take {_gib(m.get('mem_available'))} of host memory: "
             f"{m.get('mem_source_text')} (measured now)" if m.get("mem_source") == "cgroup" else
             f"This node: MemAvailable {_gib(m.get('mem_available'))} (measured now: a running job's own memory is "
             "not available)") + f", SwapFree {_gib(m.get('swap_free'))} (not counted), GPU memory "
            f"{_gib(m.get('gpu_memory'))} ({m.get('gpu_source')}).",
            "Needs are DeepSpeed's own estimate (parameters, gradients and optimizer states with its 1.5 buffer "
            "factor); activations and pinned swap buffers come on top."]
    table = cap.get("chosen_table")
    rows = cap.get("zero3") if table == "zero3" else cap.get("zero2") if table == "zero2" else None
    idx = cap.get("chosen_rows") or []
    unknown = _unknown_lines(cap)
    if not rows or not idx:
        z3 = cap.get("zero3") or []
        fitting = [r["label"] for r in z3 if planner.fits(r)]
        short = [r["label"] for r in z3 if r.get("cpu_fits") is False or r.get("gpu_fits") is False]
        undecided = [r["label"] for r in z3 if r["label"] not in fitting and r["label"] not in short]
        detail = head + [cap.get("chosen_note") or ""]
        if fitting:
            detail.append("Choices that fit this node: " + "; ".join(fitting) + ".")
        if short:
            detail.append("Choices that do not fit: " + "; ".join(short) + ".")
        if undecided:
            detail.append("Not known whether these fit: " + "; ".join(undecided) + ".")
        detail += unknown
        status = "ok" if fitting and not undecided else "warn"
        nvme = cap.get("nvme")
        if nvme:
            detail.append(f"NVMe offload at {nvme.get('path')}: at least {_gib(nvme['need_lower_bound'])} on disk per "
                          f"node (fp32 master weights and Adam's moments at 12 bytes per parameter, 2 for 16-bit "
                          f"parameters); free: {_gib(nvme.get('free'))}.")
            if nvme.get("fits") is False:
                status = "fail"
        if nvme:
            summary = "NVMe offload; disk space " + ("short" if status == "fail" else "checked")
        elif undecided:
            summary = (f"{len(fitting)} of {len(z3)} ZeRO-3 choices known to fit, {len(undecided)} unknown "
                       f"(missing: {_missing_names(cap)})")
        else:
            summary = f"{len(fitting)} of {len(z3)} ZeRO-3 choices fit this node"
        return [me.finding(status=status, title="Offload capacity: " + summary,
                           detail="\n".join(x for x in detail if x), evidence=ev)]
    best = rows[idx[0]]
    detail = list(head)
    for i in idx:
        r = rows[i]
        detail.append(f"{r['label']}: per CPU {planner.at_least(r['cpu_bytes'])} vs {_gib(r['cpu_available'])} "
                      f"available: {planner.verdict(r['cpu_fits'], r['cpu_margin'])}; per GPU "
                      f"{planner.at_least(r['gpu_bytes'])} vs "
                      f"{_gib(r['gpu_memory'])}: {planner.verdict(r['gpu_fits'], r['gpu_margin'])}.")
    remedies: list[Remedy] = []
    if cap.get("ram_short"):
        status = "fail"
        title = (f"The chosen offload needs {planner.at_least(best['cpu_bytes'])} of host memory per node; "
                 f"{_gib(best['cpu_available'])} is available")
        detail.append("When host memory runs out the kernel's OOM killer ends the job (exit -9, SIGKILL) or it "
                      "swaps and crawls.")
        others = [r["label"] for r in cap.get("zero3") or [] if planner.fits(r)]
        if others:
            detail.append("Choices that fit this node: " + "; ".join(others) + ".")
        detail.append(f"More nodes shrink the per-node need (it is split across nodes): {cap['nodes'] + 1} nodes "
                      "would need " + planner.at_least(_renode(cap, best, cap["nodes"] + 1)) + " per node.")
        ds = facts.of("dsconfig")
        target = _offload_target(facts)
        if ds and target:
            patch = nvme_patch_remedy(ds["path"], target, text=ds.get("text"), uid=_owner_uid(ds),
                                      requires_root=config_edit_needs_root(ds),
                                      requires=_target_requires(facts, target))
            if patch:
                remedies.append(patch)
        elif ds:
            t = cap.get("offload_target") or {}
            detail.append("Offloading to NVMe moves the optimizer states (and at stage 3 the parameters) out of host "
                          "memory: " + (f"--offload-path {t['path']} does not suit ({t['why']})." if t else
                                        "give an NVMe mount with --offload-path to get the ds_config patch."))
    elif cap.get("ram_tight"):
        status = "warn"
        title = "The chosen offload fits host memory only if the model is built under deepspeed.zero.Init"
        detail.append("Without zero.Init every process first builds the whole model in host memory (the "
                      "zero_init=0 row). The HF Trainer does this for you at stage 3; a hand-written loop must wrap "
                      "model construction in `with deepspeed.zero.Init(config_dict_or_path=ds_config):`.")
    elif (table == "zero3" and len(idx) > 1 and cap.get("ram_short") is False and cap.get("ram_tight") is None
          and rows[idx[1]].get("cpu_fits") is None):
        status = "warn"
        title = (f"The chosen offload fits host memory with deepspeed.zero.Init "
                 f"({planner.at_least(best['cpu_bytes'])} of {_gib(best['cpu_available'])}); without zero.Init: "
                 f"unknown ({rows[idx[1]].get('cpu_unknown')})")
        detail.append("Without zero.Init every process first builds the whole model in host memory; that need "
                      "depends on an input that was not given, so no fit is claimed for it.")
    elif cap.get("gpu_short"):
        status = "warn"
        title = (f"The chosen offload needs {planner.at_least(best['gpu_bytes'])} per GPU; the GPU has "
                 f"{_gib(best['gpu_memory'])}")
    elif best.get("cpu_fits") is None:
        status = "warn"
        title = f"Offload capacity unknown: host memory need or size not known ({best.get('cpu_unknown')})"
    elif best.get("gpu_fits") is None:
        status = "ok"
        title = (f"The chosen offload fits host memory: {planner.at_least(best['cpu_bytes'])} of "
                 f"{_gib(best['cpu_available'])}; "
                 f"per GPU: unknown ({best.get('gpu_unknown')})")
    else:
        status = "ok"
        title = (f"The chosen offload fits: {planner.at_least(best['cpu_bytes'])} of {_gib(best['cpu_available'])} "
                 f"host memory, {planner.at_least(best['gpu_bytes'])} per GPU")
    detail += unknown
    return [me.finding(status=status, title=title, detail="\n".join(detail), evidence=ev, remedies=remedies)]


def _missing_names(cap: Mapping[str, Any]) -> str:
    names = [k.replace("_", " ") for k in cap.get("missing") or {}]
    if (cap.get("machine") or {}).get("gpu_memory") is None:
        names.append("GPU memory")
    if (cap.get("machine") or {}).get("mem_available") is None:
        names.append("MemAvailable")
    return ", ".join(names) or "nothing"


def _unknown_lines(cap: Mapping[str, Any]) -> list[str]:
    """One line per missing input: which figures it leaves unknown and what would supply it."""
    out = [f"Unknown: {k.replace('_', ' ')} (not given); every figure that depends on it is shown as unknown. "
           f"Supply it with {v}." for k, v in (cap.get("missing") or {}).items()]
    m = cap.get("machine") or {}
    if m.get("gpu_memory") is None:
        out.append(f"Unknown: GPU memory ({m.get('gpu_source') or 'no GPU facts'}); NVML on the GPU node supplies "
                   "it, so per-GPU fits are unknown here.")
    return out


def _renode(cap: Mapping[str, Any], row: dict[str, Any], nodes: int) -> int:
    if row["stage"] == 3:
        cpu, _g, _l = planner.zero3_needs(cap["params"], cap["largest_layer"], cap["gpus_per_node"] or 1, nodes,
                                          row["offload_optimizer"] == "cpu", row["offload_param"] == "cpu",
                                          bool(row["zero_init"]))
        return cpu
    return planner.zero2_needs(cap["params"], cap["gpus_per_node"] or 1, nodes, row["offload_optimizer"] == "cpu")[0]


# -- offload.breakdown ------------------------------------------------------------------------------------

@check("offload.breakdown", title="Where a training iteration's time goes", probes=("trainlog",),
       optional=("rankcores",))
def check_breakdown(facts: Facts, me: CheckSpec) -> list[Finding]:
    log = facts.of("trainlog")
    if log is None:
        return [me.finding(status="skip", title="Training log: not read", detail=facts.why_not("trainlog"))]
    ev = facts.evidence("trainlog", kinds=None)
    error = log.get("error")
    if error:
        return [me.finding(status="fail", title="Training log cannot be read", detail=error, evidence=ev)]
    read = f"Read {log.get('read_bytes')} bytes of {log['path']}" + (
        " (its end only: the file is larger than zdoctor reads)" if log.get("head_skipped") else "") + "."
    if not log.get("timer_lines"):
        ds = facts.of("dsconfig") or {}
        hint = ""
        if ds.get("valid") and ds.get("wall_clock_breakdown") is not True:
            hint = f" {ds['path']} does not set \"wall_clock_breakdown\": true."
        return [me.finding(status="warn", title="No wall_clock_breakdown timings in the training log",
                        detail=f"{read} No `time (ms) | ...` lines were found. Add \"wall_clock_breakdown\": true at "
                               f"the top level of the ds_config and let a few steps run; DeepSpeed then prints "
                               f"forward/backward/step times on rank 0 to the log (no file is written).{hint}",
                        evidence=ev)]
    shares = log.get("shares") or {}
    phases = log.get("phases") or {}
    parts = ", ".join(f"{k} {v:.0%} ({phases[k]['steady_mean_ms']:.1f} ms)" for k, v in shares.items())
    lines = [read, f"{log['timer_lines']} timer lines ({log['format']}); rank {log['rank']}; the first sample of "
             "each timer is left out of the means when there are 3 or more (warm-up).",
             f"Mean iteration {log.get('iteration_ms')} ms: {parts}."]
    swap = log.get("swap")
    if swap:
        lines.append(f"NVMe swaps: {swap['mean_ms']:.1f} ms per step (" + ", ".join(
            f"{k} {v:.1f} ms" for k, v in swap["timers"].items()) + f"), {swap['share_of_step']:.0%} of {swap['of']}.")
    bp = log.get("backward_parts")
    if bp:
        lines.append("Backward: " + ", ".join(f"{k} {v['share']:.0%}" for k, v in bp.items()) + ".")
    if log.get("disk_bound"):
        cap = facts.of("capacity") or {}
        cpu_fit = next((r for r in cap.get("zero3") or [] if r["offload_param"] == "cpu" and r["zero_init"]), None)
        lines.append("The optimizer step dominates and most of it is NVMe swapping: the disk is the bottleneck. "
                     "Measure and tune it (ds_nvme_tune / ds_io sweep aio block_size and queue_depth), spread "
                     "nvme_path over a RAID-0 of several NVMe drives, or, where host memory allows, keep the "
                     "optimizer states in CPU memory (offload_optimizer.device cpu).")
        if cpu_fit and cpu_fit.get("cpu_fits"):
            lines.append(f"Host memory allows it here: cpu/cpu needs {planner.at_least(cpu_fit['cpu_bytes'])}, "
                         f"{_gib(cpu_fit['cpu_available'])} is available.")
        swap_share = (swap or {}).get("share_of_step", 0)
        return [me.finding(status="warn", title=f"NVMe swaps take {swap_share:.0%} of the optimizer "
                           f"step, which takes {shares.get('step', 0):.0%} of an iteration", detail="\n".join(lines),
                           evidence=ev)]
    if log.get("step_bound"):
        cores = cores_summary(facts.of("rankcores"))
        said = (f"Ranks and cores: {cores['sentence']} (the cores.ranks finding judges them)" if cores["sentence"]
                else f"Ranks and cores: not examined ({facts.why_not('rankcores')})")
        lines.append("The optimizer step runs on the CPU with offload (DeepSpeedCPUAdam): check the log's "
                     "'Adam Optimizer #0 is created with ... arithmetic capability' line (scalar is slow). "
                     f"{said}.")
        return [me.finding(status="warn", title=f"The optimizer step takes {shares.get('step', 0):.0%} of an "
                           "iteration", detail="\n".join(lines), evidence=ev)]
    return [me.finding(status="ok", title=f"Iteration time: {parts}", detail="\n".join(lines), evidence=ev)]


# -- offload.gpu-util ---------------------------------------------------------------------------------------

@check("offload.gpu-util", title="GPU utilisation while training", probes=("gpusample",))
def check_gpu_util(facts: Facts, me: CheckSpec) -> list[Finding]:
    gs = facts.of("gpusample")
    if gs is None:
        return [me.finding(status="skip", title="GPU utilisation: not sampled",
                           detail=facts.why_not("gpusample"))]
    ev = facts.evidence("gpusample", kinds=None)
    gpus = gs.get("gpus") or []
    lines = [f"{gs.get('samples')} samples over {gs.get('seconds')} s, every {gs.get('interval')} s."]
    starved = []
    for g in gpus:
        u = g.get("util") or {}
        lines.append(f"GPU {g['index']} ({g.get('name')}): min {u.get('min')}%, mean {u.get('mean')}%, max "
                     f"{u.get('max')}%  {g.get('sparkline')}")
        mean = u.get("mean")
        if mean is not None and mean < GPU_STARVED_PCT:
            starved.append(g)
    if starved:
        lines.append(f"Busy less than {GPU_STARVED_PCT:g}% of the time on average: the GPUs wait for the offload path "
                     "(CPU optimizer, PCIe transfers, NVMe swaps). Only meaningful while the job is training.")
        idle = f"{len(starved)} of {count_of(len(gpus), 'GPU')}"
        return [me.finding(status="warn", title=f"{idle} mostly idle while "
                           "sampled", detail="\n".join(lines), evidence=ev)]
    return [me.finding(status="ok", title=f"GPU utilisation: {count_of(len(gpus), 'GPU')} busy while sampled",
                       detail="\n".join(lines), evidence=ev)]


# -- predicates -------------------------------------------------------------------------------------------

def _lints(facts: Facts) -> list[dict[str, Any]]:
    ds = facts.of("dsconfig") or {}
    return list(ds.get("lints") or []) if ds.get("valid") else []


@predicate("ds_config_invalid", probes=("dsconfig",),
           doc="The ds_config given with --ds-config cannot be read by DeepSpeed at all: missing, unreadable, not "
               "UTF-8, malformed JSON/HJSON, a duplicate key, or not an object. False when no ds_config was given.")
def ds_config_invalid(facts: Facts) -> bool:
    ds = facts.of("dsconfig")
    return ds is not None and bool(ds) and ds.get("valid") is False


@predicate("ds_config_rejected", probes=("dsconfig",),
           doc="DeepSpeed would stop on the ds_config: it cannot be read, or a lint of severity fail fired (an "
               "unknown key in zero_optimization or an offload block, a refused value, nvme without nvme_path, "
               "ratio < 1 below stage 3, an unusable nvme_path).")
def ds_config_rejected(facts: Facts) -> bool:
    return ds_config_invalid(facts) or any(x["severity"] == "fail" for x in _lints(facts))


@predicate("offload_to_nvme_configured", probes=("dsconfig",),
           doc="The ds_config offloads parameters or optimizer states to NVMe (device nvme, as DeepSpeed reads it).")
def offload_to_nvme_configured(facts: Facts) -> bool:
    dev = (facts.of("dsconfig") or {}).get("devices") or {}
    return "nvme" in dev.values()


@predicate("nvme_offload_without_aio", probes=("dsconfig", "storage"),
           doc="The ds_config offloads to NVMe and libaio's development files are missing: DeepSpeed cannot build "
               "its async_io op and stops at start. False when libaio was not examined.")
def nvme_offload_without_aio(facts: Facts) -> bool:
    libaio = (facts.of("storage") or {}).get("libaio")
    return offload_to_nvme_configured(facts) and isinstance(libaio, dict) and libaio.get("ok") is False
