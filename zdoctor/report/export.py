"""Turn a recorded session into a report: Markdown for a ticket, standalone HTML, or complete JSON.

:func:`render` takes the events of a session (see :mod:`zdoctor.walk.session`), folds them into the report
document (:mod:`zdoctor.report.reportdoc`) and returns its text; :func:`write_export` writes it atomically. Every
text that came from the machine or the user is made inert: Markdown escapes and fences longer than any
backtick run inside them, HTML escapes.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from zdoctor.core.errors import UsageError, ZdoctorError
from zdoctor.core.model import cap_text, visible_controls
from zdoctor.edit.atomic import write_text_atomic
from zdoctor.report.docwriter import write_document
from zdoctor.report.htmlreport import render_html as html_document
from zdoctor.report.reportdoc import ReportDoc, from_session, summary_texts, text_of
from zdoctor.walk.events import fold
from zdoctor.walk.session import load_events, state_dir

FORMATS = ("md", "html", "json")
EXTENSIONS = {"md": "md", "html": "html", "json": "json"}
#: Characters of command output shown per block in Markdown and HTML (the JSON export keeps it all).
BLOCK_CAP = 4000


# --- the report model ---------------------------------------------------------------------------

def collect(events: list[dict[str, Any]]) -> ReportDoc:
    """The report document of a session's ``events`` (one fold; unknown or odd events land in ``others``)."""
    return from_session(fold(events), events)


# --- Markdown -----------------------------------------------------------------------------------

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~&#])")
_MD_LINE_START = re.compile(r"^([ \t]*)([-+=]|\d+(?=[.)]))", re.MULTILINE)


def md_escape(text: Any, line_start: bool = False) -> str:
    """``text`` as inert Markdown prose: no emphasis, links, HTML, headings, lists or table breaks.

    ``line_start`` says the text opens a line, so a leading ``-``/``+``/``=``/``1.`` is escaped too
    (later lines always are).
    """
    out = _MD_SPECIAL.sub(r"\\\1", visible_controls(text_of(text)))

    def fix(m: re.Match[str]) -> str:
        lead, mark = m.group(1), m.group(2)
        return f"{lead}{mark}\\" if mark[0].isdigit() else f"{lead}\\{mark}"

    head, sep, rest = out.partition("\n")
    if line_start:
        head = _MD_LINE_START.sub(fix, head)
    return head + sep + _MD_LINE_START.sub(fix, rest)


def md_paragraph(text: Any) -> str:
    """Escaped prose that keeps its line breaks (a trailing backslash is a hard break)."""
    lines = md_escape(text_of(text).replace("\r\n", "\n").strip("\n"), line_start=True).split("\n")
    return "\n".join(line + "\\" if line.strip() and i + 1 < len(lines) and lines[i + 1].strip() else line
                     for i, line in enumerate(lines))


def md_cell(text: Any) -> str:
    """``text`` for a Markdown table cell: escaped, one line."""
    return md_escape(text_of(text).replace("\r", "")).replace("\n", "<br>") or " "


def _longest_run(text: str, char: str = "`") -> int:
    return max((len(m) for m in re.findall(f"{re.escape(char)}+", text)), default=0)


def md_code(text: Any) -> str:
    """An inline code span that holds ``text`` literally (delimiters longer than any backtick run)."""
    body = visible_controls(text_of(text).replace("\r", "").replace("\n", " "))
    if not body.strip():
        return "(empty)"
    ticks = "`" * (_longest_run(body) + 1)
    if body.startswith("`") or body.endswith("`") or (body.startswith(" ") and body.endswith(" ")):
        body = f" {body} "
    return f"{ticks}{body}{ticks}"


def md_fence(text: Any, info: str = "text") -> str:
    """A fenced code block around ``text``, with a fence longer than any backtick run inside it."""
    body = visible_controls(text_of(text).replace("\r\n", "\n"))
    if not body.endswith("\n"):
        body += "\n"
    fence = "`" * max(3, _longest_run(body) + 1)
    return f"{fence}{info}\n{body}{fence}\n"


