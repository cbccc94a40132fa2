"""A recorded probe result checked by type as it is read (a snapshot, a fleet node's snapshot, a session).

Two layers: the record itself (``status``, ``facts``, ``evidence``, ``error``, times: :func:`record_problems`),
and the facts, compared with the types zdoctor's own probes produce at each key path
(``shape.json`` beside this module, generated from the probes' typed records with :func:`shape_of`; ``.*``
stands for any key of a map, ``[]`` for any item of an array). ``null`` is always
accepted (a probe says "unknown" with it; where the probes never write it, :func:`doubtful_nulls` names it
for a check that then cannot read the facts); integers and floats are both numbers; a key path the shape
does not know is not checked. A record with a problem is replaced by one that says what is wrong, so the
checks reading it say "not checked" instead of crashing.
"""

from __future__ import annotations

import json
import pkgutil
import types
import typing
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Union

SHAPE_FILE = Path(__file__).with_name("shape.json")
#: The statuses a probe result may have.
STATUSES = frozenset({"ok", "crash", "timeout", "skip"})
#: How many problems one record lists at most.
MAX_PROBLEMS = 5
#: Facts nested deeper than this are not walked (the reader bounds nesting already).
MAX_DEPTH = 40


def type_name(value: Any) -> str:
    """``object``, ``array``, ``string``, ``number``, ``boolean`` or ``null``: the JSON type of ``value``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _walk(value: Any, path: str, depth: int = 0,
          shape: Mapping[str, Any] | None = None) -> Iterable[tuple[str, Any]]:
    """Every key path of ``value`` with its value; a key ``shape`` does not name, under a map it knows
    (``path.*``), is walked as ``path.*``."""
    yield path, value
    if depth >= MAX_DEPTH:
        return
    if isinstance(value, dict):
        for k, v in value.items():
            child = f"{path}.{k}"
            if shape is not None and child not in shape and f"{path}.*" in shape:
                child = f"{path}.*"
            yield from _walk(v, child, depth + 1, shape)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v, f"{path}[]", depth + 1, shape)


def _is_record(tp: Any) -> bool:
    """Whether ``tp`` is a TypedDict class (``typing.is_typeddict`` is Python 3.10+)."""
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__total__")


def _type_names(tp: Any, path: str, out: dict[str, set[str]], depth: int) -> set[str] | None:
    """The JSON types of annotation ``tp`` (None: any type, not checked), recording those of what it holds
    in ``out`` under the key paths below ``path``."""
    if tp is Any or depth > MAX_DEPTH:
        return None
    origin = typing.get_origin(tp)
    if origin is Union or origin is getattr(types, "UnionType", Union):  # ``X | Y`` is types.UnionType
        names: set[str] = set()
        for arg in typing.get_args(tp):
            kinds = _type_names(arg, path, out, depth)
            if kinds is None:
                return None
            names |= kinds
        return names
    if tp is type(None):
        return {"null"}
    if tp is bool:
        return {"boolean"}
    if tp in (int, float):
        return {"number"}
    if tp is str:
        return {"string"}
    if origin is list:
        _record(typing.get_args(tp)[0], f"{path}[]", out, depth + 1)
        return {"array"}
    if origin is dict:
        _record(typing.get_args(tp)[1], f"{path}.*", out, depth + 1)
        return {"object"}
    if _is_record(tp):
        for key, value in typing.get_type_hints(tp).items():
            _record(value, f"{path}.{key}", out, depth + 1)
        return {"object"}
    raise TypeError(f"{path}: {tp!r} is not a JSON type")


def _record(tp: Any, path: str, out: dict[str, set[str]], depth: int) -> None:
    kinds = _type_names(tp, path, out, depth)
    if kinds is not None and kinds != {"null"}:
        out.setdefault(path, set()).update(kinds)


def shape_of(records: Mapping[str, Any]) -> dict[str, list[str]]:
    """The types at each key path of the facts of each probe in ``records`` (probe name -> its typed record,
    a TypedDict): the map ``shape.json`` holds. A value typed ``Any`` is not checked, so it has no entry."""
    out: dict[str, set[str]] = {}
    for name, tp in records.items():
        _record(tp, name, out, 0)
    return {p: sorted(t) for p, t in sorted(out.items())}


def shape_text(shape: Mapping[str, list[str]]) -> str:
    """``shape`` as ``shape.json`` is written: one key path a line."""
    return "{\n" + ",\n".join(f"{json.dumps(p)}: {json.dumps(t)}" for p, t in sorted(shape.items())) + "\n}\n"


@lru_cache(maxsize=1)
def known_shape() -> dict[str, frozenset[str]]:
    """The shape zdoctor's probes produce (empty when the file is missing: nothing is checked)."""
    try:  # pkgutil reads it inside the one-file bundle's zip too
        raw = json.loads((pkgutil.get_data(__package__ or "zdoctor", SHAPE_FILE.name) or b"{}").decode())
    except (OSError, ValueError):
        return {}
    return {p: frozenset(t) for p, t in raw.items() if isinstance(t, list)}


