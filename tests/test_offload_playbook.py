"""The offload-bottleneck playbook walked to its diagnoses: live on this node (a real ds_config, a real
tmpfs offload path, a model that does not fit in RAM), and on a recorded NVMe node where the walk ends
with the mount and ds_config fix."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import FIXTURES, run_cli

import zdoctor.layers.offload.probe_storage as ps
from zdoctor.core.registry import load_vocabulary
from zdoctor.host import LiveHost, ReplayHost
from zdoctor.host.replay import snapshot_document
from zdoctor.layers.offload import blockdev as bd
from zdoctor.walk.doctor import check, select_playbooks

OFFLOAD = FIXTURES / "offload"
STORE = FIXTURES / "storage"


@pytest.fixture
def tmpfs(tmp_path):
    where = tmp_path / "ram disk"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def walk_path(doc: dict, playbook: str = "offload-bottleneck") -> list[str]:
    return next(p["path"] for p in doc["playbooks"] if p["id"] == playbook)


def test_ram_short_and_a_tmpfs_offload_path(tmp_path, tmpfs):
    cfg = tmp_path / "ds_config.json"
    shutil.copy(OFFLOAD / "zero3-cpu-offload.json", cfg)
    proc = run_cli(["check", "--json", "--no-log", "--playbook", "offload-bottleneck", "--ds-config", str(cfg),
                    "--model-params", "70B", "--gpus-per-node", "8", "--offload-path", str(tmpfs / "offload")],
                   timeout=300)
    doc = json.loads(proc.stdout)
    path = walk_path(doc)
    assert path[:4] == ["config", "time", "ram", "device"], path
    assert path[-2:] == ["spare-nvme", "diag-no-fast-disk"]  # this node has no NVMe drive
    by_id = {f["id"]: f for f in doc["findings"]}
    assert by_id["offload.capacity"]["status"] == "fail"
    assert by_id["storage.mount"]["status"] == "fail" and "tmpfs" in by_id["storage.mount"]["title"]
    assert proc.returncode == 1


def recorded_nvme_node(tmp_path: Path, offload_path: str, cfg: Path, log: Path) -> ReplayHost:
    """Live offload facts for a real config and log, storage facts from the recorded NVMe node."""
    load_vocabulary()
    live = LiveHost(options={"ds_config": str(cfg), "model_params": "70B", "gpus_per_node": 8,
                             "train_log": str(log)})
    for name in ("dsconfig", "capacity", "trainlog", "gpusample"):
        live.result(name)
    doc = snapshot_document(live)
    root = tmp_path / "nvme-node"
    bd.build_tree((STORE / "nvme-node/tree.txt").read_text(), str(root))
    kw = dict(sysfs_root=str(root / "sys"), dev_root=str(root / "dev"), udev_root=str(root / "run/udev"),
              mountinfo=str(STORE / "nvme-node/mountinfo"), live=False)
    facts, ev = ps.collect_storage(offload_path, fstab_path=str(STORE / "nvme-node/fstab"), **kw)
    inv, inv_ev = ps.collect_inventory(swaps=str(STORE / "nvme-node/swaps"), **kw)
    for name, (f, e) in (("storage", (facts, ev)), ("nvme_inventory", (inv, inv_ev))):
        doc["probes"][name] = {"probe": name, "status": "ok", "facts": f, "evidence": [x.to_dict() for x in e],
                               "error": None, "started": 0.0, "duration_s": 0.0}
    return ReplayHost(json.loads(json.dumps(doc)))


def test_recorded_nvme_node_walks_to_the_nvme_fix(tmp_path):
    cfg = tmp_path / "ds_config.json"
    shutil.copy(OFFLOAD / "zero3-cpu-offload.json", cfg)
    host = recorded_nvme_node(tmp_path, "/mnt/ram disk/offload", cfg, OFFLOAD / "ds-0.17-wallclock-nvme.log")
    report = check(host, playbooks=select_playbooks(["offload-bottleneck"]))
    (run,) = report.playbooks
    assert run.path == ["config", "time", "ram", "device", "spare-nvme", "fix-mount", "fix-config",
                        "diag-nvme-offload"], run.path
    by_id = {f.id: f for f in report.findings}
    fstab = by_id["storage.fstab"]
    assert any("UUID=" in c and "nofail" in c for r in fstab.remedies for c in r.commands)
    assert by_id["offload.capacity"].status == "fail"
