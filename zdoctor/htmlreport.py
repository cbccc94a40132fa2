"""The HTML export: one standalone document (no external files, no script) built from the report model.

A summary at the top with links to every finding, a heading per playbook step, evidence tables as HTML
tables, anchors for every section and finding, light and dark colour schemes and a print style. Every
text from the machine or the user is escaped, with control characters shown as ``\\xNN``.
"""

from __future__ import annotations

import html
import re
from typing import TYPE_CHECKING, Any

from .model import cap_text
from .present import (
    ALSO_FOUND,
    NO_SYMPTOMS,
    STOPS_NOTE,
    SYMPTOMS_HEADING,
    answer_line,
    applied_heading,
    are_steps,
    first_line,
    mark,
    option_label,
    options_heading,
    pasted_script,
    recommendation,
    remedy_flags,
    requires_of,
    safe_text,
    script_label,
    split_answers,
    summary_parts,
    symptom_place,
    symptom_verdict,
    undo_label,
    unexplained_headline,
    written_text,
)
from .walkwords import in_words

if TYPE_CHECKING:
    from .events import SessionView as Report
    from .events import WalkView

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

_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def esc(text: Any) -> str:
    """``text`` as inert HTML: escaped, control characters made visible."""
    return html.escape(safe_text(text), quote=True)


