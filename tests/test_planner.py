"""DeepSpeed's memory estimators reproduced cell for cell, parameter counts from HF configs, and the needs set
against a machine."""

from __future__ import annotations

import itertools
import json
import subprocess

import pytest
from conftest import FIXTURES
from dsenv import ensure

from zdoctor.core.errors import InputError
from zdoctor.layers.offload import planner

OFF = FIXTURES / "offload"

T5_3B = {"model_type": "t5", "d_model": 1024, "d_ff": 16384, "d_kv": 128, "num_heads": 32, "num_layers": 24,
         "vocab_size": 32128, "feed_forward_proj": "relu", "relative_attention_num_buckets": 32}
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "n_inner": None,
        "vocab_size": 50257, "activation_function": "gelu_new"}
LLAMA2_7B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000, "hidden_act": "silu",
             "tie_word_embeddings": False, "max_position_embeddings": 4096}
MISTRAL_7B = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "hidden_act": "silu",
              "tie_word_embeddings": False}

GRID = r"""
import itertools, json, sys
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as z3
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as z2
spec = json.load(sys.stdin)
out3 = [list(z3(P, L, g, n, co, cp, zi)) for P, L, g, n, co, cp, zi in spec["z3"]]
out2 = [list(z2(P, g, n, co)) for P, g, n, co in spec["z2"]]
sys.stdout.write("@@R@@" + json.dumps({"z3": out3, "z2": out2}))
"""

PRINT = r"""
import sys
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold as cold
P, L, g, n = (float(x) for x in sys.argv[1:5])
print("@@R@@")
cold(total_params=P, largest_layer_params=L, num_gpus_per_node=int(g), num_nodes=int(n))
"""


def test_documented_t5_3b_example():
    """DeepSpeed's documentation: t5-3b, 1 node x 8 GPUs, cpu/cpu, zero_init=1 -> 71.69GB per CPU, 0.12GB per GPU."""
    text = planner.deepspeed_text(2851e6, 32e6, 8, 1)
    assert text.splitlines()[:5] == [
        "Estimated memory needed for params, optim states and gradients for a:",
        "HW: Setup with 1 node, 8 GPUs per node.",
        "SW: Model with 2851M total params, 32M largest layer params.",
        "  per CPU  |  per GPU |   Options",
        "   71.69GB |   0.12GB | offload_param=cpu, offload_optimizer=cpu, zero_init=1"]
    row = planner.zero3_rows(2851e6, 32e6, 8, 1)[0]
    assert (row.offload_param, row.offload_optimizer, row.zero_init) == ("cpu", "cpu", True)
    assert f"{row.cpu_bytes / 2**30:.2f}" == "71.69" and f"{row.gpu_bytes / 2**30:.2f}" == "0.12"


def test_t5_3b_from_its_config_gives_the_live_estimate():
    """From config.json: the real t5-3b count (2,851,598,336) and largest layer (the 32128 x 1024 embedding),
    so the table is the one DeepSpeed's docs show for the live model: 71.71GB / 0.12GB."""
    est = planner.estimate_hf(T5_3B)
    assert (est.params, est.largest_layer, est.largest_layer_name) == (2851598336, 32899072, "embedding")
    lines = planner.deepspeed_text(est.params, est.largest_layer, 8, 1).splitlines()
    assert lines[2] == "SW: Model with 2851M total params, 32M largest layer params."
    assert lines[4].startswith("   71.71GB |   0.12GB |")


def test_matches_deepspeed_over_a_grid():
    """Every cell of DeepSpeed's own estimators (called in the DeepSpeed environment) equals zdoctor's."""
    params = [1, 123456789, 2851e6, 7e9, 70e9, 175e9, 1.5e12]
    layers = [0, 32e6, 1e8, 2.5e9]
    gpus, nodes = [1, 2, 8], [1, 2, 4, 16]
    flags = list(itertools.product([True, False], repeat=3))
    z3 = [[p, lay, g, n, *f] for p, lay, g, n, f in itertools.product(params, layers, gpus, nodes, flags)]
    z2 = [[p, g, n, co] for p, g, n, co in itertools.product(params, gpus, nodes, [True, False])]
    proc = subprocess.run([str(ensure()), "-c", GRID], input=json.dumps({"z3": z3, "z2": z2}), capture_output=True,
                          text=True, timeout=300)
    ref = json.loads(proc.stdout.split("@@R@@", 1)[1])
    assert len(ref["z3"]) == len(z3) == 2688
    for args, want in zip(z3, ref["z3"]):
        assert list(planner.zero3_needs(*args)) == want, args
    assert len(ref["z2"]) == len(z2)
    for args, want in zip(z2, ref["z2"]):
        assert list(planner.zero2_needs(*args)) == want, args


@pytest.mark.parametrize("p, lay, g, n", [(2851e6, 32e6, 8, 1), (70e9, 1.05e9, 8, 4), (1.3e9, 5e7, 1, 1)])
def test_printed_table_matches_deepspeed(p, lay, g, n):
    proc = subprocess.run([str(ensure()), "-c", PRINT, str(p), str(lay), str(g), str(n)], capture_output=True,
                          text=True, timeout=300)
    printed = proc.stdout.split("@@R@@\n", 1)[1].strip().splitlines()
    printed = [ln.replace("OffloadDeviceEnum.cpu", "cpu").replace("cpu ,", "cpu,") for ln in printed]
    assert planner.deepspeed_text(p, lay, g, n).splitlines() == printed