def doubtful_nulls(name: str, facts: Mapping[str, Any]) -> list[str]:
    """Where ``facts`` hold null in place of an object or array the probes were never seen to leave out:
    allowed (a probe on another node may write it), but named when a check cannot read it."""
    shape = known_shape()
    out = []
    for path, value in _walk(dict(facts), name, shape=shape):
        allowed = shape.get(path)
        if value is None and allowed and "null" not in allowed and allowed <= {"object", "array"}:
            out.append(f"{path} is null, where zdoctor's probes write {' or '.join(sorted(allowed))}")
            if len(out) >= MAX_PROBLEMS:
                break
    return out


def facts_problems(name: str, facts: Mapping[str, Any]) -> list[str]:
    """Where ``facts`` of probe ``name`` hold a value of a type its probe never produces."""
    shape = known_shape()
    out: list[str] = []
    for path, value in _walk(dict(facts), name, shape=shape):
        allowed = shape.get(path)
        kind = type_name(value)
        if allowed and kind not in allowed and kind != "null":
            out.append(f"{path} is {kind}, expected {' or '.join(sorted(allowed))}")
            if len(out) >= MAX_PROBLEMS:
                break
    return out


_EVIDENCE_FIELDS = (("label", ("string",)), ("kind", ("string",)), ("argv", ("array", "null")),
                    ("exit_code", ("number", "null")), ("stdout", ("string",)), ("stderr", ("string",)),
                    ("truncated", ("boolean",)), ("paths", ("array",)), ("started", ("number",)),
                    ("duration_s", ("number",)), ("error", ("string", "null")), ("table", ("object", "null")))


def evidence_problems(where: str, evidence: Any) -> list[str]:
    """What is wrong with a list of recorded evidence items (types of their fields)."""
    if not isinstance(evidence, list):
        return [f"{where} is {type_name(evidence)}, expected array"]
    out = []
    for i, ev in enumerate(evidence):
        if not isinstance(ev, dict):
            out.append(f"{where}[{i}] is {type_name(ev)}, expected object")
            continue
        for key, kinds in _EVIDENCE_FIELDS:
            if key in ev and type_name(ev[key]) not in kinds:
                out.append(f"{where}[{i}].{key} is {type_name(ev[key])}, expected {' or '.join(kinds)}")
        table = ev.get("table")
        if isinstance(table, dict):
            for key in ("columns", "rows", "highlight"):
                if key in table and not isinstance(table[key], list):
                    out.append(f"{where}[{i}].table.{key} is {type_name(table[key])}, expected array")
            rows = table.get("rows")
            if isinstance(rows, list) and any(not isinstance(r, list) for r in rows):
                out.append(f"{where}[{i}].table.rows holds a row that is not an array")
            if isinstance(table.get("highlight"), list) and any(
                    type_name(h) != "number" for h in table["highlight"]):
                out.append(f"{where}[{i}].table.highlight holds a value that is not a number")
        if isinstance(ev.get("argv"), list) and any(not isinstance(a, str) for a in ev["argv"]):
            out.append(f"{where}[{i}].argv holds a value that is not a string")
        if len(out) >= MAX_PROBLEMS:
            break
    return out[:MAX_PROBLEMS]


