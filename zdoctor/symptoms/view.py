"""The symptom ledger of a recorded session: the symptoms its ``symptoms`` probe recorded, joined with the
latest recorded findings (a session recorded before symptoms existed has none)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from zdoctor.core.symptom import Symptom
from zdoctor.symptoms.links import Said, derive
from zdoctor.symptoms.match import with_origin


def recorded_symptoms(probe_events: Iterable[Mapping[str, Any]]) -> list[Symptom]:
    """The symptoms of the last recorded ``symptoms`` probe result, each with where its message comes from
    when an ``origins`` probe result was recorded too."""
    facts: Any = None
    origins: Any = None
    for ev in probe_events:
        res = ev.get("result") if isinstance(ev, Mapping) else None
        if isinstance(res, Mapping) and res.get("status") == "ok":
            if res.get("probe") == "symptoms":
                facts = res.get("facts")
            elif res.get("probe") == "origins":
                origins = res.get("facts")
    items = facts.get("symptoms") if isinstance(facts, Mapping) else None
    out = [Symptom.from_dict(d) for d in items or []] if isinstance(items, list) else []
    return [with_origin(s, origins) for s in out if s is not None]


def ledger_entries(probe_events: Iterable[Mapping[str, Any]],
                   findings: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each recorded symptom as the report's ledger entry: ``{id, source, where, text, kind, signature,
    explained_by}``."""
    said = [Said(str(f.get("id")), str(f.get("status")), tuple(str(x) for x in f.get("explains") or [])
                 if isinstance(f.get("explains"), list) else ()) for f in findings if isinstance(f, Mapping)]
    symptoms = recorded_symptoms(probe_events)
    links = derive(symptoms, said)
    return [{"id": s.id, "source": s.source, "where": s.where, "text": s.text, "kind": s.kind,
             "signature": s.signature, "explained_by": links[s.id],
             **({"origin": s.fields["origin_text"]} if s.fields.get("origin_text") else {})} for s in symptoms]
