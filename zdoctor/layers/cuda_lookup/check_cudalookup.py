"""Check ``cuda.lookup``: whether the training finds CUDA's libraries (layer ``cuda-lookup``).

The driver's libcuda.so.1 in the ld cache and which copy the loader gives the process (a toolkit stub
shadowing it), triton's libcuda lookup as the installed triton does it and its ``-lcuda`` link, and the
CUDA sonames every extension the training loads needs against torch's CUDA major and the nvidia-* wheels.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from typing import Any

from zdoctor.core.model import Evidence, Finding, Remedy
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.edit.sysfile import create_file_remedy, free_name
from zdoctor.layers.cuda_lookup import cudalookup as cl
from zdoctor.layers.cuda_lookup.rules import DRIVER_DIRS, TRITON_FILES
from zdoctor.symptoms.match import ids_for
from zdoctor.trials.remedies import Plan

FID = "cuda.lookup"
TITLE = "CUDA library lookup"
NO_DRIVER = "not examined: no NVIDIA driver library on this node"
LD_SO_CONF_D = "/etc/ld.so.conf.d"


def _remedies(facts: Mapping[str, Any], group: str) -> list[Remedy]:
    return [Plan.from_dict(p).to_remedy() for p in (facts.get("plans") or {}).get(group) or []]


def _cache_dir_remedies(facts: Mapping[str, Any], driver_dir: str) -> list[Remedy]:
    """Name ``driver_dir`` in a new drop-in under /etc/ld.so.conf.d (the core's careful create), then rebuild
    the cache: two steps, root's, never tried."""
    names = facts.get("ld_so_conf_d")
    if names is None:
        return []
    path = free_name(LD_SO_CONF_D, "zdoctor-nvidia", ".conf", names)
    create = create_file_remedy(path, f"{driver_dir}\n", title=f"Name {driver_dir} in {path} (root)",
                                explanation="ldconfig reads every *.conf file under /etc/ld.so.conf.d; with the "
                                            "driver's directory named there the cache (and `ldconfig -p`, which "
                                            "triton reads) lists libcuda.so.1 for every process on the node.")
    create.step, create.note = True, "not tried, because it changes the node's loader configuration (root)"
    rebuild = Remedy(title="Rebuild the ld cache (root)", commands=["ldconfig"], requires_root=True, step=True,
                     undo=[f"rm -f -- {shlex.quote(path)}", "ldconfig"],
                     explanation="ldconfig rewrites /etc/ld.so.cache from the configuration.",
                     note="not tried, because it changes the node's ld cache (root)")
    return [create, rebuild]


def _driver_table(facts: Mapping[str, Any]) -> Evidence:
    rows, hl = [], []
    cache = facts.get("cache") or {}
    for name in (cl.LIBCUDA, cl.LIBCUDA_DEV):
        for p in cache.get(name) or ["(none)"]:
            rows.append([f"ld.so cache {cache.get('path')}", name, p])
    for d in facts.get("driver_dirs") or []:
        for name, f in sorted((d.get("files") or {}).items()):
            where = f["path"] + (f" -> {f['link']}" if f.get("link") else "") + ("" if f.get("exists") else
                                                                                  " (dangling)")
            notes = [x for x, on in (("in the cache", d.get("in_cache")), ("on LD_LIBRARY_PATH",
                                     d.get("on_ld_library_path")), ("toolkit stubs", d.get("stubs"))) if on]
            if d.get("stubs"):
                hl.append(len(rows))
            rows.append([d["dir"] + (f" ({', '.join(notes)})" if notes else " (not in the cache)"), name, where])
    loader = facts.get("loader") or {}
    if loader.get("stub"):
        hl.append(len(rows))
    rows.append(["the loader, for the training process", cl.LIBCUDA,
                 f"{loader.get('path')} {loader.get('label') or ''}".strip() if loader.get("path")
                 else f"not found ({loader.get('error') or 'no answer'})"])
    return Evidence.of_table("libcuda in the ld cache, the driver directories and the loader",
                             ["where", "name", "file"], rows, hl)


def _stub_finding(me: CheckSpec, facts: Mapping[str, Any], sym: Facts, table: Evidence, status: str, title: str,
                  detail: str) -> Finding:
    """The finding that a toolkit's stub libcuda is what a name resolves to: the fixes that take the stubs
    directory off the search path, and the messages a stub gives (cuda-stub, CUDA error 34) it explains."""
    return Finding(id=me.id("stub"), status=status, title=title, detail=detail, evidence=[table],
                   remedies=_remedies(facts, "stub"),
                   explains=ids_for(sym, "cuda-stub") + ids_for(sym, "cuda-error", number="34"))


def _libcuda(me: CheckSpec, facts: Mapping[str, Any], probs: dict[str, Any], sym: Facts) -> list[Finding]:
    """The driver library: in the cache, where else, what the loader gives the process (a stub?)."""
    table = _driver_table(facts)
    loader = facts.get("loader") or {}
    out: list[Finding] = []
    if probs["stub"]:
        out.append(_stub_finding(
            me, facts, sym, table, "fail",
            f"The training process would load the toolkit's stub libcuda ({loader.get('path')}), not the driver's",
            f"The loader resolves {cl.LIBCUDA} for the training process to {loader.get('path')} "
            f"{loader.get('label') or ''}: a stub library from a CUDA toolkit's stubs directory, made for "
            "linking only. Every CUDA call then fails with error 34 (CUDA driver is a stub library)."))
    if probs["stub_dev"]:
        dev = facts.get("loader_dev") or {}
        out.append(_stub_finding(
            me, facts, sym, table, "warn",
            f"A dlopen of the unversioned libcuda.so would get the toolkit's stub ({dev.get('path')})",
            f"libcuda.so.1 resolves to the driver's, but libcuda.so resolves to {dev.get('path')} "
            f"{dev.get('label') or ''}, a toolkit stub. A library that dlopens the unversioned name (torch's "
            "CUDA driver API did until pytorch PR #112996) then gets error 34 (CUDA driver is a stub "
            "library). The stubs directory belongs on no run-time search path."))
    if not probs["driver"]:
        dirs = ", ".join(DRIVER_DIRS)
        out.append(Finding(id=me.id("libcuda"), status="skip", title=f"libcuda: {NO_DRIVER}",
                           detail=f"No {cl.LIBCUDA} other than a toolkit stub is in the ld cache "
                                  f"({(facts.get('cache') or {}).get('path')}) or in {dirs}, nor on "
                                  "LD_LIBRARY_PATH: the driver's user-space part is not installed (or not mounted "
                                  "into this container), so the driver library's lookup was not examined.",
                           evidence=[table]))
        return out
    cache = facts.get("cache") or {}
    if probs["uncached"]:
        d = probs["uncached"][0]
        reached = bool(loader.get("path")) and not loader.get("stub")
        out.append(Finding(
            id=me.id("libcuda"), status="warn" if reached else "fail",
            title=f"The driver library is in {d}, which the ld cache does not name",
            detail=f"{d} holds {cl.LIBCUDA}, but the ld cache has no entry for it, so `ldconfig -p` (which triton "
                   "reads) does not list it and the loader finds it only through LD_LIBRARY_PATH"
                   + (f": here it does ({loader.get('path')} {loader.get('label')})." if reached else
                      ": here it does not, so nothing CUDA starts."),
            evidence=[table], remedies=_remedies(facts, "uncached") + _cache_dir_remedies(facts, d)))
        return out
    if not probs["stub"] and not loader.get("path"):
        out.append(Finding(
            id=me.id("libcuda"), status="fail",
            title=f"The ld cache names the driver library, but the loader finds no {cl.LIBCUDA} for the training",
            detail=f"The cache lists {', '.join(cache.get(cl.LIBCUDA) or [])}, yet resolving {cl.LIBCUDA} for the "
                   f"training process fails ({loader.get('error') or 'no answer'}): a stale cache entry (the file "
                   "was removed or replaced by a driver upgrade without `ldconfig`), or a file of another "
                   "architecture. Run `ldconfig` (root) and look again.",
            evidence=[table]))
    elif not probs["stub"]:
        real = [p for p in cache.get(cl.LIBCUDA) or [] if not cl.is_stub_path(p)]
        dev = "; the unversioned libcuda.so is there too" if cache.get(cl.LIBCUDA_DEV) else \
            "; the unversioned libcuda.so is not (only -lcuda links and triton 2.x need it)"
        out.append(Finding(
            id=me.id("libcuda"), status="ok",
            title=f"The driver's {cl.LIBCUDA} is in the ld cache ({real[0] if real else '?'})",
            detail=f"The ld cache names {', '.join(real)}{dev}. The loader gives the training process "
                   f"{loader.get('path')} {loader.get('label') or ''}.".rstrip(),
            evidence=[table]))
    return out


def _triton(me: CheckSpec, facts: Mapping[str, Any], probs: dict[str, Any], sym: Facts) -> list[Finding]:
    triton = facts.get("triton") or {}
    symptoms = ids_for(sym, "libcuda-lookup")
    link_symptoms = ids_for(sym, "link-library-missing", library="cuda")
    if not triton.get("installed"):
        if symptoms or link_symptoms:
            return [me.not_checked("triton is not installed in the training environment zdoctor probed, so the "
                                   "triton that printed the message belongs to another environment: name it with "
                                   "--python.",
                                   sub="triton", part="triton's libcuda lookup")]
        return []
    rule = triton.get("rule") or {}
    version = triton.get("version") or "?"
    if rule.get("state") != "read":
        return [me.not_checked(f"triton {version} at {triton.get('location')} has no libcuda lookup zdoctor can "
                               f"read (looked in {', '.join(TRITON_FILES[:2])}).",
                               sub="triton", part="triton's libcuda lookup")]
    if not probs["driver"]:
        return [Finding(id=me.id("triton"), status="skip", title=f"triton's libcuda lookup: {NO_DRIVER}",
                        detail=f"triton {version} looks for `ldconfig -p` lines naming {rule.get('search')}; "
                               "with no driver library on the node there is nothing for it to find.")]
    lookup = triton.get("lookup") or {}
    ld = facts.get("ldconfig") or {}
    rule_text = (f"triton {version} ({rule.get('file')}) keeps the directories of the `ldconfig -p` lines naming "
                 f"{rule.get('search')}" + (", else LD_LIBRARY_PATH's" if rule.get("ld_library_path") else "")
                 + f", and requires {rule.get('require')} in one of them"
                 + ("; TRITON_LIBCUDA_PATH overrides the lookup" if rule.get("env_override") else ""))
    ev = [Evidence.of_table("triton's libcuda lookup", ["step", "result"],
                            [["rule read from the installed triton", rule_text],
                             ["/sbin/ldconfig -p lines naming libcuda",
                              "; ".join(x["line"].strip() for x in ld.get("libcuda") or []) or "(none)"],
                             ["directories kept", ", ".join(lookup.get("dirs") or []) or "(none)"]])]
    if not ld.get("ran"):
        return [me.not_checked(f"{rule_text}, but `/sbin/ldconfig -p` did not run here "
                               f"({ld.get('error')}); triton fails the same way.", evidence=ev,
                               sub="triton", part="triton's libcuda lookup")]
    if lookup.get("error"):
        return [Finding(id=me.id("triton"), status="fail",
                        title=f"triton {version} cannot find libcuda (AssertionError: libcuda.so cannot found!)",
                        detail=f"{rule_text}. Here that fails: {lookup['error'].splitlines()[-1]}",
                        evidence=ev, remedies=_remedies(facts, "link"), explains=symptoms)]
    return [Finding(id=me.id("triton"), status="ok",
                    title=f"triton {version} finds libcuda in {', '.join(lookup.get('dirs') or [])} "
                          f"(via {lookup.get('via')})",
                    detail=rule_text + ".", evidence=ev)]


def _link(me: CheckSpec, facts: Mapping[str, Any], probs: dict[str, Any], sym: Facts) -> list[Finding]:
    link = facts.get("link") or {}
    symptoms = ids_for(sym, "link-library-missing", library="cuda")
    if not (probs["links_cuda"] or symptoms):
        return []
    if not probs["driver"]:
        return [Finding(id=me.id("link"), status="skip", title=f"-lcuda: {NO_DRIVER}",
                        detail="-lcuda links against the driver's development link libcuda.so (or a toolkit "
                               "stub); with no driver library on the node it was not examined.")]
    if link.get("error"):
        return [me.not_checked(f"the compiler's library path is unknown: {link['error']}", sub="link", part="-lcuda")]
    if probs["triton"]:
        return []  # triton stops before its link; its finding says why
    searched = link.get("searched") or []
    ev = [Evidence.of_table("where -lcuda is looked for (the -L directories, then the compiler's library path)",
                            ["directory", "libcuda.so", "libcuda.so.1"],
                            [[x["dir"], "yes" if x.get("dev") else "-", "yes" if x.get("so1") else "-"]
                             for x in searched])]
    if link.get("finds"):
        return [Finding(id=me.id("link"), status="ok", title=f"-lcuda links against {link['finds']}",
                        detail=f"{link.get('cc')} searches the -L directories, then its library path "
                               f"({count_of(len(link.get('dirs') or []), 'directory', 'directories')}); "
                               f"{link['finds']} satisfies -lcuda.", evidence=ev)]
    beside = [x["dir"] for x in searched if x.get("so1")]
    return [Finding(id=me.id("link"), status="fail",
                    title="-lcuda finds no libcuda.so (ld: cannot find -lcuda)"
                          + (f", though {beside[0]}/libcuda.so.1 is there" if beside else ""),
                    detail=("triton builds its launcher with -lcuda" if probs["links_cuda"] else
                            "the failing build links with -lcuda")
                           + "; GNU ld looks for the unversioned libcuda.so (or libcuda.a) in the -L directories and "
                           "the compiler's library path, never in the ld cache and never for libcuda.so.1. "
                           + (f"{beside[0]} has only libcuda.so.1." if beside else "No directory searched has it."),
                    evidence=ev, remedies=_remedies(facts, "link"), explains=symptoms)]


def _rebuild(ext: dict[str, Any], torch_cuda: str | None) -> Remedy:
    kind, path = ext.get("kind"), str(ext.get("path"))
    against = f"this torch (CUDA {torch_cuda})" if torch_cuda else "this torch"
    if kind == "jit-op":
        op_dir = os.path.dirname(path)
        return Remedy(title=f"Rebuild the op {ext.get('name')} against {against}",
                      commands=[f"rm -rf -- {shlex.quote(op_dir)}"],
                      explanation="The JIT cache keeps an op built for another CUDA; removed, DeepSpeed builds it "
                                  "again on the next launch with the torch and toolkit of this environment.",
                      note="not tried, because it deletes a build (the next launch rebuilds it)")
    if kind == "deepspeed-op":
        return Remedy(title=f"Rebuild DeepSpeed's prebuilt ops against {against}",
                      commands=["pip install --force-reinstall --no-deps --no-cache-dir --no-binary deepspeed "
                                "deepspeed"],
                      explanation="The op was prebuilt (DS_BUILD_OPS) for another CUDA major; reinstalling DeepSpeed "
                                  "from source builds it against this environment's torch (set the same DS_BUILD_* "
                                  "variables as before).",
                      note="not tried, because it reinstalls a package (network and a build)")
    return Remedy(title=f"Rebuild {os.path.basename(path)} against {against}",
                  explanation="An extension links the CUDA runtime of the toolkit it was built with; rebuild it in "
                              "this environment (its setup.py / pip install) so it needs this torch's CUDA sonames.",
                  note="not tried, because it is a build of your code")


def _extensions(me: CheckSpec, facts: Mapping[str, Any], sym: Facts) -> list[Finding]:
    fid = me.id("extensions")
    if not facts.get("libs_ran"):
        return [me.not_checked("the static audit of what the training loads (the libs probe) gave no facts",
                               sub="extensions", part="extensions' CUDA sonames")]
    torch = facts.get("torch") or {}
    if not torch.get("installed"):
        return [me.not_checked("torch is not installed in the training interpreter, so there is no torch CUDA "
                               "major to hold the libraries against and no torch libraries to read; name the "
                               "training environment with --python.",
                               sub="extensions", part="extensions' CUDA sonames")]
    major = torch.get("major")
    wheels = facts.get("wheels") or {}
    exts = facts.get("extensions") or []
    torch_says = (f"torch {torch.get('version')} is built for CUDA {torch.get('cuda')}" if major is not None else
                  f"torch {torch.get('version') or '?'} is a CPU build (torch.version.cuda is None: no CUDA major)"
                  if torch.get("installed") else "torch is not installed")
    rows: list[list[str]] = []
    hl: list[int] = []
    bad: list[tuple[dict[str, Any], dict[str, Any], str]] = []
    explains: list[str] = []
    for ext in exts:
        for n in ext.get("needs") or []:
            problems = []
            if n.get("is_cuda_major") and major is not None and n["major"] != major:
                problems.append(f"CUDA {n['major']}, torch's is {major}")
            elif n.get("is_cuda_major") and major is None and ext.get("kind") != "torch":
                problems.append(f"CUDA {n['major']}, torch has no CUDA")
            if not n.get("found"):
                problems.append("not found by the loader")
            problem = "; ".join(problems)
            if problem:
                hl.append(len(rows))
                bad.append((ext, n, problem))
                explains += ids_for(sym, "library-not-found", library=n["soname"])
            rows.append([ext.get("name") or ext["path"], ext.get("kind") or "?", n["soname"],
                         wheels.get(n["soname"]) or "-", problem or "ok"])
    ev = [Evidence.of_table("CUDA sonames each library the training loads needs",
                            ["library", "kind", "needs", "nvidia-* wheel file", "problem"], rows, hl)] if rows else []
    if not exts:
        return [Finding(id=fid, status="ok", title="No library the training loads needs a CUDA soname",
                        detail=f"{torch_says}; neither torch's libraries nor the extensions, DeepSpeed's prebuilt "
                               "ops or the JIT-built ops it loads name libcudart, cuBLAS, NVRTC or another CUDA "
                               "library in DT_NEEDED.")]
    if not bad:
        return [Finding(id=fid, status="ok",
                        title=f"Every CUDA soname the training's libraries need fits torch's CUDA "
                              f"({count_of(len(rows), 'need', 'needs')})",
                        detail=f"{torch_says}; the loader finds every CUDA library the loaded objects name.",
                        evidence=ev)]
    ext, n, problem = bad[0]
    mismatch = major is not None and "torch's is" in problem
    first = f"{ext.get('name')} needs {n['soname']} ({problem})"
    loader_says = (f" The loader's error for it is '{n['soname']}: cannot open shared object file: No such file or "
                   "directory': no directory it searches holds that soname, because this environment's CUDA "
                   "libraries are another major's." if not n.get("found") else "")
    remedies = []
    seen: set[str] = set()
    for e, _n, _p in bad:
        if e["path"] not in seen and e.get("kind") != "torch":
            seen.add(e["path"])
            remedies.append(_rebuild(e, torch.get("cuda")))
    status = "fail" if (mismatch or not n.get("found")) else "warn"
    return [Finding(id=fid, status=status,
                    title=f"{first}: rebuild the op against this torch" if ext.get("kind") != "torch" else first,
                    detail=f"{torch_says}. {count_of(len(bad), 'CUDA need does', 'CUDA needs do')} not fit: "
                           + "; ".join(f"{e.get('name')} needs {x['soname']} ({p})" for e, x, p in bad[:6])
                           + "." + loader_says,
                    evidence=ev, remedies=remedies, explains=list(dict.fromkeys(explains)))]


@check(FID, title=TITLE, probes=("cudalookup",), layer="cuda-lookup",
       explains=("libcuda-lookup", "link-library-missing", "library-not-found", "cuda-stub", "cuda-error"),
       findings=(f"{FID}.stub", f"{FID}.libcuda", f"{FID}.triton", f"{FID}.link", f"{FID}.extensions"))
def check_cuda_lookup(facts: Facts, me: CheckSpec) -> list[Finding]:
    got = me.require(facts.of("cudalookup"), facts.why_not("cudalookup"), sub="not-checked")
    probs = cl.lookup_problems(got)
    out = _libcuda(me, got, probs, facts) + _triton(me, got, probs, facts) + _link(me, got, probs, facts)
    out += _extensions(me, got, facts)
    return out
