"""Check ``offload.swap-buffers``: the NVMe parameter swapper's buffers against the parameters it must hold.

DeepSpeed's "More elements N than buffer size B" (``offload_param.buffer_size`` smaller than a parameter's
partition) and "Not enough buffers N for swapping M" (``offload_param.buffer_count`` smaller than what one
swap-in takes, a module's parameters and what prefetch asked for) are explained by the config's values, the
model's largest layer over the ranks, and the installed release's own assertions; the remedy is a ds_config
patch with values computed to satisfy the assertion.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zdoctor.core.errors import InputError
from zdoctor.core.model import Finding, Remedy
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.edit.filefix import replace_remedy
from zdoctor.layers.offload.check_offload import config_edit_needs_root
from zdoctor.layers.offload.dsconfig import parse_config
from zdoctor.layers.offload.dspatch import set_values
from zdoctor.layers.offload.planner import gib
from zdoctor.layers.offload.swapbuffers import count_needed, partition, size_needed
from zdoctor.symptoms.match import symptoms_of

FID = "offload.swap-buffers"
TITLE = "NVMe parameter swap buffers against the model"
KIND = "nvme-swap-buffers"
BLOCK = ("zero_optimization", "offload_param")
NOT_TRIED = "not tried: only a training run with the new config shows it"


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)) and float(v).is_integer():
        return int(v)
    return None


def _setting(ds: Mapping[str, Any], name: str) -> dict[str, Any]:
    return (((ds.get("settings") or {}).get("offload_param") or {}).get(name)) or {}


def _source_line(facts: Facts, limit: str) -> str:
    """Where the installed release asserts the limit, or why that is not known."""
    src = facts.of("swapsource")
    if not src:
        return f"The installed release's assertion was not read ({facts.why_not('swapsource')})."
    hits = [a for a in src.get("asserts") or [] if a.get("limit") == limit]
    if not hits:
        return f"DeepSpeed {src.get('version') or '(version unknown)'} has no {limit} assertion in {src.get('file')}."
    release = f"DeepSpeed {src.get('version') or '(version unknown)'}"
    return "; ".join(f"{release} asserts `{a['condition']}` at {src.get('file')}:{a['line']} ({a['function']}): "
                     f"\"{a['message']}\"" for a in hits[:2]) + "."


def _patch(ds: Mapping[str, Any], values: dict[str, int], title: str, why: str) -> Remedy | None:
    """The ds_config patch that sets ``values`` in offload_param, through the safe edit core."""
    text, path = ds.get("text"), ds.get("path")
    if not isinstance(text, str) or not isinstance(path, str):
        return None
    try:
        patch = set_values(parse_config(text, path), BLOCK, values)
    except (InputError, ValueError):
        return None
    own = ds.get("file")
    uid = own.get("owner_uid") if isinstance(own, dict) and isinstance(own.get("owner_uid"), int) else None
    remedy = replace_remedy(path, text, patch.new_text, uid=uid, tag="ZDOCTOR_DS_CONFIG", title=title,
                            requires_root=config_edit_needs_root(ds),
                            explanation=why + " Rewrites only " + ", ".join(patch.changed) + "; the file is "
                            "replaced only while it is still the one shown, the old one kept beside it.\n\n"
                            + patch.diff)
    remedy.note = NOT_TRIED
    return remedy


@check(FID, title=TITLE, probes=("dsconfig",), optional=("capacity", "swapsource"), explains=(KIND,))
def check_swap_buffers(facts: Facts, me: CheckSpec) -> list[Finding]:
    ds = facts.of("dsconfig")
    said = [s for s in symptoms_of(facts) if s.kind == KIND]
    ev = facts.evidence("dsconfig") + facts.evidence("swapsource")
    sized = [int(s.fields["numel"]) for s in said if s.fields.get("numel", "").isdigit()]
    counted = [s for s in said if s.fields.get("available", "").isdigit() and s.fields.get("wanted", "").isdigit()]
    lines = [f"{s.where or s.source}: {s.text}" for s in said[:3]]
    if not ds or not ds.get("valid"):
        if not said:
            return [me.not_checked(facts.why_not("dsconfig") if not ds else "the ds_config is unreadable")]
        need = size_needed(*sized)
        return [me.finding(status="warn", evidence=ev, explains=[s.id for s in said],
                        title="DeepSpeed's NVMe parameter swapper ran out of buffer room (from the message only)",
                        detail="\n".join(lines + [
                            "The ds_config was not read (--ds-config), so offload_param's values are not known here. "
                            + (f"offload_param.buffer_size must be at least {need:,} elements. " if need else "")
                            + "Read next: zero_optimization.offload_param.buffer_size and buffer_count in the job's "
                              "ds_config, and give it with --ds-config."]),
                        remedies=[Remedy(title="Raise offload_param.buffer_size / buffer_count in the ds_config",
                                         commands=[f"# ds_config: zero_optimization.offload_param.buffer_size = "
                                                   f"{need or 'the largest partition'}"],
                                         note="not tried: the ds_config was not given")])]
    device = (ds.get("devices") or {}).get("offload_param")
    if device != "nvme":
        if said:
            return [me.finding(status="warn", evidence=ev, explains=[s.id for s in said],
                            title="The message comes from DeepSpeed's NVMe parameter swapper, but the ds_config "
                                  f"given offloads parameters to {device} (from the message only)",
                            detail="\n".join(lines + ["The run that printed it used another config: read its "
                                                      "zero_optimization.offload_param.buffer_size and "
                                                      "buffer_count."]))]
        return [me.finding(status="ok", evidence=ev, title="offload_param is not on NVMe: no parameter swap "
                        "buffers to size", detail=f"offload_param.device is {device}.")]
    size, count = _int(_setting(ds, "buffer_size").get("value")), _int(_setting(ds, "buffer_count").get("value"))
    cap = facts.of("capacity") or {}
    largest = _int(cap.get("largest_layer"))
    world = (_int(cap.get("nodes")) or 1) * (_int(cap.get("gpus_per_node")) or 1)
    part = partition(largest, world) if largest else None
    need = size_needed(part, *sized)
    cfg_line = (f"offload_param: buffer_size {size:,} elements ({_setting(ds, 'buffer_size').get('source')}), "
                f"buffer_count {count} ({_setting(ds, 'buffer_count').get('source')})." if size is not None
                and count is not None else "offload_param.buffer_size / buffer_count are not whole numbers.")
    model_line = (f"The model's largest layer: {largest:,} elements ({cap.get('largest_layer_source')}); over "
                  f"{count_of(world, 'rank')} its partition is {part:,} elements." if part else
                  "The model's largest parameter is not known (no --model-config or --model-params).")
    out: list[Finding] = []
    if size is not None and count is not None and need is not None and need > size:
        pinned = count * need * 2
        rem = _patch(ds, {"buffer_size": need}, f"Set offload_param.buffer_size to {need:,} in the ds_config",
                     f"{need:,} elements hold the largest partition ({max([x for x in (part, *sized) if x]):,}); the "
                     f"{count} pinned buffers then take {gib(pinned)} of host memory per rank (2 bytes each).")
        out.append(me.finding(
            status="fail", evidence=ev, explains=[s.id for s in said if s.fields.get("numel")],
            title=f"offload_param.buffer_size ({size:,}) is smaller than a parameter partition it must hold "
                  f"({max([x for x in (part, *sized) if x]):,} elements)",
            detail="\n".join(lines + [cfg_line, model_line, _source_line(facts, "buffer_size")]),
            remedies=[r for r in (rem,) if r] or [Remedy(title=f"Set offload_param.buffer_size to {need:,}",
                                                         commands=[f"# ds_config: zero_optimization.offload_param."
                                                                   f"buffer_size = {need}"], note=NOT_TRIED)]))
    if counted and count is not None:
        s = counted[0]
        want = count_needed(count, int(s.fields["available"]), int(s.fields["wanted"]))
        want = max(want, count + 1)
        rem = _patch(ds, {"buffer_count": want}, f"Set offload_param.buffer_count to {want} in the ds_config",
                     f"The swap-in wanted {count_of(int(s.fields['wanted']), 'buffer')} while "
                     f"{s.fields['available']} of {count} were free: {want} leaves that many."
                     + (f" The pinned buffers then take {gib(want * size * 2)} per rank." if size else ""))
        out.append(me.finding(
            status="fail", evidence=ev, explains=[x.id for x in counted],
            title=f"offload_param.buffer_count ({count}) is fewer than one swap-in takes",
            detail="\n".join(lines + [cfg_line, _source_line(facts, "buffer_count"),
                                      "A swap-in takes a module's parameters and those prefetch asked for "
                                      "(stage3_prefetch_bucket_size): a smaller prefetch needs fewer buffers."]),
            remedies=[r for r in (rem,) if r] or [Remedy(title=f"Set offload_param.buffer_count to {want}",
                                                         commands=[f"# ds_config: zero_optimization.offload_param."
                                                                   f"buffer_count = {want}"], note=NOT_TRIED)]))
    if out:
        return out
    if said:
        return [me.finding(status="warn", evidence=ev, explains=[s.id for s in said],
                        title="DeepSpeed's NVMe parameter swapper ran out of buffer room, but the config given "
                              "satisfies what is known (from the message only)",
                        detail="\n".join(lines + [cfg_line, model_line, "The run that printed it may have used "
                                                  "another config or model: compare its offload_param values."]))]
    if need is None:
        return [me.not_checked(f"{cfg_line} {model_line}", ev)]
    return [me.finding(status="ok", evidence=ev,
                    title=f"offload_param.buffer_size ({size:,}) holds the largest partition ({part:,})",
                    detail="\n".join([cfg_line, model_line, _source_line(facts, "buffer_size")]))]
