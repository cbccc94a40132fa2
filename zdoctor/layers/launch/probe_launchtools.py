"""Probe ``launcher_tools``: for a DeepSpeed launch across hosts, the multi-node backend it runs (--launcher,
default pdsh) and whether the program DeepSpeed looks for is on the training environment's PATH, else where
on this node it is.

Facts: ``needed`` (bool), ``why``, ``backend``, ``tool`` (:func:`zdoctor.layers.launch.launchtools.find_tool`),
``others`` (the other backends' programs found on the PATH), ``path`` (the PATH searched).
"""

from __future__ import annotations

from typing import Any

from zdoctor.core.factstypes import LauncherToolsFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import facts_of, probe
from zdoctor.layers.launch.launchtools import BACKEND_TOOL, DEFAULT_BACKEND, VERSION_FLAG, find_tool, needs_backend
from zdoctor.proc.runner import run
from zdoctor.proc.target import target_of


def collect_launcher_tools(launch: dict[str, Any], nodes: list[str], path: str
                           ) -> tuple[LauncherToolsFacts, list[Evidence]]:
    needed, why = needs_backend(launch, nodes)
    backend = str((launch.get("options") or {}).get("multinode_launcher") or DEFAULT_BACKEND).lower()
    facts: LauncherToolsFacts = {"needed": needed, "why": why, "backend": backend, "tool": None, "others": {},
                                 "path": path}
    if not needed:
        return facts, []
    program = BACKEND_TOOL.get(backend, (None, None))[0]
    if program is None:
        facts["tool"] = {"tool": None, "on_path": None, "elsewhere": None, "error": f"unknown launcher {backend!r}"}
        return facts, []
    tool = facts["tool"] = find_tool(program, path)
    found = tool["elsewhere"]
    if found:  # started once, bounded, to show it runs
        ran = run([found, VERSION_FLAG.get(program, "--version")], timeout=10, label=f"{program} version")
        tool["started"] = ran.exit_code == 0 and not ran.error
    facts["others"] = {b: found for b, (t, _) in BACKEND_TOOL.items() if b != backend
                       for found in [find_tool(t, path)["on_path"]] if found}
    rows = [[backend, program, tool["on_path"] or "not on PATH", tool["elsewhere"] or "-"]]
    rows += [[b, BACKEND_TOOL[b][0], p, "-"] for b, p in facts["others"].items()]
    return facts, [Evidence.of_table(f"The multi-node launcher ({why})", ["--launcher", "program", "on PATH",
                                                                          "elsewhere here"], rows,
                                     [0] if not tool["on_path"] else [])]


@probe("launcher_tools", title="The DeepSpeed launcher's multi-node backend: pdsh, mpirun ...", timeout=10,
       needs=("launch", "hostfile"), facts=LauncherToolsFacts)
def launcher_tools_probe(host: Any) -> tuple[LauncherToolsFacts, list[Evidence]]:
    target = target_of(host)
    lf = facts_of(host, "launch")
    if not lf.get("launch") or lf.get("source") == "none":
        return {"skipped": "no --command or --pid given: zdoctor does not know how the job is launched"}, []
    nodes = [n["name"] for n in facts_of(host, "hostfile").get("nodes") or []]
    return collect_launcher_tools(lf["launch"], nodes, target.env.get("PATH", ""))
