"""A cgroup of its own for each child zdoctor starts, where the node allows it.

cgroup v2: ``cgroup.kill`` ends every process in the group at once, however it was started (new process
groups, new sessions, double forks). cgroup v1 (no unified hierarchy): the freezer hierarchy, frozen
while each of its tasks is killed, so nothing forks in between. Each group is made under zdoctor's own
cgroup and named ``zdoctor-PID-N``; a group whose zdoctor is gone (killed with every helper it had) is
killed and removed by the next zdoctor that starts (:func:`sweep_stale`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import time

from zdoctor.proc.leftovers import named_entries, process_gone

PREFIX = "zdoctor-"
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)-\d+$")
_counter = itertools.count(1)
_base: tuple[str, str] | None | bool = False  # (kind, directory) once looked up; None: no cgroup here

# One source for killing a group, run here and in the reaper (a separate stdlib-only interpreter).
KILL_SOURCE = r'''
def kill_cgroup(path, kind):
    """SIGKILL every process in the cgroup at ``path`` (kind "v2" or "v1"); True when it is empty after."""
    import os, signal, time
    def tasks():
        try:
            with open(os.path.join(path, "cgroup.procs")) as fh:
                return [int(x) for x in fh.read().split()]
        except (OSError, ValueError):
            return []
    if kind == "v2":
        try:
            with open(os.path.join(path, "cgroup.kill"), "w") as fh:
                fh.write("1")
        except OSError:
            kind = "walk"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = tasks()
        if not left:
            return True
        if kind != "v2":
            state = os.path.join(path, "freezer.state")
            frozen = kind == "v1" and _write(state, "FROZEN")
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            if frozen:
                _write(state, "THAWED")
        time.sleep(0.02)
    return not tasks()

def _write(path, text):
    try:
        with open(path, "w") as fh:
            fh.write(text)
        return True
    except OSError:
        return False
'''
_ns: dict[str, object] = {}
exec(compile(KILL_SOURCE, "<zdoctor cgroup kill>", "exec"), _ns)


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, filesystem type, super options) of every mount, from /proc/self/mountinfo."""
    out = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                left, _, right = line.partition(" - ")
                fields, rfields = left.split(), right.split()
                if len(fields) >= 5 and len(rfields) >= 3:
                    out.append((fields[4].replace("\\040", " "), rfields[0], rfields[2]))
    except OSError:
        pass
    return out


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/PID/cgroup`` text -> the cgroup per hierarchy: ``""`` for the unified (v2) one, else its
    controllers as listed (``"memory"``, ``"cpu,cpuacct"``, ``"name=systemd"``)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.rstrip("\n").split(":", 2)
        if len(parts) == 3:
            out[parts[1]] = parts[2]
    return out


def paths_of(pid: int | str = "self", proc: str = "/proc") -> dict[str, str] | None:
    """A process's cgroup per hierarchy (see :func:`parse_proc_cgroup`); None when it cannot be read."""
    try:
        with open(os.path.join(proc, str(pid), "cgroup"), encoding="utf-8", errors="replace") as fh:
            return parse_proc_cgroup(fh.read(1 << 16))
    except OSError:
        return None


def _own_paths() -> dict[str, str]:
    """This process's cgroup per hierarchy: ``""`` for the unified (v2) one, else its controllers."""
    return paths_of() or {}


def _find_base() -> tuple[str, str] | None:
    """Where zdoctor can make child groups: ("v2", dir) or ("v1", freezer dir); None when neither works."""
    own = _own_paths()
    mounts = _mounts()
    candidates = []
    for point, fstype, _opts in mounts:
        if fstype == "cgroup2" and "" in own:
            candidates.append(("v2", os.path.join(point, own[""].lstrip("/"))))
    for point, fstype, opts in mounts:
        if fstype == "cgroup" and "freezer" in opts.split(","):
            path = next((p for c, p in own.items() if "freezer" in c.split(",")), None)
            if path is not None:
                candidates.append(("v1", os.path.join(point, path.lstrip("/"))))
    for kind, base in candidates:
        marker = "cgroup.kill" if kind == "v2" else "freezer.state"
        probe = os.path.join(base, f"{PREFIX}{os.getpid()}-0")
        try:
            os.mkdir(probe)
        except FileExistsError:
            pass
        except OSError:
            continue
        try:
            works = os.path.exists(os.path.join(probe, marker))
        finally:
            with contextlib.suppress(OSError):
                os.rmdir(probe)
        if works:
            return kind, base
    return None


def base() -> tuple[str, str] | None:
    """The cgroup kind and the directory new groups go under (looked up once)."""
    global _base
    if _base is False:
        _base = _find_base()
    return _base  # type: ignore[return-value]


class Cgroup:
    """One child's group: the child joins it (``procs``), zdoctor kills and removes it."""

    def __init__(self, path: str, kind: str) -> None:
        self.path, self.kind = path, kind

    @property
    def procs(self) -> str:
        """The file a process writes its pid to, to join the group."""
        return os.path.join(self.path, "cgroup.procs")

    def members(self) -> list[int]:
        try:
            with open(self.procs, encoding="ascii") as fh:
                return [int(x) for x in fh.read().split()]
        except (OSError, ValueError):
            return []

    def kill(self) -> bool:
        """SIGKILL every member at once; True when the group is empty afterwards."""
        return bool(_ns["kill_cgroup"](self.path, self.kind))  # type: ignore[operator]

    def remove(self, wait: float = 2.0) -> bool:
        """Remove the group once it is empty (killed members leave it a moment after the kill)."""
        deadline = time.monotonic() + wait
        while True:
            try:
                os.rmdir(self.path)
                return True
            except FileNotFoundError:
                return True
            except OSError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.02)


def create() -> Cgroup | None:
    """A new, empty group under zdoctor's own cgroup; None where the node allows none."""
    found = base()
    if found is None:
        return None
    kind, parent = found
    path = os.path.join(parent, f"{PREFIX}{os.getpid()}-{next(_counter)}")
    try:
        os.mkdir(path)
    except OSError:
        return None
    return Cgroup(path, kind)


def sweep_stale() -> list[str]:
    """Kill and remove the groups of a zdoctor that is gone (its pid, in the name, runs no more)."""
    found = base()
    if found is None:
        return []
    kind, parent = found
    removed: list[str] = []
    for name, m in named_entries(parent, _NAME):
        pid = int(m.group(1))
        if pid == os.getpid() or not process_gone(pid):
            continue  # this zdoctor's, or that zdoctor still runs
        group = Cgroup(os.path.join(parent, name), kind)
        group.kill()
        if group.remove():
            removed.append(group.path)
    return removed
