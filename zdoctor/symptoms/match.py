"""What a check calls to say which symptoms its finding explains: by kind and concrete fields, never by a
keyword. ``ids_for(facts, "version-not-found", version="GLIBCXX_3.4.30", object="/x/ext.so")``."""

from __future__ import annotations

import os
from typing import Any

from zdoctor.core.symptom import Symptom

#: Fields compared as files: the same file by path or real path (``library`` also by its file name, which
#: is how a loader message names it next to a path elsewhere).
_PATH_FIELDS = ("object",)
_NAME_FIELDS = ("library",)


def symptoms_of(facts: Any) -> list[Symptom]:
    """The symptoms the ``symptoms`` probe found (none when it did not run or answer), each with where its
    message comes from when the ``origins`` probe located it (:func:`with_origin`)."""
    of = getattr(facts, "of", None)
    found = of("symptoms") if callable(of) else None
    items = (found or {}).get("symptoms") if isinstance(found, dict) else None
    out = [Symptom.from_dict(d) for d in items or []]
    origins = of("origins") if callable(of) else None
    return [with_origin(s, origins) for s in out if s is not None]


def with_origin(s: Symptom, origins: Any) -> Symptom:
    """``s`` with the fields of its message's first origin in the installed code: ``origin``
    (``file:line`` or the library's file), ``origin_text`` (in words), ``origin_guard``, ``config_key`` and
    ``config_keys``, ``env_var`` (the names it reads, comma-separated), ``env_values`` (each as the job has it)."""
    if not isinstance(origins, dict):
        return s
    hits = (origins.get("origins") or {}).get(s.id)
    if not hits or not isinstance(hits, list) or not isinstance(hits[0], dict):
        return s
    o = hits[0]
    fields = dict(s.fields)
    at = f"{o.get('file')}:{o.get('line')}" if o.get("in") == "python" else str(o.get("file"))
    text = str(o.get("text") or at)
    if o.get("line_seen"):
        text += f", for the line that follows it: {o['line_seen']}"
    fields.update({"origin": at, "origin_text": text})
    if o.get("guard"):
        fields["origin_guard"] = str(o["guard"])
    raw_reads = o.get("reads")
    reads: dict[str, Any] = raw_reads if isinstance(raw_reads, dict) else {}
    keys = [str(k) for k in reads.get("config") or []]
    if keys:
        fields["config_key"], fields["config_keys"] = keys[0], ",".join(keys)
    env = [str(v) for v in reads.get("env") or []]
    if env:
        raw = origins.get("env")
        values: dict[str, Any] = raw if isinstance(raw, dict) else {}
        fields["env_var"] = ",".join(env)
        fields["env_values"] = ", ".join(f"{v}={values[v]}" if values.get(v) is not None else f"{v} unset"
                                         for v in env)
    return Symptom(id=s.id, source=s.source, text=s.text, kind=s.kind, fields=fields, signature=s.signature,
                   where=s.where)


def _same(key: str, have: str, want: str) -> bool:
    if have == want:
        return True
    if key in _PATH_FIELDS or key in _NAME_FIELDS:
        if os.path.realpath(have) == os.path.realpath(want):
            return True
        if key in _NAME_FIELDS and os.path.basename(have) == os.path.basename(want):
            return True
    return False


def matches(symptom: Symptom, kind: str, fields: dict[str, Any]) -> bool:
    """Whether ``symptom`` is of ``kind`` and has every given field (None: any value)."""
    if symptom.kind != kind:
        return False
    for key, want in fields.items():
        if want is None:
            continue
        have = symptom.fields.get(key)
        if have is None or not _same(key, have, str(want)):
            return False
    return True


def ids_for(facts: Any, kind: str, **fields: Any) -> list[str]:
    """Ids of the symptoms of ``kind`` whose fields equal the given ones."""
    return [s.id for s in symptoms_of(facts) if matches(s, kind, fields)]