@pytest.mark.parametrize("text, value", [("2851M", 2851000000), ("7e9", 7000000000), ("70B", 70000000000),
                                         ("1.5T", 1500000000000), ("125m", 125000000), ("7,000,000", 7000000),
                                         (" 13b ", 13000000000), ("6.7G", 6700000000), ("350k", 350000),
                                         (2851e6, 2851000000)])
def test_parse_count(text, value):
    assert planner.parse_count(text) == value


@pytest.mark.parametrize("text", ["", "abc", "-5", "0", "7XB", "1e20", "7 GiB", True, "nan"])
def test_parse_count_refuses(text):
    with pytest.raises(InputError):
        planner.parse_count(text)


@pytest.mark.parametrize("cfg, params, largest", [(GPT2, 124439808, 38597376), (LLAMA2_7B, 6738415616, 131072000),
                                                   (MISTRAL_7B, 7241732096, 131072000)])
def test_published_parameter_counts(cfg, params, largest):
    est = planner.estimate_hf(cfg)
    assert (est.params, est.largest_layer) == (params, largest)
    assert est.hidden_size == cfg.get("hidden_size", cfg.get("n_embd"))


def test_estimates_say_what_they_assumed():
    est = planner.estimate_hf({"model_type": "mystery", "hidden_size": 1024, "num_hidden_layers": 2,
                               "vocab_size": 1000})
    text = " ".join(est.assumptions)
    assert "model_type mystery is not one zdoctor knows" in text
    assert "intermediate_size not given" in text and "num_attention_heads not given" in text
    mm = planner.estimate_hf({"model_type": "llava", "text_config": dict(LLAMA2_7B)})
    assert mm.params == 6738415616 and "vision towers are not counted" in mm.assumptions[0]
    moe = planner.estimate_hf({**MISTRAL_7B, "model_type": "mixtral", "num_local_experts": 8})
    assert moe.params == 46702792704  # Mixtral-8x7B
    with pytest.raises(InputError, match="needs hidden_size"):
        planner.estimate_hf({"model_type": "llama"})


def test_model_config_file_errors(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{\n  "hidden_size": 4096,\n  "num_layers": 32\n  "vocab_size": 1\n}', encoding="utf-8")
    with pytest.raises(InputError, match=r"config.json:4:3: malformed JSON: Expecting ',' delimiter"):
        planner.load_model_config(str(bad))
    good = tmp_path / "t5.json"
    good.write_text(json.dumps(T5_3B), encoding="utf-8")
    assert planner.load_model_config(str(good)).params == 2851598336
    with pytest.raises(InputError, match="no such model config"):
        planner.load_model_config(str(tmp_path / "missing.json"))


def test_needs_against_the_h200_node():
    info = planner.read_meminfo(str(OFF / "h200-meminfo.txt"))
    assert info["MemAvailable"] == 131490436 * 1024 and info["SwapFree"] == 0
    nvml = json.loads((OFF / "h200-nvml.json").read_text(encoding="utf-8"))
    mem, count, src = planner.gpu_memory_from(nvml)
    assert (mem, count, src) == (150754820096, 1, "GPU probe")
    machine = planner.Machine(mem_available=info["MemAvailable"], gpu_memory=mem)
    rows = planner.fit_rows(planner.zero3_rows(2851e6, 32e6, 8, 1), machine)
    assert planner.verdict(rows[0]["cpu_fits"], rows[0]["cpu_margin"]) == "fits (at most 53.71 GiB spare)"
    assert planner.verdict(rows[1]["cpu_fits"], rows[1]["cpu_margin"]) == "short by at least 2.05 GiB"
    assert rows[0]["gpu_fits"] is True
    big = planner.fit_rows(planner.zero3_rows(70e9, 1.05e9, 8, 1), machine)
    assert big[0]["cpu_fits"] is False
    assert planner.verdict(False, big[0]["cpu_margin"]) == "short by at least 1634.80 GiB"
    unknown = planner.fit_rows(planner.zero3_rows(1e9, 1e7, 1, 1), planner.Machine())
    assert unknown[0]["cpu_fits"] is None and planner.verdict(None, None) == "unknown"


def test_gpu_memory_from_odd_facts():
    assert planner.gpu_memory_from(None)[0] is None
    assert planner.gpu_memory_from({"gpus": []}) == (None, 0, "the GPU probe found no GPUs")
    assert planner.gpu_memory_from({"gpus": [{"memory": {"total": None}}]})[2] == "the GPU facts give no memory size"
    two = {"gpus": [{"memory": {"total": 85899345920}}, {"memory_total": 42949672960}]}
    assert planner.gpu_memory_from(two) == (42949672960, 2, "GPU probe")


def test_this_machine_reads_the_real_node(tmp_path):
    m = planner.this_machine(disk_path=str(tmp_path / "not" / "there"))
    assert m.mem_total and m.mem_available and 0 < m.mem_available <= m.mem_total
    assert m.disk_free is not None and m.disk_total >= m.disk_free
    assert m.gpu_memory is None and m.gpu_source == "no GPU facts"
    assert planner.nvme_lower_bound(1_000_000, 2, True, True) == 7_000_000
