"""The offload probes, checks and predicates end to end on a host whose job options, DeepSpeed and GPUs are
given: real files and the real DeepSpeed source; recorded H200 memory and GPUs; NVML faked only at pynvml."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pynvml
import pytest
from conftest import FIXTURES
from dsenv import ensure

from zdoctor.core.model import ProbeResult
from zdoctor.core.registry import PREDICATES, load_vocabulary
from zdoctor.host.base import Host, run_probe_guarded
from zdoctor.layers import run_checks
from zdoctor.layers.offload import gpusample, planner
from zdoctor.layers.offload.dsconfig import load_config, parse_config
from zdoctor.proc.target import Target

OFF = FIXTURES / "offload"
OURS = ("dsconfig", "capacity", "trainlog", "gpusample")
CHECKS = ["offload.config", "offload.lint", "offload.capacity", "offload.breakdown", "offload.gpu-util"]
H200_GPU = {"name": "NVIDIA H200", "memory": {"total": 150754820096, "used": 644939776, "free": 150109880320}}


@pytest.fixture(scope="module")
def ds_location() -> str:
    python = ensure()
    found = sorted(Path(python).parent.parent.glob("lib/python3*/site-packages/deepspeed"))
    assert found
    return str(found[0])


@pytest.fixture(autouse=True)
def h200_memory(monkeypatch):
    """This node's memory as recorded on a real H200 node (125.40 GiB available, no swap)."""
    monkeypatch.setattr(planner, "MEMINFO", str(OFF / "h200-meminfo.txt"))


class JobHost(Host):
    """A live-like host: the offload probes run for real; the probes they read are given."""

    kind = "test"

    def __init__(self, options: dict[str, Any], given: dict[str, dict[str, Any]] | None = None,
                 command: str | None = None):
        super().__init__()
        self.target = Target.of(None, command=command, options=options)
        self.given = given or {}

    def _compute(self, name: str) -> ProbeResult:
        if name in OURS:
            return run_probe_guarded(self, name)
        if name in self.given:
            return ProbeResult(probe=name, facts=self.given[name])
        return ProbeResult(probe=name, status="skip", error=f"probe {name} is not part of this test")


def given(ds_location: str, gpus: int = 8, memlock_kb: int | str = 8192, **extra: Any) -> dict[str, dict[str, Any]]:
    out = {"pyenv": {"python": {"version_info": [3, 11, 7]},
                     "deepspeed": {"installed": True, "version": "0.19.8", "location": ds_location}},
           "nvml": {"gpus": [dict(H200_GPU, index=i) for i in range(gpus)]},
           "host_limits": {"target": {"memlock_soft_kb": memlock_kb}}}
    out.update(extra)
    return out


def check(host: Host) -> tuple[Any, dict[str, Any]]:
    load_vocabulary()
    facts, findings = run_checks(host, CHECKS)
    return facts, {f.id: f for f in findings}


def pred(name: str, facts) -> bool:
    return PREDICATES[name].func(facts)


def copy(tmp_path: Path, name: str) -> str:
    dst = tmp_path / name
    shutil.copy(OFF / name, dst)
    return str(dst)


# -- nothing given ------------------------------------------------------------------------------------

def test_nothing_given_skips_with_reasons():
    facts, found = check(JobHost({}))
    assert {facts[p].status for p in OURS} == {"skip"}
    assert found["offload.config"].status == "skip" and "--ds-config" in found["offload.config"].detail
    assert "--model-params or --model-config" in found["offload.capacity"].detail
    assert "--log" in found["offload.breakdown"].detail and "--gpu-sample" in found["offload.gpu-util"].detail
    assert not [i for i in found if i.startswith("offload.lint.")]
    assert not any(pred(p, facts) for p in PREDICATES if p in PREDICATE_NAMES)


PREDICATE_NAMES = ("ds_config_invalid", "ds_config_rejected", "offload_to_nvme_configured")


