"""How much memory ZeRO offload needs, by DeepSpeed's own estimators, set against this machine.

The formulas are DeepSpeed's ``estimate_zero3_model_states_mem_needs`` (runtime/zero/stage3.py) and
``estimate_zero2_model_states_mem_needs`` (runtime/zero/stage_1_and_2.py), reproduced operation for
operation so every number matches what DeepSpeed prints. They cover parameters, gradients and optimizer
states (with DeepSpeed's 1.5 buffer factor on the CPU side), not activations, pinned swap buffers or NVMe.
"per CPU" is one node's host memory; "per GPU" one GPU's memory.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from zdoctor.core.errors import InputError
from zdoctor.core.jsondoc import json_document
from zdoctor.core.units import parse_count  # noqa: F401 - model sizes as the options give them
from zdoctor.layers.offload.dsconfig import read_text
from zdoctor.layers.offload.lint import memlock_soft
from zdoctor.readers.cgroups import headroom

BUFFER_FACTOR = 1.5
GIB = 2**30
#: Where this node's memory is read from (a recorded meminfo stands in for it in tests).
MEMINFO = "/proc/meminfo"



# -- DeepSpeed's estimators ---------------------------------------------------------------------------

def zero3_needs(total_params: float, largest_layer_params: float, num_gpus_per_node: int = 1, num_nodes: int = 1,
                cpu_offload: bool = True, cpu_offload_params: bool = True, zero_init: bool = True,
                additional_buffer_factor: float = BUFFER_FACTOR) -> tuple[int, int, float]:
    """DeepSpeed's ``estimate_zero3_model_states_mem_needs``: (cpu bytes, gpu bytes, largest layer bytes)."""
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer_memory = (4 * largest_layer_params)
    if cpu_offload:
        # Offloading the parameters too moves their 2 bytes (fp16) per parameter from the GPUs to the host.
        cpu_bytes_per_param = 18 if cpu_offload_params else 16
        gpu_mem = largest_layer_memory + (0 if cpu_offload_params else int(2 * total_params / total_gpus))
        if zero_init:
            cpu_mem = total_params * cpu_bytes_per_param * gpus_factor * additional_buffer_factor
        else:
            cpu_mem = (total_params * max(4 * num_gpus_per_node, cpu_bytes_per_param * gpus_factor)
                       * additional_buffer_factor)
    else:
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
        if zero_init:
            cpu_mem = largest_layer_params * 4 * num_gpus_per_node * additional_buffer_factor
        else:
            cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem), largest_layer_memory


def zero2_needs(total_params: float, num_gpus_per_node: int = 1, num_nodes: int = 1, cpu_offload: bool = True,
                additional_buffer_factor: float = BUFFER_FACTOR) -> tuple[int, int]:
    """DeepSpeed's ``estimate_zero2_model_states_mem_needs``: (cpu bytes, gpu bytes)."""
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu_mem = 2 * total_params
        cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
        cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)


@dataclass
class NeedRow:
    """One offload choice and what DeepSpeed estimates it needs."""

    stage: int
    offload_param: str  # cpu | none
    offload_optimizer: str  # cpu | none
    zero_init: bool | None  # None at stage 2
    cpu_bytes: int
    gpu_bytes: int

    @property
    def label(self) -> str:
        s = f"offload_param={self.offload_param}, offload_optimizer={self.offload_optimizer}" if self.stage == 3 \
            else f"offload_optimizer={self.offload_optimizer}"
        return s + (f", zero_init={int(self.zero_init)}" if self.zero_init is not None else "")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "label": self.label}


def zero3_rows(total_params: float, largest_layer_params: float, gpus_per_node: int = 1,
               nodes: int = 1) -> list[NeedRow]:
    """The six rows of ``estimate_zero3_model_states_mem_needs_all_cold``, in DeepSpeed's order."""
    rows = []
    for cpu_offload in (True, False):
        for cpu_offload_params in (True, False):
            if not cpu_offload and cpu_offload_params:
                continue
            for zero_init in (True, False):
                cpu, gpu, _ = zero3_needs(total_params, largest_layer_params, gpus_per_node, nodes, cpu_offload,
                                          cpu_offload_params, zero_init)
                rows.append(NeedRow(3, "cpu" if cpu_offload_params else "none", "cpu" if cpu_offload else "none",
                                    zero_init, cpu, gpu))
    return rows


