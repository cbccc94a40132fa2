"""The one reader of a process's cgroup limits: memory and pids, v1 and v2, walked up the hierarchy.

A process's cgroups come from ``/proc/PID/cgroup`` (:func:`zdoctor.proc.cgroup.paths_of`), the directories they
live in from the mount table (:mod:`zdoctor.readers.mounts`: a v1 hierarchy per controller, the v2 unified
one). Every level from the process's own cgroup up to the top of the mount is read, because a parent's limit
binds its children (a job cgroup without a limit inside a container that has one is held by the
container's).

- v2: ``memory.max``, ``memory.high``, ``memory.current``, ``memory.peak``, ``memory.events`` (``oom``,
  ``oom_kill``, ``max``), ``memory.stat`` (``inactive_file``); ``pids.max``, ``pids.current``,
  ``pids.events``.
- v1: ``memory.limit_in_bytes``, ``memory.usage_in_bytes``, ``memory.max_usage_in_bytes``,
  ``memory.failcnt``, ``memory.oom_control`` (``oom_kill``, ``under_oom``), ``memory.stat``
  (``total_inactive_file``); the pids files as in v2.

"max" (v2) and the v1 figure for "no limit" (9223372036854771712, the page counter's maximum) are no limit.
The room left in a cgroup is ``limit - usage + inactive_file``: inactive page cache is given back before the
kernel's OOM killer runs (what ``docker stats`` shows as usage is the same difference).
"""

from __future__ import annotations

import os
from typing import Any

from zdoctor.proc.cgroup import paths_of
from zdoctor.proc.userfile import open_regular_text
from zdoctor.readers.mounts import MOUNTINFO, MountEntry, read_mountinfo

#: A limit at or above this is no limit (v1 prints 9223372036854771712 for none).
NO_LIMIT = 1 << 60
#: What each version names its files.
FILES = {
    "v1": {"limit": "memory.limit_in_bytes", "usage": "memory.usage_in_bytes", "peak": "memory.max_usage_in_bytes",
           "failcnt": "memory.failcnt", "events": "memory.oom_control", "inactive": "total_inactive_file"},
    "v2": {"limit": "memory.max", "high": "memory.high", "usage": "memory.current", "peak": "memory.peak",
           "events": "memory.events", "inactive": "inactive_file"},
}


def _read(path: str, cap: int = 1 << 16) -> str | None:
    try:
        with open_regular_text(path, encoding="ascii", errors="replace") as fh:
            return fh.read(cap)
    except OSError:
        return None


def parse_value(text: str | None) -> int | str | None:
    """One cgroup value: bytes or a count, ``"max"`` for no limit, None when unreadable."""
    t = (text or "").strip()
    if t == "max":
        return "max"
    if not t.isdigit():
        return None
    n = int(t)
    return "max" if n >= NO_LIMIT else n


def parse_keyed(text: str | None) -> dict[str, int]:
    """``key value`` lines (memory.events, memory.oom_control, memory.stat, pids.events) -> {key: int}."""
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _dir_in_mount(cgroup: str, m: MountEntry, sysroot: str) -> tuple[str | None, str | None]:
    """(the directory of ``cgroup`` under mount ``m``, why not)."""
    if ".." in cgroup.split("/"):
        return None, f"the cgroup {cgroup} lies outside this cgroup namespace"
    root = m.root.rstrip("/")
    if root and not (cgroup == root or cgroup.startswith(root + "/")):
        return None, f"the cgroup {cgroup} lies outside what {m.point} shows (it is mounted from {m.root})"
    rel = cgroup[len(root):].lstrip("/")
    return os.path.join(sysroot + m.point, rel) if rel else sysroot + m.point, None


def locate(controller: str, paths: dict[str, str], mounts: list[MountEntry],
           sysroot: str = "") -> dict[str, Any]:
    """Where ``controller`` (memory, pids) holds the process: {version, cgroup, dir, top} or {error}.

    A v1 hierarchy that binds the controller wins (a hybrid node has the controller there, not in the
    unified one); else the unified (v2) hierarchy, when its root offers the controller."""
    for key, cgroup in paths.items():
        if key and controller in key.split(","):
            m = next((m for m in reversed(mounts) if m.fstype == "cgroup" and controller in m.super_options), None)
            if m is None:
                return {"error": f"the {controller} hierarchy ({key}) is not mounted here"}
            d, why = _dir_in_mount(cgroup, m, sysroot)
            return {"error": why} if d is None else \
                {"version": "v1", "cgroup": cgroup, "dir": d, "top": sysroot + m.point}
    if "" in paths:
        m = next((m for m in reversed(mounts) if m.fstype == "cgroup2"), None)
        if m is None:
            return {"error": "the unified (v2) cgroup hierarchy is not mounted here"}
        offered = (_read(os.path.join(sysroot + m.point, "cgroup.controllers")) or "").split()
        if controller not in offered:
            return {"error": f"the {controller} controller is not enabled in the unified (v2) hierarchy at "
                             f"{m.point} (its cgroup.controllers: {' '.join(offered) or 'none'})"}
        d, why = _dir_in_mount(paths[""], m, sysroot)
        return {"error": why} if d is None else \
            {"version": "v2", "cgroup": paths[""], "dir": d, "top": sysroot + m.point}
    return {"error": f"no {controller} cgroup is listed for the process"}


