"""The HTML export: one standalone document (no external files, no script) built from the report model.

A summary at the top with links to every finding, a heading per playbook step, evidence tables as HTML
tables, anchors for every section and finding, light and dark colour schemes and a print style. Every
text from the machine or the user is escaped, with control characters shown as ``\\xNN``.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from zdoctor.core.model import cap_text
from zdoctor.core.present import mark, safe_text, summary_parts
from zdoctor.report.docwriter import write_document
from zdoctor.report.reportdoc import total_line

if TYPE_CHECKING:
    from zdoctor.report.reportdoc import ReportDoc

STYLESHEET = """
:root { color-scheme: light dark; --fg: #1f2328; --bg: #ffffff; --muted: #59636e; --line: #d1d9e0;
  --code-bg: #f6f8fa; --ok: #1a7f37; --warn: #9a6700; --fail: #cf222e; --skip: #59636e; --crash: #8250df;
  --hot: #fff1e5; --link: #0969da; }
@media (prefers-color-scheme: dark) {
  :root { --fg: #e6edf3; --bg: #0d1117; --muted: #9198a1; --line: #3d444d; --code-bg: #151b23;
    --ok: #3fb950; --warn: #d29922; --fail: #f85149; --skip: #9198a1; --crash: #ab7df8; --hot: #3d2a12;
    --link: #4493f8; }
}
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg);
  max-width: 72rem; margin: 0 auto; padding: 1rem 1.5rem; line-height: 1.45; }
a { color: var(--link); }
code, pre { font-family: ui-monospace, Menlo, "DejaVu Sans Mono", Consolas, monospace; }
main { overflow-wrap: anywhere; }
pre { background: var(--code-bg); border: 1px solid var(--line); padding: .6rem .8rem; overflow-x: auto;
  white-space: pre-wrap; overflow-wrap: anywhere; max-width: 100%; box-sizing: border-box; }
table { border-collapse: collapse; margin: .5rem 0; max-width: 100%; }
th, td { border: 1px solid var(--line); padding: .2rem .5rem; text-align: left; vertical-align: top;
  overflow-wrap: anywhere; }
