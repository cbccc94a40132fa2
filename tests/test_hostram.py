"""Host memory beyond DeepSpeed's training estimate: the real ds_config reader on the recorded NVMe
config (swap buffers), a parameter-only (ZeRO-Inference) config, the H200's recorded meminfo edited to
nearly full, a WSL2 kernel, and a training log with the OOM killer's -9, walked through the playbook."""

from __future__ import annotations

import json
import shutil

from conftest import FIXTURES, run_cli
from test_gpu_facts import h200

from zdoctor.core.registry import load_vocabulary
from zdoctor.host import LiveHost
from zdoctor.layers.offload import hostram
from zdoctor.layers.offload.check_hostram import check_hostram

OFFLOAD = FIXTURES / "offload"


def live_facts(cfg, **opts):
    load_vocabulary()
    host = LiveHost(options={"ds_config": str(cfg), **opts})
    return host.results(["dsconfig", "capacity", "hostram"])


def by_id(findings):
    return {f.id: f for f in findings}


def test_nvme_swap_buffers_are_counted_per_rank(tmp_path):
    facts = live_facts(OFFLOAD / "zero3-nvme-offload.json", model_params="70B", gpus_per_node=8)
    f = facts.of("hostram")
    opt = next(x for x in f["extra"] if "optimizer swap" in x["what"])
    assert opt["per_rank"] == 4 * 1_000_000_000 * 4 and opt["per_node"] == 8 * opt["per_rank"]
    par = next(x for x in f["extra"] if "parameter swap" in x["what"])
    assert par["per_rank"] == 5 * 100_000_000 * 2
    found = by_id(check_hostram(facts))["offload.host-ram"]
    assert "NVMe optimizer swap buffers (pinned): 119.21 GiB per node" in found.detail  # 8 x 16e9 bytes
    assert any("sub_group_size" in r.title for r in found.remedies)
    # NVMe offload is outside DeepSpeed's estimator: the buffers are a floor, never a "fits"
    assert f["estimate_per_node"] is None and "NVMe offload is not modelled" in f["estimate_unknown"]
    assert found.status == ("fail" if f["extra_per_node"] > f["mem_available"] else "skip"), found.title
    assert "fits" not in found.title or "unknown whether it fits" in found.title


def test_swap_buffers_sized_from_unknown_parameters_per_rank_are_unknown(tmp_path):
    """No model size and no GPUs seen (none on this node, no --gpus-per-node): the buffers' size per rank
    and per node is unknown, and the check says so instead of a number or a fit."""
    facts = live_facts(OFFLOAD / "zero3-nvme-offload.json")
    assert facts.of("capacity") is None  # no model size: nothing was planned
    f = facts.of("hostram")
    opt = next(x for x in f["extra"] if "optimizer swap" in x["what"])
    assert opt["per_rank"] is None and opt["per_node"] is None and "parameter count" in opt["unknown"]
    assert opt["at_most"]["per_rank"] == 4 * 1_000_000_000 * 4 and opt["at_most"]["per_node"] is None
    par = next(x for x in f["extra"] if "parameter swap" in x["what"])
    assert par["per_rank"] == 5 * 100_000_000 * 2 and par["per_node"] is None and "GPUs per node" in par["unknown"]
    assert f["extra_per_node"] is None and f["gpus_per_node"] is None
    found = by_id(check_hostram(facts))["offload.host-ram"]
    assert found.status == "skip" and "unknown whether it fits" in found.title, found.title
    assert "GiB per node" not in found.title and "unknown per node" in found.detail
    # a known parameter count alone still leaves the per-rank share unknown without the GPU count
    f = live_facts(OFFLOAD / "zero3-nvme-offload.json", model_params="70B").of("hostram")
    opt = next(x for x in f["extra"] if "optimizer swap" in x["what"])
    assert opt["per_rank"] is None and "GPUs per node" in opt["unknown"] and f["extra_per_node"] is None


def test_parameter_only_offload_without_a_model_size_is_not_nothing_beyond(tmp_path):
    cfg = tmp_path / "ds_inference.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True},
                               "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}))
    facts = live_facts(cfg, gpus_per_node=8)
    (x,) = facts.of("hostram")["extra"]
    assert x["per_node"] is None and "parameter count" in x["unknown"]
    found = by_id(check_hostram(facts))["offload.host-ram"]
    assert found.status == "skip" and "Nothing beyond" not in found.title, found.title


def test_parameter_only_offload_for_inference(tmp_path):
    cfg = tmp_path / "ds_inference.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True},
                               "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu",
                                                                                   "pin_memory": True}}}))
    facts = live_facts(cfg, model_params="70B", gpus_per_node=8)
    (x,) = facts.of("hostram")["extra"]
    assert x["what"].startswith("parameter-only offload (ZeRO-Inference)") and x["per_node"] == 140_000_000_000


