"""Probe ``symptoms``: what the user saw, collected as the root of the session.

The ``--command`` run's error lines and how it ended (from the ``livetrace`` run), the error lines at the
end of a ``--log``, and each ``--symptom TEXT``. The default import probe's output is not a symptom: the
user never saw it.
"""

from __future__ import annotations

import os
from typing import Any

from zdoctor.core.errors import InputError
from zdoctor.core.factstypes import SymptomsFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import probe
from zdoctor.core.symptom import Symptom
from zdoctor.proc.target import target_of
from zdoctor.proc.userfile import open_user_file
from zdoctor.symptoms.extract import from_run, from_text

#: Only the end of a log is read for its error lines: the failure is at the end.
LOG_TAIL_BYTES = 4 * 1024 * 1024


def log_tail(path: str) -> tuple[str, int]:
    """The last :data:`LOG_TAIL_BYTES` of the regular file ``path`` as text, and the line number its first
    line has in the file (0 when the head was skipped and the number is unknown)."""
    fh, st = open_user_file(path, "log")
    with fh:
        skip = max(0, st.st_size - LOG_TAIL_BYTES)
        if skip:
            fh.seek(skip)
        raw = fh.read(LOG_TAIL_BYTES)
    text = raw.decode("utf-8", "replace")
    if skip:
        text = text.split("\n", 1)[1] if "\n" in text else ""
    return text, 0 if skip else 1


def read_log(log: str, unread: list[str]) -> tuple[str, int] | None:
    """The ``--log``'s tail (:func:`log_tail`), or None with why it could not be read added to ``unread``."""
    try:
        return log_tail(log)
    except InputError as exc:
        unread.append(f"the --log file: {exc}")
        return None


def command_ran(host: Any) -> bool:
    """Whether a ``--command`` ran: this one's, or the one a replayed snapshot recorded (its livetrace holds
    the run)."""
    return bool(target_of(host).command or (host.info.get("kind") == "replay" and host.info.get("command")))


def _command_symptoms(host: Any, start: int) -> tuple[list[Symptom], list[str]]:
    res = host.result("livetrace")
    facts = res.facts if res.status == "ok" else {}
    if facts.get("source") != "command":
        why = res.error or facts.get("skipped") or "the run gave no facts"
        return [], [f"the --command run: {why}"]
    ev = res.evidence[0] if res.evidence else None
    found = from_run(facts.get("exit_code"), bool(facts.get("timed_out")), ev.stdout if ev else "",
                     ev.stderr if ev else facts.get("stderr_tail", ""), timeout=facts.get("timeout"),
                     waiting_in=[*(facts.get("pending_calls") or []), *(facts.get("stuck_states") or [])],
                     compiling=facts.get("compiling") or [], start=start)
    return found, []


@probe("symptoms", title="What the user saw: the command's errors, the log's, a hung run, a pasted message",
       timeout=180.0, needs=("livetrace",), derived=True, facts=SymptomsFacts)
def symptoms_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    """Every symptom, with where it was seen; and what could not be read."""
    target = target_of(host)
    opts = target.options
    symptoms: list[Symptom] = []
    unread: list[str] = []
    given: set[str] = set()
    for text in opts.get("symptom") or []:
        key = " ".join(str(text).split())
        if not key or key in given:  # the same message given twice is one symptom
            continue
        given.add(key)
        found = from_text(str(text), "user", "--symptom", start=len(symptoms) + 1)
        lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
        if not found and lines:  # nothing recognised: the message itself is the symptom
            found = [Symptom(id="", source="user", text=lines[-1][:400], kind="error-line",
                             fields={"text": lines[-1][:400]}, where="--symptom")]
        seen = {(s.kind, s.text) for s in symptoms}  # a line already given in another message is one symptom
        for s in found:
            if (s.kind, s.text) not in seen:
                seen.add((s.kind, s.text))
                s.id = f"S{len(symptoms) + 1}"
                symptoms.append(s)
    if command_ran(host):
        found, why = _command_symptoms(host, len(symptoms) + 1)
        symptoms += found
        unread += why
    log = opts.get("train_log")
    tail = read_log(str(log), unread) if log else None
    if tail is not None:
        text, first = tail
        where = os.path.basename(str(log)) if first else f"{os.path.basename(str(log))} (end)"
        symptoms += from_text(text, "log", where, start=len(symptoms) + 1)
    sources = sorted({s.source for s in symptoms})
    facts = {"symptoms": [s.to_dict() for s in symptoms], "unread": unread, "sources": sources,
             "given": {"command": bool(target.command), "log": bool(log), "symptom": bool(opts.get("symptom"))}}
    ev = []
    if symptoms:
        ev.append(Evidence.of_table("what the user saw", ["id", "seen in", "line", "recognised as"],
                                    [[s.id, s.where or s.source, s.text, s.signature or "-"] for s in symptoms]))
    return facts, ev
