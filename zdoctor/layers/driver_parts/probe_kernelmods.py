"""Probe ``kernel_modules``: whether the running kernel has an NVIDIA module on disk, and which installed
kernels do (:mod:`zdoctor.layers.driver_parts.kernelmods`), with ``dkms status`` run to show what DKMS built.

Facts: ``root`` (the module root read), ``running`` (``uname -r``), ``kernels`` (each installed kernel's
tree: its NVIDIA module files with their version, whether its headers are there), ``running_tree``,
``others_with_module``, ``loaded`` (whether ``nvidia`` is in ``/proc/modules``; None when that cannot be read),
``dkms`` (installed, exit code, its lines) and ``distro``. No module root at all (a container sees none):
``skipped`` with why.
"""

from __future__ import annotations

import os
from typing import Any

from zdoctor.core.factstypes import KernelModulesFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import probe
from zdoctor.layers.driver_parts import kernelmods
from zdoctor.layers.toolchain.probe_toolchain import read_os_release
from zdoctor.proc.runner import run, which_all
from zdoctor.readers import kmod

DKMS_TIMEOUT = 20.0
#: Where dkms is looked for besides the job's PATH (it lives in sbin, which a user's PATH may lack).
SBIN_PATH = "/usr/sbin:/sbin:/usr/bin:/bin:/usr/local/sbin"


def run_dkms_status(path: str | None) -> tuple[dict[str, Any], list[Evidence]]:
    """``dkms status``, run bounded through the runner; ``installed`` False when no dkms is on the path."""
    search = ":".join(p for p in (path, SBIN_PATH) if p)
    found = which_all("dkms", search)
    if not found:
        return {"installed": False, "path": None, "exit_code": None, "entries": [],
                "error": f"dkms is not installed (not found on {search})"}, []
    ev = run([found[0], "status"], timeout=DKMS_TIMEOUT, label="dkms status")
    error = ev.error or (f"dkms status exited {ev.exit_code}: {(ev.stderr or '').strip()[:200]}"
                         if ev.exit_code != 0 else None)
    return {"installed": True, "path": found[0], "exit_code": ev.exit_code, "error": error,
            "entries": kernelmods.parse_dkms_status(ev.stdout or "")}, [ev]


def _table(facts: dict[str, Any]) -> Evidence:
    rows = []
    for k in facts["kernels"]:
        mods = "; ".join(f"{m['path']} ({m.get('version') or 'version unknown'})" for m in k["nvidia"]) or "none"
        rows.append([k["release"] + (" (running)" if k["release"] == facts["running"] else ""), mods,
                     "yes" if k["headers"] else "no", k.get("truncated") or "-"])
    if not any(k["release"] == facts["running"] for k in facts["kernels"]):
        rows.insert(0, [f"{facts['running']} (running)", f"no {facts['root']}/{facts['running']} directory", "no",
                        "-"])
    hl = [i for i, r in enumerate(rows) if r[0].endswith("(running)") and r[1].startswith(("none", "no "))]
    return Evidence.of_table("NVIDIA kernel modules per installed kernel",
                             ["kernel", "NVIDIA module files", "headers (build)", "walk stopped"], rows, hl)


def collect(*, root: str = kernelmods.MODULE_ROOT, release: str | None = None, path: str | None = None,
            proc_modules: str = "/proc/modules") -> tuple[dict[str, Any], list[Evidence]]:
    """The facts above; ``root`` and ``release`` are parameters so a test reads a tree it built."""
    running = release or os.uname().release
    kernels, err = kernelmods.installed_kernels(root)
    text = kmod.read_text(proc_modules)
    loaded = "nvidia" in kmod.parse_proc_modules(text) if text is not None else None
    if err is not None:
        return {"root": root, "running": running, "kernels": [], "kernels_error": err, "loaded": loaded,
                "skipped": f"no kernel module tree to read ({err}): a container, or a node without "
                           f"{kernelmods.MODULE_ROOT}"}, []
    trees = [kernelmods.kernel_tree(root, k) for k in kernels]
    if running not in kernels and os.path.isdir(os.path.join(root, running)):
        trees.append(kernelmods.kernel_tree(root, running))  # past MAX_KERNELS: the running one still counts
    running_tree = next((t for t in trees if t["release"] == running), None)
    dkms, evidence = run_dkms_status(path)
    facts: dict[str, Any] = {
        "root": root, "running": running, "kernels": trees, "kernels_error": None, "running_tree": running_tree,
        "others_with_module": [t["release"] for t in trees if t["release"] != running and t["nvidia"]],
        "loaded": loaded, "dkms": dkms, "distro": read_os_release()}
    return facts, [_table(facts), *evidence]


@probe("kernel_modules", title="The NVIDIA kernel module of each installed kernel, and dkms status", timeout=40,
       background=True, facts=KernelModulesFacts)
def kernel_modules_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    """Whether the running kernel has an NVIDIA module on disk, which other kernels have one, and DKMS's list."""
    return collect(path=os.environ.get("PATH"))
