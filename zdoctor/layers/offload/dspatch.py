"""Moving a ds_config's offload to NVMe: :func:`nvme_patch` edits only the offload blocks of the original
text (comments and every other byte stay), and :func:`apply_config_patch` writes it back carefully."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zdoctor.core.errors import InputError
from zdoctor.edit.atomic import CheckedReplace, replace_checked
from zdoctor.layers.offload.dsconfig import DsConfig, load_config, parse_config
from zdoctor.layers.offload.hjsonreader import KeyPath, Span, dotted


@dataclass
class ConfigPatch:
    """The edited config text and a unified diff against the original."""

    path: str
    old_text: str
    new_text: str
    diff: str
    changed: list[str]


def _indent_unit(text: str) -> str:
    """The indentation step the file uses (two spaces when it cannot tell)."""
    widths = sorted({len(m.group(1)) for m in re.finditer(r"\n([ ]+)\S", text)})
    if "\n\t" in text and not widths:
        return "\t"
    return " " * (widths[0] if widths else 2)


def _line_indent(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    m = re.match(r"[ \t]*", text[start:])
    return m.group(0) if m else ""


def _plain(value: Any) -> Any:
    """Integral floats (``1e8`` read as 100000000.0 by json) rendered as integers."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e18:
        return int(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _render(value: dict[str, Any], indent: str, unit: str) -> str:
    body = json.dumps(_plain(value), indent=unit or 2, ensure_ascii=False)
    return body.replace("\n", "\n" + indent)


def _set_member(text: str, cfg_spans: dict[KeyPath, Span], parent: KeyPath, key: str, value: dict[str, Any],
                unit: str) -> str:
    """Replace ``parent.key``'s value in ``text``, or insert the member as the first one of ``parent``."""
    span = cfg_spans.get((*parent, key))
    if span is not None:
        indent = _line_indent(text, span.key if span.key is not None else span.start)
        return text[:span.start] + _render(value, indent, unit) + text[span.end:]
    pspan = cfg_spans.get(parent)
    if pspan is None:
        raise InputError(f"cannot place {dotted((*parent, key))}: {dotted(parent) or 'the root'} is not in the file")
    braces = text[pspan.start:pspan.start + 1] == "{"
    at = pspan.start + 1 if braces else pspan.start
    inner = text[at:pspan.end - 1 if braces else pspan.end]
    empty = not re.sub(r"/\*.*?\*/|(?:#|//)[^\n]*", "", inner, flags=re.S).strip()
    outer = _line_indent(text, pspan.key if pspan.key is not None else pspan.start)
    indent = outer + unit if braces else outer
    member = f"{json.dumps(key)}: {_render(value, indent, unit)}"
    if braces:
        if empty:
            return text[:at] + f"\n{indent}{member}\n{outer}" + text[at:].lstrip(" \t")
        return text[:at] + f"\n{indent}{member}," + ("" if text[at:at + 1].isspace() else " ") + text[at:]
    return text[:at] + f"{member}\n{indent}" + text[at:]


def nvme_patch(cfg: DsConfig, nvme_path: str, block_size: int | None = None,
               params: bool | None = None) -> ConfigPatch:
    """Move ``offload_optimizer`` (and, at stage 3, ``offload_param``) to ``device: nvme`` at ``nvme_path``.

    Only the offload blocks (and ``aio.block_size`` when ``block_size`` is given) are rewritten; every
    other byte of the file, comments included, stays. Settings already in the blocks are kept.
    ``params`` forces whether offload_param moves too (default: at stage 3 only, where it exists).
    """
    text, unit = cfg.text, _indent_unit(cfg.text)
    zero = cfg.get(("zero_optimization",))
    if not isinstance(zero, dict):
        raise InputError(f"{cfg.path}: no zero_optimization block: offloading needs ZeRO (stage 1-3 for the "
                         "optimizer, 3 for parameters); choose a stage first")
    if params is None:
        params = zero.get("stage") == 3
    changed: list[str] = []
    for key in ["offload_optimizer"] + (["offload_param"] if params else []):
        cur = parse_config(text, cfg.path)  # fresh spans after every edit
        old = cur.get(("zero_optimization", key))
        kept = {k: v for k, v in old.items() if v != "auto" and k not in ("device", "nvme_path")} \
            if isinstance(old, dict) else {}
        block = {"device": "nvme", "nvme_path": nvme_path, **kept}
        text = _set_member(text, cur.spans, ("zero_optimization",), key, block, unit)
        changed.append(f"zero_optimization.{key}")
    if block_size is not None:
        cur = parse_config(text, cfg.path)
        aio = cur.get(("aio",))
        block = dict(aio) if isinstance(aio, dict) else {}
        block["block_size"] = int(block_size)
        text = _set_member(text, cur.spans, (), "aio", block, unit)
        changed.append("aio.block_size")
    check = parse_config(text, cfg.path)  # the edit must read back as a valid config
    for key in ("offload_optimizer",) + (("offload_param",) if params else ()):
        if check.get(("zero_optimization", key, "device")) != "nvme":
            raise InputError(f"{cfg.path}: the patched config does not read back with {key}.device nvme")
    diff = "".join(difflib.unified_diff(cfg.text.splitlines(keepends=True), text.splitlines(keepends=True),
                                        fromfile=f"{cfg.path} (now)", tofile=f"{cfg.path} (patched)"))
    return ConfigPatch(path=cfg.path, old_text=cfg.text, new_text=text, diff=diff, changed=changed)


def set_values(cfg: DsConfig, block: KeyPath, values: dict[str, Any]) -> ConfigPatch:
    """Set ``values`` in the block at ``block`` (``("zero_optimization", "offload_param")``), keeping its other
    settings and every other byte of the file; the edit must read back with the new values."""
    text, unit = cfg.text, _indent_unit(cfg.text)
    old = cfg.get(block)
    if not isinstance(old, dict):
        raise InputError(f"{cfg.path}: no {dotted(block)} block to change")
    text = _set_member(text, cfg.spans, block[:-1], str(block[-1]), {**old, **values}, unit)
    check = parse_config(text, cfg.path)
    for key, value in values.items():
        if _plain(check.get((*block, key))) != _plain(value):
            raise InputError(f"{cfg.path}: the patched config does not read back with {dotted((*block, key))}")
    diff = "".join(difflib.unified_diff(cfg.text.splitlines(keepends=True), text.splitlines(keepends=True),
                                        fromfile=f"{cfg.path} (now)", tofile=f"{cfg.path} (patched)"))
    return ConfigPatch(path=cfg.path, old_text=cfg.text, new_text=text, diff=diff,
                       changed=[dotted((*block, k)) for k in values])


def apply_config_patch(path: str, new_text: str,
                       validate: Callable[[DsConfig], None] | None = None) -> dict[str, Any]:
    """Replace the ds_config at ``path`` with ``new_text``, carefully (through
    :class:`zdoctor.edit.atomic.CheckedReplace`).

    The new text must parse as a DeepSpeed config before anything is touched. A symbolic link or a
    file that is not regular is refused; the old bytes are kept as ``path.bak`` (``.bak-2``... when
    taken, never overwritten), the new text is written beside the file with its mode (and owner, as
    root) and renamed into place, then read back through :func:`load_config` and ``validate`` (a
    callable raising on a bad config). If that fails the original bytes are put back the same way.
    Returns what was done: {path, backup, written, validated, rolled_back, error}.
    """
    out: dict[str, Any] = {"path": path, "backup": None, "written": False, "validated": False,
                           "rolled_back": False, "error": None}
    parse_config(new_text, path)  # refuse a broken edit before touching anything
    new = new_text.encode("utf-8")
    rep = CheckedReplace.stage(path, new, what="ds_config")
    original = rep.original
    out["backup"] = rep.commit(f"{path}.bak")
    out["written"] = True
    try:
        back = load_config(path)
        if back.text != new_text:
            raise InputError(f"{path}: reads back different from what was written")
        if validate is not None:
            validate(back)
        out["validated"] = True
    except Exception as exc:  # noqa: BLE001 - any failed validation rolls back
        out["error"] = str(exc) or type(exc).__name__
        try:
            replace_checked(path, original, expect=new, backup=None, what="ds_config")
            out["rolled_back"] = True
        except InputError as rexc:
            out["error"] += f"; rolling back failed ({rexc}): the original is in {out['backup']}"
    return out
