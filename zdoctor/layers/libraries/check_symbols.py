"""Check ``libs.symbols``: each ``undefined symbol`` of the live run, with its cause and the fix that fits."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from typing import Any

from zdoctor.core.model import Finding, Remedy
from zdoctor.core.packages import managers_of_owner
from zdoctor.core.registry import CheckSpec, Facts, check, predicate
from zdoctor.layers.libraries.check_libs import live_unchecked
from zdoctor.layers.libraries.symbols import library_for_prefix
from zdoctor.symptoms.match import ids_for
from zdoctor.trials.remedies import Plan

ABI_WORD: dict[Any, str] = {0: "the old ABI (_GLIBCXX_USE_CXX11_ABI=0)", 1: "the C++11 ABI (_GLIBCXX_USE_CXX11_ABI=1)"}


def _llp_without(dir_: str) -> str:
    return ('export LD_LIBRARY_PATH="$(printf %s "$LD_LIBRARY_PATH" | tr : "\\n" | grep -vxF '
            f'{shlex.quote(dir_)} | paste -sd: -)"')


def _tried(e: dict[str, Any]) -> list[Remedy]:
    """The environment-only workarounds the probe re-ran the command with, with what each re-run showed."""
    return [Plan.from_dict(p).to_remedy() for p in e.get("plans") or []]


def _abi_remedy(what: str, want: int, why: str) -> Remedy:
    return Remedy(title=f"Rebuild {what} with -D_GLIBCXX_USE_CXX11_ABI={want} (the ABI of {why})",
                  commands=[f"export CXXFLAGS=\"$CXXFLAGS -D_GLIBCXX_USE_CXX11_ABI={want}\"",
                            f"# then rebuild {shlex.quote(what)} (for a torch extension: against the installed "
                            "torch, with python -m pip install --no-build-isolation --force-reinstall PACKAGE)"])


def _link_finding(e: dict[str, Any], fid: str) -> Finding:
    """A build's ``undefined reference to``: the ABI twin on the link line, or nothing that defines it."""
    where = e.get("object") or "the object being linked"
    sym, dem = e["symbol"], e.get("demangled")
    shown = dem or sym
    ref_abi, torch_abi = e.get("object_abi"), e.get("torch_abi")
    lines = [f"The link failed: {where} references {shown}"
             + (f", compiled with {ABI_WORD[ref_abi]}" if ref_abi in ABI_WORD else "") + "."]
    if torch_abi is not None:
        lines.append(f"torch._C._GLIBCXX_USE_CXX11_ABI = {int(torch_abi)}.")
    if e["kind"] == "abi-mismatch":
        prov_abi = e.get("provider_abi")
        lines += [f"{e['provider']} defines the same function as {e.get('provider_symbol')}, built with "
                  f"{ABI_WORD.get(prov_abi, 'an unknown ABI')}.",
                  "The two were compiled with different _GLIBCXX_USE_CXX11_ABI settings, so std::string (and "
                  "std::list) arguments mangle differently and the linker cannot match them."]
        want = prov_abi if isinstance(prov_abi, int) and prov_abi in ABI_WORD else int(bool(torch_abi))
        return Finding(id=fid, status="fail",
                       title=f"Link failed: C++11 ABI mismatch with {os.path.basename(e['provider'])} "
                             f"(undefined reference to {shown})", detail="\n".join(lines),
                       remedies=[_abi_remedy(where, int(want), os.path.basename(e["provider"]))])
    searched = e.get("searched") or []
    lines.append(("No library on the link line or loaded by the run defines it under either C++ ABI (read: "
                  + ", ".join(os.path.basename(p) for p in searched[:12]) + ")" if searched else
                  "No library on the link line was found to read") +
                 ": the library that defines it is missing from the link line (-lNAME), or was built "
                 "without that function.")
    rems = []
    if torch_abi is not None and ref_abi in ABI_WORD and ref_abi != int(torch_abi):
        lines.append(f"It was compiled with {ABI_WORD[ref_abi]}, torch with {ABI_WORD[int(torch_abi)]}: a "
                     "torch function referenced with the other ABI is never found.")
        rems.append(_abi_remedy(where, int(torch_abi), "torch"))
    return Finding(id=fid, status="fail", title=f"Link failed: undefined reference to {shown}",
                   detail="\n".join(lines), remedies=rems)


