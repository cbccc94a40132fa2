"""Every bundled practice scenario replays, headless, to the diagnosis its catalogue entry promises,
and carries no path of the machine it was recorded on."""

from __future__ import annotations

import pytest

from zdoctor import practice
from zdoctor.doctor import check, select_playbooks
from zdoctor.host import ReplayHost

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


def test_part_two_walks_the_whole_story():
    s = next(x for x in SCENARIOS if x.id == "slow-ssd-offload")
    report = check(ReplayHost.load(str(s.snapshot)), playbooks=select_playbooks([s.playbook]))
    assert report.playbooks[0].path == ["config", "time", "ram", "device", "speed", "spare-nvme", "fix-mount",
                                        "fix-config", "diag-nvme-offload"]
    by_id = {f.id: f for f in report.findings}
    assert "SATA/SAS SSD" in by_id["storage.device"].title
    fix = by_id["storage.fstab"]
    assert any("UUID=" in c and "noatime,nofail" in c for r in fix.remedies for c in r.commands)
