"""Environment-only workarounds for an undefined symbol, tried before they are offered.

In the order the loader decides: a shadowing ``LD_LIBRARY_PATH`` entry is dropped first, then the
directory of the copy that exports the symbol is put first, and a library the object was never linked
against is preloaded by its full path (a bare ``libcurand.so`` is often no file at all: pip's CUDA
wheels ship only ``libcurand.so.10``). Each plan is re-run with the failing command; a rebuild or a
reinstall is never tried here.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping, Sequence
from typing import Any

from zdoctor.core import progress
from zdoctor.layers.libraries.symbols import dynamic_symbols, search_dirs
from zdoctor.trials.remedies import Plan, fix_ld_library_path, split_path_list, variable_plan, verify

MAX_PRELOAD_CANDIDATES = 16


def _prepend_dir(env: Mapping[str, str], directory: str, rests_on: list[str]) -> Plan:
    new = ":".join([directory, *[e for e in split_path_list(env.get("LD_LIBRARY_PATH")) if e]])
    return variable_plan("ld-library-path-first", f"Put {directory} first on LD_LIBRARY_PATH", "LD_LIBRARY_PATH",
                         new, env, "ld.so searches LD_LIBRARY_PATH in order; the copy there that exports the "
                         "symbol is then the one loaded.", rests_on)


def exporting_file(library: str, symbol: str, dirs: Sequence[str]) -> str | None:
    """The full path of a file of ``library`` (``libcurand`` -> ``libcurand.so.10``) that exports ``symbol``."""
    seen: set[str] = set()
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(glob.escape(d), glob.escape(library) + ".so*"))):
            real = os.path.realpath(path)
            if real in seen or not os.path.isfile(path):
                continue
            seen.add(real)
            if len(seen) > MAX_PRELOAD_CANDIDATES:
                return None
            if symbol in dynamic_symbols(path)["defined"]:
                return path
    return None


def _preload(env: Mapping[str, str], path: str, rests_on: list[str]) -> Plan:
    new = " ".join([path, *(env.get("LD_PRELOAD") or "").replace(":", " ").split()])
    return variable_plan("ld-preload-library", f"Workaround for one run: preload {path}", "LD_PRELOAD", new, env,
                         "A preloaded library's symbols are there before the object is loaded; named by its full "
                         "path, it loads whatever the search path holds. It hides the missing link entry rather "
                         "than fixing it.", rests_on)


def plans_for(rec: Mapping[str, Any], env: Mapping[str, str], loaded: Sequence[str] = (),
              site_dirs: Sequence[str] = ()) -> list[Plan]:
    """The environment-only plans that fit a triaged undefined symbol, in the loader's order."""
    what = f"undefined symbol {rec['symbol']}" if rec.get("symbol") else f"version {rec.get('version')} not found"
    rests = [f"{os.path.basename(str(rec.get('object') or '?'))}: {what}"]
    if rec.get("kind") in ("shadowed", "shadowed-release"):
        loaded_dir = os.path.dirname(os.path.normpath(str(rec["loaded_copy"])))
        entries = [e for e in split_path_list(env.get("LD_LIBRARY_PATH")) if e and os.path.normpath(e) == loaded_dir]
        plans = [fix_ld_library_path(env, entries, rests)] if entries else []
        return [*plans, _prepend_dir(env, os.path.dirname(str(rec["exporting_copy"])), rests)]
    if rec.get("kind") == "never-linked" and rec.get("library"):
        path = exporting_file(str(rec["library"]), str(rec["symbol"]), search_dirs(env, loaded, site_dirs))
        return [_preload(env, path, rests)] if path else []
    return []


def try_plans(plans: list[Plan], argv: Sequence[str] | None, env: Mapping[str, str], timeout: float) -> list[Plan]:
    """Re-run the failing command with each plan (none when there is no command to re-run)."""
    for i, p in enumerate(plans, 1):
        if argv:
            with progress.doing("symbols", f"re-running the command with fix {i} of {len(plans)}"):
                verify(p, argv, env, timeout=timeout)
        else:
            p.verification = "not tried, because there is no command to re-run"
    return plans
