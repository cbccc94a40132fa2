"""Host memory an offload run takes beyond DeepSpeed's model-state estimate, and the signs that host
memory ran out.

DeepSpeed's ``estimate_zero3_model_states_mem_needs`` counts parameters, gradients and optimizer states
for training. It does not count (read from DeepSpeed 0.19.8's runtime/swap_tensor):

- NVMe optimizer offload: each rank page-locks ``offload_optimizer.buffer_count`` swap buffers of the
  largest parameter sub-group (at most ``sub_group_size`` elements, default 1e9) in the master-weight
  dtype (fp32: 4 bytes) — ``SwapBufferManager(num_elems=largest_numel, count=buffer_count)``;
- NVMe parameter offload: each rank page-locks ``offload_param.buffer_count`` x ``buffer_size`` elements
  of 16-bit parameters (``AsyncPartitionedParameterSwapper``);
- parameter-only offload (ZeRO-Inference: ``offload_param`` cpu, no optimizer offload): the training
  rows do not apply; host memory holds the 16-bit parameters (2 bytes each, split over the nodes);
- WSL2, where CUDA's pinned (page-locked) host memory is capped (NVIDIA's CUDA on WSL user guide, "WSL 2
  Support Constraints"; microsoft/WSL issue 8447: CUDA out of memory with pinned memory).
"""

from __future__ import annotations

import math
import re
from typing import Any

from zdoctor.core.model import Evidence
from zdoctor.core.plural import count_of
from zdoctor.layers.offload import planner, walllog
from zdoctor.readers.cgroups import headroom, limit_of_cgroup

#: Host memory below this share of MemTotal counts as nearly exhausted.
EXHAUSTED_SHARE = 0.10
KILL_LINE = re.compile(r"\bKilled\b|(?:exit ?code|exitcode|return code)\s*[=:]?\s*-9\b|signal 9\b|SIGKILL|"
                       r"Out of memory: Kill|oom-kill|oom_reaper", re.I)


def _value(block: dict[str, Any] | None, key: str) -> Any:
    return ((block or {}).get(key) or {}).get("value")


def _device(block: dict[str, Any] | None) -> str:
    dev = _value(block, "device")
    return dev if isinstance(dev, str) else "none"


