"""The vocabulary is declared, not found by reading source text: every check says which finding ids it
produces and which symptom kinds it explains, discovery imports the vocabulary packages, and playbook lint
judges a finding id by the declaration."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from zdoctor.core import registry
from zdoctor.core.registry import CHECKS, PROBES, load_vocabulary
from zdoctor.host import LiveHost, ReplayHost
from zdoctor.layers import evaluate_check
from zdoctor.walk.playbook_lint import finding_id_known, lint_path

ROOT = Path(__file__).resolve().parent.parent
RECORDED = [ROOT / "tests" / "fixtures" / "snapshots" / "healthy.json",
            *sorted((ROOT / "assets" / "scenarios").glob("*.json"))]


@pytest.fixture(scope="module")
def hosts():
    load_vocabulary()
    out = [ReplayHost.load(str(p)) for p in RECORDED]
    out.append(LiveHost(python=sys.executable, env=dict(os.environ)))
    return out


def test_every_finding_a_check_makes_is_one_it_declares(hosts):
    for host in hosts:
        for name, spec in CHECKS.items():
            facts = host.results(spec.reads)
            for f in evaluate_check(name, facts):
                assert spec.produces(f.id), f"{name} made {f.id!r}, which its @check(findings=...) does not declare"


def test_a_finding_that_explains_a_symptom_comes_from_a_check_that_declares_the_kind(hosts):
    from zdoctor.symptoms.match import symptoms_of

    for host in hosts:
        for name, spec in CHECKS.items():
            facts = host.results(spec.reads)
            kinds = {s.id: s.kind for s in symptoms_of(facts)}
            for f in evaluate_check(name, facts):
                assert {kinds.get(sid) for sid in f.explains} <= set(spec.explains), (name, f.id, f.explains)


def test_discovery_reads_no_source_text_and_imports_every_vocabulary_module():
    load_vocabulary()
    mods = registry.vocabulary_modules()
    assert "zdoctor.symptoms.probe_symptoms" in mods and "zdoctor.layers.gpu.check_gpu" in mods
    assert not hasattr(registry, "_registers") and not hasattr(registry, "_MARKERS")
    owners = {spec.func.__module__ for spec in CHECKS.values()} | {spec.func.__module__ for spec in PROBES.values()}
    assert owners <= set(mods)


def test_lint_knows_a_finding_by_its_declaration_not_by_a_string_in_the_source(tmp_path):
    load_vocabulary()
    assert finding_id_known("gpu.limits.memlock", "gpu.limits", CHECKS)
    assert finding_id_known("hangs.stale-lock.cpu_adam", "hangs.stale-lock", CHECKS)  # a declared family
    assert finding_id_known("libs.prediction", "libs.live", CHECKS)  # outside its own prefix, declared
    # "gpu.limits.shmem" is a string nowhere declared: a typo
    assert not finding_id_known("gpu.limits.shmem", "gpu.limits", CHECKS)
    book = tmp_path / "typo.toml"
    book.write_text('''id = "typo"
title = "A typo"
summary = "An edge on a finding id that no check declares."
start = "look"

[nodes.look]
kind = "probe"
title = "Look at the limits"
why = "The limits decide what the training may use on this node."
explain = "It reads the limits of the training shell and goes on from what they say, as always."
checks = ["gpu.limits"]

[[nodes.look.next]]
to = "small"
when = { finding = "gpu.limits.shmem", status = ["warn"] }
label = "a typo"

[[nodes.look.next]]
to = "small"
label = "otherwise"

[nodes.small]
kind = "diagnosis"
title = "Small"
why = "Something is small on this node, and the walk says what it is."
explain = "The limit that is small is named in the finding above, with the way to raise it."
''', encoding="utf-8")
    errors = [str(e) for e in lint_path(book)]
    assert any("never produces a finding 'gpu.limits.shmem'" in e for e in errors), errors


def test_the_vocabulary_command_prints_each_check_with_its_findings_and_explanations(cli):
    proc = cli(["playbooks", "vocabulary"])
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "gpu.limits  (zdoctor.layers.gpu.check_limits)" in text
    block = text[text.index("gpu.limits  ("):].split("\n\n")[0]
    assert "findings: gpu.limits, gpu.limits.memlock, gpu.limits.nofile, gpu.limits.shm" in block
    assert "explains: nofile, shm" in block