def test_predicates_are_documented_for_playbooks():
    load_vocabulary()
    for name in PREDICATE_NAMES:
        spec = PREDICATES[name]
        assert len(spec.doc) > 40 and set(spec.probes) <= set(OURS), name


# -- the HF config and t5-3b on an 8 x H200 node ----------------------------------------------------

def test_hf_config_t5_3b_fits_only_with_zero_init(tmp_path, ds_location):
    model = tmp_path / "config.json"
    model.write_text('{"model_type": "t5", "d_model": 1024, "d_ff": 16384, "d_kv": 128, "num_heads": 32, '
                     '"num_layers": 24, "vocab_size": 32128, "feed_forward_proj": "relu"}', encoding="utf-8")
    host = JobHost({"ds_config": str(OFF / "hf-zero3-auto.json"), "model_config": str(model)}, given(ds_location))
    facts, found = check(host)
    ds = facts["dsconfig"].facts
    assert ds["valid"] and ds["devices"] == {"offload_param": "cpu", "offload_optimizer": "cpu"}
    assert ds["deepspeed"]["fields_source"] == f"installed DeepSpeed source ({ds_location})"
    assert ds["memlock"] == {"soft_bytes": 8 * 2**20, "source": "the training environment (ulimit -l)"}
    assert ds["hidden_size"] == 1024
    cap = facts["capacity"].facts
    assert cap["gpus_per_node"] == 8 and cap["gpus_per_node_source"] == "GPUs on this node"
    assert cap["chosen_table"] == "zero3" and cap["chosen_rows"] == [0, 1]
    assert cap["ram_short"] is False and cap["ram_tight"] is True and cap["gpu_short"] is False
    assert found["offload.capacity"].status == "warn"
    assert "deepspeed.zero.Init" in found["offload.capacity"].title
    assert ds["uses_auto"] is True
    assert not pred("offload_to_nvme_configured", facts) and not pred("ds_config_rejected", facts)
    assert found["offload.lint.auto-value"].status == "warn"
    assert found["offload.lint.pin-memory-memlock"].status == "warn"
    table = next(e for e in facts["capacity"].evidence if e.table and e.label.startswith("ZeRO-3"))
    # DeepSpeed's estimate is a floor (activations and buffers come on top): said so, never as the exact need
    assert table.table.rows[0][:4] == ["offload_param=cpu, offload_optimizer=cpu, zero_init=1", "at least 71.71 GiB",
                                       "125.40 GiB", "fits (at most 53.69 GiB spare)"]
    assert table.table.rows[1][3] == "short by at least 2.08 GiB" and table.table.highlight == [0, 1]


def test_70b_does_not_fit_and_the_nvme_patch_remedy_works(tmp_path, ds_location):
    cfg = copy(tmp_path, "zero3-cpu-offload.json")
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    host = JobHost({"ds_config": cfg, "model_params": "70B", "nodes": 1, "offload_path": str(nvme)},
                   given(ds_location))
    facts, found = check(host)
    cap = facts["capacity"].facts
    assert cap["ram_short"] is True
    f = found["offload.capacity"]
    assert f.status == "fail" and "needs at least 1760.20 GiB" in f.title and "125.40 GiB" in f.title
    assert "2 nodes would need at least 880.10 GiB per node" in f.detail
    (remedy,) = f.remedies
    assert remedy.verified is False and "+      \"device\": \"nvme\"," in remedy.explanation
    script = "set -e\n" + "\n".join(remedy.commands) + "\n"
    subprocess.run(["bash", "-c", script], check=True, timeout=60)
    patched = load_config(cfg)
    assert patched.get(("zero_optimization", "offload_optimizer")) == {"device": "nvme", "nvme_path": str(nvme)}
    assert patched.get(("zero_optimization", "offload_param", "device")) == "nvme"
    assert Path(remedy.action["backup"]).read_bytes() == (OFF / "zero3-cpu-offload.json").read_bytes()
    subprocess.run(["bash", "-c", "\n".join(remedy.undo)], check=True, timeout=60)
    assert Path(cfg).read_bytes() == (OFF / "zero3-cpu-offload.json").read_bytes()


