"""Remedies for a CUDA library lookup that fails, from the ``cudalookup`` facts, most direct first.

Environment-only plans come first and are tried by re-running the failing command (nothing on the node
changes: a link a plan needs is made in a private temporary directory for the re-run); the changes to the
driver's directory or the ld cache need root and are shown, never tried.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from typing import Any

from zdoctor.layers.cuda_lookup.cudalookup import LIBCUDA, LIBCUDA_DEV
from zdoctor.trials.remedies import (
    Plan,
    export_line,
    restore_line,
    root_plan,
    split_path_list,
    variable_plan,
    without_entries,
)

#: Where the per-job libcuda.so link of a plan goes, under the training user's home (not the driver's dir).
USER_LINK_SUBDIR = ".local/lib/zdoctor-libcuda"
LD_SO_CONF_D = "/etc/ld.so.conf.d"


def real_libcuda(facts: Mapping[str, Any]) -> str | None:
    """The driver's libcuda.so.1 (never a stub): the loader's pick, else the cache's, else a directory's."""
    loader = facts.get("loader") or {}
    if loader.get("path") and not loader.get("stub"):
        return str(loader["path"])
    for p in (facts.get("cache") or {}).get(LIBCUDA) or []:
        if "stubs" not in p.split("/"):
            return str(p)
    for d in facts.get("driver_dirs") or []:
        f = (d.get("files") or {}).get(LIBCUDA)
        if f and f.get("exists") and not d.get("stubs"):
            return str(f["path"])
    return None


def _root_owned(facts: Mapping[str, Any], directory: str) -> bool:
    """Whether the probe saw ``directory`` owned by root (root never writes into a folder a user controls)."""
    for d in facts.get("driver_dirs") or []:
        if os.path.normpath(str(d.get("dir"))) == os.path.normpath(directory):
            return d.get("owner_uid") == 0
    return False


def _library_path_link_dir(env: Mapping[str, str], target: str, rests: list[str]) -> Plan:
    """A private directory with ``libcuda.so -> target`` first on LIBRARY_PATH (any gcc link's -lcuda)."""
    link_dir = os.path.join(env.get("HOME") or "/tmp", USER_LINK_SUBDIR)
    old = env.get("LIBRARY_PATH")
    value = ":".join([link_dir, *[e for e in split_path_list(old) if e]])
    return Plan(key="library-path-link-dir", title=f"Link against a libcuda.so of your own -> {target} (LIBRARY_PATH)",
                commands=[f"mkdir -p {shlex.quote(link_dir)}",
                          f"ln -sfn {shlex.quote(target)} {shlex.quote(os.path.join(link_dir, LIBCUDA_DEV))}",
                          export_line("LIBRARY_PATH", value)],
                undo=[restore_line("LIBRARY_PATH", old), f"rm -f {shlex.quote(os.path.join(link_dir, LIBCUDA_DEV))}"],
                explanation="gcc adds LIBRARY_PATH's directories to the linker's search, so -lcuda finds the "
                            "libcuda.so there, a link to the driver's libcuda.so.1; the program still loads "
                            "libcuda.so.1 at run time. Nothing of the driver changes.",
                rests_on=rests, trial={"kind": "link", "name": LIBCUDA_DEV, "target": target, "var": "LIBRARY_PATH",
                                       "prepend": True})


def link_plans(facts: Mapping[str, Any], env: Mapping[str, str], rests: list[str], *, triton_env: bool = True,
               lookup_fails: bool = False, triton: bool = True) -> list[Plan]:
    """Plans for triton's lookup or a ``-lcuda`` link that finds no unversioned libcuda.so. ``triton_env``:
    the installed triton honours TRITON_LIBCUDA_PATH; ``lookup_fails``: triton stops in its lookup, before
    the link (LIBRARY_PATH then does not help); ``triton``: the failing link is triton's (else another
    build's, which only LIBRARY_PATH reaches)."""
    plans: list[Plan] = []
    stubs = list(facts.get("toolkit_stubs") or [])
    real = real_libcuda(facts)
    if not triton:
        triton_env = False
        if real:
            plans.append(_library_path_link_dir(env, os.path.realpath(real), rests))
    if real and triton_env:
        target = os.path.realpath(real)
        link_dir = os.path.join(env.get("HOME") or "/tmp", USER_LINK_SUBDIR)
        link_dir_cmds = [f"mkdir -p {shlex.quote(link_dir)}",
                         f"ln -sfn {shlex.quote(target)} {shlex.quote(os.path.join(link_dir, LIBCUDA_DEV))}",
                         export_line("TRITON_LIBCUDA_PATH", link_dir)]
        plan = Plan(key="triton-libcuda-link-dir",
                    title=f"Give triton a directory of your own with libcuda.so -> {target}",
                    commands=link_dir_cmds,
                    undo=[restore_line("TRITON_LIBCUDA_PATH", env.get("TRITON_LIBCUDA_PATH")),
                          f"rm -f {shlex.quote(os.path.join(link_dir, LIBCUDA_DEV))}"],
                    explanation="TRITON_LIBCUDA_PATH names the directory triton links its launcher against "
                                "(-L DIR -lcuda) and skips its `ldconfig -p` lookup; a libcuda.so there that "
                                "points at the driver's libcuda.so.1 satisfies -lcuda, and the launcher still "
                                "loads the driver's libcuda.so.1 at run time. Nothing of the driver changes.",
                    rests_on=rests, trial={"kind": "link", "name": LIBCUDA_DEV, "target": target,
                                           "var": "TRITON_LIBCUDA_PATH"})
        plans.append(plan)
    if stubs and triton_env:
        plans.append(variable_plan(
            "triton-libcuda-stubs", f"Point TRITON_LIBCUDA_PATH at the toolkit's {stubs[0]}",
            "TRITON_LIBCUDA_PATH", stubs[0], env,
            "The toolkit's stubs directory holds an unversioned libcuda.so made for linking (its SONAME is "
            "libcuda.so.1): triton links against it, and at run time the loader gives the launcher the driver's "
            "libcuda.so.1. The stubs directory must never be on LD_LIBRARY_PATH.", rests))
    if stubs and not lookup_fails:
        old = env.get("LIBRARY_PATH")
        value = ":".join([stubs[0], *[e for e in split_path_list(old) if e]])
        plans.append(variable_plan(
            "library-path-stubs", f"Put {stubs[0]} on LIBRARY_PATH (for -lcuda)", "LIBRARY_PATH", value, env,
            "gcc adds LIBRARY_PATH's directories to the linker's search path, so -lcuda finds the stub "
            "libcuda.so there; run time is unaffected (LIBRARY_PATH is not LD_LIBRARY_PATH).", rests))
    if real and _root_owned(facts, os.path.dirname(real)):
        d = os.path.dirname(real)
        plans.append(root_plan(
            "libcuda-dev-link", f"Create the missing link {d}/libcuda.so -> libcuda.so.1 (root)",
            [f"ln -s libcuda.so.1 {shlex.quote(os.path.join(d, LIBCUDA_DEV))}", "ldconfig"],
            "The driver's development link (libcuda.so) is what the driver's -dev package or the toolkit "
            "installs; without it -lcuda fails for every user of the node. It changes the driver's directory, "
            "so it is yours to run.",
            rests, "it changes the driver's directory (root); the plans above do the same for this job only",
            undo=[f"rm {shlex.quote(os.path.join(d, LIBCUDA_DEV))}", "ldconfig"]))
    return plans


def stub_plans(facts: Mapping[str, Any], env: Mapping[str, str], rests: list[str], key: str = "loader",
               ) -> list[Plan]:
    """Plans for a stub libcuda the loader picks before the driver's (``key``: the facts of that lookup,
    ``loader`` for libcuda.so.1, ``loader_dev`` for libcuda.so)."""
    loader = facts.get(key) or {}
    plans: list[Plan] = []
    if loader.get("via") == "LD_LIBRARY_PATH":
        stub_dir = os.path.normpath(os.path.dirname(str(loader.get("path"))))
        entries = [e for e in split_path_list(env.get("LD_LIBRARY_PATH")) if e and os.path.normpath(e) == stub_dir]
        new = without_entries(env.get("LD_LIBRARY_PATH"), entries)
        plans.append(variable_plan(
            "drop-stubs-ld-library-path", f"Drop {', '.join(entries) or stub_dir} from LD_LIBRARY_PATH",
            "LD_LIBRARY_PATH", new or None, env,
            "The toolkit's stubs directory is for the linker only; on LD_LIBRARY_PATH its libcuda shadows the "
            "driver's, and every CUDA call fails with error 34 (CUDA driver is a stub library). Without it the "
            "loader takes the driver's libcuda.so.1 from the ld cache.",
            rests))
    elif loader.get("via") == "ld.so.cache":
        stub_dir = os.path.dirname(str(loader.get("path")))
        plans.append(root_plan(
            "drop-stubs-ld-cache", f"Remove {stub_dir} from the ld.so configuration (root)",
            [f"grep -rlF {shlex.quote(stub_dir)} /etc/ld.so.conf /etc/ld.so.conf.d", "ldconfig"],
            f"A file under /etc/ld.so.conf.d names {stub_dir}, so ldconfig put the stub in the cache ahead of the "
            "driver. Delete that line from the file the first command names, then rebuild the cache.",
            rests, "it changes the node's loader configuration (root)"))
    return plans


def uncached_plans(facts: Mapping[str, Any], env: Mapping[str, str], driver_dir: str, rests: list[str]) -> list[Plan]:
    """The environment-only plan for a driver directory the ld cache does not name (the root one, a drop-in
    under /etc/ld.so.conf.d, is the check's: it goes through the core's careful create)."""
    old = env.get("LD_LIBRARY_PATH")
    if any(e and os.path.normpath(e) == os.path.normpath(driver_dir) for e in split_path_list(old)):
        return []  # already there: only the cache entry is missing
    value = ":".join([driver_dir, *[e for e in split_path_list(old) if e]])
    return [variable_plan("driver-dir-ld-library-path", f"Put {driver_dir} on LD_LIBRARY_PATH", "LD_LIBRARY_PATH",
                      value, env, "The loader then finds the driver's libcuda.so.1 there before the cache; triton 3 "
                      "also reads LD_LIBRARY_PATH when `ldconfig -p` names no libcuda.", rests)]
