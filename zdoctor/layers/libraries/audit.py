"""The static audit: replay, with the ld.so emulation, what the training process will load.

The model is the process the training runs: the interpreter starts (preloads, its own DT_NEEDED), then
imports, in order, the extensions given with ``--ext`` (imported before torch), torch
(``libtorch_global_deps.so`` then ``torch/_C``), DeepSpeed's prebuilt ops and the JIT-built ops. For each
one: which libstdc++.so.6 / libgcc_s.so.1 / libc.so.6 serves it, how that copy was found, and every
version need that copy fails.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from zdoctor.readers.elf import read_elf
from zdoctor.readers.loader import LoaderConfig, Process
from zdoctor.readers.versions import family_of, missing, sort_key

LIBSTDCXX = "libstdc++.so.6"
RUNTIME_SONAMES = (LIBSTDCXX, "libgcc_s.so.1", "libc.so.6")


@dataclass
class Target:
    """One library the training imports (dlopens)."""

    path: str
    kind: str  # ext | torch | deepspeed-op | jit-op
    name: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def torch_targets(torch_dir: str | None) -> list[Target]:
    """torch's own dlopens, in the order ``import torch`` does them."""
    if not torch_dir:
        return []
    out: list[Target] = []
    deps = os.path.join(torch_dir, "lib", "libtorch_global_deps.so")
    if os.path.exists(deps):
        out.append(Target(deps, "torch", "libtorch_global_deps.so"))
    for p in sorted(glob.glob(os.path.join(glob.escape(torch_dir), "_C.*.so")))[:1]:
        out.append(Target(p, "torch", "torch._C"))
    return out


def training_targets(*, ext: Iterable[str] = (), torch_dir: str | None = None,
                     deepspeed_ops: Iterable[str] = (), jit_ops: Iterable[str] = ()) -> list[Target]:
    """Everything the training dlopens, in import order."""
    out = [Target(p, "ext", os.path.basename(p)) for p in ext]
    out += torch_targets(torch_dir)
    out += [Target(p, "deepspeed-op", os.path.basename(p)) for p in deepspeed_ops]
    out += [Target(p, "jit-op", os.path.basename(p)) for p in jit_ops]
    return out


@dataclass
class Served:
    """Which copy of a runtime library serves a target, and how it was found."""

    soname: str
    path: str
    realpath: str
    via: str
    label: str
    dir: str | None = None
    via_object: str | None = None
    loaded_by: str | None = None  # the object whose need first loaded it
    first_target: str | None = None  # the import that first brought it in (None: at start-up)
    glibcxx_max: str | None = None
    versions: list[str] | None = None


@dataclass
class TargetReport:
    target: Target
    error: str | None = None
    served: dict[str, Served] = field(default_factory=dict)
    needs: list[str] = field(default_factory=list)  # libstdc++ versions needed by its closure (strong)
    failures: list[dict[str, Any]] = field(default_factory=list)
    compilers: list[str] = field(default_factory=list)
    new_objects: list[str] = field(default_factory=list)
    kind_error: str | None = None  # not-found | bad-file | None
    tried: list[str] = field(default_factory=list)  # when a library was not found: every path considered

    @property
    def ok(self) -> bool:
        return not self.error and not self.failures

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def _find(proc: Any, soname: str, new_objects: list[Any]) -> Any:
    """The object serving ``soname``: one this import just mapped (even if rolled back), else the loaded one."""
    for o in new_objects:
        if o.soname == soname or soname in o.names:
            return o
    return proc.find_loaded(soname)


def _served(obj: Any, soname: str, first_target: dict[str, str | None]) -> Served | None:
    if obj is None:
        return None
    res = obj.resolution
    info = obj.info
    key = obj.realpath
    return Served(
        soname=soname, path=obj.name, realpath=obj.realpath, via=getattr(res, "via", "?"),
        label=res.label() if res is not None else "[?]", dir=getattr(res, "dir", None),
        via_object=getattr(res, "via_object", None), loaded_by=getattr(res, "loader", None),
        first_target=first_target.get(key),
        glibcxx_max=info.newest("GLIBCXX") if info is not None and info.ok else None,
        versions=list(info.verdef) if info is not None and info.ok and info.verdef is not None else None,
    )