# -- broken configs --------------------------------------------------------------------------------------

def test_invalid_config_is_one_failing_finding(ds_location):
    facts, found = check(JobHost({"ds_config": str(OFF / "broken-duplicate.json")}, given(ds_location)))
    f = found["offload.config"]
    assert f.status == "fail" and f.detail.startswith(f"{OFF / 'broken-duplicate.json'}:8:5: duplicate key")
    assert pred("ds_config_invalid", facts) and pred("ds_config_rejected", facts)
    assert not pred("offload_to_nvme_configured", facts)


def test_refused_keys_fail_with_positions(ds_location):
    host = JobHost({"ds_config": str(OFF / "broken-keys.json")}, given(ds_location),
                   command="deepspeed --zero-offload train.py")
    facts, found = check(host)
    assert found["offload.config"].status == "ok"
    assert "Lints: 4 failing, 5 warning" in found["offload.config"].detail
    f = found["offload.lint.unknown-key"]
    assert f.status == "fail"
    assert f"{OFF / 'broken-keys.json'}:5:31: zero_optimization.stage3_max_live_params" in f.detail
    assert found["offload.lint.ratio-below-stage3"].status == "fail"
    assert found["offload.lint.zero-offload-flag"].status == "fail"
    assert pred("ds_config_rejected", facts) and not pred("ds_config_invalid", facts)


def test_nvme_on_tmpfs_is_unsuitable(tmp_path, ds_location):
    cfg = tmp_path / "ds.json"
    cfg.write_text(load_config(str(OFF / "zero3-nvme-offload.json")).text.replace("/local_nvme", "/dev/shm/offload"),
                   encoding="utf-8")
    facts, found = check(JobHost({"ds_config": str(cfg)}, given(ds_location)))
    assert facts["dsconfig"].facts["paths"]["/dev/shm/offload"]["category"] == "memory"
    assert pred("offload_to_nvme_configured", facts)
    assert found["offload.lint.nvme-path"].status == "fail"
    assert found["offload.lint.aio-thread-count"].status == "warn"


def test_nvme_capacity_checks_the_disk(tmp_path, ds_location):
    cfg = tmp_path / "ds.json"
    cfg.write_text(load_config(str(OFF / "zero3-nvme-offload.json")).text.replace("/local_nvme", str(tmp_path)),
                   encoding="utf-8")
    facts, found = check(JobHost({"ds_config": str(cfg), "model_params": "1.5T"}, given(ds_location)))
    cap = facts["capacity"].facts
    assert cap["chosen_table"] is None and "not modelled" in cap["chosen_note"]
    assert cap["nvme"]["need_lower_bound"] == 1_500_000_000_000 * 14
    assert cap["nvme"]["fits"] is False and found["offload.capacity"].status == "fail"


# -- training logs and GPU sampling --------------------------------------------------------------------

def test_breakdowns(tmp_path, ds_location):
    facts, found = check(JobHost({"train_log": str(OFF / "ds-0.17-wallclock-nvme.log")}))
    assert found["offload.breakdown"].status == "warn" and facts["trainlog"].facts["disk_bound"] is True
    assert found["offload.breakdown"].title == "NVMe swaps take 75% of the optimizer step, which takes 80% of an " \
                                               "iteration"
    facts, found = check(JobHost({"train_log": str(OFF / "ds-0.19-wallclock.log")}))
    assert facts["trainlog"].facts["step_bound"] is True and facts["trainlog"].facts["disk_bound"] is not True
    assert found["offload.breakdown"].title == "The optimizer step takes 60% of an iteration"
    quiet = tmp_path / "quiet.log"
    quiet.write_text("loss 1.0\n", encoding="utf-8")
    facts, found = check(JobHost({"train_log": str(quiet), "ds_config": str(OFF / "hf-zero3-auto.json")},
                                 given(ds_location)))
    assert not facts["trainlog"].facts.get("error") and not facts["trainlog"].facts.get("timer_lines")
    assert "does not set \"wall_clock_breakdown\": true" in found["offload.breakdown"].detail
    facts, found = check(JobHost({"train_log": str(tmp_path / "gone.log")}))
    assert found["offload.breakdown"].status == "fail" and "no such training log" in found["offload.breakdown"].detail


