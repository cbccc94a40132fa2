"""The layers of a node zdoctor examines, and whether a run examined each one.

A check names its layer (``@check(..., layer="kernel-log")``). After a run, a layer is *examined* when at
least one of its checks looked (a finding other than its ``not-checked``), and *not examined* otherwise,
with each check's own reason; a layer some of whose checks could not look lists those parts. A layer no
check of this build belongs to is not examined either, and says so: a report never goes silent over one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping


@dataclass(frozen=True)
class Layer:
    id: str
    title: str
    #: What it reads, in a few words (the README's failure classes say more).
    reads: str

    @property
    def package(self) -> str:
        """The folder of its package under ``zdoctor/layers/`` (``kernel-log``: ``kernel_log``)."""
        return self.id.replace("-", "_")


#: Every layer, in the order reports list them.
LAYERS: tuple[Layer, ...] = (
    Layer("libraries", "Shared libraries", "what the training process loads and the versions it needs"),
    Layer("toolchain", "Compilers and the JIT build", "gcc, nvcc, ninja and Python.h as the ops' build uses them"),
    Layer("jit-build-log", "The JIT cache's build log", "each op's .ninja_log and build.ninja against the ninja "
          "and the environment the next launch uses"),
    Layer("python-env", "The training environment", "the interpreter, torch, DeepSpeed and its release rules"),
    Layer("kernel-log", "The kernel log", "NVIDIA Xid and NVRM records, PCIe AER errors, OOM-killer records"),
    Layer("driver-parts", "The driver's parts", "the loaded kernel module (and one for the running kernel), "
          "nvidia_uvm after a resume, the user-space libraries, the package record, Fabric Manager, libcuda.so.1"),
    Layer("gpu", "GPUs", "NVML: each GPU's state, PCIe link, memory, ECC and health"),
    Layer("cuda-lookup", "CUDA library lookup", "libcuda in the loader's cache, the toolkit's stubs, the CUDA "
          "sonames each extension needs"),
    Layer("gpu-capability", "The GPUs' capabilities against the job", "compute capability against the ds_config's "
          "precision and the arch list the ops are built for"),
    Layer("container", "The container and its limits", "the container runtime, the job's cgroup memory and pids "
          "limits, /dev/shm"),
    Layer("offload", "Offload capacity and storage", "the ds_config, host RAM and the offload disk"),
    Layer("nccl-network", "NCCL's network", "interfaces, routes, InfiniBand ports and the verbs library and "
          "device files they need, against the NCCL variables and the other nodes' addresses"),
    Layer("launch", "The launch", "the launcher and the environment each rank needs, the hostfile"),
    Layer("ranks", "A hung job's ranks", "each rank's state, wait channel and stack"),
    Layer("rank-cores", "Ranks and cores", "NUMA nodes, each rank's CPU affinity and thread count"),
)

BY_ID: dict[str, Layer] = {layer.id: layer for layer in LAYERS}

#: The layer of a check that names none, by the family of its name (``libs.glibcxx`` -> ``libraries``).
BY_FAMILY: dict[str, str] = {
    "libs": "libraries", "toolchain": "toolchain", "jit": "toolchain", "pyenv": "python-env", "gpu": "gpu",
    "offload": "offload", "storage": "offload",
}


def layer_of(check_name: str, declared: str = "") -> str:
    """The layer a check examines: the one it declares, else its family's (see :data:`BY_FAMILY`), else ""."""
    if declared:
        if declared not in BY_ID:
            raise ValueError(f"check {check_name!r} names unknown layer {declared!r} "
                             "(see zdoctor.core.nodelayers.LAYERS)")
        return declared
    return BY_FAMILY.get(check_name.split(".", 1)[0], "")


def layer_status(check_layers: Mapping[str, str], findings: Iterable[Any],
                 owner: Callable[[str], str | None]) -> list[dict[str, Any]]:
    """``[{id, title, status, checks, not_examined: [{check, why}], why}]`` for every layer, from each check's
    layer (``check name -> layer id``), the run's findings (objects with ``id``, ``status`` and ``title``,
    ``detail``) and ``owner(finding id) -> check name``.

    A check looked when it gave a finding that is not ``skip``; one that gave only ``skip`` findings did not,
    and their text is why; one that gave nothing gave no verdict, and is not counted as a look. ``status`` is
    ``examined`` (every check looked), ``partly examined`` (some did) or ``not examined`` (none did)."""
    by_check: dict[str, list[Any]] = {name: [] for name in check_layers}
    for f in findings:
        name = owner(f.id)
        if name in by_check:
            by_check[name].append(f)
    out: list[dict[str, Any]] = []
    for layer in LAYERS:
        names = sorted(n for n, lid in check_layers.items() if lid == layer.id)
        looked: list[str] = []
        missed: list[dict[str, str]] = []
        for name in names:
            got = by_check.get(name, [])
            if any(f.status != "skip" for f in got):
                looked.append(name)
            elif got:
                missed.append({"check": name, "why": _why(got[0])})
            else:
                missed.append({"check": name, "why": "it gave no verdict in this run"})
        if not names:
            status, why = "not examined", "no check of this zdoctor reads this layer"
        elif not looked:
            status, why = "not examined", "; ".join(f"{m['check']}: {m['why']}" for m in missed)
        else:
            status = "partly examined" if missed else "examined"
            why = "; ".join(f"{m['check']}: {m['why']}" for m in missed)
        out.append({"id": layer.id, "title": layer.title, "status": status, "checks": looked,
                    "not_examined": missed, "why": why})
    return out


def _why(finding: Any) -> str:
    """A skipped finding's reason in one line: its detail's first sentence, else its title."""
    text = " ".join((getattr(finding, "detail", "") or "").split())
    if text:
        end = text.find(". ")
        return (text[: end + 1] if 0 < end < 300 else text[:300]).rstrip()
    return " ".join((getattr(finding, "title", "") or "").split())