def _failure_dict(f: Any) -> dict[str, Any]:
    res = getattr(f, "provider_resolution", None)
    return {"version": f.version, "required_by": f.required_by, "provider": f.provider,
            "message": f.message(), "provider_label": res.label() if res is not None else None}


def static_audit(executable: str, env: Mapping[str, str], targets: list[Target], *, config: Any = None,
                 cwd: str | None = None) -> dict[str, Any]:
    """Emulate the training process; JSON-ready facts (see the module docstring)."""

    config = config or LoaderConfig.detect()
    proc = Process(executable, env, config, cwd=cwd)
    started = proc.start()
    start_failures = list(started.all_failures)
    first_target: dict[str, str | None] = {o.realpath: None for o in proc.loaded}
    reports: list[TargetReport] = []
    for t in targets:
        before = {id(o) for o in proc.loaded}
        report = TargetReport(target=t)
        info = read_elf(t.path)
        report.compilers = info.compilers() if info.ok else []
        if not info.ok:
            report.error = f"{t.path}: {info.error}"
            report.kind_error = "bad-file"
            reports.append(report)
            continue
        result = proc.dlopen(t.path)
        failures = list(result.all_failures or result.failures or [])
        report.failures = [_failure_dict(f) for f in failures]
        if result.error and not failures:
            report.error = result.error
            report.kind_error = "not-found" if "cannot open shared object file" in result.error else "bad-file"
            res = next((r for r in reversed(proc.resolutions) if r.error), None)
            if res is not None:
                report.tried = [c.path + (f" ({c.reason})" if c.reason else "") for c in res.tried]
        new = [o for o in proc.loaded if id(o) not in before]
        new_objs = list(result.new_objects or new)
        report.new_objects = [o.name for o in new_objs]
        for o in new_objs:
            first_target.setdefault(o.realpath, t.path)
        needs: list[str] = []
        for o in new_objs or []:
            if o.info is None or not o.info.ok:
                continue
            for v, weak in o.info.needs_from(LIBSTDCXX):
                if not weak and v not in needs:
                    needs.append(v)
        if not new_objs:
            for v, weak in info.needs_from(LIBSTDCXX):
                if not weak and v not in needs:
                    needs.append(v)
        report.needs = sorted(needs, key=sort_key)
        for soname in RUNTIME_SONAMES:
            s = _served(_find(proc, soname, new_objs), soname, first_target)
            if s is not None:
                report.served[soname] = s
        # Failures of the version check are the loader's; add what the emulation may have missed
        # when the copy was already loaded (needs checked against the winner, by set membership).
        winner = report.served.get(LIBSTDCXX)
        if winner is not None and winner.versions is not None and not report.failures:
            lack = missing([(n, False) for n in report.needs], winner.versions)
            for v in lack:
                report.failures.append({"version": v, "required_by": t.path, "provider": winner.path,
                                        "message": f"{winner.path}: version `{v}' not found (required by {t.path})",
                                        "provider_label": winner.label})
        reports.append(report)
    all_needs = sorted({n for r in reports for n in r.needs}, key=sort_key)
    winner = next((r.served[LIBSTDCXX] for r in reports if LIBSTDCXX in r.served), None)
    if winner is None:
        winner = _served(proc.find_loaded(LIBSTDCXX), LIBSTDCXX, first_target)
    exe_info = read_elf(executable)
    return {
        "executable": executable,
        "interpreter": {"path": executable, "realpath": os.path.realpath(executable),
                        "rpath": exe_info.rpath, "runpath": exe_info.runpath, "error": exe_info.error,
                        "needed": exe_info.needed},
        "preloads": [o.name for o in proc.loaded if getattr(o.resolution, "via", "") in
                     ("LD_PRELOAD", "/etc/ld.so.preload")],
        "start_failures": [_failure_dict(f) for f in start_failures],
        "targets": [r.to_dict() for r in reports],
        "needs": all_needs,
        "needs_by_family": {fam: [n for n in all_needs if family_of(n) == fam]
                            for fam in sorted({family_of(n) for n in all_needs})},
        "libstdcxx": asdict(winner) if winner else None,
        "failures": [dict(f, target=r.target.path) for r in reports for f in r.failures],
        "errors": [r.error for r in reports if r.error],
        "loaded": [{"path": o.name, "label": o.resolution.label() if o.resolution is not None else "[?]"}
                   for o in proc.loaded],
    }
