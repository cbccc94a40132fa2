"""NVMe parameter offload's swap buffers: DeepSpeed's own assertion, met for real, explained by the ds_config's
``offload_param.buffer_size`` against the model's largest layer, and fixed by the computed patch.

The real state: the installed DeepSpeed 0.19.8 parses the ds_config (DeepSpeedConfig) and its NVMe parameter
swapper's ``get_buffer`` (the function that asserts, with the state ``_configure_aio`` gives it: without libaio
and a GPU the swapper's own constructor cannot run here) is handed a real fp16 embedding of GPT-2 medium's
size; it stops with "More elements N than buffer size B". zdoctor, given that output as --log, the config and
the model's config.json, explains it; the remedy's own lines patch the config, and the same DeepSpeed call
then succeeds.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from dsenv import ensure
from test_gpu_facts import facts_of

from zdoctor.layers.offload import lint
from zdoctor.layers.offload.check_swapbuffers import check_swap_buffers
from zdoctor.layers.offload.dsconfig import parse_config
from zdoctor.layers.offload.swapbuffers import read_asserts
from zdoctor.symptoms.extract import from_text

ROOT = Path(__file__).resolve().parent.parent
#: DeepSpeed's swapper as _configure_aio leaves it, then get_buffer for one real parameter partition.
SWAP = """import sys
import deepspeed
import torch
from deepspeed.runtime.config import DeepSpeedConfig
from deepspeed.runtime.swap_tensor.constants import AIO_INTRA_OP_PARALLELISM
from deepspeed.runtime.swap_tensor.partitioned_param_swapper import AsyncPartitionedParameterSwapper
from deepspeed.runtime.swap_tensor.utils import AIO_ALIGNED_BYTES

deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)  # one rank, as a launcher would
config = DeepSpeedConfig(sys.argv[1])
swap = config.zero_config.offload_param
swapper = object.__new__(AsyncPartitionedParameterSwapper)
swapper.numel_alignment = AIO_ALIGNED_BYTES * config.aio_config[AIO_INTRA_OP_PARALLELISM] // 2
swapper.elements_per_buffer = swap.buffer_size
swapper.aligned_elements_per_buffer = swapper._io_aligned_numel(swap.buffer_size)
swapper.available_buffer_ids = list(range(swap.buffer_count))
swapper.param_id_to_buffer_id, swapper.param_id_to_swap_buffer, swapper.param_id_to_numel = {}, {}, {}
swapper.buffers = torch.empty(int(swapper.aligned_elements_per_buffer * swap.buffer_count), dtype=torch.float16)
embedding = torch.nn.Embedding(50257, 1024, dtype=torch.float16)
embedding.weight.ds_id = 0
world = int(sys.argv[2])
partition_size = -(-embedding.weight.numel() // world)  # partition_parameters: the aligned size over the ranks
swapper.get_buffer(embedding.weight, partition_size)
print("swap buffer for", partition_size, "elements")
"""
CONFIG = """{
  // GPT-2 medium, parameters on NVMe
  "train_micro_batch_size_per_gpu": 1,
  "zero_optimization": {
    "stage": 3,
    "offload_param": {"device": "nvme", "nvme_path": "NVME", "buffer_count": 2, "buffer_size": 1e7}
  }
}
"""
MODEL = {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 1024, "n_layer": 24, "n_head": 16, "n_positions": 1024}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _swap(python: Path, config: Path, world: int = 1) -> subprocess.CompletedProcess[str]:
    # DeepSpeed's CPU backend JIT-builds its shm op once (minutes on two cores), into a cache of its own beside
    # the environment: the environment's extension cache holds only the cpu_adam op other tests count
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", LOCAL_RANK="0",
               WORLD_SIZE="1", TORCH_EXTENSIONS_DIR=str(python.parent.parent / "zdoctor-shm-extensions"),
               PATH=f"{python.parent}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run([str(python), "-c", SWAP, str(config), str(world)], capture_output=True, text=True,
                          timeout=900, env=env)


@pytest.fixture(scope="module")
def met(tmp_path_factory):
    """The real assertion, zdoctor's report on it, and the folder: (report, tmp, python)."""
    python = ensure()
    tmp = tmp_path_factory.mktemp("swapbuf")
    (tmp / "ds.json").write_text(CONFIG.replace("NVME", str(tmp / "nvme")))
    (tmp / "config.json").write_text(json.dumps(MODEL))
    run = _swap(python, tmp / "ds.json")
    assert run.returncode != 0
    (tmp / "train.log").write_text(run.stdout + run.stderr)
    check = [sys.executable, "-m", "zdoctor", "check", "--json", "--playbook", "offload-bottleneck",
             "--python", str(python), "--ds-config", str(tmp / "ds.json"), "--model-config", str(tmp / "config.json"),
             "--gpus-per-node", "1", "--log", str(tmp / "train.log")]
    proc = subprocess.run(check, capture_output=True, text=True, timeout=600, cwd=str(tmp),
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout.strip().startswith("{"), proc.stderr[-3000:]
    return json.loads(proc.stdout), tmp, python


def test_deepspeeds_buffer_size_assertion_is_explained_by_the_config_and_the_model(met):
    report, tmp, _ = met
    assert "AssertionError: More elements 51463168 than buffer size 10000000" in (tmp / "train.log").read_text()
    f = {x["id"]: x for x in report["findings"]}["offload.swap-buffers"]
    assert f["status"] == "fail"
    assert f["title"] == ("offload_param.buffer_size (10,000,000) is smaller than a parameter partition it must "
                          "hold (51,463,168 elements)")
    assert "largest layer: 51,463,168 elements (embedding of" in f["detail"]
    assert "DeepSpeed 0.19.8 asserts `numel <= self.elements_per_buffer` at " in f["detail"]
    assert "partitioned_param_swapper.py:357 (get_buffer)" in f["detail"]
    (said,) = [s for s in report["symptoms"] if s["kind"] == "nvme-swap-buffers"]
    assert said["signature"] == "offload.swap-buffer-size" and said["explained_by"] == ["offload.swap-buffers"]


def test_the_computed_patch_satisfies_deepspeeds_condition_when_applied(met):
    report, tmp, python = met
    f = {x["id"]: x for x in report["findings"]}["offload.swap-buffers"]
    (remedy,) = f["remedies"]
    assert remedy["title"] == "Set offload_param.buffer_size to 52,000,000 in the ds_config"
    assert remedy["verification"]["state"] == "not_tried"
    before = (tmp / "ds.json").read_text()
    subprocess.run(["bash", "-e"], input="\n".join(remedy["commands"]) + "\n", text=True, check=True, timeout=60)
    after = parse_config((tmp / "ds.json").read_text(), "ds.json")
    assert after.get(("zero_optimization", "offload_param", "buffer_size")) == 52_000_000
    assert after.get(("zero_optimization", "offload_param", "buffer_count")) == 2  # the block's other values stay
    assert "// GPT-2 medium" in after.text  # every byte outside the block stays
    assert before in [p.read_text() for p in tmp.glob("ds.json.bak.zdoctor-*")]
    run = _swap(python, tmp / "ds.json")
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "swap buffer for 51463168 elements"


def test_the_installed_release_is_read_for_its_assertions():
    python = ensure()
    site = subprocess.run([str(python), "-c", "import deepspeed, os; print(os.path.dirname(deepspeed.__file__))"],
                          capture_output=True, text=True, timeout=300).stdout.strip().splitlines()[-1]
    got = read_asserts(site)
    by = {(a["limit"], a["function"]): a for a in got["asserts"]}
    assert by[("buffer_size", "get_buffer")]["message"] == \
        "More elements {numel} than buffer size {self.elements_per_buffer}"
    assert by[("buffer_count", "swap_in")]["condition"] == "len(swap_in_paths) <= len(self.available_buffer_ids)"
    assert got["min_aio_bytes"] == 1024 ** 2


# -- on facts --------------------------------------------------------------------------------------------

def _dsconfig(text: str) -> dict:
    cfg = parse_config(text, "/job/ds.json")
    eff = lint.effective(cfg, lint.static_tables("0.19.8"))
    return {"path": "/job/ds.json", "valid": True, "text": text, "settings": eff,
            "devices": {w: lint.device_of(eff, w) for w in ("offload_param", "offload_optimizer")}}


def _facts(log: str, **probes: dict):
    return facts_of(symptoms={"symptoms": [s.to_dict() for s in from_text(log, "log", "train.log")]}, **probes)


def test_not_enough_buffers_computes_the_count_one_swap_in_takes():
    text = CONFIG.replace("NVME", "/nvme")
    log = "AssertionError: Not enough buffers 0 for swapping 3"
    (f,) = check_swap_buffers(_facts(log, dsconfig=_dsconfig(text)))
    assert f.status == "fail" and f.title == "offload_param.buffer_count (2) is fewer than one swap-in takes"
    assert f.explains == ["S1"]
    assert f.remedies[0].title == "Set offload_param.buffer_count to 5 in the ds_config"


def test_without_the_config_the_message_alone_gives_the_size_needed():
    (f,) = check_swap_buffers(_facts("AssertionError: More elements 262144000 than buffer size 100000000"))
    assert f.status == "warn" and f.title.endswith("(from the message only)")
    assert "buffer_size must be at least 263,000,000 elements" in f.detail


def test_a_buffer_that_holds_the_largest_partition_is_ok_and_an_unknown_model_is_not_checked():
    text = CONFIG.replace("NVME", "/nvme").replace("1e7", "1e8")
    cap = {"largest_layer": 51463168, "largest_layer_source": "embedding", "nodes": 1, "gpus_per_node": 8}
    (f,) = check_swap_buffers(_facts("", dsconfig=_dsconfig(text), capacity=cap))
    assert f.status == "ok" and "(6,432,896)" in f.title
    (f,) = check_swap_buffers(_facts("", dsconfig=_dsconfig(text)))
    assert f.status == "skip" and "largest parameter is not known" in f.detail


def test_source_segments_are_the_ones_ast_gives():
    """One split of the file, the same text as ``ast.get_source_segment`` (which splits it at every call):
    multi-byte characters, CRLF and lone CR line ends, a form feed, expressions over several lines."""
    import ast

    from zdoctor.layers.offload.swapbuffers import Source

    text = ("assert n <= self.elements_per_buffer, \\\n    f'More elements {n} than buffer size {self.ñ(é)}'\r\n"
            "y = (1,\r\n  2)\rz = 'é' + 'x'\n\x0cw = f'{a + b}'\n")
    src = Source(text)
    nodes = [n for n in ast.walk(ast.parse(text)) if hasattr(n, "end_col_offset")]
    assert len(nodes) > 20
    assert all(src.segment(n) == (ast.get_source_segment(text, n) or "") for n in nodes)
