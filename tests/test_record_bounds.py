"""Records are range-checked where they are parsed: a kernel-log record with an out-of-range number is not a
fact (it is dropped, and counted as not read), never a crash of the whole kernel-log probe. The records are
read from a private file in /dev/kmsg's format: nothing is written into this machine's kernel log."""

from __future__ import annotations

import json
from pathlib import Path

from zdoctor.layers.kernel_log.kernlog import MAX_USEC, parse_journal, parse_kmsg_record
from zdoctor.layers.kernel_log.probe_kernlog import collect

XID = "NVRM: Xid (PCI:0000:17:00): 79, pid=1234, name=python, GPU has fallen off the bus."


def test_a_record_with_an_out_of_range_timestamp_is_dropped_and_the_others_are_read(tmp_path: Path):
    dump = tmp_path / "kmsg"
    dump.write_text(f"4,10,{10 ** 30};{XID}\n"            # a timestamp no clock gives
                    f"4,11,{MAX_USEC};{XID}\n"              # just past the bound
                    f"{1 << 40},12,5000;{XID}\n"            # a priority no syslog level has
                    f"4,13,7000000;{XID}\n")                 # a real one
    facts, evidence = collect(kmsg=str(dump), use_journal=False)  # this boot's real /proc/stat
    json.dumps(facts)
    assert facts["records_read"] == 1
    (x,) = facts["xids"]
    assert x["seq"] == 13 and x["usec"] == 7000000 and x["xid"] == 79
    assert evidence and "1 records read" in evidence[0].stdout


def test_range_checks_at_the_parsers():
    assert parse_kmsg_record(f"6,1,{10 ** 25};text") is None
    assert parse_kmsg_record("6,-1,5;text") is None
    assert parse_kmsg_record("6,1,5;text")["usec"] == 5
    line = json.dumps({"MESSAGE": XID, "__REALTIME_TIMESTAMP": str(10 ** 40), "_SOURCE_MONOTONIC_TIMESTAMP": "-4",
                       "PRIORITY": "x", "SYSLOG_FACILITY": "0"})
    (rec,) = parse_journal([line]).records
    assert rec["time"] is None and rec["usec"] is None and rec["level"] is None and rec["facility"] == 0


def test_a_nested_fact_of_another_type_in_a_snapshot_is_not_checked_never_a_crash():
    """A snapshot whose DeepSpeed release rules hold a string where the probe writes an object (and a list
    where it writes a list of objects): the release check says "not checked" with why, and so does every
    other check that trips on such a fact, instead of a crash with a traceback."""
    from zdoctor.core.registry import CHECKS, load_vocabulary
    from zdoctor.host import ReplayHost
    from zdoctor.layers import evaluate_check

    load_vocabulary()
    doc = json.loads((Path(__file__).parent / "fixtures" / "snapshots" / "healthy.json").read_text())
    doc["probes"]["dsrelease"] = {"probe": "dsrelease", "status": "ok", "error": None, "started": 0.0,
                                  "duration_s": 0.1, "evidence": [],
                                  "facts": {"installed": True, "version": "0.19.8", "location": "/opt/env/deepspeed",
                                            "rules": {"libaio-detection": "old", "zero12-pin-memory": ["x"]},
                                            "jit_origins": ["not an object"]}}
    host = ReplayHost(doc, source="edited.json")
    found = evaluate_check("pyenv.deepspeed-release", host.results(list(CHECKS["pyenv.deepspeed-release"].reads)))
    assert found and all(f.status == "skip" for f in found), [(f.id, f.status, f.detail) for f in found]
    assert "cannot be read" in found[0].detail and "traceback" not in json.dumps([f.to_dict() for f in found])
