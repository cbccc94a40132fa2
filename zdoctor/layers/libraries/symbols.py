"""Triage of ``undefined symbol`` errors: what the symbol is, and why the loaded libraries lack it.

An ``ImportError: /x/op.so: undefined symbol: SYM`` (or ``symbol lookup error``) has three common causes:

- **C++11 ABI mismatch**: the object was compiled with the other ``_GLIBCXX_USE_CXX11_ABI`` than the
  library that defines the function (torch: ``torch._C._GLIBCXX_USE_CXX11_ABI``). The demangled names
  then differ only in ``std::__cxx11::basic_string`` vs ``std::string`` (or ``std::__cxx11::list`` ...).
- **Shadowed library**: the object needs ``libX.so.N`` and the process loaded a copy of it that lacks the
  symbol (an older conda ``libcusparse`` on LD_LIBRARY_PATH before torch's own), while another copy on
  the machine exports it.
- **Never linked**: no library the object needs exports the symbol and no copy of them does either: the
  object was built without ``-lcurand`` (say) and relies on something else having loaded it.

Every ELF read is bounded; nothing here raises on unreadable or hostile files.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from typing import Any

from zdoctor.proc.userfile import open_regular
from zdoctor.readers.elf import read_elf
from zdoctor.readers.owner import package_of

UNDEFINED = re.compile(r"(?P<obj>/[^\s:]+?\.so[.\d]*)?:? ?(?:undefined symbol|symbol lookup error: [^:]+: "
                       r"undefined symbol): (?P<sym>[A-Za-z_][\w.$@]*)(?:, version (?P<ver>[\w.@+-]+))?")
#: Library a symbol prefix belongs to (CUDA math libraries, NCCL, cuDNN), for the never-linked case.
PREFIX_LIBRARY = (("curand", "libcurand"), ("cublasLt", "libcublasLt"), ("cublas", "libcublas"),
                  ("cusparse", "libcusparse"), ("cusolver", "libcusolver"), ("cufft", "libcufft"),
                  ("nccl", "libnccl"), ("cudnn", "libcudnn"), ("cudaGraph", "libcudart"), ("cuda", "libcudart"),
                  ("nvrtc", "libnvrtc"), ("aio_", "libaio"), ("io_submit", "libaio"))
MAX_SYMBOLS = 400_000
MAX_CANDIDATES = 64
#: Loaded libraries whose exports are read when looking for the other-ABI twin of a symbol.
MAX_SCANNED = 80
_STRING_NEW = "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >"
_STRING_OLD = "std::basic_string<char, std::char_traits<char>, std::allocator<char> >"


def parse_undefined(text: str) -> list[dict[str, str | None]]:
    """Each distinct ``(object, symbol)`` of the undefined-symbol errors in ``text``."""
    out: list[dict[str, str | None]] = []
    for m in UNDEFINED.finditer(text or ""):
        line_start = (text or "").rfind("\n", 0, m.start()) + 1
        if "lld: error:" in text[line_start:m.start() + 1]:
            continue  # lld's link-time "undefined symbol": the build's error, read by linkerrors
        rec = {"object": m.group("obj"), "symbol": m.group("sym"), "version": m.group("ver")}
        if rec not in out:
            out.append(rec)
    return out


def demangle(symbols: Iterable[str]) -> dict[str, str | None]:
    """Demangled names by ``c++filt`` (None for a C symbol, or where c++filt is missing)."""
    syms = [s for s in symbols if s]
    tool = shutil.which("c++filt")
    if not syms or tool is None:
        return {s: None for s in syms}
    try:
        res = subprocess.run([tool], input="\n".join(syms) + "\n", capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return {s: None for s in syms}
    lines = res.stdout.splitlines()
    out: dict[str, str | None] = {}
    for i, s in enumerate(syms):
        d = lines[i] if i < len(lines) else s
        out[s] = d if d != s else None
    return out


def abi_of(mangled: str) -> int | None:
    """1 when a mangled name uses the C++11 ABI (``B5cxx11`` / ``NSt7__cxx11``), 0 when it uses the old
    ``std::string`` (``Ss``), None when it shows neither."""
    if "cxx11" in mangled:
        return 1
    if re.search(r"(?:^_Z.*[^A-Za-z]|RK|N)Ss", mangled):
        return 0
    return None


def normalize_abi(demangled: str) -> str:
    """The demangled name with the ABI namespace removed, so both ABIs of one function compare equal."""
    return demangled.replace(_STRING_NEW, "std::string").replace(_STRING_OLD, "std::string").replace(
        "std::__cxx11::", "std::").replace("[abi:cxx11]", "")


def dynamic_symbols(path: str) -> dict[str, Any]:
    """``defined`` and ``undefined`` dynamic symbol names of an ELF file, ``needed`` and ``error``."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    out: dict[str, Any] = {"defined": set(), "undefined": set(), "needed": [], "error": None}
    try:
        with open_regular(path) as fh:
            elf = ELFFile(fh)
            dyn = elf.get_section_by_name(".dynsym")
            if dyn is not None:
                for i, sym in enumerate(dyn.iter_symbols()):
                    if i >= MAX_SYMBOLS:
                        break
                    name = sym.name.split("@")[0]
                    if not name:
                        continue
                    if sym["st_shndx"] == "SHN_UNDEF":
                        out["undefined"].add(name)
                    else:
                        out["defined"].add(name)
            for sec in elf.iter_sections():
                if isinstance(sec, DynamicSection):
                    out["needed"] = [t.needed for t in sec.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
    except (OSError, ELFError, ValueError, KeyError, IndexError, AssertionError, UnicodeDecodeError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:200]
    except Exception as exc:  # noqa: BLE001 - pyelftools raises assorted types on hostile input
        out["error"] = f"{type(exc).__name__}: {exc}"[:200]
    return out


def library_for_prefix(symbol: str) -> str | None:
    """The library a C symbol's prefix names (``curandCreateGenerator`` -> ``libcurand``)."""
    for prefix, lib in PREFIX_LIBRARY:
        if symbol.startswith(prefix):
            return lib
    return None


def candidate_copies(soname: str, dirs: Iterable[str]) -> list[str]:
    """Existing files named ``soname`` in ``dirs`` (in order, distinct by realpath), bounded."""
    out, seen = [], set()
    for d in dirs:
        path = os.path.join(d, soname)
        if os.path.isfile(path):
            real = os.path.realpath(path)
            if real not in seen:
                seen.add(real)
                out.append(path)
        if len(out) >= MAX_CANDIDATES:
            break
    return out


def search_dirs(env: Mapping[str, str], loaded: Iterable[str], site_dirs: Iterable[str] = ()) -> list[str]:
    """Where other copies of a library are looked for: beside every loaded library, LD_LIBRARY_PATH,
    the pip ``nvidia/*/lib`` and ``torch/lib`` dirs of the environment, CUDA toolkits and system dirs."""
    dirs: list[str] = []
    dirs += [os.path.dirname(p) for p in loaded if p]
    dirs += [d for d in (env.get("LD_LIBRARY_PATH") or "").split(":") if d]
    for site in site_dirs:
        dirs += sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib")))[:40]
        dirs.append(os.path.join(site, "torch", "lib"))
    dirs += sorted(glob.glob("/usr/local/cuda*/lib64"))[:8]
    dirs += ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib/x86_64-linux-gnu", "/lib64"]
    return list(dict.fromkeys(os.path.normpath(d) for d in dirs))


def own_dirs(obj: str | None) -> list[str]:
    """The directories ``obj``'s own RUNPATH (else RPATH) names, $ORIGIN expanded."""
    if not obj or not os.path.isfile(obj):
        return []

    elf = read_elf(obj)
    origin = os.path.dirname(os.path.realpath(obj))
    return [d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin)
            for d in ((elf.runpath or elf.rpath or "").split(":")) if d]