def _finding(me: CheckSpec, e: dict[str, Any], i: int, distro: Mapping[str, Any] | None = None) -> Finding:
    obj = e.get("object") or "?"
    name = os.path.basename(obj)
    sym = e["symbol"]
    dem = e.get("demangled")
    fid = me.name + (f".{i + 1}" if i else "")
    if e.get("link_time"):
        return _link_finding(e, fid)
    if e.get("version_node"):
        return _version_node_finding(e, fid, distro)
    shown = f"{sym}" + (f" ({dem})" if dem else "")
    kind = e["kind"]
    if kind == "abi-mismatch":
        torch_abi = e.get("torch_abi")
        obj_abi, prov_abi = e.get("object_abi"), e.get("provider_abi")
        want = int(torch_abi) if torch_abi is not None else prov_abi
        lines = [f"{name} asks for {shown}, built with {ABI_WORD.get(obj_abi, 'an unknown ABI')}.",
                 f"{e['provider']} exports the same function as {e.get('provider_symbol')}, built with "
                 f"{ABI_WORD.get(prov_abi, 'an unknown ABI')}.",
                 "torch._C._GLIBCXX_USE_CXX11_ABI = " + (str(torch_abi) if torch_abi is not None else "unknown") + ".",
                 "The two were compiled with different _GLIBCXX_USE_CXX11_ABI settings, so std::string (and "
                 "std::list) arguments mangle differently and the loader cannot match them. Upgrading libstdc++ "
                 "does not help: the extension must be rebuilt with the ABI of the library it calls."]
        return Finding(id=fid, status="fail", title=f"{name}: C++11 ABI mismatch with "
                       f"{os.path.basename(e['provider'])} (undefined {dem or sym})",
                       detail="\n".join(lines),
                       remedies=[Remedy(title=f"Rebuild {name} with -D_GLIBCXX_USE_CXX11_ABI={want} (the ABI of "
                                              f"{'torch' if torch_abi is not None else 'the library it calls'})",
                                        commands=[f"export CXXFLAGS=\"$CXXFLAGS -D_GLIBCXX_USE_CXX11_ABI={want}\"",
                                                  "# then rebuild/reinstall the package that ships "
                                                  f"{shlex.quote(name)} from source against the installed torch, "
                                                  "e.g. python -m pip install --no-binary :all: --no-build-isolation "
                                                  "--force-reinstall PACKAGE"])])
    if kind == "shadowed":
        loaded, good = e["loaded_copy"], e["exporting_copy"]
        return Finding(id=fid, status="fail",
                       title=f"{name}: {e['library']} was loaded from {loaded}, a copy without {dem or sym}",
                       detail=f"{name} needs {e['library']} and calls {shown}. The process loaded {loaded}, which "
                              f"does not export it; {good} does. Another copy of the library shadows the one the "
                              "extension was built against (an LD_LIBRARY_PATH entry, a conda environment's lib "
                              "dir, or an earlier import).",
                       remedies=_tried(e) or [
                           Remedy(title=f"Stop loading {os.path.dirname(loaded)} first: drop it from LD_LIBRARY_PATH",
                                  commands=[_llp_without(os.path.dirname(loaded))]),
                           Remedy(title="Or put the directory of the copy that has it first",
                                  commands=[f'export LD_LIBRARY_PATH={shlex.quote(os.path.dirname(good))}'
                                            '"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"'])])
    if kind == "never-linked":
        lib = e["library"]
        return Finding(id=fid, status="fail", title=f"{name} was never linked against {lib} ({sym})",
                       detail=f"{name} calls {shown} from {lib}, but has no DT_NEEDED entry for it "
                              f"(it needs: {', '.join(e.get('needed') or []) or 'nothing'}). No copy is shadowed: "
                              f"the library was left off the link line (-l{lib[3:]}), so the symbol resolves only "
                              "when something else loaded it first.",
                       remedies=[Remedy(title=f"Rebuild {name} with -l{lib[3:]} on its link line; for a DeepSpeed "
                                              "JIT op, remove the op dir so a release that links it rebuilds it",
                                        commands=[f"# add -l{lib[3:]} to the extension's extra_ldflags, then rebuild"]),
                                 *(_tried(e) if "plans" in e else [
                                     Remedy(title=f"Workaround for one run: preload {lib}",
                                            commands=[f'export LD_PRELOAD={lib}.so"${{LD_PRELOAD:+:$LD_PRELOAD}}"'])])])
    if kind == "other-release":
        return _other_release(e, fid, name, shown, distro)
    looked = ["no loaded library exports it under another C++ ABI", "no other copy of a library it needs has it"]
    if not library_for_prefix(sym):
        looked.append("its prefix names no known library")
    return Finding(id=fid, status="fail", title=f"{name}: undefined symbol {dem or sym}",
                   detail=f"{name} needs {shown}" + (f" (version node {e['version']})" if e.get("version") else "")
                          + f". Read: {'; '.join(looked)}; {e.get('why') or 'the cause is not known'}.")


