"""Whether the job runs in a container, and on what signs: ``/.dockerenv`` (docker), ``/run/.containerenv``
(podman), the cgroup path of the job and of PID 1 (docker, kubepods, libpod, containerd, crio, lxc), PID 1's
name (a host boots an init: systemd, init; a container starts its entry point), a container layer as the
root file system (overlay, through :mod:`zdoctor.readers.mounts`) and the variables a runtime sets
(``KUBERNETES_SERVICE_HOST``, ``container``). Each sign is recorded whether present or not: "not a
container" is a finding too, and says what was looked at."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from zdoctor.proc.cgroup import paths_of
from zdoctor.readers.mounts import mount_at, read_mountinfo

#: Words of a cgroup path a container runtime leaves, and the runtime each names.
CGROUP_WORDS = (("kubepods", "kubernetes"), ("libpod", "podman"), ("docker", "docker"), ("crio", "cri-o"),
                ("containerd", "containerd"), ("lxc", "lxc"), ("machine.slice", "systemd-nspawn"))
#: PID 1 names of a booted host (a container's PID 1 is its entry point, or a small init such as tini).
HOST_INITS = ("systemd", "init", "upstart", "openrc-init", "runit", "s6-svscan", "launchd")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(4096)
    except OSError:
        return None


def _cgroup_word(paths: dict[str, str] | None) -> tuple[str, str] | None:
    for p in (paths or {}).values():
        for word, kind in CGROUP_WORDS:
            if word in p:
                return word, kind
    return None


def detect(env: Mapping[str, str], root: str = "/", pid: int | str = "self") -> dict[str, Any]:
    """``{in_container, kind, clues, signs: [{sign, present, evidence}]}``; ``root`` stands for ``/`` (a
    recorded tree), ``pid`` is the job's process (its cgroup path is one sign)."""
    signs: list[dict[str, Any]] = []
    kind: str | None = None

    def sign(name: str, present: bool | None, evidence: str, runtime: str | None = None) -> None:
        nonlocal kind
        signs.append({"sign": name, "present": present, "evidence": evidence})
        if present and runtime and kind is None:
            kind = runtime

    for rel, runtime in (("/.dockerenv", "docker"), ("/run/.containerenv", "podman")):
        there = os.path.exists(os.path.join(root, rel.lstrip("/")))
        sign(rel, there, f"{rel} exists" if there else f"no {rel}", runtime)
    if env.get("KUBERNETES_SERVICE_HOST"):
        sign("KUBERNETES_SERVICE_HOST", True, "KUBERNETES_SERVICE_HOST is set", "kubernetes")
    if env.get("container"):
        sign("container variable", True, f"container={env['container']} is set", env["container"])
    proc = os.path.join(root, "proc")
    for who, p in (("the job's cgroup", pid), ("PID 1's cgroup", 1)):
        if who == "the job's cgroup" and str(pid) == "1":
            continue
        paths = paths_of(p, proc)
        name = f"/proc/{p}/cgroup"
        if paths is None:
            sign(who, None, f"{name} could not be read")
            continue
        found = _cgroup_word(paths)
        if found:
            sign(who, True, f"{name} mentions {found[0]}", found[1])
        else:
            shown = sorted({v for v in paths.values()})[:3]
            sign(who, False, f"{name} names no container runtime ({', '.join(shown) or 'empty'})")
    comm = _read(os.path.join(proc, "1", "comm"))
    if comm is None:
        sign("PID 1", None, "/proc/1/comm could not be read")
    else:
        c = comm.strip()
        sign("PID 1", c not in HOST_INITS, f"PID 1 is {c!r}" + (" (a host's init)" if c in HOST_INITS else
                                                                  " (not a host's init: a container's entry point)"))
    top = mount_at("/", read_mountinfo(os.path.join(proc, "self", "mountinfo")))
    if top is None:
        sign("root file system", None, "the mount table gives no / mount")
    else:
        sign("root file system", top.fstype in ("overlay", "aufs", "fuse-overlayfs"),
             f"/ is {top.fstype} ({top.source})")
    # A container is named by a file or variable its runtime puts there, or by a runtime's cgroup path; PID 1's
    # name and an overlay root alone are weaker (a rescue shell, a live image), so they count only with another.
    strong = [s for s in signs if s["present"] and s["sign"] not in ("PID 1", "root file system")]
    weak = [s for s in signs if s["present"] and s["sign"] in ("PID 1", "root file system")]
    inside = bool(strong) or len(weak) == 2
    clues = [s["evidence"] for s in signs if s["present"]] if inside else []
    return {"in_container": inside, "kind": kind if inside else None, "clues": clues, "signs": signs}
