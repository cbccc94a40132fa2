"""The facts every node of a job should share, read from each node's snapshot, and where they differ."""

from __future__ import annotations

import typing
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Probes = typing.Mapping[str, typing.Mapping[str, Any]]
#: Shown for a fact a node's snapshot does not have (probe skipped, nothing installed, no GPU).
MISSING = "(none)"


def _get(probes: Probes, probe: str, *path: str) -> Any:
    cur: Any = probes.get(probe) or {}
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def _size(n: Any) -> str | None:
    if not isinstance(n, (int, float)) or isinstance(n, bool):
        return None
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def _libstdcxx(p: Probes) -> str | None:
    lib = _get(p, "libs", "libstdcxx")
    if not isinstance(lib, Mapping) or not (lib.get("realpath") or lib.get("path")):
        return None
    newest = lib.get("glibcxx_max")
    return f"{lib.get('realpath') or lib.get('path')}" + (f" ({newest})" if newest else "")


def _nccl_library(p: Probes) -> str | None:
    loaded = _get(p, "nccl", "loaded")
    if isinstance(loaded, list) and loaded:
        return ", ".join(sorted(str(x) for x in loaded))
    providers = _get(p, "nccl", "providers")
    if isinstance(providers, list) and providers:
        return ", ".join(sorted(str(x.get("realpath") or x.get("path")) for x in providers
                                if isinstance(x, Mapping)))
    return None


def _ds_ops(p: Probes) -> str | None:
    ops: set[str] = set()
    for name in _get(p, "pyenv", "deepspeed", "prebuilt_ops") or []:
        ops.add(f"{name} (prebuilt)")
    for op in _get(p, "jitcache", "ops") or []:
        if isinstance(op, Mapping) and op.get("so_path") and op.get("in_use") is not False:
            ops.add(f"{op.get('name')} ({op.get('tag') or 'JIT'})")
    return ", ".join(sorted(ops)) or None


def _memlock(p: Probes) -> str | None:
    for side in ("target", "own"):
        soft = _get(p, "host_limits", side, "memlock_soft_kb")
        if soft is not None:
            return "unlimited" if soft in ("unlimited", -1) else f"{soft} KiB"
    return None


def _gpu_models(p: Probes) -> str | None:
    gpus = _get(p, "nvml", "gpus")
    names = Counter(str(g.get("name")) for g in gpus or [] if isinstance(g, Mapping) and g.get("name"))
    return ", ".join(f"{n} x {name}" for name, n in sorted(names.items())) or None


def _nccl_chosen(p: Probes) -> Mapping[str, Any] | None:
    chosen = _get(p, "nccl_net", "choice", "chosen")
    return chosen[0] if isinstance(chosen, list) and chosen and isinstance(chosen[0], Mapping) else None


def _nccl_interface(p: Probes) -> str | None:
    c = _nccl_chosen(p)
    return str(c.get("ifname")) if c else None


def _nccl_address(p: Probes) -> str | None:
    c = _nccl_chosen(p)
    return f"{c.get('address')}/{c.get('prefixlen')}" if c else None


def _nccl_mtu(p: Probes) -> str | None:
    name = _nccl_interface(p)
    for iface in _get(p, "nccl_net", "interfaces") or []:
        if isinstance(iface, Mapping) and iface.get("ifname") == name:
            return _text(iface.get("mtu"))
    return None


def _nccl_env(p: Probes) -> str | None:
    env = _get(p, "nccl_net", "env")
    if not isinstance(env, Mapping):
        return None
    return " ".join(f"{k}={v}" for k, v in sorted(env.items()) if str(k).startswith("NCCL_")) or "(none set)"


def _ib_ports(p: Probes) -> str | None:
    if _get(p, "infiniband", "present") is False:
        return "(no InfiniBand device)"
    ports = [f"{d.get('name')}:{q.get('port')} {q.get('link_layer')} {q.get('state')} {q.get('rate')}"
             for d in _get(p, "infiniband", "devices") or [] if isinstance(d, Mapping)
             for q in d.get("ports") or [] if isinstance(q, Mapping)]
    return ", ".join(ports) or None


def _text(value: Any) -> str | None:
    return None if value in (None, "", [], {}) else str(value)


@dataclass(frozen=True)
class SkewFact:
    """A fact that should be the same on every node, and how to read it from a snapshot's probe facts."""

    id: str
    title: str
    read: Callable[[Probes], str | None]
    why: str
    #: False for a fact that is shown per node but differs by nature (each node's own address).
    judged: bool = True


