"""Find symptoms in what the user saw: error lines recognised by the signature catalogue, the last
traceback's final line, compiler errors, and how a run ended (a signal, a time limit, a bare exit status)."""

from __future__ import annotations

import os
import re
import signal as signal_module
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from zdoctor.core.symptom import Symptom
from zdoctor.readers.stuck import hung_at_limit, shows_wait
from zdoctor.symptoms.catalogue import ANY_ERROR, SIGNATURES, Signature, pieces

#: At most this many symptoms from one source: a log of a thousand failing steps is one story.
MAX_PER_SOURCE = 12
#: Lines longer than this are cut when quoted.
MAX_LINE = 400

_TRACEBACK = "Traceback (most recent call last):"
#: ``SomeError: text`` at the start of a line (a traceback's final line, or a logged exception).
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)(?::|$)")
#: A compiler's or linker's error line: ``file.cpp:12:3: error: ...``, ``collect2: error: ...``.
_COMPILER_ERROR = re.compile(r"(?:^|\s)(?:fatal )?error: ")
#: Lines that only repeat what another line says.
_NOISE = re.compile(r"^(?:During handling of the above exception|The above exception was the direct cause)")


def _clean(line: str) -> str:
    line = line.strip()
    return line if len(line) <= MAX_LINE else line[:MAX_LINE] + " ..."


def recognise(line: str) -> tuple[Signature, dict[str, str]] | None:
    """The first catalogue signature matching ``line`` (its head or its tail when long), with the fields it
    gives."""
    for sig in SIGNATURES:
        m = sig.search(line)
        if m is not None:
            fields = {k: v.strip() for k, v in m.groupdict().items() if v is not None}
            fields.update(dict(sig.fields))
            return sig, fields
    return None


def _traceback_finals(lines: list[str]) -> set[int]:
    """Indexes of the final line of each traceback (the exception line after the frames)."""
    out: set[int] = set()
    i = 0
    while i < len(lines):
        if lines[i].strip() == _TRACEBACK:
            j = i + 1
            while j < len(lines) and (lines[j].startswith((" ", "\t")) or not lines[j].strip()):
                j += 1
            if j < len(lines):
                out.add(j)
            i = j
        i += 1
    return out


def _wraps_any(line: str) -> bool:
    """Whether ``line`` is a launcher's report of a failed rank (a catalogue entry that wraps any error)."""
    hit = recognise(line.strip())
    return hit is not None and ANY_ERROR in hit[0].wraps


def from_text(text: str, source: str, where: str = "", start: int = 1) -> list[Symptom]:
    """The symptoms in ``text`` (ids ``S<start>`` on): each recognised line once per kind and fields, the last
    traceback's final line (the last one before a launcher's own traceback, which only reports that a rank
    failed), and the first compiler errors."""
    lines = text.splitlines()
    finals = _traceback_finals(lines)
    if not finals:  # no traceback: the last line that reads as an exception stands for it
        exc = [n for n, raw in enumerate(lines) if _EXCEPTION_LINE.match(pieces(raw.strip())[0])]
        finals = set(exc[-1:])
    own = [n for n in sorted(finals) if not _wraps_any(lines[n])]
    last_final = own[-1] if own else (max(finals) if finals else None)
    found: list[Symptom] = []
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    compiler_errors = 0

    def add(line: str, kind: str, fields: dict[str, str], sig: str | None, lineno: int) -> None:
        key = (kind, tuple(sorted(fields.items())))
        if key in seen or len(found) >= MAX_PER_SOURCE:
            return
        seen.add(key)
        place = f"{where} line {lineno}" if where and source == "log" else where
        found.append(Symptom(id=f"S{start + len(found)}", source=source, text=_clean(line), kind=kind,
                             fields=fields, signature=sig, where=place))

    for n, raw in enumerate(lines):
        line = raw.strip()
        if not line or _NOISE.match(line):
            continue
        hit = recognise(line)
        if hit is not None:
            sig, fields = hit
            add(line, sig.kind, fields, sig.id, n + 1)
        elif n == last_final or (source != "command" and n in finals):
            add(line, "error-line", {"text": _clean(line)}, None, n + 1)
        elif _COMPILER_ERROR.search(pieces(line)[0]) and compiler_errors < 3:
            compiler_errors += 1
            add(line, "error-line", {"text": _clean(line)}, None, n + 1)
        elif source == "user" and _EXCEPTION_LINE.match(pieces(line)[0]):
            add(line, "error-line", {"text": _clean(line)}, None, n + 1)
    return found