def zero2_rows(total_params: float, gpus_per_node: int = 1, nodes: int = 1) -> list[NeedRow]:
    """The two rows of ``estimate_zero2_model_states_mem_needs_all_cold``."""
    rows = []
    for cpu_offload in (True, False):
        cpu, gpu = zero2_needs(total_params, gpus_per_node, nodes, cpu_offload)
        rows.append(NeedRow(2, "none", "cpu" if cpu_offload else "none", None, cpu, gpu))
    return rows


def deepspeed_text(total_params: float, largest_layer_params: float, gpus_per_node: int = 1, nodes: int = 1) -> str:
    """The table as DeepSpeed's ``estimate_zero3_model_states_mem_needs_all_cold`` prints it (the option
    names written plainly: DeepSpeed's own spelling of ``cpu`` depends on the Python version)."""
    lines = ["Estimated memory needed for params, optim states and gradients for a:",
             f"HW: Setup with {nodes} {'nodes' if nodes > 1 else 'node'}, {gpus_per_node} "
             f"{'GPUs' if gpus_per_node > 1 else 'GPU'} per node.",
             f"SW: Model with {int(total_params / 1e6)}M total params, {int(largest_layer_params / 1e6)}M largest "
             "layer params.",
             "  per CPU  |  per GPU |   Options"]
    for r in zero3_rows(total_params, largest_layer_params, gpus_per_node, nodes):
        lines.append(f" {r.cpu_bytes / GIB:7.2f}GB | {r.gpu_bytes / GIB:6.2f}GB | {r.label}")
    return "\n".join(lines)


# -- parameters from a Hugging Face config.json --------------------------------------------------------

#: Families whose MLP is gated (three matrices: gate, up, down).
GATED = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
                   "gemma3_text", "phi3", "olmo", "olmo2", "internlm2", "deepseek_v2", "deepseek_v3", "cohere",
                   "granite", "yi", "baichuan", "exaone", "stablelm_epoch", "smollm3", "ministral"})
#: Families with biases on every linear and LayerNorm (weight and bias).
BIASED = frozenset({"gpt_neox", "opt", "bloom", "phi", "falcon", "gpt_neo", "gptj", "starcoder2", "gpt_bigcode"})
#: Families with learned position embeddings (and the padding offset OPT adds).
LEARNED_POSITIONS = {"opt": 2, "gpt_neo": 0}
#: PretrainedConfig ties word embeddings by default; these families' config classes do not.
UNTIED_DEFAULT = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3",
                            "olmo", "olmo2", "internlm2", "deepseek_v2", "deepseek_v3", "gpt_neox", "falcon",
                            "bloom", "opt", "granite", "cohere", "gptj"})


@dataclass
class ModelEstimate:
    """A parameter count estimated from a config, with the largest layer and how both were derived."""

    params: int
    largest_layer: int
    largest_layer_name: str
    hidden_size: int | None
    family: str
    formula: str
    assumptions: list[str] = field(default_factory=list)
    parts: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(cfg: dict[str, Any], *names: str) -> int | None:
    for n in names:
        v = cfg.get(n)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _t5(cfg: dict[str, Any], notes: list[str]) -> ModelEstimate:
    d, ff, vocab = _int(cfg, "d_model"), _int(cfg, "d_ff"), _int(cfg, "vocab_size")
    enc = _int(cfg, "num_layers")
    if not (d and ff and vocab and enc):
        raise InputError("T5-style config needs d_model, d_ff, num_layers and vocab_size")
    dec = _int(cfg, "num_decoder_layers") or enc
    heads, dkv = _int(cfg, "num_heads") or 8, _int(cfg, "d_kv") or d // (_int(cfg, "num_heads") or 8)
    buckets = _int(cfg, "relative_attention_num_buckets") or 32
    gated = str(cfg.get("feed_forward_proj", "relu")).startswith("gated")
    inner = heads * dkv
    attn = 4 * d * inner
    ffn = (3 if gated else 2) * d * ff
    tied = cfg.get("tie_word_embeddings", True) is not False
    parts = {"embedding": vocab * d, "encoder": enc * (attn + ffn + 2 * d) + buckets * heads + d,
             "decoder": dec * (2 * attn + ffn + 3 * d) + buckets * heads + d,
             "lm_head": 0 if tied else vocab * d}
    if "num_heads" not in cfg:
        notes.append("num_heads not given: 8 assumed")
    notes.append(f"feed-forward {'gated (3 matrices)' if gated else 'not gated (2 matrices)'}; word embeddings "
                 f"{'tied with the LM head' if tied else 'separate from the LM head'}")
    layers = {"embedding": vocab * d, "feed-forward matrix": d * ff, "attention projection": d * inner}
    name = max(layers, key=lambda k: layers[k])
    return ModelEstimate(sum(parts.values()), layers[name], name, d, "t5",
                         "T5 encoder-decoder: shared embedding + encoder layers (self-attention, feed-forward, 2 "
                         "norms) + decoder layers (self- and cross-attention, feed-forward, 3 norms) + relative "
                         "position biases + final norms", notes, parts)