def _levels(where: dict[str, Any]) -> list[tuple[str, str]]:
    """(cgroup path, directory) from the process's own cgroup up to the top of the mount."""
    out: list[tuple[str, str]] = []
    cg, d, top = where["cgroup"], where["dir"], where["top"]
    while True:
        out.append((cg or "/", d))
        if os.path.normpath(d) == os.path.normpath(top) or cg in ("", "/"):
            return out
        d, cg = os.path.dirname(d), os.path.dirname(cg.rstrip("/"))


def memory(where: dict[str, Any]) -> dict[str, Any]:
    """The memory facts of a located cgroup (see the module's docstring for the files)."""
    if where.get("error"):
        return {"error": where["error"]}
    version, names = where["version"], FILES[where["version"]]
    levels: list[dict[str, Any]] = []
    for cg, d in _levels(where):
        limit = parse_value(_read(os.path.join(d, names["limit"])))
        usage = parse_value(_read(os.path.join(d, names["usage"])))
        if limit is None and usage is None:
            continue  # a level where the controller is not enabled (v2) or the root (no memory.max)
        stat = parse_keyed(_read(os.path.join(d, "memory.stat")))
        high = parse_value(_read(os.path.join(d, names["high"]))) if "high" in names else None
        inactive = stat.get(names["inactive"])
        room = None
        if isinstance(limit, int) and isinstance(usage, int):
            room = max(0, min(limit, limit - usage + (inactive or 0)))
        levels.append({"cgroup": cg, "dir": d, "limit": limit, "high": high, "usage": usage,
                       "inactive_file": inactive, "room": room})
    out: dict[str, Any] = {"version": version, "cgroup": where["cgroup"], "dir": where["dir"], "levels": levels,
                           "limit": None, "limit_cgroup": None, "limit_file": names["limit"], "room": None,
                           "high": None, "usage": None, "peak": None, "peak_file": names["peak"],
                           "oom": None, "oom_kill": None, "failcnt": None, "under_oom": None,
                           "events_file": names["events"], "error": None}
    if not levels:
        if where["cgroup"] in ("", "/"):
            out["limit"] = "max"  # the root cgroup: the kernel gives it no limit file and no limit
        else:
            out["error"] = f"none of {where['dir']} and its parents has a readable {names['limit']}"
        return out
    own = levels[0] if levels[0]["cgroup"] == (where["cgroup"] or "/") else None
    bound = [lv for lv in levels if lv["room"] is not None]
    if bound:
        tight = min(bound, key=lambda lv: lv["room"])
        out.update(limit=tight["limit"], limit_cgroup=tight["cgroup"], room=tight["room"])
    else:
        out["limit"] = "max" if all(lv["limit"] == "max" for lv in levels) else None
    highs = [lv["high"] for lv in levels if isinstance(lv["high"], int)]
    out["high"] = min(highs) if highs else ("max" if version == "v2" else None)
    if own is None:
        out["error"] = f"{where['dir']} could not be read (its parents could)"
        return out
    out["usage"] = own["usage"] if isinstance(own["usage"], int) else None
    peak = parse_value(_read(os.path.join(where["dir"], names["peak"])))
    out["peak"] = peak if isinstance(peak, int) else None
    events = parse_keyed(_read(os.path.join(where["dir"], names["events"])))
    out["oom"] = events.get("oom")
    out["oom_kill"] = events.get("oom_kill")
    out["under_oom"] = events.get("under_oom")
    if version == "v1":
        fc = parse_value(_read(os.path.join(where["dir"], names["failcnt"])))
        out["failcnt"] = fc if isinstance(fc, int) else None
    else:
        out["failcnt"] = events.get("max")  # times usage reached memory.max (v1's failcnt in spirit)
    return out


