"""Link-time ``undefined reference to`` errors of a build: the symbol, demangled, and the C++11 ABI rule.

GNU ld prints ``file.cpp:(.text+0x37): undefined reference to `greet(std::string const&)'`` (demangled;
the mangled name with ``--no-demangle``), gold ``undefined reference to 'NAME'``, lld
``ld.lld: error: undefined symbol: NAME``. An old-ABI ``std::string`` in the name while a library on the
link line defines the same function with ``std::__cxx11::basic_string`` (or the reverse) is a
``_GLIBCXX_USE_CXX11_ABI`` mismatch: the object must be compiled with the library's setting.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable
from typing import Any

from zdoctor.layers.libraries.symbols import abi_of, demangle, dynamic_symbols, normalize_abi

_GNU = re.compile(r"(?:(?P<where>[^\s:`']+):\([^)]*\): )?undefined reference to [`'](?P<sym>[^'\n]+)'")
_LLD = re.compile(r"^(?:\S*ld\.lld|\S*lld): error: undefined symbol: (?P<sym>.+?)\s*$", re.M)
_LLD_REF = re.compile(r"^>>> referenced by (?P<where>\S+)", re.M)
_SO = re.compile(r"\.so(?:\.\d+)*$")
#: Link-line libraries read at most, and defined names demangled per library.
MAX_LIBRARIES = 40
MAX_TWINS = 2000
SYSTEM_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib/x86_64-linux-gnu", "/lib64")


def parse_link_errors(text: str) -> list[dict[str, str | None]]:
    """Each distinct undefined reference in a build's output: ``symbol`` as printed (mangled or not),
    ``demangled`` (None for a C name) and ``where`` (the referencing file, when printed)."""
    found: list[tuple[str, str | None]] = []
    for m in _GNU.finditer(text or ""):
        found.append((m.group("sym").strip(), m.group("where")))
    for m in _LLD.finditer(text or ""):
        ref = _LLD_REF.search(text, m.end())
        found.append((m.group("sym").strip(), ref.group("where") if ref else None))
    mangled = [s for s, _ in found if s.startswith("_Z")]
    names = demangle(mangled) if mangled else {}
    out: list[dict[str, str | None]] = []
    seen: set[str] = set()
    for sym, where in found:
        if sym in seen:
            continue
        seen.add(sym)
        dem = names.get(sym) if sym.startswith("_Z") else (sym if "(" in sym or "::" in sym else None)
        out.append({"symbol": sym, "demangled": dem, "where": where})
    return out


def abi_of_name(symbol: str, demangled: str | None) -> int | None:
    """The C++ ABI a referenced name uses: 1 (``std::__cxx11``), 0 (the old ``std::string``), None."""
    if symbol.startswith("_Z"):
        return abi_of(symbol)
    d = demangled or ""
    if "std::__cxx11::" in d or "[abi:cxx11]" in d:
        return 1
    if "std::string" in d or "std::basic_string<" in d or "std::list<" in d:
        return 0
    return None


def link_libraries(texts: Iterable[str]) -> list[str]:
    """The shared libraries a link line names (``-L DIR``, ``-lNAME``, ``path/libx.so``), found on disk."""
    dirs: list[str] = []
    names: list[str] = []
    paths: list[str] = []
    for text in texts:
        for line in (text or "").splitlines():
            try:
                words = shlex.split(line)
            except ValueError:
                words = line.split()
            for i, w in enumerate(words):
                if w == "-L" and i + 1 < len(words):
                    dirs.append(words[i + 1])
                elif w.startswith("-L") and len(w) > 2:
                    dirs.append(w[2:])
                elif w.startswith("-l") and len(w) > 2 and not w.startswith("-l:"):
                    names.append(f"lib{w[2:]}.so")
                elif w.startswith("-l:") and len(w) > 3:
                    names.append(w[3:])
                elif w.startswith("/") and _SO.search(w):
                    paths.append(w)
    out = [p for p in paths if os.path.isfile(p)]
    for name in dict.fromkeys(names):
        for d in [*dict.fromkeys(dirs), *SYSTEM_LIB_DIRS]:
            cand = os.path.join(d, name)
            if os.path.isfile(cand):
                out.append(cand)
                break
    return list(dict.fromkeys(out))[:MAX_LIBRARIES]


def abi_twin(demangled: str, ref_abi: int, libraries: Iterable[str]) -> dict[str, Any] | None:
    """A library exporting the function ``demangled`` names under the other C++ ABI (path, name, abi)."""
    want = normalize_abi(demangled)
    base = want.split("(")[0].split("::")[-1].split("<")[0]
    token = f"{len(base)}{base}" if base else ""
    if not token:
        return None
    for path in libraries:
        defined = dynamic_symbols(path)["defined"]
        other = [s for s in defined if token in s and abi_of(s) not in (None, ref_abi)][:MAX_TWINS]
        for s, d in demangle(other).items():
            if d and normalize_abi(d) == want:
                return {"provider": path, "provider_symbol": d, "provider_abi": abi_of(s)}
    return None


def triage_link(ref: dict[str, str | None], libraries: list[str], torch_abi: bool | None) -> dict[str, Any]:
    """The cause of one undefined reference: ``abi-mismatch`` (with the library that has the other-ABI
    twin) or ``not-defined`` (no library on the link line defines it), with what was searched."""
    sym = str(ref["symbol"])
    dem = ref.get("demangled")
    ref_abi = abi_of_name(sym, dem)
    rec: dict[str, Any] = {"object": ref.get("where"), "symbol": sym, "demangled": dem, "object_abi": ref_abi,
                           "torch_abi": torch_abi, "link_time": True, "kind": "not-defined", "provider": None,
                           "provider_symbol": None, "provider_abi": None, "searched": list(libraries)}
    if dem and ref_abi is not None:
        twin = abi_twin(dem, ref_abi, libraries)
        if twin:
            rec.update(kind="abi-mismatch", **twin)
    return rec
