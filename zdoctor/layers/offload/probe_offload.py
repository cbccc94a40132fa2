"""Probes ``dsconfig``, ``capacity``, ``trainlog`` and ``gpusample``: the job's offload configuration, whether
its memory needs fit this node, and how a running job spends its time. Each reads what the user said
about the job (``host.options``) and is skipped, with the reason, when that was not given.

``dsconfig`` (``ds_config``) facts:

- ``path``, ``valid`` (DeepSpeed's reader accepts it), ``error`` (one line ``path:line:col: message``) or
  None, ``syntax`` (``json`` | ``hjson``: only DeepSpeed's own reader accepts it), ``json_error``, ``bytes``.
- ``deepspeed``: {version, python (the training interpreter's version), fields_source, static_reason}.
- ``stage`` (effective), ``devices`` {offload_param, offload_optimizer} (``none`` | ``cpu`` | ``nvme``),
  ``nvme_paths`` [{key, path}], ``wall_clock_breakdown`` (bool), ``uses_auto`` (any "auto" value).
- ``settings``: lint.effective(): zero_optimization / offload_param / offload_optimizer / aio, each key
  {key, value, source (set | default | auto), default, line}; the offload blocks are None when absent.
- ``paths``: lint.inspect_path() by nvme_path: exists, writable, mount {point, fstype, source}, category
  (block | memory | overlay | network | fuse | other | unknown), block {name, nvme, rotational}, free_bytes.
- ``memlock``: {soft_bytes (None = unlimited), source}; ``hidden_size`` (from --model-config) or None.
- ``offload_target``: --offload-path as a place for NVMe offload: {path, suitable, category, why, free_bytes}
  or None when not given (also in ``capacity``).
- ``lints``: [{rule, severity (fail | warn | info), key, value, message, line, col, detail}].
- ``precision``: dsconfig.precision(): {bf16, fp16: {enabled (True | False | "auto" | as written), key, where}}.

``capacity`` (``model_params`` or ``model_config``; ``nodes``, ``gpus_per_node``) facts:

- ``params``, ``params_source``, ``largest_layer``, ``largest_layer_source``, ``model`` (the config.json
  estimate: params, largest_layer, largest_layer_name, hidden_size, family, formula, assumptions, parts).
- ``nodes``, ``gpus_per_node``, ``gpus_per_node_source``; ``machine``: planner.Machine (bytes: mem_total,
  mem_available (what the job can take: the room under its cgroup's limit where that is below
  MemAvailable, from the ``container`` probe), mem_available_host (MemAvailable), mem_source (meminfo |
  cgroup), mem_source_text, swap_free, shm_total, shm_free, memlock_soft, gpu_memory, gpu_count,
  gpu_source, disk_path, disk_free, disk_total).
- ``zero3`` / ``zero2``: [{stage, offload_param, offload_optimizer, zero_init, label, cpu_bytes, gpu_bytes,
  cpu_available, cpu_fits, cpu_margin, gpu_memory, gpu_fits, gpu_margin}] (DeepSpeed's rows, its order).
- ``stage``, ``chosen`` {offload_param, offload_optimizer} from the ds_config (None without one),
  ``chosen_table`` (zero3 | zero2 | None), ``chosen_rows`` (indices), ``chosen_note`` (why none).
- ``ram_short`` (the chosen offload does not fit in MemAvailable even with zero_init; None: unknown),
  ``ram_tight`` (it fits only with zero.Init; None: without zero.Init unknown), ``gpu_short``;
  ``nvme`` {path, need_lower_bound, free, fits} or None; ``deepspeed_text``: the table as DeepSpeed prints it.

``trainlog`` (``train_log``) facts: walllog.parse_log(): path, size, read_bytes, head_skipped, lines_read,
timer_lines, ranks, rank, format, timers {name: {count, total_ms, mean_ms, min_ms, max_ms, first_ms,
steady_mean_ms, steady_total_ms}}, phases {forward|backward|step: {timer, ...}}, shares, dominant,
iteration_ms, backward_parts, swap {timers, mean_ms, of, share_of_step}, step_bound, disk_bound,
zero_offload_flag [[line, text]].

``gpusample`` (``gpu_sample`` seconds) facts: gpusample.sample(): seconds, interval, samples, driver,
gpus [{index, name, util {min, mean, max}, mem_util, series, sparkline, errors}].
"""

