"""The core model survives JSON and back without loss."""

from __future__ import annotations

import json

import pytest

from zdoctor.core.model import Evidence, Finding, ProbeResult, Remedy, cap_text, sort_findings, summarize


def sample_finding() -> Finding:
    return Finding(
        id="loader.libstdcxx", status="fail", title="cpu_adam.so needs GLIBCXX_3.4.30",
        detail="the copy loaded from /opt/conda/lib lacks it",
        evidence=[
            Evidence(label="readelf", argv=["readelf", "-V", "x.so"], exit_code=0, stdout="out\n",
                     stderr="", truncated=False, paths=["/x.so"], started=1.5, duration_s=0.25),
            Evidence.of_table("needs vs provides", ["needed", "provided"],
                              [["GLIBCXX_3.4.30", "-"], ["GLIBCXX_3.4.29", "GLIBCXX_3.4.29"]], [0]),
            Evidence.note("why", "because"),
        ],
        remedies=[Remedy(title="drop conda from LD_LIBRARY_PATH",
                         commands=["export LD_LIBRARY_PATH='/a b'"], verified=True,
                         requires_root=False, undo=["export LD_LIBRARY_PATH=/opt/conda/lib"],
                         explanation="x")],
    )


def test_finding_round_trips_through_json():
    f = sample_finding()
    again = Finding.from_dict(json.loads(json.dumps(f.to_dict())))
    assert again == f
    assert again.evidence[1].table.highlight == [0]


def test_probe_result_round_trips_through_json():
    r = ProbeResult(probe="toolchain", status="ok", facts={"a": [1, {"b": None}]},
                    evidence=[Evidence.note("n", "t")], error=None, started=2.0, duration_s=0.5)
    assert ProbeResult.from_dict(json.loads(json.dumps(r.to_dict()))) == r


def test_unknown_status_is_rejected():
    with pytest.raises(ValueError):
        Finding(id="x", status="bad", title="t")


def test_summary_and_order():
    fs = [Finding("b", "ok", "t"), Finding("a", "warn", "t"), Finding("c", "crash", "t"),
          Finding("d", "fail", "t")]
    assert [f.id for f in sort_findings(fs)] == ["c", "d", "a", "b"]
    s = summarize(fs)
    assert s == {"ok": 1, "warn": 1, "fail": 1, "skip": 0, "crash": 1, "total": 4}


def test_cap_text_keeps_short_text_whole():
    assert cap_text("abc", 10) == ("abc", False)
    text, cut = cap_text("x" * 100, 40)
    assert cut and len(text) < 100
