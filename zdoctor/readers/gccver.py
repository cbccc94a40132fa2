"""Pure parsers for compiler identities: ``--version`` banners, torch's build config, toolsets."""

from __future__ import annotations

import re
from typing import Any

from zdoctor.readers.versions import GCC_GLIBCXX

_NUM = r"\d+(?:\.\d+)*"
_GCC_LINE = re.compile(rf"^(?P<prog>\S+)\s+\((?P<vendor>[^)]*)\)\s+(?P<version>{_NUM})(?P<rest>.*)$")
_CLANG_LINE = re.compile(rf"^(?P<vendor>.*?)\s*clang version\s+(?P<version>{_NUM})(?P<rest>.*)$")
_ANY_VERSION = re.compile(r"\b(\d+\.\d+(?:\.\d+)*)\b")
_TOOLSET = re.compile(r"/opt/rh/((?:devtoolset|gcc-toolset)-(\d+))(?:/|$)")
_TORCH_COMPILER = re.compile(r"^\s*-\s*(GCC|clang|MSVC)\s+(\S+)\s*$", re.MULTILINE)
_TORCH_SETTING = re.compile(r"(?:^|[\s,])([A-Z][A-Z0-9_]*)=([^,\n]*)")


def version_tuple(text: str | None) -> tuple[int, ...]:
    """``"11.4.0"`` -> ``(11, 4, 0)``; leading digits only, ``()`` when there are none."""
    m = re.match(_NUM, (text or "").strip())
    return tuple(int(p) for p in m.group(0).split(".")) if m else ()


def parse_version_output(text: str) -> dict[str, Any]:
    """Identify a compiler from its ``--version`` output.

    Returns ``family`` (gcc | clang | unknown), ``version`` ("11.4.0" or None), ``major`` (int or
    None), ``vendor`` (the distribution string, e.g. "Ubuntu 11.4.0-1ubuntu1~22.04") and the
    ``first_line``.
    """
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    out: dict[str, Any] = {"family": "unknown", "version": None, "major": None, "vendor": None,
                           "first_line": first}
    if not first:
        return out
    clang = _CLANG_LINE.match(first)
    gcc = _GCC_LINE.match(first)
    if clang:
        trailing = re.search(r"\(([^)]*)\)\s*$", clang.group("rest"))
        vendor = clang.group("vendor").strip() or (trailing.group(1).strip() if trailing else "")
        out.update(family="clang", version=clang.group("version"), vendor=vendor or None)
    elif gcc and ("Free Software Foundation" in text or "gcc" in gcc.group("vendor").lower()
                  or re.search(r"(gcc|g\+\+|\bcc|c\+\+)(-\d+)?$", gcc.group("prog"))):
        vendor = gcc.group("vendor").strip()
        trailing = re.search(r"\(([^)]*)\)\s*$", gcc.group("rest"))
        if vendor == "GCC" and trailing:  # "g++ (GCC) 11.2.1 20220127 (Red Hat 11.2.1-9)"
            vendor = trailing.group(1).strip()
        out.update(family="gcc", version=gcc.group("version"), vendor=vendor or None)
    else:
        m = _ANY_VERSION.search(first)
        out["version"] = m.group(1) if m else None
    ver = version_tuple(out["version"])
    out["major"] = ver[0] if ver else None
    return out


def glibcxx_for_gcc(version: str | None) -> str | None:
    """The newest GLIBCXX version node the libstdc++ of GCC ``version`` provides (None if unknown)."""
    ver = version_tuple(version)
    if not ver:
        return None
    best = None
    ver = (ver + (0, 0, 0))[:3]
    for since, glibcxx, _cxxabi in GCC_GLIBCXX:
        if ver >= (since + (0, 0, 0))[:3]:
            best = glibcxx
    return best


def toolset_of(path: str | None) -> str | None:
    """``"devtoolset-9"`` / ``"gcc-toolset-13"`` when ``path`` lies in a Red Hat /opt/rh toolset."""
    m = _TOOLSET.search(path or "")
    return m.group(1) if m else None


def toolset_bin(path_entry: str) -> str | None:
    """The toolset name when a PATH entry is a toolset's ``root/usr/bin``-style directory."""
    return toolset_of(path_entry.rstrip("/") + "/")


def parse_torch_config(text: str | None) -> dict[str, Any]:
    """The build facts in ``torch.__config__.show()``: compiler, its version, CXX_COMPILER, C++ std.

    ``compiler`` is "GCC", "clang" or "MSVC" as torch prints it; ``version`` is as printed
    ("13.3"). ``settings`` holds every ``KEY=value`` of the "Build settings" line.
    """
    text = text or ""
    out: dict[str, Any] = {"compiler": None, "version": None, "major": None, "cxx_compiler": None,
                           "toolset": None, "cxx_std": None, "cuda_runtime": None, "settings": {}}
    m = _TORCH_COMPILER.search(text)
    if m:
        out["compiler"], out["version"] = m.group(1), m.group(2)
        ver = version_tuple(m.group(2))
        out["major"] = ver[0] if ver else None
    std = re.search(r"C\+\+ Version:\s*(\d+)", text)
    out["cxx_std"] = std.group(1) if std else None
    cuda = re.search(r"CUDA Runtime\s+(" + _NUM + ")", text)
    out["cuda_runtime"] = cuda.group(1) if cuda else None
    build = re.search(r"Build settings:(.*)$", text, re.MULTILINE)
    if build:
        out["settings"] = {k: v.strip() for k, v in _TORCH_SETTING.findall(build.group(1))}
    cxx = out["settings"].get("CXX_COMPILER")
    if cxx:
        out["cxx_compiler"] = cxx
        out["toolset"] = toolset_of(cxx)
    return out
