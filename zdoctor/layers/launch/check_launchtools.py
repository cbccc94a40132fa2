"""Check ``launcher.tools``: a DeepSpeed launch across hosts finds the program of its multi-node backend
(pdsh by default, ompi_info for --launcher openmpi ...) on the launching shell's PATH."""

from __future__ import annotations

import os
import shlex

from zdoctor.core.model import Finding, Remedy
from zdoctor.core.packages import managers, package_name
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.layers.launch.launchtools import BACKEND_TOOL
from zdoctor.symptoms.match import ids_for

CID = "launcher.tools"
LAUNCHER_MISSING = "launcher-missing"


def _with_launcher(command: str | None, backend: str) -> str:
    """The DeepSpeed launch command with ``--launcher BACKEND`` (any earlier one dropped)."""
    words = shlex.split(command or "deepspeed train.py")
    out: list[str] = []
    skip = False
    for w in words:
        if skip or w.startswith("--launcher="):
            skip = False
            continue
        if w == "--launcher":
            skip = True
            continue
        out.append(w)
    at = next((i + 1 for i, w in enumerate(out) if os.path.basename(w) in ("deepspeed", "ds")), 1)
    return shlex.join([*out[:at], "--launcher", backend, *out[at:]])


@check(CID, title="The DeepSpeed launcher's multi-node backend is installed", probes=("launcher_tools",),
       optional=("launch", "toolchain"), explains=(LAUNCHER_MISSING,), layer="launch")
def check_launcher_tools(facts: Facts, me: CheckSpec) -> list[Finding]:
    tf = me.require(facts.of("launcher_tools"), facts.why_not("launcher_tools"), sub="not-checked")
    ev = facts.evidence("launcher_tools")
    if not tf.get("needed"):
        return [me.finding(status="ok", title="No multi-node launcher is needed", detail=f"{tf.get('why')}.")]
    backend, tool = tf["backend"], tf.get("tool") or {}
    if tool.get("error"):
        return [me.not_checked(tool["error"], ev, sub="not-checked")]
    explains = ids_for(facts, LAUNCHER_MISSING, launcher=backend)
    program = tool["tool"]
    if tool.get("on_path"):
        return [me.finding(status="ok", title=f"--launcher {backend}: {program} is at {tool['on_path']}",
                        detail=f"{tf['why']}: DeepSpeed looks for {program} on the PATH and finds it.", evidence=ev)]
    command = ((facts.of("launch") or {}).get("launch") or {}).get("command")
    remedies: list[Remedy] = []
    if tool.get("elsewhere"):
        folder = os.path.dirname(tool["elsewhere"])
        remedies.append(Remedy(
            title=f"Put {folder} on the launching shell's PATH",
            commands=[f'export PATH={shlex.quote(folder)}:"$PATH"'],
            tool_started=bool(tool.get("started")),
            note=(f"{tool['elsewhere']} started" if tool.get("started") else
                  "not tried, because the program was not started"),
            explanation=f"{program} is installed at {tool['elsewhere']}, outside the PATH the launch has."))
    logical = BACKEND_TOOL[backend][1] if backend in BACKEND_TOOL else None
    distro = (facts.of("toolchain") or {}).get("distro") or {}
    if logical:
        for pm in managers(distro):
            remedies.append(Remedy(title=f"Install {package_name(logical, pm.family)} ({pm.label})",
                                   commands=pm.install(package_name(logical, pm.family)), requires_root=True,
                                   note="not tried, because it installs a package: only on your yes",
                                   explanation=f"It provides {program}; every host of the job needs it too"
                                               + (" (pdsh is in EPEL on RHEL-family systems)."
                                                  if logical == "pdsh" and pm.family == "dnf" else ".")))
    for other, path in (tf.get("others") or {}).items():
        if other in ("openmpi", "mpich", "impi", "slurm"):
            remedies.append(Remedy(title=f"Or launch through {other} ({path} is here)",
                                   commands=[_with_launcher(command, other)],
                                   note="not tried, because trying it starts the training",
                                   explanation=f"DeepSpeed's --launcher {other} starts the ranks with it instead."))
    return [me.finding(status="fail", title=f"--launcher {backend}: {program} is not on the launching "
                    "shell's PATH", detail=f"{tf['why']}, so the DeepSpeed launcher starts the other hosts' ranks "
                    f"through {backend}; it looks for {program} on the PATH (shutil.which) and stops with "
                    f"\"launcher '{backend}' not installed.\" (deepspeed/launcher/runner.py).",
                    evidence=ev, explains=explains, remedies=remedies)]
