"""Every bundled practice scenario replays, headless, to the diagnosis its catalogue entry promises,
and carries no path of the machine it was recorded on."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from zdoctor.core.registry import load_vocabulary
from zdoctor.host import ReplayHost
from zdoctor.walk import practice
from zdoctor.walk.doctor import check, select_playbooks
from zdoctor.walk.engine import Walk
from zdoctor.walk.playbook import load_all

SCENARIOS = practice.load_scenarios()


def test_the_story_has_both_parts():
    parts = {s.part: s.id for s in SCENARIOS}
    assert parts[1] == "conda-ld-library-path" and parts[2] == "slow-ssd-offload"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_scenario_reaches_its_diagnosis(scenario):
    host = ReplayHost.load(str(scenario.snapshot))
    report = check(host, playbooks=select_playbooks([scenario.playbook]))
    (run,) = report.playbooks
    assert run.diagnosis == scenario.diagnosis, run.path
    text = scenario.snapshot.read_text()
    for machine_path in ("/work/", "pytest-of-", "/root/.", "/root\"", "ciclone"):
        assert machine_path not in text


def test_part_one_tells_the_symptom_not_the_answer():
    """The opening of part 1 is what Alice saw; the cause is what the seven steps find."""
    s = next(x for x in SCENARIOS if x.id == "conda-ld-library-path")
    told = "\n".join([s.title, s.summary, s.story])
    assert "GLIBCXX_3.4.30' not found" in s.story and "cpu_adam" in told
    for answer in ("LD_LIBRARY_PATH", "conda", "bashrc", "shell profile", "/opt/conda/lib", "old libstdc++"):
        assert answer not in told, answer


def test_part_one_strace_lines_are_the_recorded_runs():
    """strace's lines in part 1 name only processes and copies the recorded loader trace names."""
    s = next(x for x in SCENARIOS if x.id == "conda-ld-library-path")
    live = json.loads(s.snapshot.read_text())["probes"]["livetrace"]["facts"]
    loaded = {(x["pid"], x["path"]) for x in live["libstdcxx"]}
    assert live["strace_lines"]
    for line in live["strace_lines"]:
        m = re.match(r'(\d+) \d\d:\d\d:\d\d\.\d+ openat\(AT_FDCWD, "([^"]+)", O_RDONLY\|O_CLOEXEC\) = \d+$', line)
        assert m and (int(m[1]), m[2]) in loaded, line


def test_part_two_walks_the_whole_story():
    s = next(x for x in SCENARIOS if x.id == "slow-ssd-offload")
    report = check(ReplayHost.load(str(s.snapshot)), playbooks=select_playbooks([s.playbook]))
    assert report.playbooks[0].path == ["config", "time", "ram", "device", "speed", "spare-nvme", "fix-mount",
                                        "fix-config", "diag-nvme-offload"]
    by_id = {f.id: f for f in report.findings}
    assert "SATA/SAS SSD" in by_id["storage.device"].title
    fix = by_id["storage.fstab"]
    assert any("UUID=" in c and "noatime,nofail" in c for r in fix.remedies for c in r.commands)


# -- one story, one node ------------------------------------------------------------------------------------

def _walk_texts(scenario) -> tuple[Any, dict[str, str]]:
    """Walk a scenario to its end; every step's findings as text (titles, details, evidence, remedies)."""
    load_vocabulary()
    host = ReplayHost.load(str(scenario.snapshot))
    walk = Walk(load_all()[scenario.playbook], host)
    steps: dict[str, str] = {}
    while not walk.done:
        outcome = walk.evaluate()
        parts = []
        for f in outcome.findings:
            parts += [f"[{f.status}] {f.id}: {f.title}", f.detail or ""]
            for e in f.evidence:
                parts += [e.label, e.stdout or ""]
                if e.table is not None:
                    parts += [" | ".join(map(str, r)) for r in e.table.rows]
            for r in f.remedies:
                parts += [r.title, r.explanation or "", *r.commands]
        steps[outcome.node.id] = "\n".join(parts)
        walk.advance()
    return walk, steps


def _facts(scenario) -> dict[str, Any]:
    return json.loads(scenario.snapshot.read_text())