class Anchors:
    """Unique, safe ``id`` attributes."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def make(self, prefix: str, name: Any) -> str:
        base = f"{prefix}-{_ID_UNSAFE.sub('-', str(name)).strip('-') or 'x'}"
        anchor, n = base, 1
        while anchor in self.used:
            n += 1
            anchor = f"{base}-{n}"
        self.used.add(anchor)
        return anchor


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


def evidence_html(ev: dict[str, Any], cap: int) -> str:
    from .exportparts import _argv_text

    kind = str(ev.get("kind") or "command")
    out = [f"<h5>{esc(ev.get('label') or kind)} <span class=\"muted\">({esc(kind)})</span></h5>"]
    facts = []
    if ev.get("argv"):
        facts.append(f"<li>Command: <code>{esc('$ ' + _argv_text(ev['argv']))}</code></li>")
    if kind == "command" or ev.get("exit_code") is not None:
        facts.append(f"<li>Exit code: <code>{esc(ev.get('exit_code'))}</code></li>")
    if ev.get("paths"):
        facts.append("<li>Files: " + ", ".join(f"<code>{esc(p)}</code>" for p in ev["paths"]) + "</li>")
    if ev.get("error"):
        facts.append(f"<li class=\"fail\">Error: {esc(ev['error'])}</li>")
    if ev.get("truncated"):
        facts.append("<li>The output was cut when it was captured.</li>")
    if facts:
        out.append("<ul>" + "".join(facts) + "</ul>")
    tab = ev.get("table")
    if isinstance(tab, dict):
        out.append(table(list(tab.get("columns") or []), [list(r) for r in tab.get("rows") or []],
                         list(tab.get("highlight") or [])))
    if ev.get("stdout"):
        label = {"file": "Content", "traceback": "Traceback", "note": "Note"}.get(kind, "Output")
        out.append(block(label, str(ev["stdout"]), cap))
    if ev.get("stderr"):
        out.append(block("Errors (stderr)", str(ev["stderr"]), cap))
    return "\n".join(out)


def remedies_html(remedies: list[dict[str, Any]], elsewhere: bool, titles: dict[str, str] | None = None) -> str:
    n = len(remedies)
    steps = are_steps(remedies)
    out = [f"<h4>{esc(options_heading(n, steps))}</h4>"]
    if recommendation(remedies):
        out.append(f"<p>{esc(recommendation(remedies))}</p>")
    for i, rem in enumerate(remedies, 1):
        out.append(f"<h5>{esc(option_label(i, n, steps, rem))}: {esc(rem.get('title') or 'Remedy')}</h5>")
        out.append(f"<p class=\"muted\">{esc('; '.join(remedy_flags(rem, recorded_elsewhere=elsewhere)))}</p>")
        if requires_of(rem):
            out.append(f"<p><strong>{esc(first_line(requires_of(rem), titles))}</strong></p>")
        if rem.get("explanation"):
            out.append(f"<p>{esc(rem['explanation'])}</p>")
        if rem.get("commands"):
            commands = [str(c) for c in rem["commands"]]
            out.append(f"<p>{esc(script_label(commands))}:</p>\n" + pre("\n".join(pasted_script(commands))))
        if rem.get("undo"):
            undo = [str(c) for c in rem["undo"]]
            out.append(f"<p>{esc(undo_label(undo))}:</p>\n" + pre("\n".join(pasted_script(undo))))
    return "\n".join(out)


def finding_html(f: dict[str, Any], anchor: str, cap: int, elsewhere: bool,
                 titles: dict[str, str] | None = None) -> str:
    status = str(f.get("status") or "")
    out = [f'<article class="finding" id="{anchor}">',
           f"<h3>{status_span(status)} {esc(status.upper())}: {esc(f.get('title') or f.get('id'))}</h3>",
           f"<p class=\"muted\">Finding <code>{esc(f.get('id'))}</code></p>"]
    if f.get("detail"):
        out.append(f"<p>{esc(f['detail']).replace(chr(10), '<br>')}</p>")
    evidence = [e for e in f.get("evidence") or [] if isinstance(e, dict)]
    if evidence:
        out.append("<h4>Evidence</h4>")
        out += [evidence_html(e, cap) for e in evidence]
    remedies = [r for r in f.get("remedies") or [] if isinstance(r, dict)]
    if remedies:
        out.append(remedies_html(remedies, elsewhere, titles))
    out.append("</article>")
    return "\n".join(out)


def run_html(run: WalkView, anchors: Anchors) -> str:
    from .exportparts import _edge_text, open_walk_note

    out = [f'<h3 id="{anchors.make("playbook", run.playbook)}">Playbook <code>{esc(run.playbook or "unnamed")}'
           f"</code>{': ' + esc(run.title) if run.title else ''}</h3>"]
    for n, ev in run.numbered():
        if ev.get("type") == "node_enter":
            kind = f" <span class=\"muted\">({esc(ev['kind'])})</span>" if ev.get("kind") else ""
            title = f": {esc(ev['title'])}" if ev.get("title") else ""
            out.append(f'<h4 id="{anchors.make("step", f"{run.playbook}-{n}")}">{n}. '
                       f"<code>{esc(ev.get('node'))}</code>{kind}{title}</h4>")
        else:
            out.append(f"<p>→ <code>{esc(ev.get('to'))}</code> from <code>{esc(ev.get('from'))}</code>: "
                       f"{esc(_edge_text(ev))}</p>")
    diag = run.diagnosis or {}
    diag_title = diag.get("title") or (run.end or {}).get("diagnosis")
    if diag_title:
        out.append(f"<p><strong>Diagnosis:</strong> {esc(diag_title)}</p>")
    if run.end and run.end.get("reason"):
        out.append(f"<p><strong>Why:</strong> {esc(in_words(str(run.end['reason'])))}</p>")
    if run.end is None:
        out.append(f"<p class=\"muted\">{esc(open_walk_note(run))}</p>")
    return "\n".join(out)


def applied_html(ev: dict[str, Any], cap: int) -> str:
    from .exportparts import _obj, _outcome, _when

    rem = _obj(ev.get("remedy"))
    sym, word = _outcome(ev)
    status = {mark("ok"): "ok", mark("fail"): "fail"}.get(sym, "skip")
    out = [f"<h3><span class=\"{status}\">{esc(sym)}</span> {esc(rem.get('title') or 'Remedy')} ({esc(word)})</h3>",
           "<ul>", f"<li>For finding <code>{esc(ev.get('finding_id'))}</code>, at {esc(_when(ev.get('ts')))}</li>"]
    if ev.get("type") == "remedy_applied":
        out.append(f"<li>Exit code: <code>{esc(ev.get('exit_code'))}</code></li>")
    if ev.get("env_file") and ev.get("type") != "remedy_written":
        out.append(f"<li>Environment changes {written_text('<code>' + esc(ev['env_file']) + '</code>')}</li>")
    if ev.get("changed"):
        out.append("<li>Changed: " + ", ".join(f"<code>{esc(p)}</code>" for p in ev["changed"]) + "</li>")
    if ev.get("backup"):
        out.append(f"<li>Backup: <code>{esc(ev['backup'])}</code></li>")
    out.append("</ul>")
    if rem.get("commands"):
        commands = [str(c) for c in rem["commands"]]
        label = f"Commands ({STOPS_NOTE})" if len(commands) > 1 else "Commands"
        out.append(f"<p>{esc(label)}:</p>\n" + pre("\n".join(pasted_script(commands))))
    if rem.get("undo"):
        undo = [str(c) for c in rem["undo"]]
        out.append(f"<p>{esc(undo_label(undo))}:</p>\n" + pre("\n".join(pasted_script(undo))))
    if ev.get("output"):
        out.append(block("Output", str(ev["output"]), cap))
    return "\n".join(out)


def header_html(rep: Report) -> str:
    from .exportparts import TORN_NOTE, _command_line, _ended, _host_line, _when

    start = rep.start
    rows = [("Host", _host_line(rep.host)), ("Mode", start.get("mode") or "unknown")]
    if start.get("argv") is not None:
        rows.append(("Command", _command_line(start.get("argv"))))
    rows.append(("Started", _when(start.get("started", start.get("ts")))))
    rows += [("Resumed", _when(ev.get("resumed", ev.get("ts")))) for ev in rep.resumes]
    rows += [("Ended", _ended(rep)), ("zdoctor", start.get("zdoctor_version") or "unknown")]
    out = [f"<h1>zdoctor session <code>{esc(rep.session_id or 'unknown')}</code></h1>", '<dl class="meta">']
    out += [f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in rows]
    out.append("</dl>")
    if rep.torn:
        out.append(f'<p class="note">{esc(TORN_NOTE)}</p>')
    return "\n".join(out)


def symptoms_html(entries: list[dict[str, Any]]) -> str:
    """The symptom ledger, first: each thing the user saw, quoted, and what explains it or UNEXPLAINED."""
    out = ['<section id="symptoms">', f"<h2>{esc(SYMPTOMS_HEADING)}</h2>"]
    if not entries:
        out += [f'<p class="muted">{esc(NO_SYMPTOMS.capitalize())}.</p>', "</section>"]
        return "\n".join(out)
    headline = unexplained_headline(entries)
    if headline:
        out.append(f'<p class="fail"><strong>{esc(headline)}.</strong></p>')
    out.append("<ul>")
    for e in entries:
        cls = "ok" if e.get("explained_by") else "fail"
        answer = answer_line(e)
        out.append(f"<li><strong>{esc(e.get('id'))}</strong> ({esc(symptom_place(e))}): <code>{esc(e.get('text'))}"
                   f'</code> — <span class="{cls}">{esc(symptom_verdict(e))}</span>'
                   + (f"; {esc(answer)}" if answer else "") + "</li>")
    out += ["</ul>", "</section>"]
    return "\n".join(out)


def summary_html(rep: Report, findings: list[dict[str, Any]], anchors: list[str]) -> str:
    counts = rep.counts()
    parts = [f'<span class="{s}">{esc(text)}</span>' for text, s in summary_parts(counts)]
    total = counts.get("total", 0)
    parts.append(f"<strong>{total} finding{'' if total == 1 else 's'}</strong>")
    out = ['<section id="summary">', "<h2>Summary</h2>", "<p>" + " · ".join(parts) + "</p>"]
    shown = [(f, anchors[i]) for i, f in enumerate(findings) if f.get("status") in ("fail", "crash", "warn")]
    if shown:
        out.append("<ul>" + "".join(f'<li>{status_span(f.get("status"))} <a href="#{a}">'
                                     f'{esc(f.get("title") or f.get("id"))}</a></li>' for f, a in shown) + "</ul>")
    nav = [("path", "Path through the playbooks"), ("findings", "Findings"), ("applied", applied_heading(rep.applied))]
    out.append("<p>" + " · ".join(f'<a href="#{a}">{esc(t)}</a>' for a, t in nav) + "</p>")
    out.append("</section>")
    return "\n".join(out)


def render_html(rep: Report, cap: int) -> str:
    """The standalone HTML document for ``rep``."""
    from .exportparts import _fleet_line, _when, fleet_tables

    anchors = Anchors()
    for reserved in ("symptoms", "summary", "fleet", "path", "findings", "also-found", "applied", "probes", "other"):
        anchors.used.add(reserved)
    symptoms = rep.symptoms()
    answers, rest = split_answers(rep.sorted_findings(), symptoms)
    findings = answers + rest
    finding_ids = [anchors.make("finding", f.get("id")) for f in findings]
    title = f"zdoctor session {rep.session_id or 'unknown'}"
    body = [header_html(rep), symptoms_html(symptoms), summary_html(rep, findings, finding_ids)]
    if rep.fleet is not None:
        body += ['<section id="fleet">', "<h2>Fleet</h2>", f"<p>{esc(_fleet_line(rep.fleet))}</p>"]
        for name, columns, rows, hot in fleet_tables(rep.fleet):
            body += [f"<h3>{esc(name)}</h3>", table(columns, rows, hot)]
        body.append("</section>")
    body += ['<section id="path">', "<h2>Path through the playbooks</h2>"]
    body += [run_html(run, anchors) for run in rep.runs] or ['<p class="muted">No playbook was walked.</p>']
    body += ["</section>", '<section id="findings">', "<h2>Findings</h2>"]
    titles = {str(f.get("id")): str(f.get("title") or "") for f in findings}
    shown = [finding_html(f, finding_ids[i], cap, rep.recorded_elsewhere, titles) for i, f in enumerate(findings)]
    if symptoms and rest:  # what explains the symptoms first, the rest under its own heading
        shown.insert(len(answers), f'</section>\n<section id="also-found">\n<h2>{esc(ALSO_FOUND)}</h2>')
    body += shown or ['<p class="muted">No findings were recorded.</p>']
    body += ["</section>", '<section id="applied">', f"<h2>{esc(applied_heading(rep.applied))}</h2>"]
    body += [applied_html(ev, cap) for ev in rep.applied] or ['<p class="muted">Nothing was applied in this '
                                                              "session.</p>"]
    body.append("</section>")
    if rep.probes:
        rows = []
        for ev in rep.probes:
            res = ev["result"]
            dur = res.get("duration_s")
            rows.append([res.get("probe"), res.get("status"), f"{dur:.2f} s" if isinstance(dur, (int, float)) else "",
                         "/".join(str(ev.get(k)) for k in ("playbook", "node") if ev.get(k)), res.get("error") or ""])
        body += ['<section id="probes">', "<h2>Probes</h2>",
                 table(["Probe", "Status", "Time", "Step", "Error"], rows), "</section>"]
    if rep.others:
        from .exportparts import _other_body

        body += ['<section id="other">', "<h2>Other events</h2>", "<ul>"]
        body += [f"<li>#{esc(ev.get('seq', '?'))} <code>{esc(ev.get('type'))}</code> at {esc(_when(ev.get('ts')))}: "
                 f"<code>{esc(_other_body(ev))}</code></li>" for ev in rep.others]
        body += ["</ul>", "</section>"]
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{esc(title)}</title>\n<style>{STYLESHEET}</style>\n</head>\n<body>\n<main>\n"
            + "\n".join(body) + "\n</main>\n</body>\n</html>\n")