class FakeRates:
    def __init__(self, gpu: int, memory: int):
        self.gpu, self.memory = gpu, memory


@pytest.fixture
def fake_nvml(monkeypatch):
    """pynvml's functions replaced at the library boundary: two GPUs, one busy, one starved."""
    series = {0: [90, 95, 100, 97], 1: [5, 0, 30, 10]}
    calls = {0: 0, 1: 0, "shutdown": 0}

    def rates(handle):
        i = calls[handle]
        calls[handle] += 1
        return FakeRates(series[handle][min(i, 3)], 40)

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 2)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: i)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: b"NVIDIA H200" if h == 0 else "NVIDIA H200")
    monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: "580.159.04")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", rates)
    return calls


def test_sample_with_nvml(fake_nvml):
    now = [0.0]
    out = gpusample.sample(2.0, 0.5, sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0])
    assert out["samples"] == 4 and out["driver"] == "580.159.04" and fake_nvml["shutdown"] == 1
    g0, g1 = out["gpus"]
    assert g0["name"] == g1["name"] == "NVIDIA H200"
    assert g0["util"] == {"min": 90.0, "mean": 95.5, "max": 100.0} and g0["sparkline"] == "████"
    assert g1["util"] == {"min": 0.0, "mean": 11.2, "max": 30.0} and g1["sparkline"] == "▁▁▃▁"
    assert gpusample.sparkline(list(range(0, 101))) and len(gpusample.sparkline([50.0] * 500)) == 60


def test_gpusample_probe_and_check(fake_nvml):
    facts, found = check(JobHost({"gpu_sample": 0.2}))
    assert facts["gpusample"].status == "ok" and facts["gpusample"].facts["samples"] >= 2
    f = found["offload.gpu-util"]
    assert f.status == "warn" and f.title == "1 of 2 GPUs mostly idle while sampled"


def test_nvml_unavailable_is_a_skip(monkeypatch):
    def no_library():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    out = gpusample.sample(1.0)
    assert out == {"skipped": "NVML unavailable (NVMLError_LibraryNotFound: NVML Shared Library Not Found)"}
    facts, found = check(JobHost({"gpu_sample": 1.0}))
    assert facts["gpusample"].status == "skip"
    assert found["offload.gpu-util"].status == "skip" and "NVML Shared Library Not Found" in \
        found["offload.gpu-util"].detail


def test_nvml_on_this_machine_answers_or_says_why():
    out = gpusample.sample(0.1, 0.05)
    if "skipped" in out:
        assert out["skipped"].startswith(("NVML unavailable (", "NVML reports no GPUs"))
    else:
        assert out["gpus"] and all(g["util"]["mean"] is not None for g in out["gpus"])


def test_replayed_facts_give_the_same_findings(tmp_path, ds_location):
    """Checks read only facts: a snapshot of the probe results yields the same verdicts on any machine."""
    from zdoctor.host.replay import ReplayHost, snapshot_document

    host = JobHost({"ds_config": str(OFF / "broken-keys.json"), "model_params": "7B",
                    "train_log": str(OFF / "ds-0.17-wallclock-nvme.log")}, given(ds_location))
    _facts, live = check(host)
    replay = ReplayHost(snapshot_document(host))
    load_vocabulary()
    _f, again = run_checks(replay, CHECKS)
    assert {f.id: f.status for f in again} == {i: f.status for i, f in live.items()}
    assert parse_config('{"a": 1}').data == {"a": 1}


# -- unknown is unknown ---------------------------------------------------------------------------------

