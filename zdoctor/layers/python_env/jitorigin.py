"""Which DeepSpeed install built a JIT op: read from the op's ``build.ninja``, compared with the install
the training uses now.

torch writes the absolute source paths into ``build.ninja`` (``build cpu_adam.o: compile
/…/site-packages/deepspeed/ops/csrc/adam/cpu_adam.cpp``), so the op dir records the DeepSpeed package
it was compiled from. That package's version is read from its ``git_version_info_installed.py`` (or
the ``deepspeed-X.dist-info`` beside it) when it is still there; a source file newer than the built
``.so`` means the op was compiled from an older copy of the sources at the same path.
"""

from __future__ import annotations

import os
import re
from typing import Any

from zdoctor.proc.userfile import open_regular_text

_COMPILE = re.compile(r"^build [^:]+: (?:compile|cuda_compile) (\S+)", re.M)
_VERSION = re.compile(r"^version\s*=\s*['\"]([^'\"]+)['\"]", re.M)
_DS_IN = re.compile(r"^(.*/deepspeed)/ops/csrc/")


def sources_of(ninja_text: str) -> list[str]:
    """The source files a build.ninja compiles."""
    return _COMPILE.findall(ninja_text or "")


def deepspeed_dir_of(sources: list[str]) -> str | None:
    """The ``…/deepspeed`` package dir the sources lie in (``…/deepspeed/ops/csrc/…``), or None."""
    for src in sources:
        m = _DS_IN.match(src)
        if m:
            return m.group(1)
    return None


def version_of(ds_dir: str) -> str | None:
    """The version of the DeepSpeed package at ``ds_dir``, from its files; None when unknown."""
    try:
        with open_regular_text(os.path.join(ds_dir, "git_version_info_installed.py"), encoding="utf-8",
                               errors="replace") as fh:
            m = _VERSION.search(fh.read(64 * 1024))
            if m:
                return m.group(1)
    except OSError:
        pass
    parent = os.path.dirname(ds_dir)
    try:
        for name in sorted(os.listdir(parent)):
            if name.startswith("deepspeed-") and name.endswith(".dist-info"):
                return name[len("deepspeed-"):-len(".dist-info")]
    except OSError:
        pass
    return None


def origin(op_dir: str, so_path: str | None) -> dict[str, Any]:
    """What built the op in ``op_dir``: deepspeed dir, its version now, sources newer than the .so."""
    out: dict[str, Any] = {"dir": op_dir, "deepspeed_dir": None, "version": None, "exists": None,
                           "newer_sources": [], "error": None}
    try:
        with open_regular_text(os.path.join(op_dir, "build.ninja"), encoding="utf-8", errors="replace") as fh:
            text = fh.read(256 * 1024)
    except OSError as exc:
        out["error"] = f"build.ninja: {exc.strerror or exc}"
        return out
    srcs = sources_of(text)
    ds_dir = deepspeed_dir_of(srcs)
    out["deepspeed_dir"] = ds_dir
    if not ds_dir:
        return out
    out["exists"] = os.path.isdir(ds_dir)
    if out["exists"]:
        out["version"] = version_of(ds_dir)
    if so_path and out["exists"]:
        try:
            so_mtime = os.stat(so_path).st_mtime
        except OSError:
            so_mtime = None
        if so_mtime is not None:
            for src in srcs[:64]:
                try:
                    if os.stat(src).st_mtime > so_mtime + 1:
                        out["newer_sources"].append(src)
                except OSError:
                    continue
    return out


def same_dir(a: str | None, b: str | None) -> bool | None:
    """Whether two package dirs are the same (after realpath); None when either is unknown."""
    if not a or not b:
        return None
    return os.path.realpath(a) == os.path.realpath(b)
