"""Which remedies the evidence supports, most direct first (verification is the caller's)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from zdoctor.layers.libraries.inventory import conda_prefix_of
from zdoctor.layers.libraries.runneeds import has_every, is_libstdcxx_version, needed_versions
from zdoctor.layers.libraries.versioned import propose_versioned
from zdoctor.readers.elf import read_elf
from zdoctor.readers.versions import gcc_release_providing, missing, sort_key
from zdoctor.trials.remedies import (
    Plan,
    conda_upgrade,
    fix_ld_library_path,
    fix_preload,
    preload,
    root_plan,
    split_path_list,
)

LIBSTDCXX = "libstdc++.so.6"


def failing_versions(libs: Mapping[str, Any], live: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The libstdc++ version failures to fix: the real loader's when it reported any, else the emulation's
    (glibc's or another library's missing nodes are no libstdc++ copy's to fix)."""
    live_errors = [e for e in live.get("version_errors") or [] if is_libstdcxx_version(str(e.get("version")))]
    return live_errors or [f for f in libs.get("failures") or [] if is_libstdcxx_version(str(f.get("version")))]


def lacks(path: str, needs: list[str]) -> bool:
    """Whether the libstdc++ at ``path`` is unusable for ``needs`` (missing versions, or not a library)."""
    info = read_elf(path)
    if not info.ok:
        return info.kind not in ("missing",)
    return bool(missing([(n, False) for n in needs], info.verdef))


def offending_entries(env: Mapping[str, str], needs: list[str], cwd: str | None = None) -> list[str]:
    """LD_LIBRARY_PATH entries (as written) whose libstdc++.so.6 lacks a needed version."""
    out: list[str] = []
    for entry in split_path_list(env.get("LD_LIBRARY_PATH")):
        base = entry or (cwd or os.getcwd())
        cand = os.path.join(base, LIBSTDCXX)
        if os.path.exists(cand) and lacks(cand, needs) and entry not in out:
            out.append(entry)
    return out


def offending_preloads(env: Mapping[str, str], needs: list[str]) -> list[str]:
    return [e for e in (env.get("LD_PRELOAD") or "").replace(":", " ").split()
            if os.path.basename(e).startswith("libstdc++") and lacks(e, needs)]


def best_copy(libs: Mapping[str, Any], needs: list[str]) -> str | None:
    """A libstdc++ from the inventory that has every need: the system's first, then the newest."""
    good = [c for c in libs.get("inventory") or [] if has_every(c, needs)]
    if not good:
        return None

    def rank(c: dict[str, Any]) -> tuple[int, int, tuple]:
        system = any(r in ("system dir", "ld.so.cache") for r in c.get("found_as") or [])
        conda = bool(c.get("conda_prefix"))
        return (0 if system else 1, 1 if conda else 0, tuple(-x for x in sort_key(c.get("glibcxx_max") or "")[1]))

    return sorted(good, key=rank)[0]["path"]


def propose(libs: Mapping[str, Any], live: Mapping[str, Any], env: Mapping[str, str]) -> list[Plan]:
    """Every plan the evidence supports, most direct first; empty when nothing fails."""
    failures = failing_versions(libs, live)
    if not failures:
        return []
    needs = sorted({*needed_versions(libs, live), *(f["version"] for f in failures)}, key=sort_key)
    rests = [f.get("message") or f"{f['provider']}: version `{f['version']}' not found "
             f"(required by {f['required_by']})" for f in failures[:3]]
    plans: list[Plan] = []
    bad_entries = offending_entries(env, needs)
    if bad_entries:
        plans.append(fix_ld_library_path(env, bad_entries, rests + [
            f"LD_LIBRARY_PATH entry {e} holds a libstdc++.so.6 that lacks a needed version" for e in bad_entries]))
    bad_preloads = offending_preloads(env, needs)
    if bad_preloads:
        plans.append(fix_preload(env, bad_preloads, rests + [f"LD_PRELOAD forces {p}" for p in bad_preloads]))
    good = best_copy(libs, needs)
    providers = {os.path.realpath(f["provider"]) for f in failures if f.get("provider")}
    if good and os.path.realpath(good) not in providers:
        plans.append(preload(env, good, bad_preloads, rests + [f"{good} defines every needed version"]))

    plans += propose_versioned(libs, env, needs, failures, rests)
    release = gcc_release_providing(needs)
    conda_envs = sorted({p for p in (conda_prefix_of(x) for x in providers) if p})
    for prefix in conda_envs:
        plans.append(conda_upgrade(prefix, release, rests + [f"the failing copy belongs to the conda env {prefix}"],
                                   env))
    interp = str((libs.get("interpreter") or {}).get("path") or "")
    own = conda_prefix_of(interp) if interp and not good else None
    if own and own not in conda_envs:  # no copy new enough anywhere: the env's own runtime, first on its RPATH
        plan = conda_upgrade(own, release, rests + [
            f"the training interpreter {interp} belongs to the conda env {own}, and no libstdc++ on the node has "
            "every needed version"], env)
        plan.explanation = (f"No libstdc++ on this node has every version the libraries need. conda-forge's "
                            f"libstdcxx-ng ships GCC {(release or '12').split('.')[0]}'s runtime into {own}/lib, "
                            "which the env's python searches first (its RPATH), for the ops it loads too.")
        plans.append(plan)
    etc = [p for p in libs.get("etc_preload") or [] if os.path.realpath(p) in providers]
    if etc:
        plans.append(root_plan(
            "etc-preload", "Remove the old libstdc++ from /etc/ld.so.preload", [],
            f"Delete the line naming {etc[0]} from /etc/ld.so.preload (as root). That file forces a library into "
            "every process on the node, even setuid ones; an old libstdc++ there breaks every newer C++ program.",
            rests, "it changes every process on the node (and needs root)"))
    return plans
