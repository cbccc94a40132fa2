"""One report document: every recorded session (the oldest too) exports with each evidence table in full
once and referred to where it is used again, and a real `check` run's terminal report and its session's
Markdown, HTML and JSON exports say the same findings in the same order with the same symptom links."""

from __future__ import annotations

import collections
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO, run_cli

from zdoctor.report.export import collect, md_table, render
from zdoctor.report.htmlreport import table as html_table
from zdoctor.walk.session import load_events

RECORDED = sorted(FIXTURES.glob("sessions*/*.jsonl"))
PY = os.path.realpath(sys.executable)


def md_tables(md: str) -> list[str]:
    """Every table of a Markdown document, whole (its consecutive ``|`` lines)."""
    return re.findall(r"(?:^\|.*\n)+", md, re.MULTILINE)


def table_uses(path: Path) -> dict[str, int]:
    """How many pieces of evidence, across all findings of the session, rest on each table (by id)."""
    doc = collect(load_events(path))
    return dict(collections.Counter(e.table.id for f in doc.findings for e in f.evidence if e.table is not None))


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_each_evidence_table_is_shown_in_full_once_and_referred_to_where_used_again(path: Path):
    events = load_events(path)
    doc = collect(events)
    md, html = render(events, "md"), render(events, "html")
    uses = table_uses(path)
    assert doc.tables and set(uses) == {t.id for t in doc.tables}
    for t in doc.tables:
        n, anchor = uses[t.id], t.id.lower()
        assert md_tables(md).count(md_table(t.columns, t.rows, t.highlight)) == 1, (t.id, t.label)
        assert re.findall(r"<table>.*?</table>", html, re.DOTALL).count(html_table(t.columns, t.rows, t.highlight)) \
            == 1, (t.id, t.label)
        assert md.count(f"[Evidence {t.id}](#{anchor})") == n - 1
        assert html.count(f'<a href="#{anchor}">Evidence {t.id}</a>') == n - 1
        # the table a reference points to carries the anchor, before every reference to it
        assert md.count(f'<a id="{anchor}"></a>') == (n > 1) and html.count(f'id="{anchor}"') == (n > 1)
        if n > 1:
            assert md.index(f'<a id="{anchor}"></a>') < md.index(f"](#{anchor})")
            assert html.index(f'id="{anchor}"') < html.index(f'href="#{anchor}"')
    # the JSON export stays loss-free: every finding keeps its evidence tables whole
    exported = json.loads(render(events, "json"))
    in_json = [e for f in exported["findings"] for e in f.get("evidence") or [] if isinstance(e.get("table"), dict)]
    assert len(in_json) == sum(uses.values())


def test_the_recorded_check_session_shares_its_repeated_tables():
    """The recorded `check` session: five tables rest under two or three findings each; its Markdown export
    shows each once (18 evidence tables before, 10 now, and the probes' table)."""
    (check,) = [p for p in RECORDED if p.stem == "20261201T130416-d9aa"]
    uses = table_uses(check)
    assert sorted(n for n in uses.values() if n > 1) == [2, 2, 3, 3, 3]
    md = render(load_events(check), "md")
    assert len(md_tables(md)) == len(uses) + 1 == 11


def test_the_terminal_report_and_every_export_come_from_one_document(tmp_path: Path):
    """A real failing command (2000 open files under a soft limit of 1024) and a pasted symptom: the terminal
    report of `check`, and the Markdown, HTML and JSON exports of the session it recorded, list the same
    findings in the same order and tie each symptom to the same findings."""
    cmd = shlex.join([PY, "-c", "fs = [open('/dev/null') for _ in range(2000)]; print('opened', len(fs))"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), NO_COLOR="1", COLUMNS="400")
    proc = subprocess.run(["prlimit", "--nofile=1024:4096", sys.executable, "-m", "zdoctor", "check", "--python",
                           PY, "--command", cmd, "--playbook", "gpu-stack",
                           "--symptom", "AssertionError: rank 3 saw 0 parameters"],
                          capture_output=True, text=True, env=env, timeout=300, cwd=str(REPO),
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, proc.stderr
    terminal = proc.stdout
    js = json.loads(run_cli(["export", "--last", "--format", "json"], env=env).stdout)
    md = run_cli(["export", "--last", "--format", "md"], env=env).stdout
    html = run_cli(["export", "--last", "--format", "html"], env=env).stdout

    order = [f["id"] for f in js["findings"]]
    # what answers each symptom first, in the symptoms' order: S1 (nothing explains it), then S2's finding
    assert order[:2] == ["symptom.unexplained.S1", "gpu.limits.nofile"] and len(order) > 10
    assert re.findall(r"^(?=.{3} ) *\S+ .+  \(([^\s()]+)\)$", terminal, re.MULTILINE) == order
    assert re.findall(r"^Finding `([^`]+)`$", md, re.MULTILINE) == [i.replace("_", "\\_") for i in order]
    assert re.findall(r'<p class="muted">Finding <code>([^<]+)</code></p>', html) == order

    links = {s["id"]: s["explained_by"] for s in js["symptoms"]}
    assert links["S1"] == [] and any(by == ["gpu.limits.nofile"] for by in links.values())
    for sid, by in links.items():
        verdict = f"explained by {', '.join(by)}" if by else "UNEXPLAINED"
        assert re.search(rf"^  {sid} .*\n +{re.escape(verdict)}", terminal, re.MULTILINE), sid
        said_md = (r"— " + re.escape(verdict.replace("_", "\\_"))) if by else r"— \*\*UNEXPLAINED"
        assert re.search(rf"^- \*\*{sid}\*\* .*{said_md}", md, re.MULTILINE), sid
        assert re.search(rf"<li><strong>{sid}</strong> .*<span class=\"{'ok' if by else 'fail'}\">"
                         rf"{re.escape(verdict)}", html), sid
