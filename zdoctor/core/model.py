"""The core data model: evidence, findings, remedies and probe results, all JSON round-trippable."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from zdoctor.core.verdicts import (
    NOT_TRIED,
    STATUSES,
    TOOL_STARTS,
    answer_first,
    count,
    verification_of,
)

OUTPUT_CAP = 64 * 1024


#: Control characters other than newline and tab: what text from a machine must not send to a terminal.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible_controls(text: str) -> str:
    """``text`` with control characters (all but newline and tab) written as ``\\xNN``, so that text from
    a machine or a file cannot drive the terminal that shows it (escape sequences, carriage returns)."""
    return CONTROL_CHARACTERS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def cap_text(text: str, limit: int = OUTPUT_CAP) -> tuple[str, bool]:
    """Cut ``text`` to ``limit`` characters, keeping head and tail; return (text, truncated)."""
    if len(text) <= limit:
        return text, False
    head = limit * 3 // 4
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[-tail:]}", True



def known_fields(cls: Any, d: Mapping[str, Any], drop: Iterable[str] = ()) -> dict[str, Any]:
    """The entries of ``d`` that name fields of the dataclass ``cls`` (less ``drop``): what a recording of
    another zdoctor release adds is passed over."""
    known = {f.name for f in fields(cls)} - set(drop)
    return {k: v for k, v in d.items() if k in known}

@dataclass
class Table:
    """Side-by-side evidence: named columns and rows of cells; ``highlight`` marks rows to stress."""

    columns: list[str]
    rows: list[list[str]]
    highlight: list[int] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Table:
        return cls(columns=list(d["columns"]), rows=[list(r) for r in d["rows"]],
                   highlight=list(d.get("highlight", [])))


@dataclass
class Evidence:
    """What a fact rests on: a command run, a file read, or a table built from them."""

    label: str
    kind: str = "command"  # command | file | table | note | traceback
    argv: list[str] | None = None
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    paths: list[str] = field(default_factory=list)
    started: float = 0.0
    duration_s: float = 0.0
    error: str | None = None
    table: Table | None = None

    @classmethod
    def note(cls, label: str, text: str) -> Evidence:
        return cls(label=label, kind="note", stdout=text, started=time.time())

    @classmethod
    def of_table(cls, label: str, columns: list[str], rows: list[list[str]],
                 highlight: list[int] | None = None) -> Evidence:
        return cls(label=label, kind="table", started=time.time(),
                   table=Table(columns, [[str(c) for c in r] for r in rows], highlight or []))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Evidence:
        data = known_fields(cls, d)
        if data.get("table") is not None:
            data["table"] = Table.from_dict(data["table"])
        return cls(**data)


@dataclass
class Remedy:
    """A fix as data: shell lines to paste before the launch command, and how to undo them.

    ``verified`` is true only when the fix was tried (the failing command re-run with it) and fixed it;
    ``tried`` says it was tried at all; ``note`` says what the re-run showed, or why it was not tried.
    :func:`zdoctor.core.verdicts.verification_of` turns these into the one three-state verification.
    """

    title: str
    commands: list[str] = field(default_factory=list)
    verified: bool | None = None
    requires_root: bool = False
    undo: list[str] = field(default_factory=list)
    explanation: str = ""
    tried: bool = False
    note: str = ""
    # How the guide applies it when not by running ``commands`` in bash: {"kind": "fstab-add", ...} runs
    # the safe core (zdoctor.layers.offload.fstab.apply_fstab_line) as root instead.
    action: dict[str, Any] | None = None
    # One step of several that together are the fix, done in the order listed (format, then mount, then
    # create the directory), not an alternative to the finding's other remedies.
    step: bool = False
    # Tools the commands need that the node does not have, each said by zdoctor.core.present.tool_missing.
    missing: list[str] = field(default_factory=list)
    # Ids of findings whose fix must be done before this one (it depends on them; it is no alternative to
    # them): pointing the config at a directory on a drive the storage.fstab fix mounts.
    requires: list[str] = field(default_factory=list)
    # Tried only by starting the tool the failing command needs (``ninja --version``), and the tool
    # started: "tried: the tool starts", never "fixed" (the failing command itself was not re-run).
    tool_started: bool = False
    # False where the node's present state does not support the fix (a drastic one for a record the node
    # now contradicts): listed, "not recommended" with ``note`` saying why, never the recommended option.
    recommended: bool = True

    def __post_init__(self) -> None:
        if self.tool_started:
            self.tried = True
        if self.verified:  # fixed the command when tried: so it was tried
            self.tried = True

    def to_dict(self) -> dict[str, Any]:
        v = verification_of(self)
        out = {"title": self.title, "commands": list(self.commands), "verified": v.verified,
               "requires_root": self.requires_root, "undo": list(self.undo), "explanation": self.explanation,
               "verification": v.to_dict()}
        if self.action is not None:
            out["action"] = self.action
        if self.step:
            out["step"] = True
        if self.missing:
            out["missing"] = list(self.missing)
        if self.requires:
            out["requires"] = list(self.requires)
        if not self.recommended:
            out["recommended"] = False
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Remedy:
        out = cls(**known_fields(cls, d, drop=("tried", "note")))
        v = verification_of(d)
        out.verified = v.verified
        out.tried = v.state != NOT_TRIED
        out.tool_started = v.state == TOOL_STARTS
        out.note = v.reason
        return out


@dataclass
class Finding:
    """One verdict of the doctor, with the evidence it came from and the remedies it suggests."""

    id: str
    status: str
    title: str
    detail: str = ""
    evidence: list[Evidence] = field(default_factory=list)
    remedies: list[Remedy] = field(default_factory=list)
    #: Ids of the symptoms (what the user saw) this finding explains, matched on their concrete content.
    explains: list[str] = field(default_factory=list)
    #: The cause class it names for what it explains (:data:`zdoctor.core.causes.CAUSES`), when it names one.
    cause: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown finding status {self.status!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "title": self.title,
            "detail": self.detail,
            "evidence": [e.to_dict() for e in self.evidence],
            "remedies": [r.to_dict() for r in self.remedies],
            "explains": list(self.explains),
            **({"cause": self.cause} if self.cause else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        explains = d.get("explains")
        return cls(
            id=d["id"], status=d["status"], title=d["title"], detail=d.get("detail", ""),
            evidence=[Evidence.from_dict(e) for e in d.get("evidence", [])],
            remedies=[Remedy.from_dict(r) for r in d.get("remedies", [])],
            explains=[str(x) for x in explains] if isinstance(explains, list) else [],
            cause=d["cause"] if isinstance(d.get("cause"), str) else None,
        )


@dataclass
class ProbeResult:
    """What one probe learned: facts (plain JSON data) and the evidence behind them.

    ``status`` is ``ok`` when the probe ran to the end (even if what it found is bad), ``crash`` when
    it raised, ``timeout`` when it ran past its budget, and ``skip`` when it could not run here.
    """

    probe: str
    status: str = "ok"
    facts: dict[str, Any] = field(default_factory=dict)
    evidence: list[Evidence] = field(default_factory=list)
    error: str | None = None
    started: float = 0.0
    duration_s: float = 0.0
    #: Read from a recording (a snapshot or a session), not probed here; not part of the record.
    replayed: bool = field(default=False, compare=False, repr=False)
    #: Of a recording: where its facts hold null in place of an object or array (see zdoctor.core.shape).
    doubtful: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "probe": self.probe,
            "status": self.status,
            "facts": self.facts,
            "evidence": [e.to_dict() for e in self.evidence],
            "error": self.error,
            "started": self.started,
            "duration_s": self.duration_s,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProbeResult:
        return cls(
            probe=d["probe"], status=d.get("status", "ok"), facts=dict(d.get("facts", {})),
            evidence=[Evidence.from_dict(e) for e in d.get("evidence", [])],
            error=d.get("error"), started=d.get("started", 0.0), duration_s=d.get("duration_s", 0.0),
        )


def summarize(findings: list[Finding]) -> dict[str, int]:
    """Count findings per status, plus a total (see :func:`zdoctor.core.verdicts.count`)."""
    return count(f.status for f in findings)


def sort_findings(findings: Iterable[Finding], symptoms: Iterable[Mapping[str, Any]] = ()) -> list[Finding]:
    """Those that answer one of ``symptoms`` (the ledger's entries) first, then worst first, then by id, so
    reports read the same every time (see :func:`zdoctor.core.verdicts.answer_first`)."""
    return answer_first(findings, symptoms)
