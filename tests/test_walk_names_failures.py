"""A walk never ends past a failing finding on its path without naming it, and the offload walk routes
WSL2's pinned-memory cap. The offload facts are this node's (a real ds_config, a real tmpfs offload path,
DeepSpeed's estimator on a model that does not fit); the libaio facts are those recorded on a node
without libaio's development files (tests/fixtures/offload/libaio-missing.json), the kernel a WSL2 one."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from conftest import FIXTURES

from zdoctor.core.registry import load_vocabulary
from zdoctor.host import LiveHost, ReplayHost
from zdoctor.host.replay import snapshot_document
from zdoctor.layers.offload import hostram
from zdoctor.walk.engine import Walk, failing_on_path, probe_names
from zdoctor.walk.playbook import load_all

OFFLOAD = FIXTURES / "offload"


@pytest.fixture
def tmpfs(tmp_path):
    where = tmp_path / "ram disk"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def recorded(options: dict, **facts: dict) -> ReplayHost:
    """This node's facts for every probe the offload walk reads, with whole facts of some probes replaced."""
    load_vocabulary()
    book = load_all()["offload-bottleneck"]
    live = LiveHost(options=options)
    live.results(list(dict.fromkeys(n for node in book.nodes.values() for n in probe_names(node))))
    doc = json.loads(json.dumps(snapshot_document(live)))
    for name, change in facts.items():
        doc["probes"][name]["facts"].update(change)
    return ReplayHost(doc)


def test_the_offload_walk_names_the_missing_libaio_it_passed(tmp_path, tmpfs):
    cfg = tmp_path / "ds_config.json"
    shutil.copy(OFFLOAD / "zero3-cpu-offload.json", cfg)
    libaio = json.loads((OFFLOAD / "libaio-missing.json").read_text())
    host = recorded({"ds_config": str(cfg), "model_params": "70B", "gpus_per_node": 8,
                     "offload_path": str(tmpfs / "offload")}, storage={"libaio": libaio})
    book = load_all()["offload-bottleneck"]
    walk = Walk(book, host)
    result = walk.run()
    assert result.path[-2:] == ["spare-nvme", "diag-no-fast-disk"], result.path
    step = next(o for o in result.outcomes if o.node.id == "device")
    assert {f.id: f.status for f in step.findings}["storage.libaio"] == "fail"  # shown at its step
    named = {x["id"]: x for x in result.failing_on_path}
    assert named["storage.libaio"]["node"] == "device" and "libaio" in named["storage.libaio"]["title"]
    assert "storage.mount" in named  # the tmpfs path, failing at the same step
    assert "offload.capacity" not in named  # the end lists that check itself
    assert "also failing on the way: " in result.reason and "storage.libaio" in result.reason
    # the rule on its own: nothing is named past an end whose own checks cover the failures
    end = book.nodes["diag-no-fast-disk"]
    assert failing_on_path(result.outcomes, ["config", "diag-no-fast-disk"], end) == []


def test_wsl2_pinned_memory_is_routed_not_ignored(tmp_path):
    cfg = tmp_path / "ds_config.json"
    shutil.copy(OFFLOAD / "zero3-cpu-offload.json", cfg)
    opts = {"ds_config": str(cfg), "model_params": "100M", "gpus_per_node": 1}
    load_vocabulary()
    live = LiveHost(options=opts)
    ds, cap = live.result("dsconfig").facts, live.result("capacity").facts
    wsl, _ev = hostram.collect(ds, cap, opts, kernel_release="5.15.153.1-microsoft-standard-WSL2")
    assert wsl["wsl"] and wsl["pinned_blocks"], wsl
    host = recorded(opts, hostram=wsl)
    result = Walk(load_all()["offload-bottleneck"], host).run()
    assert result.path[-1] == "diag-host-ram", result.path
    ram = next(o for o in result.outcomes if o.node.id == "ram")
    assert {f.id: f.status for f in ram.findings}["offload.host-ram.wsl2"] == "warn"


def test_nvme_offload_without_libaio_ends_in_its_own_diagnosis(tmp_path, tmpfs):
    cfg = tmp_path / "ds_config.json"
    doc = json.loads((OFFLOAD / "zero3-nvme-offload.json").read_text())
    zero = doc["zero_optimization"]
    zero["sub_group_size"] = 1e7  # small pinned swap buffers: host memory is not what stops this run
    zero["offload_param"]["buffer_size"] = 1e7
    cfg.write_text(json.dumps(doc))
    libaio = json.loads((OFFLOAD / "libaio-missing.json").read_text())
    host = recorded({"ds_config": str(cfg), "model_params": "7B", "gpus_per_node": 8,
                     "offload_path": str(tmpfs / "offload")}, storage={"libaio": libaio})
    result = Walk(load_all()["offload-bottleneck"], host).run()
    assert result.path[-2:] == ["device", "diag-aio-missing"], result.path
    assert "storage.libaio" not in {x["id"] for x in result.failing_on_path}  # the end lists it itself