def signal_name(number: int) -> str:
    try:
        return signal_module.Signals(number).name
    except ValueError:
        return f"signal {number}"


def still_compiling(compiling: Sequence[Mapping[str, Any]], timeout: float | None) -> Symptom | None:
    """The symptom of a run ended by its time limit while build tools were at work, or None."""
    tools = [c for c in compiling if isinstance(c, Mapping) and c.get("comm")]
    if not tools:
        return None
    first = tools[0]
    what = ", ".join(dict.fromkeys(
        f"{c['comm']}" + (f" on {os.path.basename(str(c['file']))}" if c.get("file") else "")
        + (f" (running {c['running_s']} s)" if c.get("running_s") else "") for c in tools[:4]))
    limit = f"{timeout:g} s" if timeout else "its time limit"
    return Symptom(id="", source="process", kind="still-compiling", where="--command run",
                   fields={"tool": str(first["comm"]), "file": str(first.get("file") or "")},
                   text=f"the op was still compiling when the run reached {limit} ({what}): not a hang; rerun "
                        "with a longer --timeout")


def from_run(exit_code: int | None, timed_out: bool, stdout: str, stderr: str, *, timeout: float | None = None,
             waiting_in: Iterable[str] = (), compiling: Sequence[Mapping[str, Any]] = (),
             start: int = 1) -> list[Symptom]:
    """The symptoms of a ``--command`` run: its error lines, then how it ended when that says more (killed by
    a signal, stopped at the time limit while still compiling, still working or hung, or a failing exit status
    with no error line to show for it)."""
    found = from_text(f"{stdout}\n{stderr}", "command", "--command output", start)
    nxt = start + len(found)
    kinds = {(s.kind, s.fields.get("signal")) for s in found}
    building = still_compiling(compiling, timeout) if timed_out else None
    if building is not None:
        building.id = f"S{nxt}"
        found.append(building)
    elif timed_out:
        sampled = [w for w in waiting_in if w]
        waits = [w for w in sampled if shows_wait([w])][:3]  # a process on a CPU is working, not waiting
        limit = f"{timeout:g} s" if timeout else "its time limit"
        if not hung_at_limit(sampled, users_limit=True):
            found.append(Symptom(id=f"S{nxt}", source="process", kind="still-working", where="--command run",
                                 text=f"the command was still working when the run reached {limit} (every "
                                      f"process sampled was on a CPU: {'; '.join(sampled[:3])}): not a hang; "
                                      "rerun with a longer --timeout"))
        else:
            text = f"the command did not finish within {limit}"
            if waits:
                text += "; it was waiting in " + "; ".join(waits)
            found.append(Symptom(id=f"S{nxt}", source="process", text=text, kind="hang",
                                 fields={"waiting_in": waits[0] if waits else ""}, where="--command run"))
    elif exit_code is not None and exit_code < 0:
        sig = str(-exit_code)
        if ("killed", sig) not in kinds:
            kind = "killed" if exit_code == -9 else "signal"
            found.append(Symptom(id=f"S{nxt}", source="command", kind=kind, fields={"signal": sig},
                                 text=f"the command was ended by {signal_name(-exit_code)}", where="--command run"))
    elif exit_code not in (None, 0) and not found:
        found.append(Symptom(id=f"S{nxt}", source="command", kind="exit-status", fields={"code": str(exit_code)},
                             text=f"the command exited with status {exit_code} and printed no error line",
                             where="--command run"))
    return found
