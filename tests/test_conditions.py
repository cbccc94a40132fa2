"""Playbook conditions as data: an edge says which finding (and statuses) or which fact it needs, the walk
evaluates it from the checks' findings (each check once per probe result), lint knows the finding ids, and
`zdoctor playbooks predicates` lists the named conditions that data cannot say."""

from __future__ import annotations

from pathlib import Path

from conftest import FIXTURES
from test_gpu_facts import h200

from zdoctor.core import registry
from zdoctor.core.model import ProbeResult
from zdoctor.core.registry import CHECKS, Facts, load_vocabulary
from zdoctor.host import ReplayHost
from zdoctor.host.replay import SNAPSHOT_FORMAT, SNAPSHOT_VERSION
from zdoctor.layers import evaluate_check
from zdoctor.report.export import render
from zdoctor.walk.engine import Walk
from zdoctor.walk.playbook import load_playbook
from zdoctor.walk.playbook_lint import lint_path

PLAYBOOK = '''
id = "p2p"
title = "P2P"
summary = "Whether peer-to-peer is a risk here."
start = "env"

[nodes.env]
kind = "probe"
title = "The NCCL environment"
why = "P2P over a consumer board hangs."
explain = "."
checks = ["gpu.env"]

[[nodes.env.next]]
to = "risky"
when = {{ finding = "{fid}", status = ["warn"] }}

[[nodes.env.next]]
to = "one"
when = {{ fact = "nvml.count", equals = 1 }}

[[nodes.env.next]]
to = "fine"

[nodes.risky]
kind = "diagnosis"
title = "P2P is a risk"
why = "."
explain = "."

[nodes.one]
kind = "diagnosis"
title = "One GPU"
why = "."
explain = "."

[nodes.fine]
kind = "diagnosis"
title = "Fine"
why = "."
explain = "."
'''


def write(tmp_path: Path, fid: str = "gpu.env.p2p") -> Path:
    path = tmp_path / "p2p.toml"
    path.write_text(PLAYBOOK.format(fid=fid))
    return path


def test_lint_knows_the_finding_ids(tmp_path: Path):
    assert lint_path(write(tmp_path)) == []
    errors = [str(e) for e in lint_path(write(tmp_path, "gpu.env.p2pp"))]
    assert len(errors) == 1 and "check 'gpu.env' never produces a finding 'gpu.env.p2pp'" in errors[0]
    errors = [str(e) for e in lint_path(write(tmp_path, "nosuch.thing"))]
    assert len(errors) == 1 and "no registered check produces finding 'nosuch.thing'" in errors[0]
    assert lint_path(FIXTURES.parent.parent / "playbooks") == []


def test_the_walk_takes_a_data_edge_and_records_it(tmp_path: Path):
    load_vocabulary()
    book = load_playbook(write(tmp_path))
    events: list[dict] = []
    facts = h200()
    host = ReplayHost({"format": SNAPSHOT_FORMAT, "version": SNAPSHOT_VERSION, "host": {"hostname": "h"},
                       "probes": {k: v.to_dict() for k, v in facts.items()}})
    walk = Walk(book, host, record=lambda t, d: events.append({"type": t, **d}))
    result = walk.run()
    assert result.path == ["env", "one"]  # one H200: no P2P risk, and the fact condition holds
    (edge,) = [e for e in events if e["type"] == "edge"]
    assert edge["condition"] == {"fact": "nvml.count", "equals": 1} and edge["predicate"] is None
    md = render([{"type": "session_start", "session_id": "s"}, *events], "md")
    assert "→ `one` from `env`: fact nvml.count is 1\n" in md


def test_a_check_runs_once_per_probe_result(monkeypatch):
    load_vocabulary()
    spec = CHECKS["gpu.env"]
    calls = []

    def counted(facts):
        calls.append(1)
        return spec.func(facts)

    monkeypatch.setitem(CHECKS, "gpu.env", registry.CheckSpec(spec.name, counted, spec.title, spec.probes))
    facts = h200()
    for _ in range(5):
        evaluate_check("gpu.env", facts)
    assert len(calls) == 1
    fresh = Facts({**dict(facts.items()), "gpu_env": ProbeResult.from_dict(facts["gpu_env"].to_dict())})
    evaluate_check("gpu.env", fresh)  # a new probe result: the check runs again
    assert len(calls) == 2


def test_playbooks_predicates_lists_each_with_its_docstring(cli):
    out = cli(["playbooks", "predicates"])
    assert out.returncode == 0
    load_vocabulary()
    for name, spec in registry.PREDICATES.items():
        assert f"{name}  (reads " in out.stdout and spec.doc in out.stdout
    assert "gpu_p2p_risk" not in out.stdout  # now a data condition in the playbook
    assert "when = {finding = " in out.stdout


def test_a_new_check_module_is_found_without_a_list(tmp_path: Path, monkeypatch):
    """Every ``check_*`` (and ``probe_*``) module of the vocabulary packages is imported (no list, and no
    reading of their source); a helper module beside them is not, and the probe script that runs inside the
    training interpreter lives outside them, in zdoctor.scripts."""
    import sys

    pkg = tmp_path / "extra_checks"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("raise AssertionError('a helper is imported only by what uses it')\n")
    (pkg / "check_new.py").write_text(
        "from zdoctor.core.registry import check\n"
        "@check('extra.new', title='A new check', probes=())\n"
        "def new(facts):\n    return []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "VOCABULARY_PACKAGES", (*registry.VOCABULARY_PACKAGES, "extra_checks"))
    monkeypatch.delitem(sys.modules, "extra_checks", raising=False)
    assert "extra_checks.check_new" in registry.vocabulary_modules()
    assert "extra_checks.helper" not in registry.vocabulary_modules()
    assert "zdoctor.scripts.probe_script" not in registry.vocabulary_modules()
    try:
        load_vocabulary()
        assert "extra.new" in CHECKS
    finally:
        CHECKS.pop("extra.new", None)
