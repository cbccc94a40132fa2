"""A recorded snapshot standing in for the machine it was taken on."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from zdoctor import __version__
from zdoctor.core.errors import InputError
from zdoctor.core.jsondoc import json_document
from zdoctor.core.model import Evidence, ProbeResult
from zdoctor.core.registry import PROBES
from zdoctor.core.shape import doubtful_nulls, record_problems
from zdoctor.core.symptom import Symptom
from zdoctor.host.base import Host, run_probe_guarded
from zdoctor.proc.target import Target
from zdoctor.proc.userfile import read_user_file

SNAPSHOT_FORMAT = "zdoctor-snapshot"
SNAPSHOT_VERSION = 1
#: A snapshot is a few MiB at most (every evidence is capped); a larger file is not one.
MAX_SNAPSHOT_BYTES = 32 * 1024 * 1024


def snapshot_document(host: Host) -> dict[str, Any]:
    """Everything ``host`` has probed, as one JSON-ready document."""
    return {
        "format": SNAPSHOT_FORMAT,
        "version": SNAPSHOT_VERSION,
        "zdoctor": __version__,
        "created": time.time(),
        "host": host.info,
        "probes": {name: res.to_dict() for name, res in sorted(host.recorded().items())},
    }


#: How the error of a probe record that could not be used begins (:func:`zdoctor.layers.probe_findings`).
MALFORMED = "the recorded result is malformed: "


def read_record(name: str, d: Any) -> ProbeResult:
    """The recorded result of probe ``name``, checked by type (:mod:`.shape`); a malformed one becomes a
    ``crash`` result whose error says what is wrong, so its checks say "not checked"."""
    problems = record_problems(name, d)
    if not problems:
        try:
            res = ProbeResult.from_dict({**d, "probe": name})
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            problems = [f"{type(exc).__name__}: {exc}"]
        else:
            res.replayed = True
            res.doubtful = tuple(doubtful_nulls(name, res.facts))
            return res
    res = ProbeResult(probe=name, status="crash", error=MALFORMED + "; ".join(problems))
    res.replayed = True
    return res


class ReplayHost(Host):
    """Answers every probe from a snapshot; a probe the snapshot lacks is a ``skip``."""

    kind = "replay"

    def __init__(self, document: dict[str, Any], source: str = "<memory>") -> None:
        super().__init__()
        if not isinstance(document, dict) or document.get("format") != SNAPSHOT_FORMAT:
            raise InputError(f"{source}: not a zdoctor snapshot (no \"format\": \"{SNAPSHOT_FORMAT}\")")
        if document.get("version") != SNAPSHOT_VERSION:
            raise InputError(f"{source}: snapshot version {document.get('version')!r} is not supported")
        probes = document.get("probes")
        if not isinstance(probes, dict):
            raise InputError(f"{source}: snapshot has no \"probes\" object")
        self._recorded = {str(name): read_record(str(name), d) for name, d in probes.items()}
        #: Asked (:meth:`ask`): the symptoms are read again, and these the node's user gave kept.
        self._asked = False
        self._given_on_node: ProbeResult | None = None
        recorded_host = document.get("host")
        info = recorded_host if isinstance(recorded_host, dict) else {}
        self.info = {**info, "kind": self.kind, "recorded_kind": info.get("kind"), "source": source}

    @classmethod
    def load(cls, path: str) -> ReplayHost:
        """Read a snapshot file; any problem is an :class:`InputError` with a one-line message."""

        if not os.path.lexists(path):
            raise InputError(f"{path}: no such file")
        raw = read_user_file(path, "snapshot file", MAX_SNAPSHOT_BYTES)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{path}: not a text file") from None
        return cls(json_document(text, path), source=path)

    def ask(self, options: Mapping[str, Any]) -> None:
        """Add what the user saw (``symptom``, ``train_log``) to the recorded node: the symptoms are read
        again, from the recorded run and these, after them those the node's own user gave, and all are
        matched against the recorded facts."""
        self.target = Target.of(options=dict(options))
        self._asked = True
        self._given_on_node = self._recorded.pop("symptoms", None)

    def forget(self, names: Iterable[str]) -> None:
        """A snapshot does not change: nothing to forget."""

    def _compute(self, name: str) -> ProbeResult:
        if name == "symptoms" and self._asked:
            return with_given_on_node(replace(run_probe_guarded(self, name), duration_s=0.0), self._given_on_node)
        rec = self._recorded.get(name)
        if rec is None:
            spec = PROBES.get(name)
            if spec is not None and spec.derived:  # computed from what the snapshot recorded
                # its time here is this machine's, not the node's: a replay shows recorded times only
                return replace(run_probe_guarded(self, name), duration_s=0.0)
            return ProbeResult(probe=name, status="skip", error=f"probe {name} is not in this snapshot")
        return rec


def with_given_on_node(asked: ProbeResult, recorded: ProbeResult | None) -> ProbeResult:
    """The symptoms of an asked replay (``asked``: the recorded run's and those given here) followed by those
    the node's own user gave (``--symptom``, ``--log``), which only the snapshot holds: numbered on, the same
    line once, and a log the node could not read still said."""
    if asked.status != "ok" or recorded is None or recorded.status != "ok":
        return asked
    items = recorded.facts.get("symptoms")
    mine = [s for s in (Symptom.from_dict(d) for d in asked.facts.get("symptoms") or []) if s is not None]
    seen = {(s.kind, s.text) for s in mine}
    theirs: list[Symptom] = []
    for s in (Symptom.from_dict(d) for d in (items if isinstance(items, list) else [])):
        if s is None or s.source == "command" or (s.kind, s.text) in seen:
            continue  # the run is read again from its recording; a line given here too is one symptom
        seen.add((s.kind, s.text))
        s.id = f"S{len(mine) + len(theirs) + 1}"
        theirs.append(s)
    lost = recorded.facts.get("unread")
    unread = [u.replace("the --log file", "the --log file on the node", 1) for u in lost or []
              if isinstance(u, str) and u.startswith("the --log file")] if isinstance(lost, list) else []
    if not theirs and not unread:
        return asked
    said = recorded.facts.get("given")
    before: dict[str, Any] = said if isinstance(said, dict) else {}
    given = {k: bool(v) or bool(before.get(k)) for k, v in (asked.facts.get("given") or {}).items()}
    facts = {**asked.facts, "symptoms": [s.to_dict() for s in mine + theirs], "given": given,
             "unread": [*(asked.facts.get("unread") or []), *unread],
             "sources": sorted({s.source for s in mine + theirs})}
    evidence = list(asked.evidence)
    if theirs:
        evidence.append(Evidence.of_table("what the user on the node saw (recorded)",
                                          ["id", "seen in", "line", "recognised as"],
                                          [[s.id, s.where or s.source, s.text, s.signature or "-"] for s in theirs]))
    return replace(asked, facts=facts, evidence=evidence)