def triage(obj: str | None, symbol: str, loaded: Mapping[str, str], env: Mapping[str, str],
           torch_abi: bool | None, site_dirs: Iterable[str] = (), version: str | None = None) -> dict[str, Any]:
    """The cause of ``obj``'s undefined ``symbol`` (asked for in version node ``version``, when the loader
    named one) in a process that loaded ``loaded`` (soname or name -> path). ``kind``: abi-mismatch |
    shadowed | other-release | never-linked | unknown, with what shows it."""
    dem = demangle([symbol]).get(symbol)
    rec: dict[str, Any] = {"object": obj, "symbol": symbol, "version": version, "demangled": dem, "kind": "unknown",
                           "object_abi": abi_of(symbol), "torch_abi": torch_abi, "provider": None,
                           "provider_symbol": None, "provider_abi": None, "needed": [], "loaded_copy": None,
                           "exporting_copy": None, "library": None, "why": None}
    info = dynamic_symbols(obj) if obj and os.path.isfile(obj) else {"needed": [], "error": "object not found"}
    rec["needed"] = list(info.get("needed") or [])
    # the libraries the object names first: the provider is almost always one of them (bounded scan)
    loaded_paths = sorted(dict.fromkeys(p for p in loaded.values() if p),
                          key=lambda p: os.path.basename(p) not in rec["needed"])[:MAX_SCANNED]
    # 1. the same function under the other ABI, exported by a loaded library
    if dem and rec["object_abi"] is not None:
        want = normalize_abi(dem)
        base = want.split("(")[0].split("::")[-1].split("<")[0]
        token = f"{len(base)}{base}" if base else ""
        for path in loaded_paths:
            ds = dynamic_symbols(path)
            other = [s for s in ds["defined"] if token in s and ("cxx11" in s) != ("cxx11" in symbol)
                     and abi_of(s) is not None][:2000]
            if not other:
                continue
            names = demangle(other)
            for s, d in names.items():
                if d and normalize_abi(d) == want:
                    rec.update(kind="abi-mismatch", provider=path, provider_symbol=d, provider_abi=abi_of(s))
                    return rec
    # 2. a library the object needs, loaded from a copy that lacks the symbol while another copy has it
    dirs = search_dirs(env, loaded_paths, site_dirs)
    dirs = list(dict.fromkeys([*own_dirs(obj), *dirs]))
    for soname in rec["needed"]:
        have = loaded.get(soname)
        if not have:
            continue
        if symbol in dynamic_symbols(have)["defined"]:
            rec["why"] = f"{have} exports it"
            return rec
        for cand in candidate_copies(soname, dirs):
            if os.path.realpath(cand) == os.path.realpath(have):
                continue
            if symbol in dynamic_symbols(cand)["defined"]:
                rec.update(kind="shadowed", library=soname, loaded_copy=have, exporting_copy=cand)
                return rec
    # 3. the version node names the library, and its only copy here is a release without the symbol
    if version:

        for soname in rec["needed"]:
            have = loaded.get(soname)
            if have and version in (read_elf(have).verdef or []):
                others = [c for c in candidate_copies(soname, dirs) if os.path.realpath(c) != os.path.realpath(have)]
                rec.update(kind="other-release", library=soname, loaded_copy=have, package=package_of(have),
                           other_copies=others, searched=len(dirs))
                return rec
    # 4. nothing the object needs could provide it
    lib = library_for_prefix(symbol)
    if lib and not any(n.startswith(lib + ".so") for n in rec["needed"]):
        rec.update(kind="never-linked", library=lib,
                   why=f"{os.path.basename(obj or '?')} has no DT_NEEDED entry for {lib}.so")
    return rec