from __future__ import annotations

import os
from typing import Any

from zdoctor.core.errors import InputError
from zdoctor.core.factstypes import CapacityFacts, DsconfigFacts, GpusampleFacts, HostramFacts, TrainlogFacts
from zdoctor.core.model import Evidence, cap_text
from zdoctor.core.plural import count_of
from zdoctor.core.registry import facts_of, probe
from zdoctor.layers.libraries.probe_libs import LIVE_TIMEOUT
from zdoctor.layers.offload import gpusample, hostram, lint, planner, walllog
from zdoctor.layers.offload.dsconfig import load_config, precision
from zdoctor.layers.python_env.probe_pyenv import TARGET_TIMEOUT
from zdoctor.proc.target import target_of


def _options(host: Any) -> dict[str, Any]:
    return dict(target_of(host).options)


def _python_version(pyenv: dict[str, Any] | None) -> tuple[int, ...] | None:
    vi = ((pyenv or {}).get("python") or {}).get("version_info")
    if isinstance(vi, (list, tuple)) and len(vi) >= 2 and all(isinstance(x, int) for x in vi[:3]):
        return tuple(vi[:3])
    return None


def _memlock(host: Any) -> tuple[int | None, str]:
    """The training's locked-memory soft limit in bytes (None = unlimited, -1 = unknown) and its source."""
    limits = (facts_of(host, "host_limits") or None)
    target = (limits or {}).get("target") if isinstance(limits, dict) else None
    if isinstance(target, dict):
        kb = target.get("memlock_soft_kb")
        if kb == "unlimited":
            return None, "the training environment (ulimit -l)"
        if isinstance(kb, int) and not isinstance(kb, bool):
            return kb * 1024, "the training environment (ulimit -l)"
    return lint.memlock_soft(), "zdoctor's own process (RLIMIT_MEMLOCK)"


def _model(host: Any) -> tuple[dict[str, Any] | None, str | None]:
    """(params, largest layer and where they came from) from --model-params / --model-config, or why not."""
    opts = _options(host)
    est = None
    if opts.get("model_config"):
        try:
            est = planner.load_model_config(str(opts["model_config"]))
        except InputError as exc:
            return None, str(exc)
    if opts.get("model_params") is not None:
        try:
            params = planner.parse_count(opts["model_params"])
        except InputError as exc:
            return None, str(exc)
        if est is not None:
            largest, lsrc = est.largest_layer, f"{est.largest_layer_name} of {opts['model_config']}"
        else:
            largest, lsrc = 0, "unknown without --model-config: the figures that depend on it are unknown"
        return {"params": params, "params_source": f"--model-params {opts['model_params']}", "largest_layer": largest,
                "largest_layer_source": lsrc, "model": est.to_dict() if est else None}, None
    if est is not None:
        return {"params": est.params, "params_source": f"estimated from {opts['model_config']}",
                "largest_layer": est.largest_layer,
                "largest_layer_source": f"{est.largest_layer_name} of {opts['model_config']}",
                "model": est.to_dict()}, None
    return None, "no model size given (--model-params or --model-config)"


def _offload_target(host: Any) -> dict[str, Any] | None:
    """--offload-path as a place for NVMe offload: {path, suitable, category, why} (None when not given)."""
    path = _options(host).get("offload_path")
    if not path:
        return None
    info = lint.inspect_path(str(path))
    why = None
    if info["category"] != "block":
        why = f"it lies on {((info.get('mount') or {}).get('fstype')) or 'an unknown file system'}, not a local disk"
    elif not info["writable"]:
        why = f"{info['anchor']} is not writable"
    return {"path": str(path), "suitable": why is None, "category": info["category"], "why": why,
            "free_bytes": info["free_bytes"]}


# -- dsconfig -------------------------------------------------------------------------------------------

def _settings_table(eff: dict[str, Any]) -> Evidence:
    rows, hl = [], []
    blocks = [("zero_optimization", ("stage", "offload_param", "offload_optimizer", "overlap_comm",
                                     "reduce_bucket_size", "prefetch_bucket_size", "param_persistence_threshold",
                                     "max_live_parameters", "max_reuse_distance", "sub_group_size")),
              ("offload_param", None), ("offload_optimizer", None), ("aio", None)]
    for block, names in blocks:
        entries = eff.get(block)
        if not entries:
            if block in ("offload_param", "offload_optimizer"):
                rows.append([f"zero_optimization.{block}", "not configured", "-", "-"])
            continue
        for name, e in entries.items():
            if names and name not in names:
                continue
            if e["source"] != "default":
                hl.append(len(rows))
            rows.append([e["key"], repr(e["value"]), e["source"], repr(e["default"])])
    return Evidence.of_table("offload settings as DeepSpeed reads them", ["key", "value", "source", "default"], rows,
                             hl)