def _release_of(pkg: dict[str, Any]) -> str:
    return (f"{pkg.get('name')} {pkg.get('version') or '(version not recorded)'}, per its {pkg['manager']} metadata"
            if pkg.get("name") else "no package metadata names it")


def _version_node_finding(e: dict[str, Any], fid: str, distro: Mapping[str, Any] | None = None) -> Finding:
    """Another library's version node is missing: the loaded copy is another release (or shadows one)."""
    name = os.path.basename(str(e.get("object") or "?"))
    lib, have, node = e["library"], e["loaded_copy"], e["version"]
    pkg = e.get("package") or {}
    defines = [d for d in e.get("defines") or [] if d != lib]
    lines = [f"The loader said: {e.get('message') or node + ' not found'}",
             f"{name} needs version node {node} of {lib}. The loaded copy {have} ({_release_of(pkg)}) defines "
             + (", ".join(defines[-6:]) if defines else "no version node") + f": it is another release of {lib} "
             f"than the one {name} was built against."]
    if e["kind"] == "shadowed-release":
        lines.append(f"{e['exporting_copy']} defines {node}: the loader found the other copy first.")
        return Finding(id=fid, status="fail", title=f"{name} needs {node} of {lib}; the loaded {have} is another "
                       f"release, {e['exporting_copy']} has it", detail="\n".join(lines), remedies=_tried(e))
    lines.append(f"No other copy of {lib} zdoctor found defines it ({e.get('searched', 0)} directories searched).")
    rems = _package_remedies(pkg, name, f"defines {node}", lib, distro)
    return Finding(id=fid, status="fail",
                   title=f"{name} needs {node} of {lib}: the loaded copy ({pkg.get('name') or have} "
                         f"{pkg.get('version') or ''}".rstrip() + ") is another release, and no other copy found "
                         "has it",
                   detail="\n".join(lines), remedies=rems)


def _package_remedies(pkg: dict[str, Any], name: str, wanted: str, lib: str,
                      distro: Mapping[str, Any] | None = None, rebuild: bool = True) -> list[Remedy]:
    """Install the release of the library's package that ``name`` was built against, or (``rebuild``, where
    the installed library has what ``name`` asks for) rebuild ``name`` against it."""
    rems = []
    if pkg.get("manager") == "pip" and pkg.get("name"):
        rems.append(Remedy(title=f"Install the release of {pkg['name']} that {name} was built against (one that "
                                 f"{wanted}), replacing {pkg.get('version')}",
                           commands=["# the release the package of " + shlex.quote(name) + " names in its "
                                     "requirements, e.g.:",
                                     f"python -m pip install --upgrade {shlex.quote(str(pkg['name']))}"]))
    elif pkg.get("manager") in ("dpkg", "rpm") and pkg.get("name"):
        for pm in managers_of_owner(pkg["manager"], distro):
            rems.append(Remedy(title=f"Install the release of {pkg['name']} that {name} was built against, "
                                     f"replacing {pkg.get('version')} ({pm.label})",
                               commands=pm.upgrade(shlex.quote(str(pkg["name"]))), requires_root=True))
    if not rebuild:
        return rems
    rems.append(Remedy(title=f"Or rebuild {name} against the installed {lib}"
                             + (f" ({pkg['name']} {pkg.get('version')})" if pkg.get("name") else ""),
                       commands=[f"# rebuild the package that ships {shlex.quote(name)} from source on this node"]))
    return rems


