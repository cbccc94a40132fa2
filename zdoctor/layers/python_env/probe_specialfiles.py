"""Probe ``special_files``: a FIFO, a device, a socket or a looping link where the training's libraries,
JIT ops or shell start-up files are read (see :mod:`zdoctor.layers.python_env.specialfiles`); ``lstat``/``stat``
only, so it cannot block on what it finds."""

from __future__ import annotations

from typing import Any

from zdoctor.core.factstypes import SpecialFilesFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import probe
from zdoctor.layers.python_env.specialfiles import scan
from zdoctor.proc.target import target_of


@probe("special_files", title="FIFOs, devices and looping links where libraries, ops and start-up files are read",
       timeout=20.0, facts=SpecialFilesFacts)
def special_files_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    env = dict(target_of(host).env)
    facts = scan(env, env.get("HOME"))
    rows = [[f["path"], f["kind"], f["where"]] for f in facts["found"]]
    ev = [Evidence.note("where special files were looked for", "\n".join(facts["looked"]))]
    if rows:
        ev.append(Evidence.of_table("special files found", ["path", "is", "where"], rows))
    return facts, ev