def md_table(columns: list[Any], rows: list[list[Any]], highlight: list[int] | None = None) -> str:
    """A Markdown table; highlighted rows get a ``⚠`` in a leading marker column."""
    width = max([len(columns)] + [len(r) for r in rows]) if (columns or rows) else 0
    cols = [text_of(c) for c in columns] + [""] * (width - len(columns))
    marked = set(highlight or [])
    lines = ["| | " + " | ".join(md_cell(c) for c in cols) + " |",
             "|---|" + "---|" * width]
    for i, row in enumerate(rows):
        cells = [text_of(c) for c in row] + [""] * (width - len(row))
        mark = "⚠" if i in marked else " "
        lines.append(f"| {mark} | " + " | ".join(md_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


class MarkdownWriter:
    """The Markdown of a report document (see :class:`zdoctor.report.docwriter.Writer`)."""

    spells_path = True
    shows_empty_path = False

    def __init__(self, cap: int = BLOCK_CAP) -> None:
        self.cap = cap
        self.lines: list[str] = []

    def text(self, text: str) -> str:
        return md_escape(text)

    def code(self, text: str) -> str:
        return md_code(text)

    def strong(self, inline: str) -> str:
        return f"**{inline}**"

    def aside(self, text: str) -> str:
        return f"({md_escape(text)})"

    def mark(self, symbol: str, status: str) -> str:
        return symbol

    def status_text(self, text: str, status: str, emphasis: bool) -> str:
        return self.strong(md_escape(text)) if emphasis else md_escape(text)

    def link(self, inline: str, anchor: str) -> str:
        return f"[{inline}](#{anchor})"

    def exit_code(self, code: object, duration_s: float | None) -> str:
        return (md_code(code) if code is not None else "none") + (f" after {duration_s:.2f} s" if duration_s else "")

    def heading(self, level: int, inline: str, anchor: str = "") -> None:
        self.lines += [f"{'#' * level} {inline}", ""]

    def label(self, level: int, inline: str, note: str, apart: bool = False) -> None:
        self.lines += [self.strong(inline) + (f" {self.aside(note)}" if note else ""), ""]

    def para(self, inline: str, cls: str = "", anchor: str = "") -> None:
        self.lines += [(f'<a id="{anchor}"></a>' if anchor else "") + inline, ""]

    def prose(self, text: str, breaks: bool = True, cls: str = "") -> None:
        self.lines += [md_paragraph(text), ""]

    def note(self, text: str) -> None:
        self.lines += [f"> {text}", ""]

    def items(self, items: list[tuple[str, str]], tight: bool = False) -> None:
        self.lines += [f"- {inline}" for inline, _cls in items] + [""]

    def meta(self, rows: list[tuple[str, list[tuple[str, bool]]]]) -> None:
        self.lines += [f"- **{md_escape(key)}:** " + "".join(md_code(t) if code else md_escape(t) for t, code in parts)
                       for key, parts in rows] + [""]

    def table(self, columns: list[str], rows: list[list[str]], highlight: list[int]) -> None:
        self.lines.append(md_table(columns, rows, highlight))

    def grid(self, columns: list[str], rows: list[list[str]]) -> None:
        self.lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        self.lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows] + [""]

    def output(self, label: str, text: str, quote: bool = False) -> None:
        if quote:
            self.lines += ["> " + line if line else ">" for line in md_escape(text, line_start=True).splitlines()]
            self.lines.append("")
            return
        shown, cut = cap_text(text, self.cap)
        head = f"{label} (cut to {self.cap} characters; the JSON export has all of it):" if cut else f"{label}:"
        self.lines += [head, "", md_fence(shown)]

    def script(self, label: str, commands: list[str]) -> None:
        self.lines += [f"{md_escape(label)}:", "", md_fence("\n".join(commands), "bash")]

    def step(self, number: int, inline: str, anchor: str) -> None:
        self.lines.append(f"{number}. {inline}")

    def edge(self, number: int, inline: str) -> None:
        self.lines.append(("   " if number else "") + "- " + inline)

    def steps_end(self, any_steps: bool) -> None:
        if any_steps:
            self.lines.append("")

    def summary(self, doc: ReportDoc) -> None:
        self.lines += ["## Summary", "", " · ".join(text for text, _ in summary_texts(doc.counts)), ""]

    def open_section(self, anchor: str, title: str) -> None:
        self.heading(2, md_escape(title))

    def close_section(self) -> None:
        pass

    def open_group(self, anchor: str, cls: str) -> None:
        pass

    def close_group(self) -> None:
        pass


def render_md(doc: ReportDoc, cap: int = BLOCK_CAP) -> str:
    """The Markdown report."""
    w = MarkdownWriter(cap)
    write_document(doc, w)
    return "\n".join(w.lines).rstrip("\n") + "\n"


# --- HTML ---------------------------------------------------------------------------------------

def render_html(doc: ReportDoc, cap: int = BLOCK_CAP) -> str:
    """A standalone HTML document (see :mod:`zdoctor.report.htmlreport`)."""

    return html_document(doc, cap)


# --- JSON ---------------------------------------------------------------------------------------

def render_json(doc: ReportDoc) -> str:
    """The complete, loss-free JSON document: every event, plus symptoms, findings and summary for
    convenience."""
    return json.dumps(doc.data, indent=2, ensure_ascii=False, default=str) + "\n"


# --- entry points -------------------------------------------------------------------------------

def render(events: list[dict[str, Any]], fmt: str, live: bool = False) -> str:
    """Render a session's ``events`` as ``md``, ``html`` or ``json`` text; ``live`` says the session is still
    running (the export is made from inside it)."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown export format {fmt!r} (choose md, html or json)")
    view = fold(events)
    view.live = live
    doc = from_session(view, events)
    if fmt == "md":
        return render_md(doc)
    if fmt == "html":
        return render_html(doc)
    return render_json(doc)


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
