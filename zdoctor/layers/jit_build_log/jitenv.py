"""What torch would write into a JIT op's ``build.ninja`` in this environment, against what the op's
build.ninja says: each difference changes the command line, and ninja rebuilds ("command line changed").

torch (torch/utils/cpp_extension.py ``_write_ninja_file``) rewrites build.ninja at every load from the
environment it runs in: ``cxx`` is ``$CXX`` or ``c++``, behind ``ccache``/``sccache`` when one is on PATH
and the torch release wraps compilers (``_wrap_compiler``, unless TORCH_NO_COMPILER_WRAPPER is set);
``nvcc`` is ``$PYTORCH_NVCC`` or ``$CUDA_HOME/bin/nvcc``; the cflags hold ``-isystem`` for torch's headers and
the interpreter's include directory; DeepSpeed's JIT hands torch the arch list (its ``-gencode`` flags).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from typing import Any

from zdoctor.proc.runner import which_all
from zdoctor.proc.userfile import read_prefix

WRAPPERS = ("ccache", "sccache")
_ISYSTEM = re.compile(r"-isystem\s+(\S+)")


def torch_wraps_compilers(torch_location: str | None) -> bool | None:
    """Whether the installed torch puts ccache/sccache in front of the compiler (read from its
    cpp_extension.py); None when the file cannot be read."""
    if not torch_location:
        return None
    try:
        data, _cut = read_prefix(os.path.join(torch_location, "utils", "cpp_extension.py"), 1024 * 1024)
    except OSError:
        return None
    return b"def _wrap_compiler" in data


def expected_cxx(env: Mapping[str, str], wraps: bool | None) -> tuple[str | None, str]:
    """The ``cxx`` value torch writes for ``env``, and how it was decided; None when not known."""
    compiler = env.get("CXX") or "c++"
    how = "$CXX" if env.get("CXX") else "c++ ($CXX is not set)"
    if wraps is None:
        return None, "whether this torch wraps the compiler in ccache/sccache is not known"
    if wraps and not env.get("TORCH_NO_COMPILER_WRAPPER"):
        for w in WRAPPERS:
            if which_all(w, env.get("PATH")):
                return shlex.join([w, compiler]), f"{how}, behind {w} (on PATH; torch wraps compilers)"
    return shlex.join([compiler]), how


def expected_nvcc(env: Mapping[str, str], cuda_home: str | None, wraps: bool | None) -> str | None:
    """The ``nvcc`` value torch writes, or None when it is not known."""
    if env.get("PYTORCH_NVCC"):
        return env["PYTORCH_NVCC"]
    if not cuda_home or wraps is None:
        return None
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    if wraps and not env.get("TORCH_NO_COMPILER_WRAPPER"):
        for w in WRAPPERS:
            if which_all(w, env.get("PATH")):
                return shlex.join([w, nvcc])
    return shlex.join([nvcc])


def differences(variables: Mapping[str, str], now: Mapping[str, Any]) -> list[dict[str, str]]:
    """``[{what, build, now}]``: where the op's build.ninja (its top-level ``variables``) differs from what
    torch would write now (``now``: cxx, nvcc, torch_include, python_include, each None when not known)."""
    out: list[dict[str, str]] = []
    for key, what in (("cxx", "the C++ compiler (cxx)"), ("nvcc", "nvcc")):
        built = variables.get(key)
        want = now.get(key)
        if built is not None and want is not None and built.strip() != want:
            out.append({"what": what, "build": built.strip(), "now": want})
    includes = _ISYSTEM.findall(variables.get("cflags", ""))
    for key, what, test in (("torch_include", "torch's headers", lambda p: p.endswith("/torch/include")),
                            ("python_include", "the Python headers", lambda p: "/include/python" in p)):
        want = now.get(key)
        built = next((p for p in includes if test(p)), None)
        if built is not None and want and os.path.normpath(built) != os.path.normpath(want):
            out.append({"what": what, "build": built, "now": want})
    return out