def _gpt2(cfg: dict[str, Any], notes: list[str]) -> ModelEstimate:
    h, n, vocab = _int(cfg, "n_embd"), _int(cfg, "n_layer"), _int(cfg, "vocab_size")
    if not (h and n and vocab):
        raise InputError("GPT-2-style config needs n_embd, n_layer and vocab_size")
    pos = _int(cfg, "n_positions", "n_ctx") or 1024
    inner = _int(cfg, "n_inner") or 4 * h
    if not _int(cfg, "n_inner"):
        notes.append(f"n_inner not given: 4 * n_embd = {inner}")
    layer = 2 * 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * inner + inner) + (inner * h + h)
    tied = cfg.get("tie_word_embeddings", True) is not False
    parts = {"embedding": vocab * h, "positions": pos * h, "layers": n * layer, "final_norm": 2 * h,
             "lm_head": 0 if tied else vocab * h}
    layers = {"embedding": vocab * h, "mlp matrix (c_fc)": h * inner + inner,
              "attention qkv (c_attn)": h * 3 * h + 3 * h}
    name = max(layers, key=lambda k: layers[k])
    return ModelEstimate(sum(parts.values()), layers[name], name, h, "gpt2",
                         "GPT-2: token + learned position embeddings + layers (fused qkv, projection, 2-matrix MLP, "
                         "2 LayerNorms, biases everywhere) + final LayerNorm", notes, parts)


