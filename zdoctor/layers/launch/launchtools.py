"""The program each DeepSpeed multi-node launcher backend needs on the launching node, as DeepSpeed checks
it (``backend_exists`` in deepspeed/launcher/multinode_runner.py: ``shutil.which`` on the launching shell's
PATH), and where it is looked for when that PATH lacks it.

When the launch spans more than one host (after --include/--exclude) or gives --force_multi, and not
--no_ssh, the launcher picks ``--launcher`` (default pdsh) and stops with "launcher 'pdsh' not installed."
when the program is missing (deepspeed/launcher/runner.py main, 0.3 to 0.19.8).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

#: --launcher value -> (the program DeepSpeed's backend_exists looks for, the logical package that has it).
BACKEND_TOOL: dict[str, tuple[str, str | None]] = {
    "pdsh": ("pdsh", "pdsh"),
    "openmpi": ("ompi_info", "openmpi"),
    "mpich": ("mpirun", None),
    "impi": ("mpirun", None),
    "slurm": ("sinfo", None),
    "mvapich": ("mpiname", None),
}
DEFAULT_BACKEND = "pdsh"
#: How each program says its version (what starting it to prove it runs looks like).
VERSION_FLAG = {"pdsh": "-V", "ompi_info": "--version", "mpirun": "--version", "sinfo": "--version",
                "mpiname": "-a"}
#: Folders a distribution installs these programs in that a login PATH may lack (RHEL's openmpi module path).
KNOWN_DIRS = ("/usr/bin", "/usr/local/bin", "/bin", "/usr/sbin", "/usr/lib64/openmpi/bin",
              "/usr/lib/x86_64-linux-gnu/openmpi/bin", "/usr/lib/aarch64-linux-gnu/openmpi/bin",
              "/opt/openmpi/bin", "/usr/lib64/mpich/bin", "/opt/slurm/bin")


def active_hosts(nodes: list[str], include: str | None, exclude: str | None) -> list[str]:
    """The hostfile's hosts the launch uses after --include / --exclude (``host1:0,1@host2``)."""
    def named(spec: str) -> list[str]:
        return [part.partition(":")[0] for part in spec.split("@") if part]
    if include:
        return [h for h in nodes if h in named(include)]
    if exclude:
        whole = [p.partition(":")[0] for p in exclude.split("@") if p and ":" not in p]
        return [h for h in nodes if h not in whole]
    return list(nodes)


def needs_backend(launch: dict[str, Any], nodes: list[str]) -> tuple[bool, str]:
    """Whether the DeepSpeed launch runs a multi-node backend, and why (or why not)."""
    opts = launch.get("options") or {}
    if launch.get("launcher") != "deepspeed":
        return False, "the launch does not use the DeepSpeed launcher"
    if opts.get("no_ssh"):
        return False, "--no_ssh: each node runs its own launcher"
    hosts = active_hosts(nodes, opts.get("include"), opts.get("exclude"))
    if opts.get("force_multi"):
        return True, "--force_multi"
    if len(hosts) > 1:
        return True, f"the launch spans {len(hosts)} hosts of the hostfile"
    return False, "the launch runs on one host: no multi-node backend is used"


def find_tool(tool: str, path: str | None) -> dict[str, Any]:
    """``{tool, on_path, elsewhere}``: where ``tool`` is on ``path`` (as ``shutil.which`` finds it), and else in
    the distributions' usual folders."""
    on_path = shutil.which(tool, path=path or "")
    elsewhere = None
    if not on_path:
        elsewhere = next((os.path.join(d, tool) for d in KNOWN_DIRS
                          if os.access(os.path.join(d, tool), os.X_OK)), None)
    return {"tool": tool, "on_path": on_path, "elsewhere": elsewhere}
