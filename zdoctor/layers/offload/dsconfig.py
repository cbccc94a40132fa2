"""A DeepSpeed config file as DeepSpeed reads it (:mod:`zdoctor.layers.offload.hjsonreader`), with the position of
every value.

DeepSpeed reads the file as HJSON and refuses a duplicate key. The Hugging Face Trainer and Accelerate
read the same file with the standard ``json.load`` instead (strict JSON; a duplicate key silently keeps
the last value) and hand DeepSpeed the resulting dict: :func:`load_config` adds the file checks and
reports whether strict JSON parsers accept the file too. :mod:`zdoctor.layers.offload.dspatch` edits it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from zdoctor.core.errors import InputError
from zdoctor.core.keypath import value_at
from zdoctor.layers.offload.hjsonreader import (
    DuplicateKeyError,
    KeyPath,
    ParseError,
    Span,
    dotted,
    key_at,
    line_col,
    parse_text,
)
from zdoctor.proc.userfile import read_user_file

#: Larger files are refused: a ds_config is a few kilobytes.
MAX_BYTES = 16 * 1024 * 1024


@dataclass
class DsConfig:
    """A ds_config as DeepSpeed reads it, with the position of every value."""

    path: str
    text: str
    data: dict[str, Any]
    spans: dict[KeyPath, Span] = field(default_factory=dict)
    #: ``json``: strict JSON (every reader agrees); ``hjson``: only DeepSpeed's own reader accepts it.
    syntax: str = "json"
    #: Why strict JSON readers (the HF Trainer, Accelerate: ``json.load``) refuse it: ``line:col: msg``.
    json_error: str | None = None

    def get(self, path: KeyPath, default: Any = None) -> Any:
        return value_at(self.data, path, default)

    def has(self, path: KeyPath) -> bool:
        return path in self.spans

    def pos(self, path: KeyPath) -> tuple[int, int] | None:
        """Line and column of the value at ``path`` (None when the file does not set it)."""
        span = self.spans.get(path)
        return line_col(self.text, span.start) if span else None

    def where(self, path: KeyPath) -> str:
        """``path:line:col`` of the value (the bare path when the file does not set it)."""
        p = self.pos(path)
        return f"{self.path}:{p[0]}:{p[1]}" if p else self.path


def _json_error(text: str) -> str | None:
    """Why a strict JSON reader refuses ``text`` (``line:col: msg``), or None when it accepts it."""
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return f"{exc.lineno}:{exc.colno}: {exc.msg}"
    except (ValueError, RecursionError) as exc:
        return f"1:1: {exc}"
    return None


def parse_config(text: str, path: str = "<text>") -> DsConfig:
    """Parse ``text`` as DeepSpeed would; any problem is one :class:`InputError` line with a position."""
    try:
        data, spans = parse_text(text)
    except DuplicateKeyError as exc:
        line, col = line_col(text, exc.pos)
        fl, _fc = line_col(text, exc.first)
        where = f" in {dotted(exc.path)}" if exc.path else ""
        raise InputError(f"{path}:{line}:{col}: duplicate key {json.dumps(key_at(text, exc.pos))}{where} "
                         f"(first at line {fl}); DeepSpeed refuses the file: {exc.msg}") from None
    except ParseError as exc:
        line, col = line_col(text, exc.pos)
        jerr = _json_error(text)
        strict = f"strict JSON readers fail too: line {jerr.replace(':', ' column ', 1)}" if jerr else \
            "strict JSON readers accept it"
        raise InputError(f"{path}:{line}:{col}: malformed config: {exc.msg} (DeepSpeed's HJSON reader; {strict})") \
            from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply to read") from None
    if not isinstance(data, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(data), "a number")
        raise InputError(f"{path}:1:1: the config is {kind}, not an object: DeepSpeed needs a JSON object at the top")
    jerr = _json_error(text)
    return DsConfig(path=path, text=text, data=data, spans=spans, syntax="json" if jerr is None else "hjson",
                    json_error=jerr)


def read_text(path: str, what: str = "file", cap: int = MAX_BYTES) -> str:
    """The UTF-8 text of ``path``; missing, unreadable, huge, binary or undecodable files are InputErrors,
    and so is anything but a regular file (see :mod:`zdoctor.proc.userfile`)."""

    raw = read_user_file(path, what, cap)
    if b"\x00" in raw:
        off = raw.index(b"\x00")
        before = raw[:off].decode("utf-8", "replace")
        line, col = line_col(before, len(before))
        raise InputError(f"{path}:{line}:{col}: not a text file (NUL byte at offset {off})")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = raw[:exc.start].decode("utf-8", "replace")
        line, col = line_col(before, len(before))
        raise InputError(f"{path}:{line}:{col}: not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                         "DeepSpeed and json.load read configs as UTF-8") from None


def load_config(path: str) -> DsConfig:
    """Read and parse the ds_config at ``path`` (see :func:`parse_config`)."""
    return parse_config(read_text(path, "ds_config"), path)


def precision(cfg: DsConfig) -> dict[str, dict[str, Any]]:
    """The precision the ds_config asks for: ``{bf16: {enabled, key, where}, fp16: {...}}``. ``enabled`` is
    True, False, ``"auto"`` (the Hugging Face Trainer fills it in) or the value as written; a section the
    file does not set is DeepSpeed's default, False (``where`` None). DeepSpeed reads ``bf16`` and, when
    that is absent, the older name ``bfloat16`` (runtime/precision_config.py ``get_bfloat16_config``)."""
    out: dict[str, dict[str, Any]] = {}
    for name, keys in (("bf16", ("bf16", "bfloat16")), ("fp16", ("fp16",))):
        key = next((k for k in keys if isinstance(cfg.get((k,)), dict)), None)
        if key is None or not cfg.has((key, "enabled")):
            out[name] = {"enabled": False, "key": f"{keys[0]}.enabled", "where": None}
            continue
        value = cfg.get((key, "enabled"))
        out[name] = {"enabled": value, "key": f"{key}.enabled", "where": cfg.where((key, "enabled"))}
    return out