FACTS: tuple[SkewFact, ...] = (
    SkewFact("driver", "NVIDIA driver", lambda p: _text(_get(p, "nvml", "driver")),
             "NCCL and the CUDA runtime behave differently across driver branches; a job mixes them at its risk"),
    SkewFact("cuda-driver", "CUDA the driver supports", lambda p: _text(_get(p, "nvml", "cuda_driver_version")),
             "a runtime newer than one node's driver fails there alone"),
    SkewFact("cuda-runtime", "torch's CUDA runtime", lambda p: _text(_get(p, "pyenv", "torch", "cuda")),
             "ranks built against different CUDA runtimes can disagree on collectives"),
    SkewFact("torch", "torch", lambda p: _text(_get(p, "pyenv", "torch", "version")),
             "every rank must run the same torch: tensors and collectives are exchanged in its formats"),
    SkewFact("nccl", "NCCL version", lambda p: _text(_get(p, "nccl", "torch_nccl")),
             "ranks with different NCCL versions can hang in the first collective"),
    SkewFact("nccl-library", "libnccl loaded", _nccl_library,
             "a second libnccl on one node's path changes the version that node really runs"),
    SkewFact("deepspeed", "DeepSpeed", lambda p: _text(_get(p, "pyenv", "deepspeed", "version")),
             "ZeRO-3 partitions parameters the same way only when every rank runs the same DeepSpeed"),
    SkewFact("deepspeed-ops", "DeepSpeed ops built", _ds_ops,
             "a node missing a built op compiles it at launch (slow, and it can fail or hang there)"),
    SkewFact("libstdcxx", "libstdc++ that resolves", _libstdcxx,
             "an older libstdc++ on one node makes extensions fail to import there only"),
    SkewFact("ld-library-path", "LD_LIBRARY_PATH", lambda p: _text(_get(p, "libs", "env", "LD_LIBRARY_PATH")),
             "an entry only one node has (a conda lib dir) changes which libraries that node loads"),
    SkewFact("ld-preload", "LD_PRELOAD", lambda p: _text(_get(p, "libs", "env", "LD_PRELOAD")),
             "a library preloaded on one node only replaces symbols there"),
    SkewFact("python", "Python", lambda p: _text(_get(p, "pyenv", "python", "version_info")
                                                   and ".".join(map(str, _get(p, "pyenv", "python", "version_info")))),
             "extensions and JIT-built ops are built per Python version"),
    SkewFact("glibc", "glibc", lambda p: _text(_get(p, "system", "glibc")),
             "binaries built on a newer glibc do not load on an older one"),
    SkewFact("shm", "/dev/shm size", lambda p: _size(_get(p, "host_limits", "shm", "total")),
             "NCCL's shared-memory transport and the data loaders need it; a small one fails on one node"),
    SkewFact("memlock", "memlock limit", _memlock,
             "pinned CPU buffers for offload need locked memory; a low limit fails or slows that node"),
    SkewFact("gpu-count", "GPUs visible", lambda p: _text(_get(p, "nvml", "count")),
             "the launcher starts one rank per slot; a node with fewer GPUs fails or oversubscribes"),
    SkewFact("gpu-model", "GPU model", _gpu_models,
             "mixed GPU models run at the slowest one's pace and may need different kernels"),
    SkewFact("nccl-interface", "NCCL interface", _nccl_interface,
             "ranks that bootstrap on differently named interfaces are often on different networks"),
    SkewFact("nccl-address", "NCCL address", _nccl_address,
             "each node's own address (shown, not compared): the fleet's reach check routes every node to it",
             judged=False),
    SkewFact("nccl-mtu", "MTU of NCCL's interface", _nccl_mtu,
             "a smaller MTU on one node drops or fragments the others' large frames (RoCE stalls)"),
    SkewFact("nccl-env", "NCCL variables", _nccl_env,
             "a node without the job's NCCL_SOCKET_IFNAME / NCCL_IB_* picks another interface or GID than the rest"),
    SkewFact("ib-ports", "InfiniBand / RoCE ports", _ib_ports,
             "a node whose port is down or of another link layer or rate falls back to sockets or slows every "
             "collective"),
)


@dataclass
class SkewRow:
    """One fact across the nodes: each node's value, the majority value, and the nodes that differ."""

    fact: SkewFact
    values: dict[str, str]
    majority: str | None = None
    differing: list[str] = field(default_factory=list)
    tie: bool = False

    @property
    def differs(self) -> bool:
        return self.fact.judged and bool(self.differing)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.fact.id, "title": self.fact.title, "majority": self.majority, "tie": self.tie,
                "differing": self.differing, "values": self.values, "why": self.fact.why,
                "judged": self.fact.judged}


def majority(values: Mapping[str, str], order: Sequence[str]) -> tuple[str | None, list[str], bool]:
    """The most common value (ties go to the value seen first in ``order``), the nodes that differ, and
    whether it was a tie."""
    if not values:
        return None, [], False
    counts = Counter(values.values())
    top = max(counts.values())
    leaders = [v for v in dict.fromkeys(values[h] for h in order if h in values) if counts[v] == top]
    best = leaders[0]
    return best, [h for h in order if h in values and values[h] != best], len(leaders) > 1


def read_facts(probes: Probes) -> dict[str, str]:
    """Every skew fact of one node's snapshot, as display text (:data:`MISSING` when absent)."""
    out: dict[str, str] = {}
    for fact in FACTS:
        try:
            value = fact.read(probes)
        except (TypeError, ValueError, AttributeError):
            value = None
        out[fact.id] = value if value is not None else MISSING
    return out


def skew_table(per_node: Mapping[str, Mapping[str, str]], order: Sequence[str]) -> list[SkewRow]:
    """One :class:`SkewRow` per fact over the nodes that gave a snapshot, in ``order``."""
    rows = []
    for fact in FACTS:
        values = {h: per_node[h][fact.id] for h in order if h in per_node}
        best, differing, tie = majority(values, order) if fact.judged else (None, [], False)
        rows.append(SkewRow(fact, values, best, differing, tie))
    return rows