def record_problems(name: str, rec: Any) -> list[str]:
    """What is wrong with the recorded result of probe ``name`` (empty: it may be used)."""
    if not isinstance(rec, dict):
        return [f"{name} is {type_name(rec)}, expected object"]
    out = []
    status = rec.get("status", "ok")
    if not isinstance(status, str) or status not in STATUSES:
        out.append(f"{name}.status is {rec.get('status')!r}, expected one of {', '.join(sorted(STATUSES))}")
    for key, kinds in (("probe", ("string",)), ("facts", ("object",)), ("error", ("string", "null")),
                       ("started", ("number",)), ("duration_s", ("number",))):
        if key in rec and type_name(rec[key]) not in kinds:
            out.append(f"{name}.{key} is {type_name(rec[key])}, expected {' or '.join(kinds)}")
    out += evidence_problems(f"{name}.evidence", rec.get("evidence", []))
    if isinstance(rec.get("facts"), dict):
        out += facts_problems(name, rec["facts"])
    return out[:MAX_PROBLEMS]


#: The statuses a finding may have (as :data:`zdoctor.core.model.STATUSES`).
FINDING_STATUSES = frozenset({"ok", "warn", "fail", "skip", "crash"})
_REMEDY_FIELDS = (("title", ("string",)), ("commands", ("array",)), ("verified", ("boolean", "null")),
                  ("requires_root", ("boolean",)), ("undo", ("array",)), ("explanation", ("string",)),
                  ("action", ("object", "null")), ("step", ("boolean",)), ("verification", ("object", "null")))


def _fields(where: str, d: Mapping[str, Any], spec: Iterable[tuple[str, tuple[str, ...]]]) -> list[str]:
    return [f"{where}.{key} is {type_name(d[key])}, expected {' or '.join(kinds)}"
            for key, kinds in spec if key in d and type_name(d[key]) not in kinds]


def remedy_problems(where: str, rem: Any) -> list[str]:
    """What is wrong with a recorded remedy (types of its fields, its commands strings)."""
    if not isinstance(rem, dict):
        return [f"{where} is {type_name(rem)}, expected object"]
    out = _fields(where, rem, _REMEDY_FIELDS)
    for key in ("commands", "undo"):
        if isinstance(rem.get(key), list) and any(not isinstance(c, str) for c in rem[key]):
            out.append(f"{where}.{key} holds a value that is not a string")
    return out


def finding_problems(f: Any) -> list[str]:
    """What is wrong with a recorded finding (empty: it may be used)."""
    if not isinstance(f, dict):
        return [f"finding is {type_name(f)}, expected object"]
    out = _fields("finding", f, (("id", ("string",)), ("title", ("string",)), ("detail", ("string",)),
                                 ("remedies", ("array",)), ("explains", ("array",))))
    status = f.get("status")
    if not isinstance(status, str) or status not in FINDING_STATUSES:
        out.append(f"finding.status is {status!r}, expected one of {', '.join(sorted(FINDING_STATUSES))}")
    out += evidence_problems("finding.evidence", f.get("evidence", []))
    remedies = f.get("remedies")
    for i, rem in enumerate(remedies if isinstance(remedies, list) else []):
        out += remedy_problems(f"finding.remedies[{i}]", rem)
    return out[:MAX_PROBLEMS]


def event_problems(event: Mapping[str, Any]) -> list[str]:
    """What is wrong with the payload of a recorded session event whose kind zdoctor reads in depth
    (a finding, a probe result, a remedy outcome); other kinds are read field by field with defaults."""
    kind = event.get("type")
    if kind == "finding" and "finding" in event:
        return finding_problems(event["finding"])
    if kind == "probe_result" and "result" in event:
        rec = event["result"]
        name = rec.get("probe") if isinstance(rec, dict) else None
        return record_problems(name if isinstance(name, str) else "result", rec)
    if isinstance(kind, str) and kind.startswith("remedy_") and "remedy" in event:
        return remedy_problems("remedy", event["remedy"])
    return []
