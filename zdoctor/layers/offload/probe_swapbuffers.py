"""Probe ``swapsource``: the NVMe parameter swapper's buffer assertions in the installed DeepSpeed.

Facts: :func:`zdoctor.layers.offload.swapbuffers.read_asserts` of the training environment's DeepSpeed
({file, asserts: [{limit, line, function, condition, message}], min_aio_bytes}) and ``version``; skipped when
DeepSpeed is not installed there or not known.
"""

from __future__ import annotations

from typing import Any

from zdoctor.core.factstypes import SwapsourceFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import facts_of, probe
from zdoctor.layers.offload.swapbuffers import read_asserts


@probe("swapsource", title="The NVMe parameter swapper's buffer assertions in the installed DeepSpeed", timeout=30,
       needs=("pyenv",), facts=SwapsourceFacts)
def swapsource_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    """Read the swapper's buffer_size / buffer_count assertions from the installed DeepSpeed's source."""
    ds = (facts_of(host, "pyenv") or {}).get("deepspeed")
    ds = ds if isinstance(ds, dict) else {}
    loc = ds.get("location")
    if not ds.get("installed") or not isinstance(loc, str):
        return {"skipped": "DeepSpeed is not installed in the training environment" if ds.get("installed") is False
                else "the training environment's DeepSpeed is unknown"}, []
    try:
        facts = read_asserts(loc)
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        return {"skipped": f"reading DeepSpeed's swapper source in {loc} failed ({exc})"}, []
    facts["version"] = ds.get("version") if isinstance(ds.get("version"), str) else None
    rows = [[f"{a['function']}:{a['line']}", a["limit"], a["condition"], a["message"]] for a in facts["asserts"]]
    return facts, [Evidence.of_table(f"buffer assertions in {facts['file']} (DeepSpeed {facts['version']})",
                                     ["where", "limit", "condition", "message"], rows)]