def triage_version(error: Mapping[str, Any], env: Mapping[str, str], loaded: Iterable[str],
                   site_dirs: Iterable[str] = ()) -> dict[str, Any]:
    """A missing version node of a library other than libstdc++ and glibc (``libfoo.so.1: version `FOO_2'
    not found (required by op.so)``): the loaded copy's nodes, its package release, and any other copy here
    that defines the node. ``kind``: other-release (no copy here has it) | shadowed-release (another does)."""
    provider, version = str(error.get("provider") or ""), str(error.get("version") or "")
    info = read_elf(provider)
    soname = info.soname if info.ok and info.soname else os.path.basename(provider)
    dirs = list(dict.fromkeys([*own_dirs(error.get("required_by")), *search_dirs(env, loaded, site_dirs)]))
    others = [c for c in candidate_copies(soname, dirs) if os.path.realpath(c) != os.path.realpath(provider)]
    having = [c for c in others if version in (read_elf(c).verdef or [])]
    return {"object": error.get("required_by"), "symbol": None, "version": version, "version_node": True,
            "kind": "shadowed-release" if having else "other-release", "library": soname, "loaded_copy": provider,
            "defines": list(info.verdef or []) if info.ok else None, "package": package_of(provider),
            "exporting_copy": having[0] if having else None, "other_copies": others, "searched": len(dirs),
            "message": error.get("message")}
