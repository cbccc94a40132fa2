"""One symptom: a line the user saw (or the way a run ended), with the concrete fields findings match on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Where a symptom was seen.
SOURCES = ("command", "log", "user", "process")
#: What each source is called in sentences.
#: Statuses of a finding that can explain a symptom: an ``ok`` or a ``skip`` never explains a failure.
EXPLAINING = frozenset({"fail", "warn", "crash"})
#: Id prefix of the finding that stands for a symptom nothing explains.
UNEXPLAINED_PREFIX = "symptom.unexplained."
SOURCE_WORDS = {"command": "the --command run", "log": "the --log file", "user": "the message you gave",
                "process": "the run at its time limit"}


@dataclass
class Symptom:
    """``kind`` is the signature's kind (or ``error-line``, ``exit-status``, ``hang``); ``fields`` are the
    values a finding must share to explain it (the GLIBCXX version and requiring object, the symbol, the
    signal ...); ``signature`` names the catalogue entry that recognised the line, if one did."""

    id: str
    source: str
    text: str
    kind: str
    fields: dict[str, str] = field(default_factory=dict)
    signature: str | None = None
    where: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "source": self.source, "text": self.text, "kind": self.kind,
                "fields": dict(self.fields), "signature": self.signature, "where": self.where}

    @classmethod
    def from_dict(cls, d: Any) -> Symptom | None:
        """The symptom a dict describes, or None when it is not one (a damaged snapshot or session)."""
        if not isinstance(d, dict) or not all(isinstance(d.get(k), str) for k in ("id", "source", "text", "kind")):
            return None
        raw = d.get("fields")
        fields: dict[str, str] = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
        sig, where = d.get("signature"), d.get("where")
        return cls(id=d["id"], source=d["source"], text=d["text"], kind=d["kind"], fields=fields,
                   signature=sig if isinstance(sig, str) else None, where=where if isinstance(where, str) else "")
