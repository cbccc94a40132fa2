"""The CPUs of the node and of each rank: NUMA nodes from sysfs, a process's allowed CPUs and threads from
/proc. The readers take their root directories as parameters, so tests point them at recorded trees."""

from __future__ import annotations

import os
import re
from typing import Any

from zdoctor.proc.userfile import open_regular

NODE_ROOT = "/sys/devices/system/node"
PROC_ROOT = "/proc"
_RANGE = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?\Z")
#: A cpulist longer than this is not a node's (a hostile or broken file).
MAX_CPULIST = 64 * 1024


def parse_cpulist(text: str) -> list[int] | None:
    """``"0-3,8,10-14:2"`` -> [0, 1, 2, 3, 8, 10, 12, 14]; None when it is not a cpulist; [] when empty."""
    text = (text or "").strip()
    if not text:
        return []
    cpus: set[int] = set()
    for part in text.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            return None
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        step = int(m.group(3)) if m.group(3) else 1
        if hi < lo or step < 1 or hi - lo > 1 << 16:
            return None
        cpus.update(range(lo, hi + 1, step))
    return sorted(cpus)


def format_cpulist(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8] -> ``"0-3,8"``."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(set(cpus)):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def _read(path: str, cap: int = MAX_CPULIST) -> str:
    with open_regular(path) as fh:
        return fh.read(cap).decode("ascii", "replace")


def numa_nodes(root: str = NODE_ROOT) -> dict[str, Any]:
    """``{"nodes": [{"node": 0, "cpus": "0-15", "count": 16}], "error": None}`` from ``root/node*/cpulist``;
    an error (no sysfs node directory: a kernel without NUMA, a container hiding it) instead of nodes."""
    try:
        names = sorted((n for n in os.listdir(root) if re.match(r"node\d+\Z", n)), key=lambda n: int(n[4:]))
    except OSError as exc:
        return {"nodes": [], "error": f"{root}: {exc.strerror or exc}"}
    nodes = []
    for name in names:
        try:
            cpus = parse_cpulist(_read(os.path.join(root, name, "cpulist")))
        except OSError as exc:
            return {"nodes": [], "error": f"{root}/{name}/cpulist: {exc.strerror or exc}"}
        if cpus is None:
            return {"nodes": [], "error": f"{root}/{name}/cpulist: not a CPU list"}
        nodes.append({"node": int(name[4:]), "cpus": format_cpulist(cpus), "count": len(cpus)})
    if not nodes:
        return {"nodes": [], "error": f"{root}: no node directories"}
    return {"nodes": nodes, "error": None}


def process_cpus(pid: int, proc_root: str = PROC_ROOT) -> dict[str, Any]:
    """``{"pid", "cpus" (cpulist), "count", "threads", "error"}`` of a process, from its ``status`` file
    (``Cpus_allowed_list``, ``Threads``)."""
    rec: dict[str, Any] = {"pid": pid, "cpus": None, "count": None, "threads": None, "error": None}
    try:
        text = _read(os.path.join(proc_root, str(pid), "status"), 256 * 1024)
    except OSError as exc:
        rec["error"] = exc.strerror or str(exc)
        return rec
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "Cpus_allowed_list":
            cpus = parse_cpulist(value)
            if cpus is not None:
                rec.update(cpus=format_cpulist(cpus), count=len(cpus))
        elif key == "Threads" and value.strip().isdigit():
            rec["threads"] = int(value.strip())
    if rec["cpus"] is None:
        rec["error"] = "no Cpus_allowed_list in its status file"
    return rec


def nodes_of(cpus: list[int], nodes: list[dict[str, Any]]) -> list[int]:
    """The NUMA nodes ``cpus`` fall on."""
    have = set(cpus)
    return [n["node"] for n in nodes if have & set(parse_cpulist(n["cpus"]) or [])]
