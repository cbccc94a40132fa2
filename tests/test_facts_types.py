"""The probes' typed facts: every probe declares its record, ``shape.json`` is the shape generated from those
records (under Python 3.8 as under this one), every recorded snapshot and session replays under it, and a
value of the wrong type is still refused."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, List, Optional, TypedDict

from bundlekit import interpreter
from test_gpu_facts import h200_all

from zdoctor.core import factstypes
from zdoctor.core.registry import PROBES, declared_shape, load_vocabulary
from zdoctor.core.shape import SHAPE_FILE, doubtful_nulls, facts_problems, record_problems, shape_of, shape_text

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def recorded_results() -> list[tuple[str, str, dict[str, Any]]]:
    """(where, probe, record) of every probe result the repository records: snapshots, the practice
    scenarios, the sessions' probe_result events, and the H200 node's facts."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    snapshots = [FIXTURES / "snapshots" / "healthy.json", FIXTURES / "ranks" / "gloo-deadlock.json",
                 *sorted((ROOT / "assets" / "scenarios").glob("*.json"))]
    for path in snapshots:
        for name, rec in json.loads(path.read_text())["probes"].items():
            out.append((path.name, name, rec))
    for path in sorted(FIXTURES.glob("sessions*/*.jsonl")):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event.get("type") == "probe_result":
                out.append((path.name, event["result"]["probe"], event["result"]))
    out += [("h200", name, {"status": "ok", "facts": facts}) for name, facts in h200_all().items()]
    return out


def test_every_probe_declares_the_typed_record_of_its_facts():
    load_vocabulary()
    undeclared = [name for name, spec in PROBES.items() if spec.facts is None]
    assert undeclared == []
    assert all(spec.facts in vars(factstypes).values() for spec in PROBES.values())


def test_shape_json_is_the_shape_of_the_declared_records():
    assert SHAPE_FILE.read_text(encoding="utf-8") == shape_text(declared_shape()), \
        "zdoctor/shape.json differs from the probes' typed records: run `python bench/write_shape.py`"


def test_python_3_8_generates_the_same_shape():
    """The records are read at run time (``typing.List`` and so on): 3.8 must read them as this Python does."""
    load_vocabulary()
    records = {name: spec.facts.__name__ for name, spec in PROBES.items() if spec.facts is not None}
    code = ("import json, sys\nfrom zdoctor.core import factstypes\n"
            "from zdoctor.core.shape import shape_of, shape_text\n"
            "names = json.loads(sys.argv[1])\n"
            "sys.stdout.write(shape_text(shape_of({n: getattr(factstypes, r) for n, r in names.items()})))\n")
    proc = subprocess.run([interpreter("3.8"), "-c", code, json.dumps(records)], cwd=ROOT, capture_output=True,
                          text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == SHAPE_FILE.read_text(encoding="utf-8")


def test_every_recorded_snapshot_and_session_replays_under_the_generated_shape():
    results = recorded_results()
    assert len({name for _w, name, _r in results}) >= 30  # most probes are recorded somewhere
    problems = [(where, name, record_problems(name, rec)) for where, name, rec in results]
    assert [p for p in problems if p[2]] == []


class _Inner(TypedDict, total=False):
    size: int | None


class _Record(TypedDict, total=False):
    name: str
    ratio: float
    flags: list[bool]
    inner: _Inner
    env: dict[str, str]
    either: int | str
    anything: Any
    rows: Optional[List[_Inner]]  # noqa: UP006, UP045 - the form the records use on Python 3.8


def test_shape_of_walks_records_lists_maps_and_unions():
    assert shape_of({"p": _Record}) == {
        "p": ["object"], "p.either": ["number", "string"], "p.env": ["object"], "p.env.*": ["string"],
        "p.flags": ["array"], "p.flags[]": ["boolean"], "p.inner": ["object"], "p.inner.size": ["null", "number"],
        "p.name": ["string"], "p.ratio": ["number"], "p.rows": ["array", "null"], "p.rows[]": ["object"],
        "p.rows[].size": ["null", "number"]}


def test_the_generated_shape_refuses_values_of_the_wrong_type():
    # a key of a map (any environment variable name) is checked as the map's values are
    assert facts_problems("pyenv", {"env": {"SOME_VAR": "x", "OTHER": 3}}) == \
        ["pyenv.env.* is number, expected string"]
    # a record nested in a list, a number where a string is written, an object where an array is
    assert facts_problems("kernel_log", {"xids": "none"}) == ["kernel_log.xids is string, expected array"]
    assert facts_problems("symptoms", {"symptoms": [{"id": 1, "text": "x"}]}) == \
        ["symptoms.symptoms[].id is number, expected string"]
    # null is "unknown": accepted anywhere, but named where the probe never writes it for an object
    assert facts_problems("symptoms", {"given": None}) == []
    assert doubtful_nulls("symptoms", {"given": None}) == \
        ["symptoms.given is null, where zdoctor's probes write object"]
    # a typed record's own problems make the whole record unusable
    assert record_problems("cudalookup", {"status": "ok", "facts": {"cache": {"libcuda.so.1": "x"}}}) == \
        ["cudalookup.cache.libcuda.so.1 is string, expected array"]


def test_the_typed_accessor_gives_each_probe_the_record_it_declares():
    """``Facts.of`` has one overload per probe (mypy reads them): each names the record the probe declares."""
    load_vocabulary()
    tree = ast.parse((ROOT / "zdoctor" / "core" / "registry.py").read_text(encoding="utf-8"))
    overloads = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "of" and node.decorator_list:
            arg = node.args.args[1].annotation
            if isinstance(arg, ast.Subscript) and isinstance(arg.slice, ast.Constant):
                overloads[arg.slice.value] = ast.unparse(node.returns) if node.returns else ""
    assert overloads == {name: f"ft.{spec.facts.__name__} | None" for name, spec in PROBES.items()
                         if spec.facts is not None}


def test_mypy_checks_the_keys_and_types_a_check_reads(tmp_path: Path):
    """What ``Facts.of`` gives is the probe's record to mypy: a key it does not name and a value used as the
    wrong type are errors, a read that matches the record is not."""
    snippet = tmp_path / "reads.py"
    snippet.write_text(
        "from zdoctor.core.registry import Facts\n\n\n"
        "def right(facts: Facts) -> int:\n"
        "    kl = facts.of('kernel_log')\n"
        "    return (kl.get('records_read') or 0) if kl is not None else 0\n\n\n"
        "def wrong(facts: Facts) -> str:\n"
        "    kl = facts.of('kernel_log')\n"
        "    if kl is None:\n"
        "        return ''\n"
        "    kl['no_such_key']\n"
        "    return kl['records_read']\n")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "--cache-dir", str(tmp_path / "cache"),
                           str(snippet)], cwd=ROOT, capture_output=True, text=True)
    errors = [line.split(": error: ", 1)[1] for line in proc.stdout.splitlines() if ": error: " in line]
    assert errors == ['TypedDict "KernelLogFacts" has no key "no_such_key"  [typeddict-item]',
                      'Incompatible return value type (got "int", expected "str")  [return-value]'], proc.stdout
