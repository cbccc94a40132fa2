"""DeepSpeed's behaviour that changed between releases, as data with its source, and how to tell which
behaviour the installed release has.

A release number alone is a weak key: the pull requests below are dated, but the first release that
carried each one is mostly unverified (``release`` says what was read from which release's sdist). So the
installed release is read from its own files (the op builders and the ZeRO code in the installed
package): the source decides, and only when the files cannot be read does the version fall back to
"unknown". ``CURRENT_READ_FROM`` is the release whose files the current rules were read from: a version
at or above it has them.
"""

from __future__ import annotations

import ast
import os
import re
from typing import Any

from zdoctor.proc.userfile import open_regular

#: The DeepSpeed release whose source the "current" column of every rule was read from.
CURRENT_READ_FROM = (0, 19, 8)

#: Each rule: id, what it is about, the old and the current behaviour, and where that was read.
RULES: list[dict[str, Any]] = [
    {"id": "nvcc-minor-tolerance",
     "about": "nvcc's CUDA release vs torch.version.cuda before a CUDA op build (op_builder/builder.py "
              "assert_no_cuda_mismatch)",
     "old": "the same major.minor only (one exception: nvcc 11.1 with torch built for 11.0, DeepSpeed PR 570, "
            "December 2020); any other minor mismatch raises 'Installed CUDA version X does not match ...'",
     "current": "two minors of one major pass when both are in the table cuda_minor_mismatch_ok",
     "sources": ["DeepSpeed PR 1139 '[builder] allow minor cuda version differences' (2021-06-07): the table",
                 "DeepSpeed PR 1329 (2021-08-26): 11.4 added", "DeepSpeed PR 2211 (2022-08-12): 11.7 added",
                 "DeepSpeed PR 2390: 11.8 added", "DeepSpeed PR 5591 (2024-05-30): 12.4 and 12.5 added",
                 "DeepSpeed PR 3436 (2023-05-03): DS_SKIP_CUDA_CHECK=1",
                 "read from the PyPI sdists: 0.3.16 has no table (exact match or 11.1-with-11.0); 0.4.0 has "
                 "it with 10.0-10.2 and 11.0-11.3 and no DS_SKIP_CUDA_CHECK"],
     "release": "0.4.0 has the table, 0.3.16 does not"},
    {"id": "libaio-detection",
     "about": "how async_io decides that libaio is there (ds_report's async_io 'compatible' column)",
     "old": "the Debian package database only (dpkg -l libaio-dev): NO on RPM and conda systems with libaio "
            "present, OKAY on a Debian host whose build would still fail",
     "current": "compiles and links a test program against -laio (honours CFLAGS/LDFLAGS); package managers "
                "are queried only to word the hint",
     "sources": ["DeepSpeed issue 1126 (the dpkg-only check)",
                 "DeepSpeed PR 1247 'test link against libaio using distutils' (2021-07-23)",
                 "DeepSpeed PR 1250 'query for libaio package using known package managers' (2021-07-24)",
                 "read from the 0.4.0 sdist: async_io.is_compatible -> libraries_installed(['libaio-dev']) -> "
                 "dpkg -l",
                 "tag v0.4.3 op_builder/async_io.py: libraries_installed(['libaio-dev']); tag v0.4.4 "
                 "op_builder/async_io.py: has_function('io_submit', ('aio',))",
                 "tag v0.4.0 op_builder/builder.py jit_load: 'Unable to JIT load the async_io op due to it not "
                 "being compatible'; setup.py builds an op only when op_enabled and is_compatible"],
     "release": "through 0.4.3 dpkg only; 0.4.4 is the first release with the link test",
     "first_current": "0.4.4",
     "old_consequence": "an op this check calls incompatible is neither JIT-loaded (builder.jit_load raises "
                        "RuntimeError) nor pre-built (setup.py skips it even with DS_BUILD_AIO=1)"},
    {"id": "zero12-pin-memory",
     "about": "offload_optimizer.pin_memory at ZeRO stage 1/2",
     "old": "the ZeRO-1/2 optimizer never reads it: the setting has no effect",
     "current": "read into cpu_offload_pin_memory: pinned host buffers only when it is true",
     "sources": ["read from runtime/zero/stage_1_and_2.py of DeepSpeed 0.19.8 (cpu_offload_pin_memory) and "
                 "runtime/zero/stage2.py of the 0.4.0 sdist (pins with cpu_offload, whatever pin_memory says); "
                 "the pull request that added it: unknown"],
     "release": "0.4.0 ignores it; the first release that reads it: unknown"},
    {"id": "wall-clock-timer-names",
     "about": "the timer names wall_clock_breakdown prints",
     "old": "forward_microstep / backward_microstep / backward_inner_microstep / backward_allreduce_microstep / "
            "step_microstep, and forward / backward / backward_inner / backward_allreduce / step",
     "current": "fwd_microstep / bwd_microstep / bwd_inner_microstep / bwd_allreduce_microstep / step_microstep, "
                "and fwd / bwd / bwd_inner / bwd_allreduce / step",
     "sources": ["runtime/engine.py FORWARD_MICRO_TIMER = 'forward_microstep' in older releases; fwd_microstep in "
                 "0.19.8; the pull request that renamed them: unknown"],
     "release": "0.4.0 prints the older names; the first release with the current ones: unknown"},
    {"id": "fp16-compute-capability",
     "about": "fp16 on a GPU of compute capability 6.x (accelerator/cuda_accelerator.py is_fp16_supported; the "
              "engine stops with 'Type fp16 is not supported on your device.' when it answers False)",
     "old": "compute capability 7.0 or newer only (`major >= 7`), with no way around it",
     "current": "7.0 or newer; 6.x too when DS_ALLOW_DEPRECATED_FP16=1 is set",
     "sources": ["read from accelerator/cuda_accelerator.py of DeepSpeed 0.19.8 (DS_ALLOW_DEPRECATED_FP16) and of "
                 "earlier releases with the accelerator abstraction (major >= 7 alone); the pull request that "
                 "added the switch: unknown"],
     "release": "0.19.8 has the switch; the first release with it: unknown"},
    {"id": "jit-arch-list-numbers",
     "about": "arch names in TORCH_CUDA_ARCH_LIST (Ampere, Hopper ...) for a JIT build of a CUDA op "
              "(op_builder/builder.py compute_capability_args, jit mode)",
     "old": "unknown",
     "current": "each entry is read as numbers (sorted by int() of its parts): a name stops the build with "
                "\"ValueError: invalid literal for int() with base 10: 'Hopper'\", though torch itself expands "
                "names",
     "sources": ["read from op_builder/builder.py of DeepSpeed 0.19.8 (the sort key int(part.split('+')[0]) for "
                 "part in cc.split('.')), and run: TORCH_CUDA_ARCH_LIST=Hopper raised that ValueError"],
     "release": "0.19.8 refuses names; since which release: unknown"},
]