def meminfo(tmp_path, available_kb: int):
    text = (OFFLOAD / "h200-meminfo.txt").read_text()
    lines = [f"MemAvailable:   {available_kb} kB" if ln.startswith("MemAvailable:") else ln
             for ln in text.splitlines()]
    p = tmp_path / "meminfo"
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def test_nearly_exhausted_memory_and_wsl2_pinning(tmp_path):
    ds = {"path": "cfg.json", "settings": {"offload_optimizer": {"device": {"value": "cpu"},
                                                                 "pin_memory": {"value": True}}}}
    f, _ = hostram.collect(ds, {}, {}, meminfo=meminfo(tmp_path, 4_000_000),
                           kernel_release="5.15.153.1-microsoft-standard-WSL2")
    found = by_id(check_hostram(h200(hostram=f)))
    assert found["offload.host-ram"].status == "warn" and "nearly exhausted" in found["offload.host-ram"].title
    w = found["offload.host-ram.wsl2"]
    assert w.status == "warn" and w.remedies[0].commands == ["# ds_config: zero_optimization.offload_optimizer."
                                                             "pin_memory = false"]


def test_a_killed_run_never_ends_in_ram_is_not_the_bottleneck(tmp_path):
    cfg = tmp_path / "ds_config.json"
    shutil.copy(OFFLOAD / "zero3-cpu-offload.json", cfg)
    log = tmp_path / "train.log"
    log.write_text((OFFLOAD / "ds-0.19-wallclock.log").read_text()
                   + "[2026-11-30 10:00:00,000] [INFO] [launch.py:319:sigkill_handler] Killing subprocess 4242\n"
                   + "[2026-11-30 10:00:00,001] [ERROR] [launch.py:325:sigkill_handler] ['python', 'train.py'] "
                     "exits with return code = -9\n")
    args = ["check", "--json", "--no-log", "--playbook", "offload-bottleneck", "--ds-config", str(cfg),
            "--model-params", "100M", "--gpus-per-node", "1", "--log", str(log)]
    doc = json.loads(run_cli(args, timeout=300).stdout)
    path = next(p["path"] for p in doc["playbooks"] if p["id"] == "offload-bottleneck")
    assert "diag-no-bottleneck" not in path and path[-1] == "diag-host-ram", path
    f = {x["id"]: x for x in doc["findings"]}["offload.host-ram"]
    assert f["status"] == "fail" and "return code = -9" in f["detail"] and "OOM killer" in f["detail"]
    # the same run without the kill reads as no bottleneck (the estimate fits)
    log.write_text((OFFLOAD / "ds-0.19-wallclock.log").read_text())
    doc = json.loads(run_cli(args, timeout=300).stdout)
    assert next(p["path"] for p in doc["playbooks"] if p["id"] == "offload-bottleneck")[-1] != "diag-host-ram"


def test_pinning_off_is_not_offered_where_the_installed_release_ignores_pin_memory(tmp_path):
    """DeepSpeed 0.4.0 (its real ZeRO 1/2 source, recorded) pins the offload buffers at stage 1/2 whatever
    pin_memory says: the WSL2 finding then offers the upgrade, not a setting that changes nothing."""
    from zdoctor.layers.python_env import dsrules as dsr

    ds = {"path": "cfg.json", "stage": 2,
          "settings": {"offload_optimizer": {"device": {"value": "cpu"}, "pin_memory": {"value": True}}}}
    f, _ = hostram.collect(ds, {}, {}, meminfo=meminfo(tmp_path, 4_000_000),
                           kernel_release="5.15.153.1-microsoft-standard-WSL2")
    old = dsr.installed_rules(str(FIXTURES / "deepspeed-releases" / "0.4.0"), "0.4.0")
    assert old["zero12-pin-memory"]["state"] == "old"
    w = by_id(check_hostram(h200(hostram=f, dsconfig=ds, dsrelease={"version": "0.4.0", "rules": old})))
    (rem,) = w["offload.host-ram.wsl2"].remedies
    assert rem.title.startswith("Upgrade DeepSpeed: 0.4.0 pins the offload buffers at ZeRO stage 2")
    assert not any("pin_memory = false" in c for c in rem.commands)
    # at stage 3 the same release reads pin_memory: turning it off is offered
    w3 = by_id(check_hostram(h200(hostram=f, dsconfig={**ds, "stage": 3}, dsrelease={"version": "0.4.0",
                                                                                       "rules": old})))
    assert w3["offload.host-ram.wsl2"].remedies[0].commands == [
        "# ds_config: zero_optimization.offload_optimizer.pin_memory = false"]