def test_missing_inputs_give_unknown_figures_and_no_fits():
    """No GPU seen, no --gpus-per-node, no --model-config: every figure that depends on them is unknown (never
    a 0.00 GiB lower bound), nothing is said to fit, and each unknown names what would supply it."""
    host = JobHost({"model_params": "2B"}, {"host_limits": {"target": {"memlock_soft_kb": 8192}}})
    facts, found = check(host)
    cap = facts["capacity"].facts
    assert cap["gpus_per_node"] is None and set(cap["missing"]) == {"gpus_per_node", "largest_layer"}
    assert cap["deepspeed_text"] is None
    for r in cap["zero3"] + cap["zero2"]:
        assert r["gpu_fits"] is None and "NVML" in r["gpu_unknown"]
        assert not planner.fits(r)
    # cpu/cpu with zero.Init needs 18 bytes x 1.5 per parameter whatever the GPUs: a real number, and it fits.
    first = cap["zero3"][0]
    assert first["cpu_bytes"] == int(2e9 * 18 * 1.5) and first["cpu_fits"] is True and first["cpu_unknown"] is None
    # none/none without zero.Init needs 4 bytes per parameter per GPU on the host: unknown without the GPU count.
    last = cap["zero3"][-1]
    assert last["cpu_bytes"] is None and last["cpu_fits"] is None and "--gpus-per-node" in last["cpu_unknown"]
    table = next(e for e in facts["capacity"].evidence if e.table and e.label.startswith("ZeRO-3"))
    cells = [c for row in table.table.rows for c in row]
    assert not any("0.00 GiB" in c or c.startswith("≥") for c in cells)
    assert not any(c.startswith("fits") for row in table.table.rows for c in (row[6],))
    f = found["offload.capacity"]
    assert f.status == "warn" and "unknown" in f.title and "Choices that fit this node" not in f.detail
    for supplier in ("--gpus-per-node", "--model-config", "NVML"):
        assert supplier in f.detail, supplier


def test_a_need_that_moves_only_past_four_gpus_is_unknown_without_the_gpu_count():
    """DeepSpeed's zero_init=0 need is max(4 x GPUs per node, 18) bytes per parameter: the same for 1 and 2
    GPUs, larger from 5 on. With no GPU seen and no --gpus-per-node it is unknown, and the chosen offload
    is not said to fit without zero.Init."""
    row = planner.zero3_rows(1e8, 0, 1, 1)[1]
    assert row.zero_init is False and "gpus_per_node" in planner.row_depends_on(row, 1e8, 0, 1, 1)["cpu"]
    host = JobHost({"model_params": "100M", "ds_config": str(OFF / "zero3-cpu-offload.json")},
                   {"host_limits": {"target": {"memlock_soft_kb": 8192}}})
    facts, found = check(host)
    cap = facts["capacity"].facts
    with_init, without = (cap["zero3"][i] for i in cap["chosen_rows"])
    assert with_init["cpu_bytes"] == int(1e8 * 18 * 1.5) and with_init["cpu_fits"] is True
    assert without["cpu_bytes"] is None and without["cpu_fits"] is None and "--gpus-per-node" in without["cpu_unknown"]
    assert cap["ram_short"] is False and cap["ram_tight"] is None
    f = found["offload.capacity"]
    assert f.status == "warn" and "without zero.Init: unknown" in f.title, f.title


def test_real_numbers_still_say_fits(tmp_path):
    """With the GPUs seen through NVML and the model's config, every figure is known and "fits" is said."""
    model = tmp_path / "config.json"
    model.write_text('{"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 8, '
                     '"num_attention_heads": 8, "vocab_size": 32000}', encoding="utf-8")
    host = JobHost({"model_config": str(model)}, {"nvml": {"gpus": [dict(H200_GPU, index=i) for i in range(8)]},
                                                  "host_limits": {"target": {"memlock_soft_kb": 8192}}})
    facts, found = check(host)
    cap = facts["capacity"].facts
    assert cap["missing"] == {} and cap["gpus_per_node"] == 8 and cap["deepspeed_text"]
    assert all(planner.fits(r) for r in cap["zero3"])
    assert found["offload.capacity"].status == "ok" and "6 of 6 ZeRO-3 choices fit" in found["offload.capacity"].title