RULES_BY_ID = {r["id"]: r for r in RULES}

#: Files of the installed package each rule is read from (first that exists), relative to deepspeed/.
RULE_FILES = {
    "nvcc-minor-tolerance": ("ops/op_builder/builder.py", "../op_builder/builder.py"),
    "libaio-detection": ("ops/op_builder/async_io.py", "../op_builder/async_io.py"),
    "zero12-pin-memory": ("runtime/zero/stage_1_and_2.py", "runtime/zero/stage2.py"),
    "wall-clock-timer-names": ("runtime/engine.py",),
    "fp16-compute-capability": ("accelerator/cuda_accelerator.py",),
    "jit-arch-list-numbers": ("ops/op_builder/builder.py", "../op_builder/builder.py"),
}
MAX_SOURCE_BYTES = 2 * 1024 * 1024

_TABLE = re.compile(r"^cuda_minor_mismatch_ok\s*=\s*(\{.*?^\})", re.S | re.M)


#: How the source tells each rule's behaviour (but nvcc-minor-tolerance's, which reads a table): the markers of
#: the current behaviour, those of the old one (a marker is strings that must all be in the file; the empty
#: marker is always there), and why neither is known when no marker is found.
SOURCE_MARKERS: dict[str, tuple[tuple[tuple[str, ...], ...], tuple[tuple[str, ...], ...], str]] = {
    # libraries_installed ran `dpkg -l`
    "libaio-detection": ((("has_function",),), (("dpkg",), ("libraries_installed",)),
                         "neither a link test nor a dpkg query in async_io.py"),
    "zero12-pin-memory": ((("offload_optimizer_config.pin_memory",), ("cpu_offload_pin_memory",)), ((),), ""),
    "wall-clock-timer-names": ((("'fwd_microstep'",), ('"fwd_microstep"',)),
                               (("'forward_microstep'",), ('"forward_microstep"',)), "no timer names in engine.py"),
    "fp16-compute-capability": ((("DS_ALLOW_DEPRECATED_FP16",),), (("def is_fp16_supported", "major >= 7"),),
                                "no compute capability test in is_fp16_supported"),
    "jit-arch-list-numbers": ((("int(part.split('+')[0]) for part in cc.split('.')",),), (),
                              "no numeric sort of the JIT arch list in builder.py"),
}


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """``"0.9.5+abc"`` -> ``(0, 9, 5)``; None when there is no leading number."""
    m = re.match(r"\s*(\d+(?:\.\d+)*)", text or "")
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def nvcc_table(text: str) -> dict[int, list[str]] | None:
    """The ``cuda_minor_mismatch_ok`` dict literal of a builder.py, or None when it has none."""
    m = _TABLE.search(text)
    if not m:
        return None
    try:
        value = ast.literal_eval(m.group(1))
    except (ValueError, SyntaxError):
        return None
    if not isinstance(value, dict):
        return None
    return {int(k): [str(v) for v in vs] for k, vs in value.items() if isinstance(vs, (list, tuple))}