def _other_release(e: dict[str, Any], fid: str, name: str, shown: str,
                   distro: Mapping[str, Any] | None = None) -> Finding:
    """The symbol's version node names a library whose only copy here is a release without the symbol."""
    lib, have, node = e["library"], e["loaded_copy"], e["version"]
    pkg = e.get("package") or {}
    release = _release_of(pkg)
    only = not e.get("other_copies")
    lines = [f"{name} asks for {shown} in version node {node}: that node is {lib}'s.",
             f"The loaded {lib} is {have} ({release}). It defines the node {node} but not {e['symbol']}: it is "
             f"another release of {lib} than the one {name} was built against, which exports it.",
             (f"It is the only copy of {lib} zdoctor found ({e.get('searched', 0)} directories searched: beside "
              "every loaded library, LD_LIBRARY_PATH, the environment's pip packages, CUDA toolkits, system dirs)."
              if only else f"Other copies found, none exporting it: {', '.join(e['other_copies'][:4])}."),
             f"Not offered: rebuilding {name} against the installed {lib}, because {have} does not export "
             f"{e['symbol']} (its dynamic symbols were read): {name}'s code calls it, so a rebuild would ask for it "
             "again."]
    rems = _package_remedies(pkg, name, f"exports {e['symbol']}", lib, distro, rebuild=False)
    return Finding(id=fid, status="fail",
                   title=f"{name}: the installed {lib} ({pkg.get('name') or have} {pkg.get('version') or ''}".rstrip()
                         + f") is another release: it lacks {shown}",
                   detail="\n".join(lines), remedies=rems)


@check("libs.symbols", title="Undefined symbols: ABI, shadowed or never-linked library",
       probes=("symbols", "livetrace"), optional=("toolchain",),
       explains=("undefined-symbol", "undefined-reference", "version-not-found"))
def check_symbols(facts: Facts, me: CheckSpec) -> list[Finding]:
    f = facts.of("symbols")
    if f is None or f.get("skipped"):
        why = (f.get("skipped") if f else None) or facts.why_not("symbols")
        return [me.not_checked(why)]
    errs = f.get("errors") or []
    nothing = live_unchecked(facts) if facts.of("livetrace") else None
    if not errs and nothing:
        return [me.finding(status="skip", title="Undefined symbols: not checked, the live run "
                           "loaded nothing of the training", detail=nothing)]
    if not errs:
        return [me.finding(status="ok", title="No undefined symbol in the live run",
                           detail=f"The live run's error output names no undefined symbol and no link-time "
                                  f"undefined reference "
                                  f"({f.get('loaded_count', 0)} objects loaded).")]
    ev = facts.evidence("symbols")
    out = []
    for i, e in enumerate(errs):
        fi = _finding(me, e, i, (facts.of("toolchain") or {}).get("distro"))
        fi.evidence = ev
        fi.explains = _explains(facts, e)
        out.append(fi)
    return out


def _explains(facts: Facts, e: dict[str, Any]) -> list[str]:
    """The symptoms this triage explains: the same symbol (and object, at run time), with a cause found."""
    if e.get("link_time"):
        return ids_for(facts, "undefined-reference", symbol=e["symbol"])
    if e.get("version_node"):
        return ids_for(facts, "version-not-found", version=e["version"], object=e.get("object"))
    if e.get("kind") == "unknown":
        return []
    return ids_for(facts, "undefined-symbol", symbol=e["symbol"], object=e.get("object"))


@predicate("undefined_symbol", doc="the live run failed on an undefined symbol, a link-time undefined reference "
           "or another library's missing version node", probes=("symbols",))
def undefined_symbol(facts: Facts) -> bool:
    return bool((facts.of("symbols") or {}).get("errors"))