tr.hot td { background: var(--hot); font-weight: 600; }
dl.meta { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: .1rem 1rem; }
dl.meta dd { margin: 0; min-width: 0; }
dl.meta dt { font-weight: 600; }
.muted { color: var(--muted); }
.ok { color: var(--ok); } .warn { color: var(--warn); } .fail { color: var(--fail); }
.skip { color: var(--skip); } .crash { color: var(--crash); }
.finding { border-top: 1px solid var(--line); margin-top: 1rem; }
.note { border-left: 4px solid var(--warn); padding-left: .6rem; }
@media print { body { max-width: none; color: #000; background: #fff; } a { color: #000; }
  pre { white-space: pre-wrap; border-color: #999; } .finding { break-inside: avoid-page; } }
"""

def esc(text: Any) -> str:
    """``text`` as inert HTML: escaped, control characters made visible."""
    return html.escape(safe_text(text), quote=True)


def status_span(status: Any) -> str:
    status = "" if status is None else str(status)
    return f'<span class="{esc(status)}">{esc(mark(status))}</span>'


def table(columns: list[Any], rows: list[list[Any]], highlight: list[int] | None = None) -> str:
    """An HTML table; highlighted rows get a ``⚠`` and the ``hot`` class."""
    width = max([len(columns)] + [len(r) for r in rows]) if (columns or rows) else 0
    hot = set(highlight or [])
    cols = list(columns) + [""] * (width - len(columns))
    out = ["<table>", "<thead><tr><th></th>" + "".join(f"<th>{esc(c)}</th>" for c in cols) + "</tr></thead>",
           "<tbody>"]
    for i, row in enumerate(rows):
        cells = list(row) + [""] * (width - len(row))
        attr = ' class="hot"' if i in hot else ""
        out.append(f"<tr{attr}><td>{'⚠' if i in hot else ''}</td>"
                   + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    out += ["</tbody>", "</table>"]
    return "\n".join(out)


def pre(text: Any, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<pre{attr}><code>{esc(text)}</code></pre>"


def block(label: str, text: str, cap: int) -> str:
    shown, cut = cap_text(text, cap)
    head = f"{label} (cut to {cap} characters; the JSON export has all of it):" if cut else f"{label}:"
    return f'<p class="muted">{esc(head)}</p>\n{pre(shown)}'


class HtmlWriter:
    """The HTML of a report document (see :class:`zdoctor.report.docwriter.Writer`)."""

    spells_path = False
    shows_empty_path = True

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.lines: list[str] = []

    def text(self, text: str) -> str:
        return esc(text)

    def code(self, text: str) -> str:
        return f"<code>{esc(text)}</code>"

    def strong(self, inline: str) -> str:
        return f"<strong>{inline}</strong>"

    def aside(self, text: str) -> str:
        return f'<span class="muted">({esc(text)})</span>'

    def mark(self, symbol: str, status: str) -> str:
        return f'<span class="{esc(status)}">{esc(symbol)}</span>'

    def status_text(self, text: str, status: str, emphasis: bool) -> str:
        return f'<span class="{esc(status)}">{esc(text)}</span>'

    def link(self, inline: str, anchor: str) -> str:
        return f'<a href="#{anchor}">{inline}</a>'

    def exit_code(self, code: object, duration_s: float | None) -> str:
        return f"<code>{esc(code)}</code>"

    def heading(self, level: int, inline: str, anchor: str = "") -> None:
        attr = f' id="{anchor}"' if anchor else ""
        self.lines.append(f"<h{level}{attr}>{inline}</h{level}>")

    def label(self, level: int, inline: str, note: str, apart: bool = False) -> None:
        if apart:
            self.lines += [f"<h{level}>{inline}</h{level}>", f'<p class="muted">{esc(note)}</p>']
        else:
            self.lines.append(f"<h{level}>{inline}" + (f" {self.aside(note)}" if note else "") + f"</h{level}>")

    def para(self, inline: str, cls: str = "", anchor: str = "") -> None:
        attrs = (f' class="{cls}"' if cls else "") + (f' id="{anchor}"' if anchor else "")
        self.lines.append(f"<p{attrs}>{inline}</p>")

    def prose(self, text: str, breaks: bool = True, cls: str = "") -> None:
        body = esc(text).replace("\n", "<br>") if breaks else esc(text)
        self.lines.append((f'<p class="{cls}">' if cls else "<p>") + body + "</p>")

    def note(self, text: str) -> None:
        self.lines.append(f'<p class="note">{esc(text)}</p>')

    def items(self, items: list[tuple[str, str]], tight: bool = False) -> None:
        lines = [(f'<li class="{cls}">' if cls else "<li>") + inline + "</li>" for inline, cls in items]
        self.lines += ["<ul>" + "".join(lines) + "</ul>"] if tight else ["<ul>", *lines, "</ul>"]

    def meta(self, rows: list[tuple[str, list[tuple[str, bool]]]]) -> None:
        self.lines.append('<dl class="meta">')
        self.lines += [f"<dt>{esc(key)}</dt><dd>{esc(''.join(t for t, _code in parts))}</dd>" for key, parts in rows]
        self.lines.append("</dl>")

    def table(self, columns: list[str], rows: list[list[str]], highlight: list[int]) -> None:
        self.lines.append(table(columns, rows, highlight))

    def grid(self, columns: list[str], rows: list[list[str]]) -> None:
        self.lines.append(table(columns, rows))

    def output(self, label: str, text: str, quote: bool = False) -> None:
        self.lines.append(block(label, text, self.cap))

    def script(self, label: str, commands: list[str]) -> None:
        self.lines.append(f"<p>{esc(label)}:</p>\n" + pre("\n".join(commands)))

    def step(self, number: int, inline: str, anchor: str) -> None:
        self.heading(4, f"{number}. {inline}", anchor)

    def edge(self, number: int, inline: str) -> None:
        self.para(inline)

    def steps_end(self, any_steps: bool) -> None:
        pass

    def summary(self, doc: ReportDoc) -> None:
        parts = [f'<span class="{s}">{esc(text)}</span>' for text, s in summary_parts(doc.counts)]
        parts.append(f"<strong>{total_line(doc.counts)}</strong>")
        self.lines += ['<section id="summary">', "<h2>Summary</h2>", "<p>" + " · ".join(parts) + "</p>"]
        shown = [f for f in doc.findings if f.status in ("fail", "crash", "warn")]
        if shown:
            self.lines.append("<ul>" + "".join(f'<li>{status_span(f.status)} <a href="#{f.anchor}">{esc(f.title)}</a>'
                                               "</li>" for f in shown) + "</ul>")
        nav = [("path", "Path through the playbooks"), ("findings", "Findings"), ("applied", doc.applied_heading)]
        self.lines.append("<p>" + " · ".join(f'<a href="#{a}">{esc(t)}</a>' for a, t in nav) + "</p>")
        self.lines.append("</section>")

    def open_section(self, anchor: str, title: str) -> None:
        self.lines += [f'<section id="{anchor}">', f"<h2>{esc(title)}</h2>"]

    def close_section(self) -> None:
        self.lines.append("</section>")

    def open_group(self, anchor: str, cls: str) -> None:
        self.lines.append(f'<article class="{cls}" id="{anchor}">')

    def close_group(self) -> None:
        self.lines.append("</article>")


def render_html(doc: ReportDoc, cap: int) -> str:
    """The standalone HTML document for ``doc``."""
    w = HtmlWriter(cap)
    write_document(doc, w)
    title = f"zdoctor session {doc.session_id or 'unknown'}"
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{esc(title)}</title>\n<style>{STYLESHEET}</style>\n</head>\n<body>\n<main>\n"
            + "\n".join(w.lines) + "\n</main>\n</body>\n</html>\n")
