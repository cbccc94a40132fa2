"""Turn a recorded session into a report: Markdown for a ticket, standalone HTML, or complete JSON.

:func:`render` takes the events of a session (see :mod:`zdoctor.session`) and returns text;
:func:`write_export` writes it atomically. Every text that came from the machine or the user is made
inert: Markdown escapes and fences longer than any backtick run inside them, HTML escapes (rich is
given :class:`rich.text.Text` objects, never markup strings). rich is imported only for HTML.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from .atomic import write_text_atomic
from .errors import UsageError
from .events import SessionView, WalkView, fold
from .exportparts import (  # noqa: F401 - shared with the HTML export
    TORN_NOTE,
    UNFINISHED_NOTE,
    _argv_text,
    _command_line,
    _edge_text,
    _ended,
    _fleet_line,
    _host_line,
    _obj,
    _other_body,
    _outcome,
    _s,
    _summary_parts,
    _when,
    fleet_tables,
    open_walk_note,
)
from .model import cap_text, visible_controls
from .present import (
    ALSO_FOUND,
    MARKS,
    NO_SYMPTOMS,
    STOPS_NOTE,
    SYMPTOMS_HEADING,
    answer_line,
    applied_heading,
    are_steps,
    first_line,
    option_label,
    options_heading,
    pasted_script,
    recommendation,
    remedy_flags,
    requires_of,
    script_label,
    split_answers,
    symptom_place,
    symptom_verdict,
    undo_label,
    unexplained_headline,
    written_text,
)
from .walkwords import in_words

FORMATS = ("md", "html", "json")
EXTENSIONS = {"md": "md", "html": "html", "json": "json"}
#: Characters of command output shown per block in Markdown and HTML (the JSON export keeps it all).
BLOCK_CAP = 4000


# --- the report model ---------------------------------------------------------------------------

#: What a session's events say, gathered for rendering (one fold, shared with resume and the walk).
Report = SessionView


def collect(events: list[dict[str, Any]]) -> Report:
    """Gather ``events`` into a :class:`Report`; unknown or odd events land in ``others``."""
    return fold(events)


# --- Markdown -----------------------------------------------------------------------------------

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~&#])")
_MD_LINE_START = re.compile(r"^([ \t]*)([-+=]|\d+(?=[.)]))", re.MULTILINE)


def md_escape(text: Any, line_start: bool = False) -> str:
    """``text`` as inert Markdown prose: no emphasis, links, HTML, headings, lists or table breaks.

    ``line_start`` says the text opens a line, so a leading ``-``/``+``/``=``/``1.`` is escaped too
    (later lines always are).
    """
    out = _MD_SPECIAL.sub(r"\\\1", visible_controls(_s(text)))

    def fix(m: re.Match[str]) -> str:
        lead, mark = m.group(1), m.group(2)
        return f"{lead}{mark}\\" if mark[0].isdigit() else f"{lead}\\{mark}"

    head, sep, rest = out.partition("\n")
    if line_start:
        head = _MD_LINE_START.sub(fix, head)
    return head + sep + _MD_LINE_START.sub(fix, rest)


def md_paragraph(text: Any) -> str:
    """Escaped prose that keeps its line breaks (a trailing backslash is a hard break)."""
    lines = md_escape(_s(text).replace("\r\n", "\n").strip("\n"), line_start=True).split("\n")
    return "\n".join(line + "\\" if line.strip() and i + 1 < len(lines) and lines[i + 1].strip() else line
                     for i, line in enumerate(lines))


def md_cell(text: Any) -> str:
    """``text`` for a Markdown table cell: escaped, one line."""
    return md_escape(_s(text).replace("\r", "")).replace("\n", "<br>") or " "


def _longest_run(text: str, char: str = "`") -> int:
    return max((len(m) for m in re.findall(f"{re.escape(char)}+", text)), default=0)


def md_code(text: Any) -> str:
    """An inline code span that holds ``text`` literally (delimiters longer than any backtick run)."""
    body = visible_controls(_s(text).replace("\r", "").replace("\n", " "))
    if not body.strip():
        return "(empty)"
    ticks = "`" * (_longest_run(body) + 1)
    if body.startswith("`") or body.endswith("`") or (body.startswith(" ") and body.endswith(" ")):
        body = f" {body} "
    return f"{ticks}{body}{ticks}"


def md_fence(text: Any, info: str = "text") -> str:
    """A fenced code block around ``text``, with a fence longer than any backtick run inside it."""
    body = visible_controls(_s(text).replace("\r\n", "\n"))
    if not body.endswith("\n"):
        body += "\n"
    fence = "`" * max(3, _longest_run(body) + 1)
    return f"{fence}{info}\n{body}{fence}\n"


def _md_output(label: str, text: str, cap: int) -> list[str]:
    shown, cut = cap_text(text, cap)
    head = f"{label} (cut to {cap} characters; the JSON export has all of it):" if cut else f"{label}:"
    return [head, "", md_fence(shown)]


def md_table(columns: list[Any], rows: list[list[Any]], highlight: list[int] | None = None) -> str:
    """A Markdown table; highlighted rows get a ``⚠`` in a leading marker column."""
    width = max([len(columns)] + [len(r) for r in rows]) if (columns or rows) else 0
    cols = [_s(c) for c in columns] + [""] * (width - len(columns))
    marked = set(highlight or [])
    lines = ["| | " + " | ".join(md_cell(c) for c in cols) + " |",
             "|---|" + "---|" * width]
    for i, row in enumerate(rows):
        cells = [_s(c) for c in row] + [""] * (width - len(row))
        mark = "⚠" if i in marked else " "
        lines.append(f"| {mark} | " + " | ".join(md_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _md_evidence(ev: dict[str, Any], cap: int) -> list[str]:
    kind = _s(ev.get("kind")) or "command"
    out = [f"**{md_escape(ev.get('label') or kind)}** ({md_escape(kind)})", ""]
    facts = []
    if ev.get("argv"):
        facts.append(f"- Command: {md_code('$ ' + _argv_text(ev['argv']))}")
    if kind == "command" or ev.get("exit_code") is not None:
        code = ev.get("exit_code")
        facts.append(f"- Exit code: {md_code(code) if code is not None else 'none'}"
                     + (f" after {ev['duration_s']:.2f} s" if isinstance(ev.get("duration_s"), (int, float))
                        and ev.get("duration_s") else ""))
    if ev.get("paths"):
        facts.append("- Files: " + ", ".join(md_code(p) for p in ev["paths"]))
    if ev.get("error"):
        facts.append(f"- Error: {md_escape(ev['error'])}")
    if ev.get("truncated"):
        facts.append("- The output was cut when it was captured.")
    if facts:
        out += facts + [""]
    table = ev.get("table")
    if isinstance(table, dict):
        out += [md_table(list(table.get("columns") or []), [list(r) for r in table.get("rows") or []],
                         list(table.get("highlight") or []))]
    stdout, stderr = _s(ev.get("stdout")), _s(ev.get("stderr"))
    if stdout:
        if kind == "note":
            out += ["> " + line if line else ">" for line in md_escape(stdout, line_start=True).splitlines()] + [""]
        else:
            label = {"file": "Content", "traceback": "Traceback"}.get(kind, "Output")
            out += _md_output(label, stdout, cap)
    if stderr:
        out += _md_output("Errors (stderr)", stderr, cap)
    return out


def _md_remedy(n: int, total: int, rem: dict[str, Any], elsewhere: bool, steps: bool = False,
               titles: dict[str, str] | None = None) -> list[str]:
    flags = remedy_flags(rem, recorded_elsewhere=elsewhere)
    out = [f"**{md_escape(option_label(n, total, steps, rem))}: {md_escape(rem.get('title') or 'Remedy')}** "
           f"({md_escape('; '.join(flags))})", ""]
    if requires_of(rem):
        out += [f"**{md_escape(first_line(requires_of(rem), titles))}**", ""]
    if rem.get("explanation"):
        out += [md_paragraph(rem["explanation"]), ""]
    commands = [_s(c) for c in rem.get("commands") or []]
    if commands:
        out += [f"{md_escape(script_label(commands))}:", "", md_fence("\n".join(pasted_script(commands)), "bash")]
    undo = [_s(c) for c in rem.get("undo") or []]
    if undo:
        out += [undo_label(undo) + ":", "", md_fence("\n".join(pasted_script(undo)), "bash")]
    return out


def _md_finding(f: dict[str, Any], cap: int, elsewhere: bool = False,
                titles: dict[str, str] | None = None) -> list[str]:
    status = _s(f.get("status"))
    mark = MARKS.get(status, "?")
    out = [f"### {mark} {md_escape(status.upper())}: {md_escape(f.get('title') or f.get('id'))}", "",
           f"Finding {md_code(f.get('id'))}", ""]
    if f.get("detail"):
        out += [md_paragraph(f["detail"]), ""]
    evidence = [e for e in f.get("evidence") or [] if isinstance(e, dict)]
    if evidence:
        out += ["#### Evidence", ""]
        for ev in evidence:
            out += _md_evidence(ev, cap)
    remedies = [r for r in f.get("remedies") or [] if isinstance(r, dict)]
    if remedies:
        steps = are_steps(remedies)
        out += [f"#### {md_escape(options_heading(len(remedies), steps))}", ""]
        if recommendation(remedies):
            out += [md_escape(recommendation(remedies)), ""]
        for i, rem in enumerate(remedies, 1):
            out += _md_remedy(i, len(remedies), rem, elsewhere, steps, titles)
    return out


def _md_run(run: WalkView) -> list[str]:
    title = f": {md_escape(run.title)}" if run.title else ""
    out = [f"### Playbook {md_code(run.playbook or 'unnamed')}{title}", ""]
    path = run.end.get("path") if run.end else None
    if isinstance(path, list) and path:
        out += ["Path: " + " → ".join(md_code(p) for p in path), ""]
    for n, ev in run.numbered():
        if ev.get("type") == "node_enter":
            kind = f" ({md_escape(ev['kind'])})" if ev.get("kind") else ""
            label = f": {md_escape(ev['title'])}" if ev.get("title") else ""
            out.append(f"{n}. {md_code(ev.get('node'))}{kind}{label}")
        else:
            indent = "   " if n else ""
            out.append(f"{indent}- → {md_code(ev.get('to'))} from {md_code(ev.get('from'))}: "
                       f"{md_escape(_edge_text(ev))}")
    if run.steps:
        out.append("")
    diag = run.diagnosis or {}
    diag_title = diag.get("title") or (run.end or {}).get("diagnosis")
    if diag_title:
        node = f" (node {md_code(diag['node'])})" if diag.get("node") else ""
        out += [f"**Diagnosis:** {md_escape(diag_title)}{node}", ""]
    if run.end and run.end.get("reason"):
        out += [f"**Why:** {md_escape(in_words(str(run.end['reason'])))}", ""]
    if run.end is None:
        out += [md_escape(open_walk_note(run)), ""]
    return out


def _md_applied(ev: dict[str, Any], cap: int) -> list[str]:
    rem = _obj(ev.get("remedy"))
    mark, word = _outcome(ev)
    out = [f"### {mark} {md_escape(rem.get('title') or 'Remedy')} ({md_escape(word)})", "",
           f"- For finding {md_code(ev.get('finding_id'))}, at {_when(ev.get('ts'))}"]
    if ev.get("type") == "remedy_applied":
        out.append(f"- Exit code: {md_code(ev.get('exit_code')) if ev.get('exit_code') is not None else 'none'}")
    if ev.get("env_file") and ev.get("type") != "remedy_written":
        out.append(f"- Environment changes {written_text(md_code(ev['env_file']))}")
    if ev.get("changed"):
        out.append("- Changed: " + ", ".join(md_code(p) for p in ev["changed"]))
    if ev.get("backup"):
        out.append(f"- Backup: {md_code(ev['backup'])}")
    out.append("")
    commands = [_s(c) for c in rem.get("commands") or []]
    if commands:
        out += [f"Commands ({STOPS_NOTE}):" if len(commands) > 1 else "Commands:", "",
                md_fence("\n".join(pasted_script(commands)), "bash")]
    undo = [_s(c) for c in rem.get("undo") or []]
    if undo:
        out += [undo_label(undo) + ":", "", md_fence("\n".join(pasted_script(undo)), "bash")]
    if ev.get("output"):
        out += _md_output("Output", _s(ev["output"]), cap)
    return out


def _md_symptoms(entries: list[dict[str, Any]]) -> list[str]:
    """The symptom ledger, first: each thing the user saw, quoted, and what explains it or UNEXPLAINED."""
    out = [f"## {SYMPTOMS_HEADING}", ""]
    if not entries:
        return out + [md_paragraph(NO_SYMPTOMS.capitalize() + "."), ""]
    headline = unexplained_headline(entries)
    if headline:
        out += [f"**{md_escape(headline)}.**", ""]
    for e in entries:
        verdict = symptom_verdict(e)
        shown = f"**{md_escape(verdict)}**" if not e.get("explained_by") else md_escape(verdict)
        place = md_escape(symptom_place(e))
        answer = answer_line(e)
        out.append(f"- **{md_escape(e.get('id'))}** ({place}): {md_code(e.get('text'))} — {shown}"
                   + (f"; {md_escape(answer)}" if answer else ""))
    return out + [""]


def render_md(rep: Report, cap: int = BLOCK_CAP) -> str:
    """The Markdown report."""
    start = rep.start
    out = [f"# zdoctor session {md_code(rep.session_id or 'unknown')}", "",
           f"- **Host:** {md_escape(_host_line(rep.host))}",
           f"- **Mode:** {md_escape(start.get('mode') or 'unknown')}"]
    if start.get("argv") is not None:
        out.append(f"- **Command:** {md_code(_command_line(start.get('argv')))}")
    out.append(f"- **Started:** {_when(start.get('started', start.get('ts')))}")
    for ev in rep.resumes:
        out.append(f"- **Resumed:** {_when(ev.get('resumed', ev.get('ts')))}")
    if rep.end is not None and rep.end.get("exit_code") is not None:
        out.append(f"- **Ended:** {_when(rep.end.get('ts'))}, exit code {md_code(rep.end.get('exit_code'))}")
    else:
        out.append(f"- **Ended:** {md_escape(_ended(rep))}")
    out.append(f"- **zdoctor:** {md_escape(start.get('zdoctor_version') or 'unknown')}")
    out.append("")
    if rep.torn:
        out += [f"> {TORN_NOTE}", ""]

    out += _md_symptoms(rep.symptoms())
    out += ["## Summary", "", " · ".join(text for text, _ in _summary_parts(rep.counts())), ""]
    if rep.fleet is not None:
        out += ["## Fleet", "", md_paragraph(_fleet_line(rep.fleet)), ""]
        for title, columns, rows, hot in fleet_tables(rep.fleet):
            out += [f"**{md_escape(title)}**", "", md_table(columns, rows, hot)]
    if rep.runs:
        out += ["## Path through the playbooks", ""]
        for run in rep.runs:
            out += _md_run(run)
    symptoms = rep.symptoms()
    answers, rest = split_answers(rep.sorted_findings(), symptoms)
    out += ["## Findings", ""]
    if not answers and not rest:
        out += ["No findings were recorded.", ""]
    titles = {str(f.get("id")): _s(f.get("title")) for f in answers + rest}
    for f in answers:
        out += _md_finding(f, cap, rep.recorded_elsewhere, titles)
    if symptoms and rest:  # what explains the symptoms first, the rest under its own heading
        out += [f"## {md_escape(ALSO_FOUND)}", ""]
    for f in rest:
        out += _md_finding(f, cap, rep.recorded_elsewhere, titles)
    out += [f"## {md_escape(applied_heading(rep.applied))}", ""]
    if not rep.applied:
        out += ["Nothing was applied in this session.", ""]
    for ev in rep.applied:
        out += _md_applied(ev, cap)
    if rep.probes:
        out += ["## Probes", "", "| Probe | Status | Time | Step | Error |", "|---|---|---|---|---|"]
        for ev in rep.probes:
            res = ev["result"]
            dur = res.get("duration_s")
            step = "/".join(_s(ev.get(k)) for k in ("playbook", "node") if ev.get(k))
            out.append(f"| {md_cell(res.get('probe'))} | {md_cell(res.get('status'))} | "
                       f"{f'{dur:.2f} s' if isinstance(dur, (int, float)) else ''} | {md_cell(step)} | "
                       f"{md_cell(res.get('error'))} |")
        out.append("")
    if rep.others:
        out += ["## Other events", ""]
        for ev in rep.others:
            out.append(f"- #{md_escape(ev.get('seq', '?'))} {md_code(ev.get('type'))} at "
                       f"{_when(ev.get('ts'))}: {md_code(_other_body(ev))}")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


# --- HTML ---------------------------------------------------------------------------------------

def render_html(rep: Report, cap: int = BLOCK_CAP) -> str:
    """A standalone HTML document (see :mod:`zdoctor.htmlreport`)."""
    from .htmlreport import render_html as html_document

    return html_document(rep, cap)


# --- JSON ---------------------------------------------------------------------------------------

def render_json(rep: Report, events: list[Any]) -> str:
    """The complete, loss-free JSON document: every event, plus findings and summary for convenience."""
    start = rep.start
    doc = {
        "format": "zdoctor-session",
        "version": 1,
        "session": rep.session_id or None,
        "zdoctor_version": start.get("zdoctor_version"),
        "mode": start.get("mode"),
        "host": rep.host,
        "started": start.get("started", start.get("ts")),
        "ended": rep.end.get("ts") if rep.end else None,
        "exit_code": rep.end.get("exit_code") if rep.end else None,
        "torn_last_event": rep.torn,
        "events": list(events),
        "symptoms": rep.symptoms(),
        "findings": rep.sorted_findings(),
        "summary": rep.counts(),
    }
    return json.dumps(doc, indent=2, ensure_ascii=False, default=str) + "\n"


# --- entry points -------------------------------------------------------------------------------

def render(events: list[dict[str, Any]], fmt: str, live: bool = False) -> str:
    """Render a session's ``events`` as ``md``, ``html`` or ``json`` text; ``live`` says the session is still
    running (the export is made from inside it)."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown export format {fmt!r} (choose md, html or json)")
    rep = collect(events)
    rep.live = live
    if fmt == "md":
        return render_md(rep)
    if fmt == "html":
        return render_html(rep)
    return render_json(rep, events)


def default_name(session_id: str, fmt: str) -> str:
    """The file name an export gets when the user names none: ``zdoctor-<id>.<ext>``."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown export format {fmt!r} (choose md, html or json)")
    return f"zdoctor-{session_id}.{EXTENSIONS[fmt]}"


def export_session(session_id: str, fmt: str, folder: str | os.PathLike[str] | None = None,
                   live: bool = False) -> Path:
    """Write session ``session_id`` as ``fmt`` into ``folder`` (default: the working directory) under its
    default name; where that folder cannot be written, into the state directory's ``exports``. Returns the
    absolute path written."""
    from .errors import ZdoctorError
    from .session import load_events, state_dir

    text = render(load_events(session_id), fmt, live=live)
    name = default_name(session_id, fmt)
    try:
        path = write_export(text, Path(folder or Path.cwd()) / name)
    except ZdoctorError:
        fallback = state_dir() / "exports"
        fallback.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = write_export(text, fallback / name)
    return path.resolve()


def write_export(text: str, out_path: str | os.PathLike[str]) -> Path:
    """Write ``text`` to ``out_path`` atomically (temp file, fsync, rename) with mode 0600."""
    return write_text_atomic(out_path, text, 0o600)