def test_both_parts_tell_of_one_node():
    one, two = (next(s for s in SCENARIOS if s.part == n) for n in (1, 2))
    d1, d2 = _facts(one), _facts(two)
    w1, steps1 = _walk_texts(one)
    w2, steps2 = _walk_texts(two)
    assert w1.diagnosis == one.diagnosis and w2.diagnosis == two.diagnosis
    every = "\n".join([*steps1.values(), *steps2.values(), json.dumps(d1), json.dumps(d2)])

    # One OS, one kernel, one host, one training interpreter with one torch and one DeepSpeed.
    for key in ("hostname", "os", "kernel", "arch", "python"):
        assert d1["host"][key] == d2["host"][key], key
    os_name = d1["host"]["os"]
    assert d1["probes"]["system"]["facts"]["os"] == os_name
    assert "Ubuntu" not in every
    assert set(re.findall(r"Debian GNU/Linux \d+ \(\w+\)", every)) == {os_name}
    for p in ("python", "torch", "deepspeed"):
        a, b = d1["probes"]["pyenv"]["facts"][p], d2["probes"]["pyenv"]["facts"][p]
        assert (a.get("version"), a.get("executable")) == (b.get("version"), b.get("executable")), p
    assert d2["probes"]["dsconfig"]["facts"]["deepspeed"]["version"] == d1["probes"]["pyenv"]["facts"]["deepspeed"][
        "version"]
    # One memory: the planner of part 2 reads the MemAvailable part 1 recorded.
    assert d2["probes"]["capacity"]["facts"]["machine"]["mem_available"] == \
        d1["probes"]["system"]["facts"]["memory"]["MemAvailable"]

    # One set of disks: / on nvme0n1p2 in both parts; /ssd/offload on sda in every step that names a device.
    assert "/dev/vda" not in every
    roots = [r["mount"]["source"] for r in d1["probes"]["jitcache"]["facts"]["roots"] if r.get("mount")]
    assert roots == ["/dev/nvme0n1p2"]
    inv = {d["name"]: d for d in d2["probes"]["nvme_inventory"]["facts"]["drives"]}
    assert "nvme0n1p2" in inv["nvme0n1"]["filesystems"] and not inv["nvme0n1"]["unmounted"]
    devices = set()
    for text in steps2.values():
        for line in text.splitlines():
            if "/ssd" in line:
                devices |= set(re.findall(r"/dev/(sd[a-z]+|vd[a-z]+|nvme\d+n\d+(?:p\d+)?)\b", line))
                devices |= set(re.findall(r"\bon (sd[a-z]+|vd[a-z]+)\b", line))
    assert devices == {"sda"}, devices
    assert d2["probes"]["storage"]["facts"]["mount"]["source"] == "/dev/sda"
    assert d2["probes"]["dsconfig"]["facts"]["paths"]["/ssd/offload"]["mount"]["source"] == "/dev/sda"

    # One free-space figure for /ssd, wherever a step reads it; never "free ?".
    free = {d2["probes"]["storage"]["facts"]["space"]["avail_bytes"],
            d2["probes"]["dsconfig"]["facts"]["paths"]["/ssd/offload"]["free_bytes"],
            d2["probes"]["capacity"]["facts"]["machine"]["disk_free"],
            d2["probes"]["capacity"]["facts"]["nvme"]["free"]}
    assert len(free) == 1
    shown = set(re.findall(r"free:? ([0-9.]+ [GT]iB)", "\n".join(steps2.values())))
    assert len(shown) == 1, shown
    assert "free ?" not in every and "free: unknown" not in every

    # "How fast is it, really?" measured: write and read rates, not a skip.
    speed = steps2["speed"]
    assert "[skip] storage.throughput" not in speed
    m = re.search(r"storage.throughput: .*write ([0-9.]+) MB/s, read ([0-9.]+) MB/s", speed)
    assert m and 300 < float(m.group(1)) < 600 and 300 < float(m.group(2)) < 600, speed[:400]
    tp = d2["probes"]["storage"]["facts"]["throughput"]
    assert tp["ran"] and tp["write"]["complete"] and tp["read"]["complete"] and tp["removed"]

    # The promised ds_config diff appears at the fix step, moving nvme_path to the directory the mount step makes.
    fix = steps2["fix-config"]
    target = d2["probes"]["nvme_inventory"]["facts"]["suggestion"]["offload_dir"]
    assert re.search(r'^-.*"nvme_path": "/ssd/offload"', fix, re.M)
    assert re.search(r'^\+.*"nvme_path": "' + re.escape(target) + '"', fix, re.M)
    assert f"mkdir -p -- {target}" in steps2["fix-mount"]

    # Step 6 finds the shell-profile line behind the symptom the story tells (and the story leaves to it).
    line = "export LD_LIBRARY_PATH=/opt/conda/lib"
    assert re.search(r"/home/alice/\.bashrc line \d+: " + re.escape(line), steps1["source"])
    # ... and it is the same user throughout: alice's home, her job files, her offload directory.
    assert d2["probes"]["storage"]["facts"]["user"]["name"] == "alice"
    assert d1["probes"]["jitcache"]["facts"]["env"]["HOME"] == "/home/alice"