def _times(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a * b


def extra_needs(settings: dict[str, Any], params: int | None, gpus_per_node: int | None,
                nodes: int) -> list[dict[str, Any]]:
    """Each host-memory need the estimator leaves out: what, bytes per rank and per node, formula.

    A figure that depends on an input nobody gave (the parameter count, the GPUs per node) is None, with
    ``unknown`` saying what is missing (and ``at_most`` where a config value caps it); never a stand-in."""
    out: list[dict[str, Any]] = []
    op, oo = settings.get("offload_param"), settings.get("offload_optimizer")
    gpn_missing = "the GPUs per node (--gpus-per-node, or the GPUs NVML lists on this node)"
    if _device(oo) == "nvme":
        count = int(_value(oo, "buffer_count") or 4)
        sub = int(float(_value(settings.get("zero_optimization"), "sub_group_size") or 1e9))
        missing = [m for m, gone in (("the parameter count (--model-params or --model-config)", not params),
                                     (gpn_missing, gpus_per_node is None)) if gone]
        numel = min(sub, math.ceil(params / (gpus_per_node * max(1, nodes)))) if params and gpus_per_node else None
        per_rank = None if numel is None else count * numel * 4
        out.append({"what": "NVMe optimizer swap buffers (pinned)", "per_rank": per_rank,
                    "per_node": _times(per_rank, gpus_per_node),
                    "at_most": {"per_rank": count * sub * 4, "per_node": _times(count * sub * 4, gpus_per_node)},
                    "unknown": "; ".join(missing) or None,
                    "formula": f"buffer_count {count} x "
                               f"{f'{numel:,}' if numel is not None else 'unknown'} elements (largest sub-group: "
                               f"min(sub_group_size {sub:,}, parameters per rank)) x 4 bytes, per rank",
                    "key": "zero_optimization.offload_optimizer.buffer_count / sub_group_size"})
    if _device(op) == "nvme":
        count = int(_value(op, "buffer_count") or 5)
        size = int(float(_value(op, "buffer_size") or 1e8))
        per_rank = count * size * 2
        out.append({"what": "NVMe parameter swap buffers (pinned)", "per_rank": per_rank,
                    "per_node": _times(per_rank, gpus_per_node),
                    "unknown": gpn_missing if gpus_per_node is None else None,
                    "formula": f"buffer_count {count} x buffer_size {size:,} x 2 bytes, per rank",
                    "key": "zero_optimization.offload_param.buffer_count / buffer_size"})
    if _device(op) == "cpu" and _device(oo) == "none":
        per_node = math.ceil(params * 2 / max(1, nodes)) if params else None
        out.append({"what": "parameter-only offload (ZeRO-Inference): 16-bit parameters in host memory",
                    "per_rank": None if per_node is None or not gpus_per_node else
                    math.ceil(per_node / gpus_per_node), "per_node": per_node,
                    "unknown": None if params else "the parameter count (--model-params or --model-config)",
                    "formula": f"{f'{params:,}' if params else 'unknown'} parameters x 2 bytes / "
                               f"{count_of(nodes, 'node')}",
                    "key": "zero_optimization.offload_param.device = cpu, no optimizer offload"})
    return out


def known_sum(values: list[int | None]) -> int | None:
    """The sum, or None when any part is unknown."""
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def killed_lines(lines: list[str], limit: int = 5) -> list[list[Any]]:
    """``[line number, text]`` of the log lines that say a process was killed (SIGKILL, -9, OOM)."""
    out: list[list[Any]] = []
    for i, line in enumerate(lines, 1):
        if KILL_LINE.search(line):
            out.append([i, line.strip()[:300]])
            if len(out) >= limit:
                break
    return out


_OOM_KILL = re.compile(r"oom-kill:constraint=(CONSTRAINT_\w+)((?:,\w+=[^,\s]*)*)")
_KILLED_PROCESS = re.compile(r"(Memory cgroup out of memory|Out of memory)(?: \(oom_kill_allocating_task\))?: "
                             r"Kill(?:ed)? process (\d+) \(([^)]*)\)")
_MEMCG_USAGE = re.compile(r"\bmemory: usage (\d+)kB, limit (\d+)kB")
#: The kernel's OOM constraint (mm/oom_kill.c ``oom_constraint_text``) -> what ran out.
CONSTRAINTS = {"CONSTRAINT_NONE": "global", "CONSTRAINT_MEMCG": "memcg", "CONSTRAINT_CPUSET": "cpuset",
               "CONSTRAINT_MEMORY_POLICY": "mempolicy"}
#: A memcg limit the kernel prints for "no limit" (PAGE_COUNTER_MAX in kB) is above this.
NO_LIMIT_KB = 1 << 50


def oom_kills(lines: list[str], limit: int = 5) -> list[dict[str, Any]]:
    """The kernel's OOM kills in log lines: ``kind`` (memcg | global | cpuset | mempolicy), ``constraint``,
    ``memcg`` (oom_memcg), ``task_memcg`` (the killed task's cgroup), ``task``, ``pid``, ``limit_kb`` /
    ``usage_kb`` of the memcg (its "memory: usage ..kB, limit ..kB" line), ``line`` and ``text`` of the
    "Killed process" line."""
    out: list[dict[str, Any]] = []
    pending: dict[str, Any] = {}
    for i, line in enumerate(lines, 1):
        m = _MEMCG_USAGE.search(line)
        if m:
            pending.update(usage_kb=int(m.group(1)), limit_kb=int(m.group(2)))
            continue
        m = _OOM_KILL.search(line)
        if m:
            fields = dict(kv.split("=", 1) for kv in m.group(2).split(",") if "=" in kv)
            pending.update(constraint=m.group(1), kind=CONSTRAINTS.get(m.group(1), "unknown"),
                           memcg=fields.get("oom_memcg"), task=fields.get("task"),
                           task_memcg=fields.get("task_memcg"),
                           pid=int(fields["pid"]) if fields.get("pid", "").isdigit() else None)
            continue
        m = _KILLED_PROCESS.search(line)
        if m:
            kind = "memcg" if m.group(1).startswith("Memory cgroup") else pending.get("kind") or "global"
            rec = {"kind": kind, "constraint": pending.get("constraint"), "memcg": pending.get("memcg"),
                   "task_memcg": pending.get("task_memcg"), "task": m.group(3), "pid": int(m.group(2)), "line": i,
                   "text": line.strip()[:300],
                   "limit_kb": None, "usage_kb": None}
            if kind == "memcg" and (pending.get("limit_kb") or 0) < NO_LIMIT_KB:
                rec.update(limit_kb=pending.get("limit_kb"), usage_kb=pending.get("usage_kb"))
            out.append(rec)
            pending = {}
            if len(out) >= limit:
                break
    return out


def memcg_limit(path: str | None, sysroot: str = "") -> dict[str, Any] | None:
    """The memory limit of cgroup ``path`` now (as a kernel log names it), when that cgroup still exists:
    ``{file, bytes}`` (bytes None for no limit); ``sysroot`` prefixes the cgroup mounts (a recorded tree)."""
    if not path:
        return None
    return limit_of_cgroup(path, sysroot=sysroot)


def is_wsl(kernel_release: str, proc_version: str = "") -> bool:
    text = f"{kernel_release} {proc_version}".lower()
    return "microsoft" in text or "wsl" in text


def collect(ds: dict[str, Any], cap: dict[str, Any], opts: dict[str, Any], *, meminfo: str | None = None,
            kernel_release: str | None = None, proc_version: str = "/proc/version", gpu_count: int | None = None,
            cgroup_sysroot: str = "", cgroup: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[Any]]:
    """The hostram facts from the dsconfig and capacity facts, the job options (``train_log``,
    ``gpus_per_node``), the GPUs seen on this node (``gpu_count``, when the capacity plan did not run), the
    cgroups of the kills the log records (their mounts prefixed by ``cgroup_sysroot``) and the job's own
    cgroup (``cgroup``: the ``container`` probe's facts), whose limit is the memory the job has where it is
    below the host's."""
    import platform


    mem = planner.read_meminfo(meminfo)
    settings = ds.get("settings") or {}
    params = cap.get("params") or None
    given = cap.get("gpus_per_node") or opts.get("gpus_per_node") or gpu_count
    gpn = int(given) if given else None
    nodes = int(cap.get("nodes") or opts.get("nodes") or 1)
    extra = extra_needs(settings, params, gpn, nodes) if settings else []
    table, idx = cap.get("chosen_table"), cap.get("chosen_rows") or []
    rows = cap.get(table) if table else None
    estimate = rows[idx[0]]["cpu_bytes"] if rows and idx else None
    if estimate is not None:
        estimate_unknown = None
    elif not cap:
        estimate_unknown = "DeepSpeed's estimate needs the model size (--model-params or --model-config)"
    elif rows and idx:
        estimate_unknown = f"DeepSpeed's estimate depends on {rows[idx[0]].get('cpu_unknown') or 'an unknown input'}"
    else:
        estimate_unknown = cap.get("chosen_note") or "no offload choice DeepSpeed's estimator covers"
    log = opts.get("train_log")
    kills: list[list[Any]] = []
    ooms: list[dict[str, Any]] = []
    log_error = None
    if log:
        try:
            lines, _meta = walllog.read_log_lines(str(log))
            kills = killed_lines(lines)
            ooms = oom_kills(lines)
        except Exception as exc:  # noqa: BLE001 - an unreadable log is reported by the trainlog probe
            log_error = str(exc)
    try:
        with open(proc_version, encoding="utf-8", errors="replace") as fh:
            pv = fh.read(512)
    except OSError:
        pv = ""
    wsl = is_wsl(kernel_release if kernel_release is not None else platform.release(), pv if kernel_release is None
                 else "")
    room = headroom(mem.get("MemAvailable"), cgroup)
    host_total, host_avail = mem.get("MemTotal"), mem.get("MemAvailable")
    # Judged against the job's memory: its cgroup's room and limit where that binds, else the host's.
    avail = room["bytes"]
    total = room["limit"] if room["source"] == "cgroup" else host_total
    pins = [b for b in ("offload_param", "offload_optimizer")
            if settings.get(b) and _device(settings.get(b)) != "none" and _value(settings.get(b), "pin_memory")]
    facts = {"config": ds.get("path"), "extra": extra, "extra_per_node": known_sum([x["per_node"] for x in extra]),
             "extra_known_per_node": sum(x["per_node"] for x in extra if x["per_node"] is not None),
             "gpus_per_node": gpn, "estimate_per_node": estimate, "estimate_unknown": estimate_unknown,
             "mem_total": total, "mem_available": avail, "mem_total_host": host_total,
             "mem_available_host": host_avail, "mem_source": room["source"], "mem_source_text": room["text"],
             "exhausted": bool(total and avail is not None and avail < EXHAUSTED_SHARE * total),
             "killed": kills, "oom_kills": ooms, "log": log, "log_error": log_error, "wsl": wsl, "pinned_blocks": pins,
             "devices": {b: _device(settings.get(b)) for b in ("offload_param", "offload_optimizer")}}
    for k in ooms:
        k["cgroup_now"] = memcg_limit(k["memcg"], cgroup_sysroot) if k["kind"] == "memcg" else None
    ev = [Evidence.of_table("host memory beyond DeepSpeed's estimate (per node)",
                            ["what", "per rank", "per node", "how"],
                            [[x["what"], planner.gib(x["per_rank"]), planner.gib(x["per_node"]),
                              x["formula"] + (f" (unknown: {x['unknown']})" if x.get("unknown") else "")]
                             for x in extra] or [["nothing beyond the estimate for this config", "-", "-", "-"]])]
    if kills:
        ev.append(Evidence.of_table(f"kills in {log}", ["line", "text"], [[str(n), t] for n, t in kills],
                                    list(range(len(kills)))))
    return facts, ev