def _ownership(path: str) -> dict[str, Any] | None:
    """Who owns the ds_config and the directory it sits in (uid, gid, mode), as recorded on the node: whether
    rewriting it needs root is judged from these, wherever the facts are read, and a fix applies only while
    the file's owner is still the same."""
    try:
        st = os.stat(path)
        dst = os.stat(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return None
    return {"owner_uid": st.st_uid, "owner_gid": st.st_gid, "dir_owner_uid": dst.st_uid,
            "dir_mode": oct(dst.st_mode & 0o7777)}


@probe("dsconfig", title="DeepSpeed config (ds_config) as DeepSpeed reads it", timeout=TARGET_TIMEOUT + 60,
       needs=("pyenv", "host_limits"), facts=DsconfigFacts)
def dsconfig_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    """Read and lint the job's ds_config against the installed DeepSpeed and this machine."""
    opts = _options(host)
    path = opts.get("ds_config")
    if not path:
        return {"skipped": "no ds_config given (--ds-config)"}, []
    path = str(path)
    pyenv = (facts_of(host, "pyenv") or None)
    ds = (pyenv or {}).get("deepspeed") if isinstance((pyenv or {}).get("deepspeed"), dict) else None
    tables, static_reason = lint.tables_for(ds)
    pyver = _python_version(pyenv)
    facts: dict[str, Any] = {"path": path, "valid": False, "error": None, "syntax": None, "json_error": None,
                             "bytes": None, "deepspeed": {"version": tables.version,
                                                          "python": ".".join(map(str, pyver)) if pyver else None,
                                                          "fields_source": tables.source,
                                                          "static_reason": static_reason},
                             "stage": None, "devices": {}, "nvme_paths": [], "wall_clock_breakdown": None,
                             "uses_auto": False, "settings": None, "paths": {}, "memlock": None,
                             "hidden_size": None, "lints": [], "offload_target": _offload_target(host)}
    facts["file"] = _ownership(path)
    try:
        cfg = load_config(path)
    except InputError as exc:
        facts["error"] = str(exc)
        return facts, [Evidence(label=f"read {path}", kind="file", paths=[path], error=str(exc))]
    facts.update(valid=True, syntax=cfg.syntax, json_error=cfg.json_error, bytes=len(cfg.text.encode("utf-8")),
                 text=cfg.text if len(cfg.text) <= CONFIG_TEXT_MAX else None)
    eff = lint.effective(cfg, tables)
    facts["settings"] = eff
    facts["stage"] = eff["stage"]
    facts["devices"] = {w: lint.device_of(eff, w) for w in ("offload_param", "offload_optimizer")}
    for which in ("offload_optimizer", "offload_param"):
        block = eff.get(which)
        if block and facts["devices"][which] == "nvme" and isinstance(block["nvme_path"]["value"], str):
            facts["nvme_paths"].append({"key": f"zero_optimization.{which}.nvme_path",
                                        "path": block["nvme_path"]["value"]})
    facts["precision"] = precision(cfg)
    wcb = cfg.get(("wall_clock_breakdown",))
    facts["wall_clock_breakdown"] = wcb if isinstance(wcb, bool) else None
    paths = {p["path"]: lint.inspect_path(p["path"]) for p in facts["nvme_paths"]}
    facts["paths"] = paths
    soft, source = _memlock(host)
    facts["memlock"] = {"soft_bytes": soft if soft != -1 else "unknown", "source": source}
    model, _why = _model(host)
    hidden = ((model or {}).get("model") or {}).get("hidden_size")
    facts["hidden_size"] = hidden
    pinned = None
    if model is not None:
        nodes = int(opts.get("nodes") or 1)
        gpn = int(opts.get("gpus_per_node") or 1)
        if eff["stage"] == 3 and facts["devices"]["offload_optimizer"] == "cpu":
            pinned, _g, _l = planner.zero3_needs(model["params"], model["largest_layer"], gpn, nodes, True,
                                                 facts["devices"]["offload_param"] == "cpu", True)
    gpu_mem, _n, _src = planner.gpu_memory_from((facts_of(host, "nvml") or None) or (facts_of(host, "gpu") or None))
    ctx = lint.LintContext(tables=tables, ds_version=tables.version, python_version=pyver, hidden_size=hidden,
                           memlock_soft=soft, memlock_source=source, pinned_need=pinned, gpu_memory=gpu_mem,
                           paths=paths, command=target_of(host).command)
    lints = lint.lint_config(cfg, ctx)
    facts["lints"] = [x.to_dict() for x in lints]
    facts["uses_auto"] = any(x.rule == "auto-value" for x in lints)
    text, truncated = cap_text(cfg.text)
    ev = [Evidence(label=f"ds_config {path}", kind="file", paths=[path], stdout=text, truncated=truncated),
          _settings_table(eff)]
    if lints:
        ev.append(Evidence.of_table("ds_config lints", ["where", "rule", "severity", "message"],
                                    [[f"{x.line}:{x.col}" if x.line else x.key or "-", x.rule, x.severity,
                                      x.message[:200]] for x in lints],
                                    [i for i, x in enumerate(lints) if x.severity == "fail"]))
    return facts, ev


#: A ds_config up to this size is kept in the facts, so a patch to it can be shown (and replayed) as a diff.
CONFIG_TEXT_MAX = 256 * 1024


# -- capacity -------------------------------------------------------------------------------------------

def _chosen(ds: dict[str, Any] | None) -> tuple[dict[str, str] | None, str | None, list[int], str | None, int | None]:
    """(devices, table, row indices, note, stage) for the ds_config's offload choice."""
    if not ds or not ds.get("valid"):
        return None, None, [], "no valid ds_config given: every choice is shown", None
    stage, dev = ds.get("stage"), ds.get("devices") or {}
    p, o = dev.get("offload_param", "none"), dev.get("offload_optimizer", "none")
    chosen = {"offload_param": p, "offload_optimizer": o}
    if "nvme" in (p, o):
        return chosen, None, [], "NVMe offload is not modelled by DeepSpeed's estimator (see the disk estimate)", stage
    if stage == 3:
        order = [("cpu", "cpu"), ("none", "cpu"), ("none", "none")]
        if (p, o) not in order:
            return chosen, None, [], f"offload_param={p} with offload_optimizer={o} is not a combination DeepSpeed's " \
                "estimator covers", stage
        i = order.index((p, o))
        return chosen, "zero3", [2 * i, 2 * i + 1], None, stage
    if stage == 2:
        return chosen, "zero2", [0 if o == "cpu" else 1], None, stage
    return chosen, None, [], f"stage {stage}: DeepSpeed's estimators cover ZeRO-2 and ZeRO-3 only", stage


def _capacity_table(rows: list[dict[str, Any]], chosen: list[int], title: str,
                    available: str = "available (MemAvailable)") -> Evidence:
    out = []
    for r in rows:
        # A figure that depends on an input nobody gave is unknown, never computed from a stand-in.
        out.append([r["label"], planner.at_least(r["cpu_bytes"]), planner.gib(r["cpu_available"]),
                    planner.verdict(r["cpu_fits"], r["cpu_margin"]), planner.at_least(r["gpu_bytes"]),
                    planner.gib(r["gpu_memory"]), planner.verdict(r["gpu_fits"], r["gpu_margin"])])
    return Evidence.of_table(title, ["choice", "per-CPU need", available, "CPU",
                                     "per-GPU need", "GPU memory", "GPU"], out, chosen)


@probe("capacity", title="Offload memory needs (DeepSpeed's estimator) against this node",
       timeout=max(TARGET_TIMEOUT + 120, LIVE_TIMEOUT + 90),
       needs=("dsconfig", "nvml", "host_limits", "container"), facts=CapacityFacts)
def capacity_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    """DeepSpeed's ZeRO-2/3 memory estimate for the model, next to this node's RAM, GPU memory and disk."""
    opts = _options(host)
    model, why = _model(host)
    if model is None:
        return {"skipped": why}, []
    ds = (facts_of(host, "dsconfig") or None) if opts.get("ds_config") else None
    gpu = (facts_of(host, "nvml") or None) or (facts_of(host, "gpu") or None)
    nodes = int(opts.get("nodes") or 1)
    disk_path = opts.get("offload_path") or next((p["path"] for p in (ds or {}).get("nvme_paths") or []), None)
    machine = planner.this_machine(disk_path=str(disk_path) if disk_path else None, gpu_facts=gpu,
                                   cgroup=(facts_of(host, "container") or {}).get("cgroup"))
    soft, src = _memlock(host)
    machine.memlock_soft = soft
    if opts.get("gpus_per_node"):
        gpn, gsrc = int(opts["gpus_per_node"]), "--gpus-per-node"
    elif machine.gpu_count:
        gpn, gsrc = machine.gpu_count, "GPUs on this node"
    else:
        gpn, gsrc = 1, "unknown (no GPU seen, no --gpus-per-node)"
    missing = {}
    if gsrc.startswith("unknown"):
        missing["gpus_per_node"] = planner.SUPPLIERS["gpus_per_node"]
    if not model["largest_layer"]:
        missing["largest_layer"] = planner.SUPPLIERS["largest_layer"]
    inputs = (model["params"], model["largest_layer"], gpn, nodes)
    z3 = planner.fit_rows(planner.zero3_rows(model["params"], model["largest_layer"], gpn, nodes), machine,
                          missing=missing, inputs=inputs)
    z2 = planner.fit_rows(planner.zero2_rows(model["params"], gpn, nodes), machine, missing=missing,
                          inputs=inputs)
    chosen, table, idx, note, stage = _chosen(ds)
    rows = {"zero3": z3, "zero2": z2}.get(table or "", [])
    ram_short = ram_tight = gpu_short = None
    if rows and idx:
        best = rows[idx[0]]
        ram_short = None if best["cpu_fits"] is None else not best["cpu_fits"]
        if table == "zero3" and len(idx) > 1 and ram_short is False:
            without = rows[idx[1]]["cpu_fits"]
            ram_tight = None if without is None else without is False
        gpu_short = None if best["gpu_fits"] is None else not best["gpu_fits"]
    nvme = None
    if chosen and "nvme" in chosen.values():
        need = planner.nvme_lower_bound(model["params"], nodes, chosen["offload_optimizer"] == "nvme",
                                        chosen["offload_param"] == "nvme")
        nvme = {"path": disk_path, "need_lower_bound": need, "free": machine.disk_free,
                "fits": None if machine.disk_free is None else need <= machine.disk_free}
    facts = {**model, "nodes": nodes, "gpus_per_node": None if "gpus_per_node" in missing else gpn,
             "gpus_per_node_source": gsrc, "missing": missing,
             "machine": machine.to_dict(), "memlock_source": src, "zero3": z3, "zero2": z2, "stage": stage,
             "chosen": chosen, "chosen_table": table, "chosen_rows": idx, "chosen_note": note,
             "ram_short": ram_short, "ram_tight": ram_tight, "gpu_short": gpu_short, "nvme": nvme,
             "offload_target": _offload_target(host),
             "deepspeed_text": None if missing else
             planner.deepspeed_text(model["params"], model["largest_layer"], gpn, nodes)}
    m = machine
    lock = "unlimited" if soft is None else ("unknown" if soft == -1 else planner.gib(soft))
    machine_rows = [["MemTotal", planner.gib(m.mem_total)], ["MemAvailable", planner.gib(m.mem_available_host)],
                    ["memory the job can take (the figure the fits use)", m.mem_source_text or "unknown"],
                    ["SwapFree (not counted: pinned memory cannot swap)", planner.gib(m.swap_free)],
                    ["/dev/shm size / free", f"{planner.gib(m.shm_total)} / {planner.gib(m.shm_free)}"],
                    [f"locked-memory limit ({src})", lock],
                    [f"GPU memory (smallest; {m.gpu_source})", planner.gib(m.gpu_memory)],
                    [f"offload disk free ({m.disk_path or 'no offload path'})", planner.gib(m.disk_free)]]
    per_node = "an unknown number of GPUs" if "gpus_per_node" in missing else count_of(gpn, "GPU")
    avail_col = "available (room under the cgroup limit)" if m.mem_source == "cgroup" else "available (MemAvailable)"
    ev = [_capacity_table(z3, idx if table == "zero3" else [], f"ZeRO-3 needs for {model['params']:,} parameters, "
                          f"{count_of(nodes, 'node')} x {per_node} (DeepSpeed's estimator)", avail_col),
          _capacity_table(z2, idx if table == "zero2" else [], "ZeRO-2 needs (DeepSpeed's estimator)", avail_col),
          Evidence.of_table("this node", ["what", "size"], machine_rows)]
    if missing:
        ev.append(Evidence.note("unknown inputs", "\n".join(
            f"{k.replace('_', ' ')}: not given; the figures that depend on it are unknown. Supplied by {v}."
            for k, v in missing.items())))
    else:
        ev.append(Evidence.note("DeepSpeed's own output for these numbers", facts["deepspeed_text"]))
    return facts, ev


# -- trainlog, gpusample ------------------------------------------------------------------------------

@probe("trainlog", title="wall_clock_breakdown timings in the training log", timeout=120.0, facts=TrainlogFacts)
def trainlog_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    """Per-phase timings of the training log the user named (--log)."""
    path = _options(host).get("train_log")
    if not path:
        return {"skipped": "no training log given (--log)"}, []
    try:
        facts = walllog.parse_log(str(path))
    except InputError as exc:
        return {"path": str(path), "error": str(exc), "timer_lines": 0}, [
            Evidence(label=f"read {path}", kind="file", paths=[str(path)], error=str(exc))]
    facts["error"] = None
    rows = []
    for name, t in facts["timers"].items():
        rows.append([name, str(t["count"]), f"{t['mean_ms']:.2f}", f"{t['steady_mean_ms']:.2f}", f"{t['max_ms']:.2f}"])
    hl = [i for i, r in enumerate(rows) if r[0] in ("step", "optimizer_step", *walllog.SWAP_TIMERS)]
    ev = [Evidence.of_table(f"timers of rank {facts['rank']} in {path}", ["timer", "count", "mean ms",
                            "mean ms (without the first)", "max ms"], rows, hl)]
    if facts["shares"]:
        ev.append(Evidence.of_table("where an iteration goes", ["phase", "timer", "mean ms", "share"],
                                    [[k, facts["phases"][k]["timer"], f"{facts['phases'][k]['steady_mean_ms']:.2f}",
                                      f"{v:.0%}"] for k, v in facts["shares"].items()],
                                    [list(facts["shares"]).index(facts["dominant"])]))
    return facts, ev


@probe("gpusample", title="GPU utilisation sampled through NVML", timeout=gpusample.MAX_SECONDS + 30,
       facts=GpusampleFacts)
def gpusample_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    """Sample every GPU's utilisation for --gpu-sample seconds."""
    seconds = _options(host).get("gpu_sample")
    if not seconds:
        return {"skipped": "no GPU sampling asked for (--gpu-sample S)"}, []
    interval = 0.5 if float(seconds) >= 2 else max(0.1, float(seconds) / 4)
    facts = gpusample.sample(float(seconds), interval)
    if facts.get("skipped"):
        return facts, []
    rows = [[str(g["index"]), g["name"] or "?", *(f"{g['util'][k]:g}" if g["util"][k] is not None else "?"
                                                  for k in ("min", "mean", "max")), g["sparkline"]]
            for g in facts["gpus"]]
    return facts, [Evidence.of_table(f"GPU utilisation % over {facts['seconds']:g} s ({facts['samples']} samples)",
                                     ["gpu", "name", "min", "mean", "max", "over time"], rows)]



# -- hostram ------------------------------------------------------------------------------------------

@probe("hostram", title="Host memory beyond the offload estimate: swap buffers, inference, WSL2, kills",
       timeout=60.0 + LIVE_TIMEOUT, needs=("dsconfig", "capacity", "nvml", "container"), facts=HostramFacts)
def hostram_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    """Pinned buffers and parameter-only offload the estimator leaves out, memory now, kills in the log."""

    opts = _options(host)
    ds = (facts_of(host, "dsconfig") or None) or {}
    cap = (facts_of(host, "capacity") or None) or {}
    _mem, gpus, _src = planner.gpu_memory_from((facts_of(host, "nvml") or None) or (facts_of(host, "gpu") or None))
    return hostram.collect(ds, cap, opts, gpu_count=gpus or None,
                           cgroup=(facts_of(host, "container") or {}).get("cgroup"))
