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
    """The symptoms the ``symptoms`` probe found (none when it did not run or answer)."""
    of = getattr(facts, "of", None)
    found = of("symptoms") if callable(of) else None
    items = (found or {}).get("symptoms") if isinstance(found, dict) else None
    out = [Symptom.from_dict(d) for d in items or []]
    return [s for s in out if s is not None]


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