def _decoder(cfg: dict[str, Any], notes: list[str]) -> ModelEstimate:
    mt = str(cfg.get("model_type") or "")
    h = _int(cfg, "hidden_size", "d_model", "n_embd")
    n = _int(cfg, "num_hidden_layers", "num_layers", "n_layer")
    vocab = _int(cfg, "vocab_size")
    if not (h and n and vocab):
        raise InputError("config needs hidden_size, num_hidden_layers and vocab_size to estimate parameters")
    heads = _int(cfg, "num_attention_heads", "n_head")
    if heads is None:
        heads = max(1, h // 128)
        notes.append(f"num_attention_heads not given: {heads} assumed (head size 128)")
    kv = _int(cfg, "num_key_value_heads") or heads
    hd = _int(cfg, "head_dim") or h // heads
    inter = _int(cfg, "intermediate_size", "ffn_dim", "n_inner")
    if inter is None:
        inter = 4 * h
        notes.append(f"intermediate_size not given: 4 * hidden_size = {inter}")
    act = str(cfg.get("hidden_act") or cfg.get("activation_function") or "")
    gated = mt in GATED or (mt not in BIASED and act in ("silu", "swish", "swiglu"))
    biased = mt in BIASED
    if mt not in GATED and mt not in BIASED:
        notes.append(f"model_type {mt or '(none)'} is not one zdoctor knows: LLaMA-style layout assumed "
                     f"({'gated' if gated else 'plain'} MLP from hidden_act {act or '(none)'}, RMSNorm, no biases)")
    q, kvp, o = h * heads * hd, h * kv * hd, heads * hd * h
    attn = q + 2 * kvp + o
    if biased or cfg.get("attention_bias") is True:
        attn += heads * hd + 2 * kv * hd + (h if biased else 0)
    elif mt == "qwen2" or mt == "qwen2_moe":
        attn += heads * hd + 2 * kv * hd  # Qwen2 has q/k/v biases
    mlp_one = h * inter
    mlp = (3 if gated else 2) * mlp_one + ((2 * inter if gated else inter) + h if biased else 0)
    experts = _int(cfg, "num_local_experts")
    if experts:
        mlp = experts * mlp + h * experts
        notes.append(f"mixture of experts: {experts} experts per layer, all counted (not only the active ones)")
    elif any(k in cfg for k in ("num_experts", "n_routed_experts", "moe_intermediate_size")):
        notes.append("mixture-of-experts keys present but not modelled: the count covers a dense model only")
    norm = 2 * h if biased else h
    layer = attn + mlp + 2 * norm
    tie_default = mt not in UNTIED_DEFAULT
    tied = cfg.get("tie_word_embeddings", tie_default) is not False
    if "tie_word_embeddings" not in cfg:
        notes.append(f"tie_word_embeddings not given: {'tied' if tied else 'untied'} assumed for {mt or 'this model'}")
    offset = LEARNED_POSITIONS.get(mt)
    positions = ((_int(cfg, "max_position_embeddings") or 2048) + offset) * h if offset is not None else 0
    parts = {"embedding": vocab * h, "positions": positions, "layers": n * layer, "final_norm": norm,
             "lm_head": 0 if tied else vocab * h}
    layers = {"embedding": vocab * h, "mlp matrix": mlp_one + (inter if biased else 0), "attention query": q}
    name = max(layers, key=lambda k: layers[k])
    return ModelEstimate(sum(parts.values()), layers[name], name, h, mt or "decoder",
                         "decoder: embedding + layers (q/k/v/o attention with grouped KV heads, "
                         f"{'gated 3' if gated else '2'}-matrix MLP, 2 norms) + final norm + LM head unless tied",
                         notes, parts)


def estimate_hf(cfg: dict[str, Any]) -> ModelEstimate:
    """Estimate total parameters and the largest layer from a Hugging Face ``config.json`` dict.

    The largest layer is what DeepSpeed's ``estimate_zero3_model_states_mem_needs_all_live`` measures:
    the most parameters any single module holds directly, which in a transformer is the embedding
    (vocab_size * hidden_size) or one MLP matrix (hidden_size * intermediate_size), whichever is larger.
    """
    if not isinstance(cfg, dict):
        raise InputError("a model config must be a JSON object")
    notes: list[str] = []
    if not any(k in cfg for k in ("hidden_size", "d_model", "n_embd")) and isinstance(cfg.get("text_config"), dict):
        notes.append("multimodal config: the text model (text_config) only; vision towers are not counted")
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type"))}
    mt = str(cfg.get("model_type") or "")
    if mt in ("t5", "mt5", "umt5", "longt5") or ("d_ff" in cfg and "d_model" in cfg and "num_layers" in cfg):
        return _t5(cfg, notes)
    if mt == "gpt2" or ("n_embd" in cfg and "n_layer" in cfg and "hidden_size" not in cfg):
        return _gpt2(cfg, notes)
    return _decoder(cfg, notes)


def load_model_config(path: str) -> ModelEstimate:
    """Read ``config.json`` (strict JSON, as transformers does) and estimate it."""


    text = read_text(path, "model config")
    data = json_document(text, path)
    try:
        return estimate_hf(data)
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None


# -- this machine ---------------------------------------------------------------------------------------

def read_meminfo(path: str | None = None) -> dict[str, int]:
    """/proc/meminfo in bytes: MemTotal, MemAvailable, SwapTotal, SwapFree, ... (empty when unreadable)."""
    out: dict[str, int] = {}
    try:
        with open(path or MEMINFO, encoding="ascii", errors="replace") as fh:
            for line in fh:
                m = re.match(r"(\S+):\s+(\d+)(?:\s+kB)?", line)
                if m:
                    out[m.group(1)] = int(m.group(2)) * (1024 if line.rstrip().endswith("kB") else 1)
    except OSError:
        return {}
    return out


def fs_space(path: str) -> dict[str, int] | None:
    """Total and free (for unprivileged users) bytes of the file system holding ``path``."""
    cur = os.path.abspath(path)
    while not os.path.exists(cur) and cur != os.path.dirname(cur):
        cur = os.path.dirname(cur)
    try:
        st = os.statvfs(cur)
    except OSError:
        return None
    return {"total": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize, "measured_at": cur}


def gpu_memory_from(facts: dict[str, Any] | None) -> tuple[int | None, int | None, str]:
    """(smallest GPU's total memory in bytes, GPU count, where from) out of GPU probe facts of any usual shape."""
    if not isinstance(facts, dict):
        return None, None, "no GPU facts"
    gpus = facts.get("gpus") if isinstance(facts.get("gpus"), list) else facts.get("devices")
    if not isinstance(gpus, list):
        return None, None, "the GPU facts list no GPUs"
    totals = []
    for g in gpus:
        if not isinstance(g, dict):
            continue
        mem = g.get("memory")
        cands = [mem.get("total") if isinstance(mem, dict) else None, g.get("memory_total"), g.get("mem_total"),
                 g.get("total_memory")]
        val = next((c for c in cands if isinstance(c, int) and not isinstance(c, bool) and c > 0), None)
        if val is None and isinstance(g.get("memory_total_mib"), int | float):
            val = int(g["memory_total_mib"] * 2**20)
        if val is not None:
            totals.append(val)
    if not gpus:
        return None, 0, "the GPU probe found no GPUs"
    if not totals:
        return None, len(gpus), "the GPU facts give no memory size"
    return min(totals), len(gpus), "GPU probe"


@dataclass
class Machine:
    """What this node offers the offload (bytes; None when unknown)."""

    mem_total: int | None = None
    #: What the job can take: MemAvailable, or the room under its cgroup's limit where that is smaller.
    mem_available: int | None = None
    #: /proc/meminfo's MemAvailable itself, and which of the two ``mem_available`` is (meminfo | cgroup).
    mem_available_host: int | None = None
    mem_source: str | None = None
    #: The same in words: the number used and where it was read.
    mem_source_text: str = ""
    swap_free: int | None = None
    shm_total: int | None = None
    shm_free: int | None = None
    memlock_soft: int | None = -1  # None = unlimited, -1 = unknown
    gpu_memory: int | None = None
    gpu_count: int | None = None
    gpu_source: str = "no GPU facts"
    disk_path: str | None = None
    disk_free: int | None = None
    disk_total: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def this_machine(meminfo: str | None = None, shm: str = "/dev/shm", disk_path: str | None = None,
                 gpu_facts: dict[str, Any] | None = None, cgroup: dict[str, Any] | None = None) -> Machine:
    """Read this node's memory, /dev/shm, memlock limit, GPU memory (from GPU facts) and offload disk; the
    memory available is the job's: the room under its cgroup's limit (``cgroup``: the ``container`` probe's
    cgroup facts) where that is below MemAvailable."""

    info = read_meminfo(meminfo)
    room = headroom(info.get("MemAvailable"), cgroup)
    m = Machine(mem_total=info.get("MemTotal"), mem_available=room["bytes"],
                mem_available_host=info.get("MemAvailable"), mem_source=room["source"],
                mem_source_text=room["text"], swap_free=info.get("SwapFree"), memlock_soft=memlock_soft())
    space = fs_space(shm) if os.path.isdir(shm) else None
    if space:
        m.shm_total, m.shm_free = space["total"], space["free"]
    m.gpu_memory, m.gpu_count, m.gpu_source = gpu_memory_from(gpu_facts)
    if disk_path:
        m.disk_path = disk_path
        d = fs_space(disk_path)
        if d:
            m.disk_free, m.disk_total = d["free"], d["total"]
    return m


def gib(n: float | None) -> str:
    return "unknown" if n is None else f"{n / GIB:.2f} GiB"


#: What supplies each input a need can depend on, named when that input is missing.
SUPPLIERS = {
    "gpus_per_node": "--gpus-per-node (or the GPUs NVML lists on this node)",
    "largest_layer": "--model-config (the model's config.json gives its largest layer)",
    "params": "--model-params or --model-config",
}


def _row_needs(r: NeedRow, params: float, largest: float, gpn: int, nodes: int) -> tuple[int, int]:
    if r.stage == 3:
        cpu, gpu, _ = zero3_needs(params, largest, gpn, nodes, r.offload_optimizer == "cpu",
                                  r.offload_param == "cpu", bool(r.zero_init))
        return cpu, gpu
    return zero2_needs(params, gpn, nodes, r.offload_optimizer == "cpu")


def row_depends_on(r: NeedRow, params: float, largest: float, gpn: int, nodes: int) -> dict[str, set[str]]:
    """Which inputs (``gpus_per_node``, ``largest_layer``) the row's cpu and gpu figures depend on, found by
    re-evaluating DeepSpeed's formula with each input set to values across its whole range (one step is not
    enough: ``max(4 * gpus_per_node, 18)`` does not move from 1 to 2 GPUs, but does from 4 to 8)."""
    base = _row_needs(r, params, largest, gpn, nodes)
    out: dict[str, set[str]] = {"cpu": set(), "gpu": set()}
    trials = [("gpus_per_node", _row_needs(r, params, largest, g, nodes)) for g in (1, 2, 4, 8, 16, 64, 1024)
              if g != gpn]
    trials += [("largest_layer", _row_needs(r, params, x, gpn, nodes)) for x in (largest + 10**6, largest * 4 + 1)]
    for name, changed in trials:
        for i, side in enumerate(("cpu", "gpu")):
            if changed[i] != base[i]:
                out[side].add(name)
    return out


def fit_rows(rows: list[NeedRow], machine: Machine, *, missing: dict[str, str] | None = None,
             inputs: tuple[float, float, int, int] | None = None) -> list[dict[str, Any]]:
    """Each need row with the machine next to it: cpu/gpu fits (None when unknown) and the margin in bytes.

    ``missing`` names the inputs that were not given (``gpus_per_node``, ``largest_layer``) with what would
    supply them; ``inputs`` are (params, largest layer, GPUs per node, nodes) the rows were computed from.
    A figure that depends on a missing input is None (unknown), with ``cpu_unknown``/``gpu_unknown`` saying
    what would supply it; "fits" is only ever computed from real numbers.
    """
    missing = missing or {}
    out = []
    for r in rows:
        d = r.to_dict()
        deps = row_depends_on(r, *inputs) if inputs and missing else {"cpu": set(), "gpu": set()}
        avail, gpu = machine.mem_available, machine.gpu_memory
        cpu_miss = sorted(missing[k] for k in deps["cpu"] if k in missing)
        gpu_miss = sorted(missing[k] for k in deps["gpu"] if k in missing)
        if cpu_miss:
            d["cpu_bytes"] = None
        if gpu_miss:
            d["gpu_bytes"] = None
        if avail is None:
            cpu_miss.append("MemAvailable (/proc/meminfo could not be read)")
        if gpu is None:
            gpu_miss.append(f"GPU memory (NVML on the GPU node; here: {machine.gpu_source})")
        d["cpu_unknown"] = "; ".join(cpu_miss) or None
        d["gpu_unknown"] = "; ".join(gpu_miss) or None
        d["cpu_available"] = avail
        known_cpu = avail is not None and d["cpu_bytes"] is not None
        known_gpu = gpu is not None and d["gpu_bytes"] is not None
        d["cpu_fits"] = d["cpu_bytes"] <= avail if known_cpu else None
        d["cpu_margin"] = avail - d["cpu_bytes"] if known_cpu else None
        d["gpu_memory"] = gpu
        d["gpu_fits"] = d["gpu_bytes"] <= gpu if known_gpu else None
        d["gpu_margin"] = gpu - d["gpu_bytes"] if known_gpu else None
        out.append(d)
    return out


def fits(row: dict[str, Any]) -> bool:
    """The row fits this node on both sides, by real numbers (never from an unknown)."""
    return row.get("cpu_fits") is True and row.get("gpu_fits") is True


def at_least(n: float | None) -> str:
    """A need that is a floor (DeepSpeed's estimate leaves activations and buffers out): ``at least 4.10 GiB``
    (``unknown`` when not known)."""
    return "unknown" if n is None else f"at least {gib(n)}"


def verdict(fits: bool | None, margin: int | None) -> str:
    """How a floor of a need compares with what there is: ``fits (at most 12.30 GiB spare)`` / ``short by at
    least 4.10 GiB`` / ``unknown``."""
    if fits is None or margin is None:
        return "unknown"
    return f"fits (at most {gib(margin)} spare)" if fits else f"short by at least {gib(-margin)}"


def nvme_lower_bound(total_params: int, nodes: int, optimizer: bool, params: bool) -> int:
    """Bytes one node writes under nvme_path at least: fp32 master weights and Adam's two moments
    (12 bytes per parameter) for the optimizer, 16-bit parameters (2 bytes) for parameter offload;
    each node holds its share. DeepSpeed's estimator does not model NVMe; this floor ignores gradients
    and alignment padding."""
    per = (12 if optimizer else 0) + (2 if params else 0)
    return int(total_params * per / max(nodes, 1))
