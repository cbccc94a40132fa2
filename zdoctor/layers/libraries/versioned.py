"""A newer libstdc++ held only as its versioned file (``libstdc++.so.6.0.33``, no ``libstdc++.so.6`` link).

ld.so looks for the name ``libstdc++.so.6``, never for the versioned file, so an environment whose
package left out the link (pytorch/pytorch#157709) has the right library and still loads an older
one from further down the search path. Two fixes, both tried before they are offered:

- preload the versioned file (an environment change: the re-run gets ``LD_PRELOAD``);
- create the link in that directory. The trial changes nothing on the node: the link is made in a
  private temp directory put at the front of ``LD_LIBRARY_PATH`` for the re-run only. It is offered
  only when the loader would reach that directory before the copy that won, for the objects that
  failed, so that the trial and the real link load the same file.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from zdoctor.layers.libraries.inventory import candidate_dirs
from zdoctor.readers.elf import read_elf
from zdoctor.readers.loader import expand_dst
from zdoctor.readers.versions import missing
from zdoctor.trials.remedies import Plan, preload, split_path_list

LIBSTDCXX = "libstdc++.so.6"
_VERSIONED = re.compile(r"^libstdc\+\+\.so\.6\.0\.(\d+)$")


def versioned_only(dirs: Iterable[str]) -> list[str]:
    """``libstdc++.so.6.0.N`` files in directories that have no ``libstdc++.so.6`` (newest first per dir)."""
    out: list[str] = []
    seen: set[str] = set()
    for d in dirs:
        norm = os.path.normpath(d) if d else d
        if not norm or norm in seen or not os.path.isdir(norm):
            continue
        seen.add(norm)
        if os.path.lexists(os.path.join(norm, LIBSTDCXX)):
            continue
        files = [p for p in glob.glob(os.path.join(glob.escape(norm), "libstdc++.so.6.0.*"))
                 if _VERSIONED.match(os.path.basename(p)) and os.path.isfile(p)]
        files.sort(key=lambda p: int(_VERSIONED.match(os.path.basename(p)).group(1)), reverse=True)
        out.extend(files)
    return out


def searched_before_winner(obj: str, env: Mapping[str, str], exe_rpath_dirs: Sequence[str],
                           dst_lib: str | None = None, platform: str | None = None) -> list[str]:
    """The directories ld.so searches for ``obj``'s ``DT_NEEDED`` before the cache and system dirs.

    The object's own ``DT_RPATH`` and the executable's when it has no ``DT_RUNPATH``, then
    ``LD_LIBRARY_PATH``, then its ``DT_RUNPATH`` (``$ORIGIN`` is the object's directory).
    """
    info = read_elf(obj)
    origin = os.path.dirname(obj)

    def expand(value: str | None) -> list[str]:
        out = []
        for e in (value or "").split(":"):
            x = expand_dst(e, origin, dst_lib, platform) if e else None
            if x:
                out.append(os.path.normpath(x))
        return out

    dirs: list[str] = []
    if info.ok and not info.runpath:
        dirs += expand(info.rpath) + [os.path.normpath(d) for d in exe_rpath_dirs if d]
    dirs += [os.path.normpath(e) for e in split_path_list(env.get("LD_LIBRARY_PATH")) if e]
    if info.ok and info.runpath:
        dirs += expand(info.runpath)
    return dirs


def _reached_first(directory: str, winner: str | None, order: list[str]) -> bool:
    """Whether ``directory`` comes before the winner's directory in ``order`` (winner elsewhere: yes)."""
    if directory not in order:
        return False
    if not winner:
        return True
    wdir = os.path.normpath(os.path.dirname(winner))
    return wdir not in order or order.index(directory) < order.index(wdir)


def link_plan(versioned: str, env: Mapping[str, str], rests_on: list[str]) -> Plan:
    """Create ``libstdc++.so.6 -> libstdc++.so.6.0.N`` beside the versioned file (tried in a temp dir)."""
    d = os.path.dirname(versioned)
    link = os.path.join(d, LIBSTDCXX)
    writable = os.access(d, os.W_OK)
    return Plan(
        key="libstdcxx-link",
        title=f"Create the missing link {link} -> {os.path.basename(versioned)}",
        commands=[shlex.join(["ln", "-s", "--", os.path.basename(versioned), link])],
        undo=[shlex.join(["rm", "--", link])],
        explanation=(f"{d} holds {os.path.basename(versioned)}, a libstdc++ with every version the libraries "
                     "need, but not the libstdc++.so.6 link that ld.so looks for, so an older copy further down "
                     "the search path is loaded instead (the package installed the file without its link). "
                     "The link is what the package should have made; it changes only that directory."),
        rests_on=rests_on,
        requires_root=not writable,
        trial={"kind": "link", "name": LIBSTDCXX, "target": versioned},
    )


def propose_versioned(libs: Mapping[str, Any], env: Mapping[str, str], needs: list[str],
                      failures: list[dict[str, Any]], rests: list[str],
                      config: Any = None) -> list[Plan]:
    """The preload and link plans for a versioned-only libstdc++ that has every need."""

    interp = libs.get("interpreter") or {}
    dirs = [d for d, _why in candidate_dirs(env, interpreter=interp, toolsets=False)]
    plans: list[Plan] = []
    for path in versioned_only(dirs):
        info = read_elf(path)
        if not info.ok or missing([(n, False) for n in needs], info.verdef):
            continue
        have = f"{path} (held only as its versioned file: no libstdc++.so.6 beside it) defines every needed version"
        plans.append(preload(env, path, [], rests + [have], key="ld-preload-versioned"))
        d = os.path.normpath(os.path.dirname(path))
        objects = sorted({f["required_by"] for f in failures if f.get("required_by")})
        winners = {f["required_by"]: f.get("provider") for f in failures}
        dst_lib = getattr(config, "dst_lib", None)
        platform = getattr(config, "platform", None)
        reached = bool(objects) and all(
            _reached_first(d, winners.get(o), searched_before_winner(o, env, interp.get("rpath_dirs") or [],
                                                                     dst_lib, platform))
            for o in objects)
        if reached:
            plans.append(link_plan(path, env, rests + [have]))
        break  # the newest usable copy is enough
    return plans


