"""Exports of a recorded session: Markdown for tickets, standalone HTML, loss-free JSON."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import REPO
from markdown_it import MarkdownIt

from zdoctor.core.errors import InputError, UsageError
from zdoctor.core.model import Evidence, Finding, ProbeResult, Remedy
from zdoctor.report.export import default_name, md_code, md_escape, md_fence, render, write_export
from zdoctor.walk.session import SessionLog, load_events

HF = "hf_" + "ZyXwVuTsRqPoNmLkJiHgFeDcBa98765432"
HOST = {"hostname": "gpu-node-7", "os": "Ubuntu 22.04.4 LTS", "kernel": "5.15.0-105-generic",
        "arch": "x86_64", "python": "/opt/conda/envs/train/bin/python", "kind": "live"}
HOSTILE = "evil | pipe `tick` ``double`` $(touch pwned) <script>alert(1)</script> *bold* [x](http://e)"
LONG_CMD = "export LD_LIBRARY_PATH=" + ":".join(f"/opt/conda/envs/train/lib/dir{i}" for i in range(8))


def glibcxx_finding(status: str = "fail") -> Finding:
    ldd = Evidence(label="import of the DeepSpeed CPU Adam extension", argv=["python", "-c", "import cpu_adam"],
                   exit_code=1, duration_s=0.42,
                   stdout=f"export HF_TOKEN={HF}\nexport CUDA_HOME=/usr/local/cuda\n",
                   stderr="ImportError: /lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.30' not "
                          "found (required by cpu_adam.so)\n")
    table = Evidence.of_table("GLIBCXX versions: needed vs provided", ["version", "cpu_adam.so needs",
                                                                        "/lib/x86_64-linux-gnu/libstdc++.so.6"],
                              [["GLIBCXX_3.4.30", "yes", "missing"], ["GLIBCXX_3.4.29", "yes", "present"]],
                              highlight=[0])
    fix = Remedy("Load the conda libstdc++ first", commands=[LONG_CMD], verified=True,
                 undo=["export LD_LIBRARY_PATH=\"$ZDOCTOR_OLD_LD_LIBRARY_PATH\""],
                 explanation="The conda env ships libstdc++ with GLIBCXX_3.4.30.")
    root = Remedy("Upgrade the system libstdc++", commands=["sudo apt-get install -y libstdc++6"],
                  verified=None, requires_root=True)
    return Finding("loader.glibcxx", status, "libstdc++ lacks GLIBCXX_3.4.30",
                   "cpu_adam.so needs GLIBCXX_3.4.30\nthe system libstdc++ stops at 3.4.29",
                   evidence=[ldd, table], remedies=[fix, root])


def hostile_finding() -> Finding:
    out = "````\n```bash\nrm -rf /\n```\n`````x\n"
    return Finding("x.hostile", "warn", HOSTILE, HOSTILE + "\n# not a heading\n- not a list",
                   evidence=[Evidence(label=HOSTILE, argv=["sh", "-c", "echo `id` | tee $(touch pwned)"],
                                      exit_code=0, stdout=out),
                             Evidence.of_table("t|able", ["a|b", "`c`"], [[HOSTILE, "x\ny"]], [0])],
                   remedies=[Remedy("quote " + HOSTILE, commands=["echo '$(touch pwned)'", "echo ````"],
                                    undo=["true"])])


@pytest.fixture
def session(state_home: Path) -> str:
    """A complete recorded session: a playbook walk, findings, a remedy applied, a re-check."""
    log = SessionLog.create("tui", ["--python", "/opt/conda/envs/train/bin/python"], HOST)
    log.record("playbook_start", {"playbook": "zero3-startup", "title": "ZeRO-3 Offload will not start",
                                  "start": "toolchain"})
    log.record("node_enter", {"playbook": "zero3-startup", "node": "toolchain", "kind": "check",
                              "title": "Can the extension load?"})
    log.record("probe_result", {"playbook": "zero3-startup", "node": "toolchain",
                                "result": ProbeResult(probe="loader", facts={"ok": False}, duration_s=0.5)})
    log.record("finding", {"playbook": "zero3-startup", "node": "toolchain", "finding": glibcxx_finding()})
    log.record("edge", {"playbook": "zero3-startup", "from": "toolchain", "to": "old-libstdcxx",
                        "predicate": "glibcxx_satisfied", "negate": True,
                        "reason": "the loaded libstdc++ lacks GLIBCXX_3.4.30", "override": False})
    log.record("node_enter", {"playbook": "zero3-startup", "node": "old-libstdcxx", "kind": "diagnosis",
                              "title": "An old system libstdc++ is loaded first"})
    log.record("diagnosis", {"playbook": "zero3-startup", "node": "old-libstdcxx",
                             "title": "An old system libstdc++ is loaded first"})
    log.record("playbook_end", {"playbook": "zero3-startup", "path": ["toolchain", "old-libstdcxx"],
                                "diagnosis": "old-libstdcxx", "reason": "reached a diagnosis"})
    log.record("finding", {"finding": Finding("gpu.count", "ok", "8 GPUs visible")})
    log.record("finding", {"finding": hostile_finding()})
    log.record("finding", {"finding": Finding("probe.crash", "crash", "probe nvml crashed",
                                              evidence=[Evidence(label="traceback", kind="traceback",
                                                                 stdout="Traceback ...\nKeyError: 'x'")])})
    log.record("remedy_applied", {"finding_id": "loader.glibcxx", "remedy": glibcxx_finding().remedies[0],
                                  "ok": True, "exit_code": 0, "output": "wrote ~/.zdoctor/env.sh",
                                  "changed": ["/root/.zdoctor/env.sh"], "backup": None})
    log.record("finding", {"finding": glibcxx_finding("ok")})  # the re-check after the fix
    log.record("summary", {"ok": 2, "warn": 1, "fail": 0, "skip": 0, "crash": 1, "total": 4})
    log.record("gpu_topology_seen", {"links": "NV18"})  # a type this exporter does not know
    log.close(1)
    return log.id


def md_html(md: str) -> str:
    """Markdown rendered by a real CommonMark parser (raw HTML allowed, as many ticket systems do)."""
    return MarkdownIt("commonmark", {"html": True}).enable("table").render(md)


class TextOf(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.parts.append(data)


def html_text(doc: str) -> tuple[str, list[str]]:
    p = TextOf()
    p.feed(doc)
    return "".join(p.parts), p.tags


# --- Markdown -----------------------------------------------------------------------------------

def test_md_header_summary_and_path(session: str):
    md = render(load_events(session), "md")
    assert md.startswith(f"# zdoctor session `{session}`\n")
    assert "- **Host:** gpu\\-node\\-7" not in md  # hyphens mid-text stay readable
    assert "gpu-node-7 (Ubuntu 22.04.4 LTS, kernel 5.15.0-105-generic, x86\\_64)" in md
    assert "- **Mode:** tui" in md
    assert "`zdoctor --python /opt/conda/envs/train/bin/python`" in md
    assert "- **zdoctor:** 0.1.0" in md and ", exit code `1`" in md
    assert "✗ 0 fail · ‼ 1 crash · ! 1 warn · - 0 skip · ✓ 2 ok · 4 findings" in md
    assert "Path: `toolchain` → `old-libstdcxx`" in md
    assert "   - → `old-libstdcxx` from `toolchain`: the loaded libstdc++ lacks GLIBCXX\\_3.4.30\n" in md
    assert "predicate" not in md
    assert "**Diagnosis:** An old system libstdc++ is loaded first (node `old-libstdcxx`)" in md


def test_md_findings_worst_first_latest_version_only(session: str):
    md = render(load_events(session), "md")
    headings = [line for line in md.splitlines() if line.startswith("### ") and ("crashed" in line or
                "GPUs" in line or "GLIBCXX" in line or "evil" in line)]
    assert [h.split()[1] for h in headings] == ["‼", "!", "✓", "✓"]
    assert headings[0] == "### ‼ CRASH: probe nvml crashed"
    assert "FAIL" not in md  # the failing glibcxx finding was re-checked after the fix: only "ok" remains
    assert md.count(": libstdc++ lacks GLIBCXX\\_3.4.30\n") == 1
    assert "### ✓ OK: libstdc++ lacks GLIBCXX\\_3.4.30\n" in md


def test_md_evidence_table_and_remedies(session: str):
    md = render(load_events(session), "md")
    assert ("| | version | cpu\\_adam.so needs | /lib/x86\\_64\\-linux\\-gnu/libstdc++.so.6 |"
            not in md)
    assert "| | version | cpu\\_adam.so needs | /lib/x86\\_64-linux-gnu/libstdc++.so.6 |\n|---|---|---|---|\n" in md
    assert "| ⚠ | GLIBCXX\\_3.4.30 | yes | missing |\n|   | GLIBCXX\\_3.4.29 | yes | present |\n" in md
    assert "- Command: `$ python -c 'import cpu_adam'`" in md
    assert "- Exit code: `1` after 0.42 s" in md
    assert f"```bash\n{LONG_CMD}\n```" in md
    assert "```bash\nsudo apt-get install -y libstdc++6\n```" in md
    assert "**Option 1 (recommended): Load the conda libstdc++ first** (tried: fixed)" in md
    assert "Recommended because it was tried and fixed the failing command." in md
    assert "**Option 2: Upgrade the system libstdc++** (not tried, because it needs root and changes the machine)" in md
    assert "Run these in bash, in order" not in md
    assert 'Undo:\n\n```bash\nexport LD_LIBRARY_PATH="$ZDOCTOR_OLD_LD_LIBRARY_PATH"\n```' in md
    assert "cpu\\_adam.so needs GLIBCXX\\_3.4.30\\\nthe system libstdc++ stops at 3.4.29" in md
    html = md_html(md)
    assert "<td>⚠</td>\n<td>GLIBCXX_3.4.30</td>\n<td>yes</td>\n<td>missing</td>" in html
    assert f'<pre><code class="language-bash">{LONG_CMD}\n</code></pre>' in html


def test_md_what_was_applied_probes_and_unknown_events(session: str):
    md = render(load_events(session), "md")
    applied = md.split("## What was applied\n", 1)[1].split("\n## ", 1)[0]
    assert "### ✓ Load the conda libstdc++ first (applied)" in applied
    assert "- For finding `loader.glibcxx`" in applied
    assert "- Changed: `/root/.zdoctor/env.sh`" in applied
    assert f"```bash\n{LONG_CMD}\n```" in applied
    assert "wrote ~/.zdoctor/env.sh" in applied
    assert "| loader | ok | 0.50 s | zero3\\-startup/toolchain |" not in md
    assert "| loader | ok | 0.50 s | zero3-startup/toolchain |   |" in md
    assert '`gpu_topology_seen` at ' in md and '`{"links": "NV18"}`' in md


def test_secrets_in_evidence_stay_redacted_in_every_format(session: str):
    events = load_events(session)
    for fmt in ("md", "html", "json"):
        text = render(events, fmt)
        assert HF not in text, fmt
        assert "HF_TOKEN=&lt;redacted&gt;" in text if fmt == "html" else "HF_TOKEN=<redacted>" in text
        assert "CUDA_HOME=/usr/local/cuda" in text


def test_md_hostile_text_is_inert(session: str):
    md = render(load_events(session), "md")
    html = md_html(md)
    assert "<script>" not in html and "<a href" not in html and "<em>" not in html
    assert "<h1>not" not in html and "<li>not a list" not in html
    text = html.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")
    # The hostile title comes through literally, pipes and backticks included.
    assert f"<h3>! WARN: {HOSTILE}</h3>" in text
    # Output full of backtick fences stays one code block with the exact content.
    assert '<pre><code class="language-text">````\n```bash\nrm -rf /\n```\n`````x\n</code></pre>' in text
    # Remedy lines are shown exactly, never broken out of their block.
    assert "<pre><code class=\"language-bash\">echo '$(touch pwned)' &&\necho ````\n</code></pre>" in text
    # Table cells with pipes and newlines stay in their cell.
    assert f"<td>{HOSTILE}</td>\n<td>x<br>y</td>" in text
    assert "<th>a|b</th>\n<th>`c`</th>" in text
    assert not (REPO / "pwned").exists()


def test_md_helpers():
    assert md_code("a ``b`` c") == "```a ``b`` c```"
    assert md_code("`x`") == "`` `x` ``"
    assert md_fence("```\n````") == "`````text\n```\n````\n`````\n"
    assert md_escape("1. not a list", line_start=True) == "1\\. not a list"
    assert md_escape("version 1. ok") == "version 1. ok"
    for hostile in [HOSTILE, "``` a", "x`", "|||", "\\`"]:
        rendered = MarkdownIt("commonmark").render(md_code(hostile))
        expected = hostile.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
        assert f"<code>{expected}</code>" in rendered


# --- HTML ---------------------------------------------------------------------------------------

def test_html_is_a_standalone_document_with_the_findings(session: str):
    doc = render(load_events(session), "html")
    assert doc.startswith("<!DOCTYPE html>\n<html lang=\"en\">")
    assert doc.rstrip().endswith("</html>")
    assert f"<title>zdoctor session {session}</title>" in doc
    assert '<meta charset="utf-8">' in doc
    assert "<link" not in doc and "<script" not in doc and "src=" not in doc  # nothing external
    assert "<style>" in doc and "prefers-color-scheme: dark" in doc and "@media print" in doc
    text, tags = html_text(doc)
    assert "script" not in tags
    for needle in ("libstdc++ lacks GLIBCXX_3.4.30", "8 GPUs visible", "probe nvml crashed", HOSTILE,
                   "An old system libstdc++ is loaded first", "GLIBCXX_3.4.29", "Upgrade the system libstdc++",
                   "sudo apt-get install -y libstdc++6", "needs root", "What was applied", "gpu_topology_seen"):
        assert needle in text, needle
    # Commands are printed whole, in their own block, so they copy out intact.
    assert f"<pre><code>{LONG_CMD}</code></pre>" in doc
    assert "echo '$(touch pwned)'" in text


def test_html_highlights_table_rows(session: str):
    doc = render(load_events(session), "html")
    text, _ = html_text(doc)
    row = next(line for line in text.splitlines() if "GLIBCXX_3.4.30" in line and "missing" in line)
    assert "⚠" in row
    plain = next(line for line in text.splitlines() if "GLIBCXX_3.4.29" in line and "present" in line)
    assert "⚠" not in plain


# --- JSON ---------------------------------------------------------------------------------------

def test_json_round_trips_every_event(session: str):
    events = load_events(session)
    doc = json.loads(render(events, "json"))
    assert doc["format"] == "zdoctor-session" and doc["version"] == 1
    assert doc["session"] == session
    assert doc["host"] == HOST
    assert doc["events"] == list(events)
    assert [e["seq"] for e in doc["events"]] == list(range(1, len(events) + 1))
    assert doc["summary"] == {"ok": 2, "warn": 1, "fail": 0, "skip": 0, "crash": 1, "total": 4}
    assert [f["id"] for f in doc["findings"]] == ["probe.crash", "x.hostile", "gpu.count", "loader.glibcxx"]
    latest = {f["id"]: Finding.from_dict(f) for f in doc["findings"]}
    assert latest["loader.glibcxx"].status == "ok"
    assert latest["loader.glibcxx"].remedies[0].commands == [LONG_CMD]
    assert doc["exit_code"] == 1 and doc["torn_last_event"] is False


def test_summary_is_counted_when_none_was_recorded(state_home: Path):
    log = SessionLog.create("check", ["check"], HOST)
    log.record("finding", {"finding": Finding("a", "fail", "A")})
    log.record("finding", {"finding": Finding("b", "warn", "B")})
    log.record("finding", {"finding": Finding("a", "ok", "A again")})
    doc = json.loads(render(load_events(log.id), "json"))
    assert doc["summary"] == {"ok": 1, "warn": 1, "fail": 0, "skip": 0, "crash": 0, "total": 2}
    assert doc["ended"] is None
    log.record("summary", {"ok": 1, "warn": 1, "fail": 0, "skip": 0, "crash": 0, "total": 2})
    log.record("finding", {"finding": Finding("b", "ok", "B fixed")})  # a re-check after the summary
    doc = json.loads(render(load_events(log.id), "json"))
    assert doc["summary"] == {"ok": 2, "warn": 0, "fail": 0, "skip": 0, "crash": 0, "total": 2}


# --- odd sessions -------------------------------------------------------------------------------

def test_torn_unfinished_session_renders_in_every_format(state_home: Path):
    log = SessionLog.create("tui", [], HOST)
    log.record("playbook_start", {"playbook": "p", "title": "P", "start": "a"})
    log.record("node_enter", {"playbook": "p", "node": "a", "kind": "check", "title": "A"})
    with open(log.path, "ab") as fh:
        fh.write(b'{"seq": 4, "ts": 1.0, "type": "ed')
    events = load_events(log.id)
    md = render(events, "md")
    assert "cut off mid-write" in md and "not recorded (interrupted, or still running)" in md
    assert "did not reach its end" in md
    assert "cut off mid-write" in html_text(render(events, "html"))[0]
    assert json.loads(render(events, "json"))["torn_last_event"] is True


def test_empty_and_odd_events_do_not_crash():
    odd = [{"type": "finding", "finding": "not a dict"}, {"type": "edge"}, {"no": "type"}, 42,
           {"type": "remedy_applied", "remedy": None, "ok": False}]
    for fmt in ("md", "html", "json"):
        assert render([], fmt)
        assert render(odd, fmt)
    assert "No findings were recorded." in render([], "md")
    assert json.loads(render(odd, "json"))["events"] == odd


def test_output_is_capped_in_reports_but_whole_in_json(state_home: Path):
    big = "".join(f"line {i}\n" for i in range(20000))
    log = SessionLog.create("check", [], HOST)
    log.record("finding", {"finding": Finding("big", "warn", "big output",
                                              evidence=[Evidence(label="dmesg", stdout=big)])})
    events = load_events(log.id)
    md = render(events, "md")
    assert "cut to 4000 characters; the JSON export has all of it" in md
    assert len(md) < 10000 and "line 0\n" in md and "line 19999\n" in md
    assert json.loads(render(events, "json"))["findings"][0]["evidence"][0]["stdout"] == big


def test_unknown_format_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown export format 'pdf'"):
        render([], "pdf")
    with pytest.raises(UsageError):
        default_name("20240101T000000-abcd", "txt")


def test_md_and_json_never_import_rich(session: str):
    code = ("import sys\nfrom zdoctor.walk.session import load_events\nfrom zdoctor.report.export import render\n"
            f"ev = load_events({session!r})\nrender(ev, 'md'); render(ev, 'json')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(REPO),
                          env=dict(os.environ), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# --- writing ------------------------------------------------------------------------------------

def test_write_export_is_atomic_and_private(tmp_path: Path):
    target = tmp_path / default_name("20240101T000000-abcd", "md")
    assert target.name == "zdoctor-20240101T000000-abcd.md"
    target.write_text("old")
    target.chmod(0o644)
    assert write_export("new report\n", target) == target
    assert target.read_text() == "new report\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]  # no temp file left behind


def test_devices_and_pipes_are_written_through_never_replaced(tmp_path: Path, cli):
    """`-o /dev/null` or a FIFO: renaming a temp file over them would turn the device into a plain file."""
    import threading

    write_export("discarded\n", os.devnull)
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    write_export("through the pipe\n", fifo)
    reader.join(10)
    assert got == ["through the pipe\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]
    r = cli(["snapshot", "-o", os.devnull, "--python", sys.executable])
    assert r.returncode == 0, r.stderr
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_undecodable_names_survive_export_to_file(state_home: Path, tmp_path: Path):
    odd = os.fsdecode(b"/data/ckpt-\xff/model.pt")
    log = SessionLog.create("check", [], HOST)
    log.record("finding", {"finding": Finding("f", "warn", "odd path", evidence=[
        Evidence(label="ls", kind="file", paths=[odd], stdout=odd)])})
    events = load_events(log.id)
    out = write_export(render(events, "json"), tmp_path / "s.json")
    assert json.loads(out.read_text(encoding="utf-8"))["findings"][0]["evidence"][0]["paths"] == [odd]
    md = write_export(render(events, "md"), tmp_path / "s.md").read_text(encoding="utf-8")
    assert "/data/ckpt-\\udcff/model.pt" in md


def test_write_export_errors_are_one_line(tmp_path: Path):
    with pytest.raises(InputError, match="does not exist") as info:
        write_export("x", tmp_path / "missing" / "out.md")
    assert "\n" not in str(info.value)
    with pytest.raises(InputError, match="is a directory"):
        write_export("x", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_declined_and_practised_remedies_are_listed_with_what_was_applied(state_home: Path):
    log = SessionLog.create("tui", [], HOST)
    rem = glibcxx_finding().remedies[0]
    log.record("remedy_declined", {"finding_id": "loader.glibcxx", "remedy": rem,
                                   "how": "answered No in the confirmation"})
    log.record("remedy_practised", {"finding_id": "loader.glibcxx", "remedy": rem})
    log.record("remedy_applied", {"finding_id": "loader.glibcxx", "remedy": rem, "ok": False, "exit_code": 3,
                                  "env_file": "/home/u/.local/state/zdoctor/fixes/x.sh"})
    log.close(0)
    events = load_events(log.id)
    md = render(events, "md")
    applied = md.split("## What was done with the fixes\n", 1)[1].split("\n## ", 1)[0]
    assert "(declined: answered No in the confirmation)" in applied
    assert "(practised: nothing was run)" in applied
    assert "(failed)" in applied and "- Exit code: `3`" in applied
    assert "written to `/home/u/.local/state/zdoctor/fixes/x.sh`" in applied
    assert "Nothing was applied" not in applied
    text, _ = html_text(render(events, "html"))
    assert "(declined: answered No in the confirmation)" in text and "(practised: nothing was run)" in text


def test_export_session_falls_back_to_the_state_directory(state_home: Path, tmp_path: Path):
    from zdoctor.report.export import export_session

    log = SessionLog.create("check", ["check"], HOST)
    log.record("finding", {"finding": Finding("f", "fail", "broken").to_dict()})
    log.close(1)
    here = export_session(log.id, "md", tmp_path)
    assert here == (tmp_path / f"zdoctor-{log.id}.md").resolve() and "broken" in here.read_text()
    gone = export_session(log.id, "json", tmp_path / "no" / "such" / "dir")
    assert gone == (state_home / "zdoctor" / "exports" / f"zdoctor-{log.id}.json").resolve()
    assert json.loads(gone.read_text())["session"] == log.id


def test_control_characters_never_reach_a_terminal(state_home: Path):
    """A path or an output with an escape sequence is shown as text in the Markdown (which people `cat`)
    and in the terminal report; the JSON export keeps it exactly."""
    import io

    from zdoctor.report.terminal import print_report
    from zdoctor.walk.doctor import CheckReport

    clear = "\x1b[2J\x1b]0;owned\x07"
    f = Finding("libs.odd", "fail", f"odd file /opt/{clear}lib.so", detail=f"line\r{clear}",
                evidence=[Evidence(label="ls", kind="command", stdout=f"out {clear}\n")])
    log = SessionLog.create("check", ["check"], HOST)
    log.record("finding", {"finding": f.to_dict()})
    log.close(1)
    events = load_events(log.id)
    md = render(events, "md")
    assert "\x1b" not in md and "\x07" not in md and "\\x1b[2J" in md.replace("\\\\", "\\")
    assert json.loads(render(events, "json"))["findings"][0]["title"] == f"odd file /opt/{clear}lib.so"
    buf = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    print_report(CheckReport(host={"hostname": f"node{clear}"}, findings=[f]), buf)
    buf.seek(0)
    text = buf.read()
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text
    assert "odd file /opt/\\x1b[2J\\x1b]0;owned\\x07lib.so" in text


def test_a_walk_stopped_at_its_diagnosis_says_one_thing(state_home: Path):
    """A walk that reached its diagnosis and was exported before it closed does not also say it never
    reached its end."""
    log = SessionLog.create("tui", [], HOST)
    log.record("playbook_start", {"playbook": "p", "title": "P", "start": "a"})
    log.record("node_enter", {"playbook": "p", "node": "a", "kind": "check", "title": "A"})
    log.record("node_enter", {"playbook": "p", "node": "d", "kind": "diagnosis", "title": "Old libstdc++"})
    log.record("diagnosis", {"playbook": "p", "node": "d", "title": "Old libstdc++"})
    events = load_events(log.id)
    md = render(events, "md")
    html = html_text(render(events, "html"))[0]
    for text in (md, html):
        assert "Diagnosis:" in text and "Old libstdc++" in text
        assert "did not reach its end" not in text
        assert "stopped at this diagnosis" in text
