"""The answer to the user's symptom comes first. A real broken node: the real loader fails a real import on
a real old libstdc++ (the user's symptom, explained by libs.glibcxx), and the job's hostfile is malformed
(a failing finding of another layer that explains nothing). The findings that explain the symptom lead the
terminal report, the JSON, the exports and the guide's start screen; the rest follow under "Also found on
this node"; each symptom names the walk that answers it, and the start screen's Next: goes there."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys

import pytest
from conftest import run_cli
from envkit import build_extension, make_old_libstdcxx

from zdoctor.core.answers import WalkEnd, answering_walk, with_answers
from zdoctor.core.model import Finding
from zdoctor.core.present import ALSO_FOUND
from zdoctor.core.verdicts import answer_first, split_answers

PY = os.path.realpath(sys.executable)
OTHER = "launcher.hostfile"  # fails, explains nothing, and sorts before libs.glibcxx by id


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "TORCH_EXTENSIONS_DIR"))}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("answer-first")
    old = make_old_libstdcxx(root / "old").parent
    exts = root / "exts"
    build_extension(exts, "needsnew")
    hostfile = root / "hostfile"
    hostfile.write_text("worker-1 slots=eight\n")
    command = shlex.join([PY, "-c", f"import sys; sys.path.insert(0, {str(exts)!r}); import needsnew"])
    return {"old": str(old), "hostfile": str(hostfile), "command": command, "state": str(root / "state")}


def check_args(node: dict[str, str], python: str = PY) -> list[str]:
    return ["check", "--timeout", "60", "--python", python, "--hostfile", node["hostfile"],
            "--command", node["command"], "--playbook", "zero3-launch"]


@pytest.fixture(scope="module")
def recorded(node) -> dict[str, str]:
    """One recorded check of the broken node: its terminal report and its three exports."""
    env = clean_env(LD_LIBRARY_PATH=node["old"], XDG_STATE_HOME=node["state"])
    proc = run_cli(check_args(node), env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr
    out = {"report": proc.stdout}
    for fmt in ("md", "html", "json"):
        exported = run_cli(["export", "--last", "--format", fmt], env=env)
        assert exported.returncode == 0, exported.stderr
        out[fmt] = exported.stdout
    return out


# -- the one order ------------------------------------------------------------------------------------

def test_findings_that_answer_a_symptom_come_first_in_symptom_order_then_the_rest_worst_first():
    symptoms = [{"id": "S1", "explained_by": ["libs.glibcxx"]}, {"id": "S2", "explained_by": []},
                {"id": "S3", "explained_by": ["gpu.limits.nofile"]}]
    found = [Finding("kernel.xid", "crash", "Xid 79"), Finding("launcher.hostfile", "fail", "hostfile"),
             Finding("gpu.limits.nofile", "warn", "nofile", explains=["S3"]),
             Finding("symptom.unexplained.S2", "fail", "Unexplained"),
             Finding("libs.glibcxx", "fail", "GLIBCXX"), Finding("libs.inventory", "warn", "copies"),
             Finding("pyenv.interpreter", "ok", "python", explains=["S1"])]  # an ok never explains
    order = ["libs.glibcxx", "symptom.unexplained.S2", "gpu.limits.nofile",
             "kernel.xid", "launcher.hostfile", "libs.inventory", "pyenv.interpreter"]
    assert [f.id for f in answer_first(found, symptoms)] == order
    assert [f["id"] for f in answer_first([f.to_dict() for f in found], symptoms)] == order  # dicts alike
    answers, rest = split_answers(found, symptoms)
    assert [f.id for f in answers] == order[:3] and [f.id for f in rest] == order[3:]
    # with no symptom, worst first then by id, as before
    assert [f.id for f in answer_first(found)] == ["kernel.xid", "launcher.hostfile", "libs.glibcxx",
                                                   "symptom.unexplained.S2", "gpu.limits.nofile",
                                                   "libs.inventory", "pyenv.interpreter"]


def test_the_walk_whose_end_names_the_explaining_finding_answers_before_one_that_only_met_it():
    passed = WalkEnd("gpu-stack", "GPU stack", "diag-no-driver", "No usable driver", met=("libs.glibcxx",), named=())
    named = WalkEnd("zero3-launch", "ZeRO-3", "diag-ld-library-path", "old libstdc++",
                    met=("libs.glibcxx", "libs.live"), named=("libs.glibcxx",))
    entry = {"id": "S1", "explained_by": ["libs.glibcxx", "libs.live"]}
    answer, _ = answering_walk(entry, [passed, named])
    assert (answer["playbook"], answer["finding"], answer["named_by_end"]) == ("zero3-launch", "libs.glibcxx", True)
    answer, _ = answering_walk(entry, [passed])
    assert (answer["playbook"], answer["named_by_end"]) == ("gpu-stack", False)
    (unexplained,) = with_answers([{"id": "S2", "explained_by": []}], [passed, named])
    assert unexplained["answered_by"] is None and unexplained["not_answered"] == "no finding explains it"
    assert answering_walk(entry, []) == (None, "no playbook was walked")
    assert answering_walk({"id": "S3", "explained_by": ["kernel.xid"]}, [passed, named]) == (
        None, "no walk met a finding that explains it")


# -- every renderer, on the real broken node ----------------------------------------------------------

def test_the_json_leads_with_the_explaining_findings_and_names_the_walk_that_answers(node):
    proc = run_cli(["check", "--json", "--no-log", *check_args(node)[1:]], env=clean_env(LD_LIBRARY_PATH=node["old"]),
                   timeout=300)
    doc = json.loads(proc.stdout)
    (s,) = doc["symptoms"]
    assert "GLIBCXX_3.4.30" in s["text"] and "libs.glibcxx" in s["explained_by"]
    ids = [f["id"] for f in doc["findings"]]
    first = ids[:len(s["explained_by"])]
    assert ids[0] == "libs.glibcxx" and set(first) == set(s["explained_by"]), ids[:6]
    assert ids.index(OTHER) >= len(first)
    assert next(f for f in doc["findings"] if f["id"] == OTHER)["status"] == "fail"
    run = next(p for p in doc["playbooks"] if p["id"] == "zero3-launch")
    assert s["answered_by"] == {"playbook": "zero3-launch", "title": run["title"],
                                "diagnosis": "diag-ld-library-path", "diagnosis_title": run["diagnosis_title"],
                                "finding": "libs.glibcxx", "named_by_end": True}
    assert "not_answered" not in s


def test_the_terminal_report_shows_the_answer_before_what_else_was_found(recorded):
    text = recorded["report"]
    answer, heading, other = text.index("(libs.glibcxx)"), text.index(f"\n{ALSO_FOUND}:"), text.index(f"({OTHER})")
    assert text.index("What you saw:") < answer < heading < other
    assert "the walk zero3-launch answers it: An LD_LIBRARY_PATH entry loads an old libstdc++" in text


def test_the_exports_show_the_answer_before_what_else_was_found(recorded):
    md = recorded["md"]
    assert md.index("Finding `libs.glibcxx`") < md.index(f"\n## {ALSO_FOUND}\n") < md.index(f"Finding `{OTHER}`")
    html = recorded["html"]
    assert html.index('id="finding-libs.glibcxx"') < html.index('<section id="also-found">') \
        < html.index(f'id="finding-{OTHER}"')
    assert html.index(f"<h2>{ALSO_FOUND}</h2>") > html.index('<section id="findings">')
    doc = json.loads(recorded["json"])
    (s,) = doc["symptoms"]
    ids = [f["id"] for f in doc["findings"]]
    assert ids[0] == "libs.glibcxx" and set(ids[:len(s["explained_by"])]) == set(s["explained_by"])
    # the recorded walk answers the symptom in the exports as it did in the check
    answer = s["answered_by"]
    assert (answer["playbook"], answer["diagnosis"], answer["finding"], answer["named_by_end"]) == (
        "zero3-launch", "diag-ld-library-path", "libs.glibcxx", True)
    line = "the walk zero3-launch answers it: An LD_LIBRARY_PATH entry loads an old libstdc++ (diag-ld-library-path)"
    assert md.index(line.replace("_", "\\_")) < md.index("## Findings")  # Markdown escapes the underscores
    assert html.index(line) < html.index('id="summary"')


def test_with_no_symptom_the_reports_read_as_before(node, tmp_path):
    env = clean_env(XDG_STATE_HOME=str(tmp_path / "state"))
    proc = run_cli(["check", "--python", PY, "--hostfile", node["hostfile"], "--playbook", "zero3-launch"],
                   env=env, timeout=300)
    assert "What you saw: no symptom given" in proc.stdout, proc.stdout[:400]
    assert ALSO_FOUND not in proc.stdout and f"({OTHER})" in proc.stdout
    md = run_cli(["export", "--last", "--format", "md"], env=env).stdout
    assert ALSO_FOUND not in md and f"Finding `{OTHER}`" in md
    html = run_cli(["export", "--last", "--format", "html"], env=env).stdout
    assert 'id="also-found"' not in html


# -- the guide ----------------------------------------------------------------------------------------

def test_the_start_screens_next_line_goes_to_the_walk_that_answers_the_symptom(node, tmp_path):
    import dsenv
    from test_tui import make, name, plain, settle

    from zdoctor.host import LiveHost

    python = str(dsenv.ensure())  # torch is there: the Next: line is not about the interpreter

    async def scenario() -> None:
        host = LiveHost(python=python, env=clean_env(LD_LIBRARY_PATH=node["old"]), command=node["command"],
                        timeout=60, options={"hostfile": node["hostfile"]})
        app = make(host=host, argv=["tui"], export_dir=tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen" and app.screen.findings is not None,
                         timeout=240, what="the first pass")
            start = app.screen
            (s,) = start.symptoms
            assert "libs.glibcxx" in s["explained_by"]
            glibcxx = next(f for f in start.findings if f.id == "libs.glibcxx")
            other = next(f for f in start.findings if f.id == OTHER)
            assert other.status == "fail"
            line = plain(start.query_one("#next-step"))
            assert line.startswith("Next: walk zero3-launch (select it below), for what you saw (S1): "), line
            assert glibcxx.title in " ".join(line.split())
            shown = plain(start.query_one("#pass-findings"), width=400)
            assert shown.index(glibcxx.title) < shown.index(f"{ALSO_FOUND}:") < shown.index(other.title)

    asyncio.run(scenario())