def pids(where: dict[str, Any]) -> dict[str, Any]:
    """pids.max (the tightest up the hierarchy), pids.current and pids.events' ``max`` (forks refused)."""
    if where.get("error"):
        return {"error": where["error"]}
    levels: list[dict[str, Any]] = []
    for cg, d in _levels(where):
        mx = parse_value(_read(os.path.join(d, "pids.max")))
        cur = parse_value(_read(os.path.join(d, "pids.current")))
        if mx is None and cur is None:
            continue
        levels.append({"cgroup": cg, "max": mx, "current": cur,
                       "room": mx - cur if isinstance(mx, int) and isinstance(cur, int) else None})
    out: dict[str, Any] = {"version": where["version"], "cgroup": where["cgroup"], "dir": where["dir"],
                           "levels": levels, "max": None, "current": None, "limit_cgroup": None, "refused": None,
                           "error": None}
    if not levels:
        if where["cgroup"] in ("", "/"):
            out["max"] = "max"  # the root cgroup: no pids.max, no limit
        else:
            out["error"] = f"none of {where['dir']} and its parents has a readable pids.max"
        return out
    if levels[0]["cgroup"] == (where["cgroup"] or "/") and isinstance(levels[0]["current"], int):
        out["current"] = levels[0]["current"]
    bound = [lv for lv in levels if lv["room"] is not None]
    if bound:
        tight = min(bound, key=lambda lv: lv["room"])
        out.update(max=tight["max"], current=tight["current"], limit_cgroup=tight["cgroup"])
    elif all(lv["max"] == "max" for lv in levels if lv["max"] is not None):
        out["max"] = "max"
    out["refused"] = parse_keyed(_read(os.path.join(where["dir"], "pids.events"))).get("max")
    return out


def read_process(pid: int | str = "self", *, proc: str = "/proc", mountinfo: str = MOUNTINFO,
                 sysroot: str = "") -> dict[str, Any]:
    """The cgroup facts of process ``pid``: {pid, paths, memory, pids, error}. ``sysroot`` prefixes every
    mount point (a recorded tree of cgroup files stands in for /sys/fs/cgroup)."""
    paths = paths_of(pid, proc)
    if paths is None:
        why = f"{proc}/{pid}/cgroup could not be read"
        return {"pid": pid, "paths": None, "memory": {"error": why}, "pids": {"error": why}, "error": why}
    mounts = read_mountinfo(mountinfo)
    if not mounts:
        why = f"the mount table {mountinfo} could not be read"
        return {"pid": pid, "paths": paths, "memory": {"error": why}, "pids": {"error": why}, "error": why}
    return {"pid": pid, "paths": paths, "memory": memory(locate("memory", paths, mounts, sysroot)),
            "pids": pids(locate("pids", paths, mounts, sysroot)), "error": None}


def limit_of_cgroup(cgroup: str, *, mountinfo: str = MOUNTINFO, sysroot: str = "") -> dict[str, Any] | None:
    """The memory limit of the cgroup at path ``cgroup`` (as a kernel log names it), when it still exists:
    ``{file, bytes}`` (bytes None for no limit); None when it is gone or cannot be read."""
    mounts = read_mountinfo(mountinfo)
    for paths in ({"memory": cgroup}, {"": cgroup}):
        where = locate("memory", paths, mounts, sysroot)
        if where.get("error") or not os.path.isdir(where["dir"]):
            continue
        name = FILES[where["version"]]["limit"]
        value = parse_value(_read(os.path.join(where["dir"], name)))
        if value is None:
            continue
        return {"file": os.path.join(where["dir"], name), "bytes": value if isinstance(value, int) else None}
    return None


def headroom(mem_available: int | None, facts: dict[str, Any] | None) -> dict[str, Any]:
    """The memory a job can still take: the smaller of the host's MemAvailable and the room left under its
    cgroup's tightest limit, with which one it is. ``{bytes, source (cgroup | meminfo | None), text,
    host_available, limit, limit_cgroup, limit_file, room}``."""
    mem = (facts or {}).get("memory") if isinstance(facts, dict) else None
    mem = mem if isinstance(mem, dict) else {}
    room, limit = mem.get("room"), mem.get("limit")
    out: dict[str, Any] = {"bytes": mem_available, "source": "meminfo" if mem_available is not None else None,
                           "host_available": mem_available, "limit": limit if isinstance(limit, int) else None,
                           "limit_cgroup": mem.get("limit_cgroup"), "limit_file": mem.get("limit_file"),
                           "room": room if isinstance(room, int) else None, "text": ""}
    host = f"the host's MemAvailable {_gib(mem_available)} shown by /proc/meminfo"
    if isinstance(room, int) and isinstance(limit, int) and (mem_available is None or room < mem_available):
        out.update(bytes=room, source="cgroup")
        out["text"] = (f"the job's cgroup limit {_gib(limit)} ({mem.get('limit_file')} of "
                       f"{mem.get('limit_cgroup')}), {_gib(room)} of it free, lower than {host}")
    elif mem_available is not None:
        if isinstance(limit, int):
            out["text"] = (f"{host} (the job's cgroup limit {_gib(limit)}, {mem.get('limit_file')} of "
                           f"{mem.get('limit_cgroup')}, leaves {_gib(room)}: more)")
        elif limit == "max":
            out["text"] = f"{host} (the job's cgroup sets no memory limit)"
        else:
            why = mem.get("error") or "not read"
            out["text"] = f"{host} (the job's cgroup limit: unknown, {why})"
    return out


def _gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 2**30:.2f} GiB"