def decide(rule_id: str, text: str) -> dict[str, Any]:
    """Which behaviour of ``rule_id`` the source ``text`` has: ``state`` old | current | unknown."""
    if rule_id == "nvcc-minor-tolerance":
        if "def assert_no_cuda_mismatch" not in text:
            return {"state": "unknown", "why": "no assert_no_cuda_mismatch in the file"}
        table = nvcc_table(text)
        if table is None and "cuda_minor_mismatch_ok" in text:
            return {"state": "unknown", "why": "cuda_minor_mismatch_ok is not a plain dict literal"}
        return {"state": "current" if table else "old", "table": table,
                "skip_env": "DS_SKIP_CUDA_CHECK" in text,
                "exception_11_1": table is None and ('"11.1"' in text or "'11.1'" in text)}
    current, old, why = SOURCE_MARKERS[rule_id]
    if _has_marker(text, current):
        return {"state": "current"}
    if _has_marker(text, old):
        return {"state": "old"}
    return {"state": "unknown", "why": why}


def _has_marker(text: str, markers: tuple[tuple[str, ...], ...]) -> bool:
    """Whether ``text`` holds every string of one of ``markers``."""
    return any(all(s in text for s in marker) for marker in markers)


def read_source(location: str, rel_paths: tuple[str, ...]) -> tuple[str | None, str | None, str | None]:
    """(path, text, error) of the first of ``rel_paths`` under ``location`` that exists."""
    for rel in rel_paths:
        path = os.path.normpath(os.path.join(location, rel))
        if not os.path.isfile(path):
            continue
        try:
            with open_regular(path) as fh:
                return path, fh.read(MAX_SOURCE_BYTES).decode("utf-8", errors="replace"), None
        except OSError as exc:
            return path, None, exc.strerror or str(exc)
    return None, None, f"none of {', '.join(rel_paths)} under {location}"


def installed_rules(location: str | None, version: str | None) -> dict[str, dict[str, Any]]:
    """Per rule: the state the installed release has (from its files), the file and how it was decided."""
    ver = parse_version(version)
    out: dict[str, dict[str, Any]] = {}
    for rule in RULES:
        rid = rule["id"]
        rec: dict[str, Any] = {"state": "unknown", "file": None, "how": None}
        if location:
            path, text, err = read_source(location, RULE_FILES[rid])
            if text is not None:
                rec.update(decide(rid, text))
                rec.update(file=path, how="read from the installed file")
            else:
                rec["why"] = err
        if rec["state"] == "unknown" and ver is not None and ver >= CURRENT_READ_FROM:
            rec.update(state="current", how=f"DeepSpeed {version} is not older than the release the current "
                                            f"rule was read from ({'.'.join(map(str, CURRENT_READ_FROM))})")
        out[rid] = rec
    return out
