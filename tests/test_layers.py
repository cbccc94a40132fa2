"""The layers of the node: each check names one, and a run says of every layer whether it was examined."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from zdoctor.core.model import Finding
from zdoctor.core.nodelayers import BY_ID, LAYERS, layer_of, layer_status
from zdoctor.core.registry import CHECKS, load_vocabulary


def _status(findings: list[Finding], layers: dict[str, str]) -> dict[str, dict]:
    def owner(fid: str) -> str | None:
        return next((n for n in sorted(layers, key=len, reverse=True) if fid == n or fid.startswith(n + ".")), None)

    return {row["id"]: row for row in layer_status(layers, findings, owner)}


def test_a_layer_whose_checks_all_skipped_is_not_examined_and_says_why():
    layers = {"kernel.log": "kernel-log", "gpu.driver": "gpu", "gpu.env": "gpu"}
    rows = _status([
        Finding(id="kernel.log.not-checked", status="skip", title="Kernel log: not checked",
                detail="/dev/kmsg: Operation not permitted. journalctl is not installed."),
        Finding(id="gpu.driver", status="skip", title="NVIDIA driver: not checked", detail="no driver"),
        Finding(id="gpu.env.deprecated", status="ok", title="No deprecated NCCL variable names"),
    ], layers)
    kern = rows["kernel-log"]
    assert kern["status"] == "not examined"
    assert "Operation not permitted" in kern["why"] and kern["checks"] == []
    gpu = rows["gpu"]
    assert gpu["status"] == "partly examined" and gpu["checks"] == ["gpu.env"]
    assert gpu["not_examined"] == [{"check": "gpu.driver", "why": "no driver"}]


def test_a_failing_finding_counts_as_a_look_and_a_silent_check_does_not():
    layers = {"launch.env": "launch", "launch.hostfile": "launch"}
    rows = _status([Finding(id="launch.env", status="fail", title="RANK is not set")], layers)
    assert rows["launch"]["status"] == "partly examined"
    assert rows["launch"]["not_examined"] == [{"check": "launch.hostfile", "why": "it gave no verdict in this run"}]


def test_a_layer_no_check_reads_is_named_as_not_examined_not_left_out():
    rows = _status([], {})
    assert set(rows) == set(BY_ID)
    assert all(r["status"] == "not examined" and r["why"] for r in rows.values())


def test_a_check_naming_an_unknown_layer_is_refused_and_families_have_their_default():
    with pytest.raises(ValueError, match="unknown layer"):
        layer_of("x.y", "no-such-layer")
    assert layer_of("libs.glibcxx") == "libraries"
    assert layer_of("kernel.log", "kernel-log") == "kernel-log"


def test_every_registered_check_belongs_to_a_known_layer():
    load_vocabulary()
    unknown = {name: spec.layer for name, spec in CHECKS.items() if spec.layer and spec.layer not in BY_ID}
    assert unknown == {}


def test_check_json_on_this_machine_says_of_every_layer_examined_or_why_not():
    out = subprocess.run([sys.executable, "-m", "zdoctor", "check", "--json", "--no-log"],
                         capture_output=True, text=True, timeout=240)
    doc = json.loads(out.stdout)
    rows = {row["id"]: row for row in doc["layers"]}
    assert list(rows) == [layer.id for layer in LAYERS]
    for row in rows.values():
        assert row["status"] in ("examined", "partly examined", "not examined")
        if row["status"] != "examined":
            assert row["why"].strip(), row
    driver = next(f for f in doc["findings"] if f["id"] == "gpu.driver")
    if driver["status"] == "skip":  # no NVIDIA driver here: the GPU layer is not wholly examined, and says so
        assert rows["gpu"]["status"] != "examined"
        assert any(m["check"] == "gpu.driver" for m in rows["gpu"]["not_examined"])


def test_the_readme_lists_every_layer():
    from conftest import REPO

    text = (REPO / "README.md").read_text(encoding="utf-8")
    # each row says what the layer reads, as LAYERS declares it (the one source)
    assert [layer.id for layer in LAYERS if f"| `{layer.id}` | {layer.reads} |" not in text] == []
