"""A remedy whose tool the node lacks says so, and why a remedy was not tried is worded once: the JSON
record, the terminal report and the exports carry the same sentence (never an empty reason)."""

from __future__ import annotations

import html
import io
import json
import re
import stat
from pathlib import Path

from zdoctor.core.model import Finding, Remedy
from zdoctor.core.present import DEFAULT_NOT_TRIED, verification_of, verification_text
from zdoctor.report.export import render
from zdoctor.report.terminal import print_report
from zdoctor.trials.remedies import Plan, conda_upgrade
from zdoctor.walk.doctor import CheckReport
from zdoctor.walk.session import SessionLog, load_events

HOST = {"hostname": "gpu-node-7", "os": "Ubuntu 22.04.4 LTS", "kind": "live"}


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def everywhere(remedy: Remedy, state_home: Path) -> dict[str, str]:
    """The remedy as the JSON, the terminal report and the Markdown and HTML exports show it."""
    finding = Finding("libs.glibcxx", "fail", "the old libstdc++ is loaded", remedies=[remedy])
    buf = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    print_report(CheckReport(host=HOST, findings=[finding]), buf)
    buf.seek(0)
    log = SessionLog.create("check", ["check"], HOST)
    log.record("finding", {"finding": finding.to_dict()})
    log.close(1)
    events = load_events(log.id)
    md = re.sub(r"\\([^A-Za-z0-9\s])", r"\1", render(events, "md"))  # Markdown's escapes taken off
    return {"json": json.dumps(finding.to_dict()), "terminal": buf.read(), "md": md,
            "html": html.unescape(render(events, "html"))}


def test_conda_missing_on_the_node_is_said_in_every_renderer(tmp_path: Path, state_home: Path):
    prefix = tmp_path / "envs" / "train"
    (prefix / "lib").mkdir(parents=True)
    bare = tmp_path / "bin"
    bare.mkdir()
    plan = conda_upgrade(str(prefix), "13.1", [], env={"PATH": str(bare)})
    remedy = Plan.from_dict(json.loads(json.dumps(plan.to_dict()))).to_remedy()  # as the libfix probe records it
    (said,) = remedy.missing
    assert said.startswith("conda was not found on this node (looked: ")
    assert f"the training PATH ({bare})" in said and "CONDA_EXE (unset)" in said and str(prefix / "bin") in said
    shown = everywhere(remedy, state_home)
    for where, text in shown.items():
        assert said in (text.replace("\\n", " ") if where == "json" else " ".join(text.split())), where


def test_conda_found_off_the_path_is_run_by_its_path(tmp_path: Path):
    base = tmp_path / "miniforge"
    prefix = base / "envs" / "train"
    (prefix / "lib").mkdir(parents=True)
    conda = executable(base / "condabin" / "conda")
    plan = conda_upgrade(str(prefix), "13.1", [], env={"PATH": "/nonexistent-h5"})
    assert plan.commands[0].startswith(f"{conda} install -y -p {prefix}") and not plan.missing
    on_path = executable(tmp_path / "path" / "conda")
    plan = conda_upgrade(str(prefix), "13.1", [], env={"PATH": str(on_path.parent)})
    assert plan.commands[0].startswith("conda install") and not plan.missing


def test_a_remedy_not_tried_without_a_reason_records_the_one_shown(state_home: Path):
    remedy = Remedy("Rebuild the op", ["rm -rf ~/.cache/torch_extensions/py311_cu124/cpu_adam"])
    record = remedy.to_dict()
    assert record["verification"] == {"state": "not_tried", "reason": DEFAULT_NOT_TRIED}
    sentence = verification_text(verification_of(remedy))
    assert sentence == f"not tried, because {DEFAULT_NOT_TRIED}"
    for where, text in everywhere(remedy, state_home).items():
        assert (DEFAULT_NOT_TRIED if where == "json" else sentence) in " ".join(text.split()), where
    # An older record with an empty reason reads back with the same words.
    assert verification_of({**record, "verification": {"state": "not_tried", "reason": ""}}).reason == \
        DEFAULT_NOT_TRIED
