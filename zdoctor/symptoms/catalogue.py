"""The catalogue of known failure messages, as data with sources, kept by node layer.

Each signature is a regular expression over one line of what the user saw (a command's output, a log, a
pasted message) -> the symptom kind the ledger matches findings on, the fields that kind is matched by
(the named groups), what the message means, which checks confirm it on a node, and what to read next.
Where no check of zdoctor can confirm it (``confirm`` empty), the ledger still names the likely cause,
marked "from the message only, not confirmed on this node".

Each node layer's entries live in its package, ``zdoctor/layers/<layer>/symptoms.toml`` (read as a data file
by path, never imported); the folder says the entry's layer. Order matters: the first signature that matches
a line names it, so the specific ones come first; :data:`ORDER` lists every entry of every layer in the order
they are tried. ``sources`` say where the message text comes from (the code that prints it, or its
documentation).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zdoctor.core.errors import InputError
from zdoctor.core.nodelayers import LAYERS
from zdoctor.core.resources import data_dir
from zdoctor.core.tomlfile import load_toml_file


@dataclass(frozen=True)
class Signature:
    """One known failure message."""

    id: str
    kind: str
    pattern: str
    #: The node layer whose package holds the entry (a key of :data:`zdoctor.core.nodelayers.LAYERS`).
    layer: str
    meaning: str
    read_next: str
    sources: tuple[str, ...]
    confirm: tuple[str, ...] = ()
    #: Fixed fields added to the named groups (``{"signal": "9"}`` for a "Killed" line).
    fields: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    #: The messages this one wraps (signature ids; :data:`ANY_ERROR` for any error of the same run): it is
    #: explained by what explains the inner message (DeepSpeed's op builder around torch's, a launcher's
    #: exit line around a rank's error).
    wraps: tuple[str, ...] = ()

    @property
    def regex(self) -> re.Pattern[str]:
        return _compiled(self.pattern)

    def search(self, line: str) -> re.Match[str] | None:
        """The match in ``line``'s head or tail (:func:`pieces`), or None: the only way a line is matched."""
        return next((m for m in (self.regex.search(p) for p in pieces(line)) if m is not None), None)


#: Only this much of a line's head (and as much of its tail) is matched: every pattern fails in time linear in
#: what it reads, and this bounds what it reads, whatever a log or a command prints on one line.
MATCH_LIMIT = 4096


def pieces(line: str) -> tuple[str, ...]:
    """What of ``line`` is matched: all of it, or its head and its tail (:data:`MATCH_LIMIT` each)."""
    return (line,) if len(line) <= MATCH_LIMIT else (line[:MATCH_LIMIT], line[-MATCH_LIMIT:])


#: In ``wraps``: any other error seen in the same place (the launcher's line around whatever a rank raised).
ANY_ERROR = "*"

_CACHE: dict[str, re.Pattern[str]] = {}


def _compiled(pattern: str) -> re.Pattern[str]:
    found = _CACHE.get(pattern)
    if found is None:
        found = _CACHE[pattern] = re.compile(pattern)
    return found


#: The file of a node layer's package that holds the layer's known messages.
LAYER_FILE = "symptoms.toml"

#: Every entry of every layer, in the order they are tried on a line (the first match names it).
ORDER: tuple[str, ...] = (
    # -- InfiniBand's user space first: the loader's generic "cannot open shared object file" would take
    # libibverbs' own warning
    "nccl.ibverbs-not-loaded",
    "nccl.ib-open-device",
    "nccl.ib-no-device",
    "libibverbs.driver-not-loaded",
    "libibverbs.no-provider",
    # -- the loader: the libstdc++ and glibc versions before any other version line
    "loader.glibcxx-version",
    "loader.glibc-version",
    "loader.version-not-found",
    "loader.undefined-nccl-symbol",
    "loader.undefined-symbol",
    # -- CUDA library lookup before the loader's and the linker's generic lines
    "link.cannot-find-lcuda",
    "loader.cannot-open-cuda",
    "cuda.stub-library",
    "loader.cannot-open",
    "link.undefined-reference",
    "link.cannot-find-lib",
    # -- the build
    "build.compiler-pass-missing",
    "build.missing-header",
    "build.ninja-required",
    "deepspeed.jit-ninja",
    "build.no-space",
    "build.extension-failed",
    "torch.cuda-mismatch",
    "deepspeed.cuda-mismatch",
    "deepspeed.async-io-libaio",
    "deepspeed.cpuadam-attr",
    "deepspeed.no-launcher",
    "deepspeed.no-slot",
    "python.no-mpi4py",
    "deepspeed.assertion-batch",
    # -- CUDA and the driver
    "cuda.driver-too-old",
    "cuda.init-error",
    "cuda.driver-insufficient",
    # -- the driver's parts: CUDA start errors without their number, Fabric Manager
    "cuda.compat-not-supported",
    "cuda.system-not-ready",
    "cuda.system-driver-mismatch",
    "fabricmanager.version-mismatch",
    "driver.module-not-found",
    "driver.smi-no-driver",
    "driver.cuda-unknown-error",
    "cuda.no-kernel-image",
    "cuda.oom",
    "cuda.bf16-unsupported",
    "deepspeed.fp16-unsupported",
    "cuda.error",
    "nvcc.unsupported-arch",
    "ninja.log-version",
    "triton.no-libcuda",
    "nvml.version-mismatch",
    "kernel.api-mismatch",
    "kernel.xid",
    "kernel.oom-memcg",
    "kernel.memcg-oom",
    "kernel.oom",
    # -- NCCL and the network
    "nccl.no-socket-interface",
    "nccl.ib-completion",
    "nccl.watchdog-timeout",
    # -- NCCL's network: sockets and routes
    "nccl.no-subnet-interface",
    "nccl.connect-failed",
    "c10d.collective-mismatch",
    # -- the C++ runtime ending the process
    "cxx.terminate-no-exception",
    "cxx.terminate-uncaught",
    # -- locked memory for RDMA (before NCCL's generic WARN line)
    "nccl.ibv-reg-mr-enomem",
    "rdma.ibv-reg-mr-enomem",
    "libibverbs.rlimit-memlock",
    "nccl.warn",
    "ssh.resolve",
    # -- the launch
    "deepspeed.rank-exit",
    "launcher.called-process-error",
    "torchrun.child-failed",
    "deepspeed.ssh-unreachable",
    "c10d.port-in-use",
    "c10d.port-in-use-bind",
    "ssh.connect",
    "c10d.client-connect",
    "deepspeed.launcher-missing",
    "ssh.permission-denied",
    "ssh.host-key-changed",
    "ssh.host-key-verification",
    "deepspeed.num-with-include",
    # -- processes and resources
    "resource.too-many-open-files",
    "resource.shm-denied",
    "resource.shm-bus-error",
    "process.killed",
    # -- the container and its cgroup limits
    "kernel.memcg-task-limit",
    "container.oomkilled",
    "container.exit-137",
    "slurm.oom-kill-events",
    "slurm.task-out-of-memory",
    "offload.swap-buffer-size",
    "offload.swap-buffer-count",
    "python.ancdata",
    "python.cant-start-thread",
    "process.fork-eagain",
    "openmp.thread-creation",
    "openblas.pthread-create",
    # -- the kernel log: PCIe AER
    "kernel.aer-bus-error",
    "kernel.aer-received",
    "deepspeed.bug-user-args-resplit",
    "deepspeed.bug-pdsh-ssh-port",
    "deepspeed.bug-openmpi-env-check",
    "deepspeed.bug-pdsh-export-unquoted",
)

_REQUIRED = ("id", "kind", "pattern", "meaning", "read_next", "sources")
_OPTIONAL = ("confirm", "fields", "wraps")


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: not a non-empty string")
    return value


def _texts(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise InputError(f"{where}: not a list of strings")
    return tuple(_text(v, where) for v in value)


def entry_of(layer: str, raw: Any, where: str) -> Signature:
    """The signature one ``[[signature]]`` table of ``layer``'s file describes; a missing, unknown or
    mistyped key is an :class:`InputError` naming ``where``."""
    if not isinstance(raw, dict):
        raise InputError(f"{where}: a [[signature]] entry is not a table")
    at = f"{where}: entry {raw.get('id')!r}"
    missing = [k for k in _REQUIRED if k not in raw]
    unknown = sorted(k for k in raw if k not in _REQUIRED + _OPTIONAL)
    if missing or unknown:
        wrong = [f"lacks {', '.join(missing)}"] if missing else []
        raise InputError(f"{at}: " + "; ".join(wrong + ([f"unknown {', '.join(unknown)}"] if unknown else [])))
    fields = raw.get("fields", {})
    if not isinstance(fields, dict):
        raise InputError(f"{at}: fields is not a table")
    try:
        re.compile(raw["pattern"])
    except (re.error, TypeError) as exc:
        raise InputError(f"{at}: the pattern does not compile: {exc}") from None
    return Signature(
        id=_text(raw["id"], at), kind=_text(raw["kind"], f"{at} kind"), pattern=_text(raw["pattern"], f"{at} pattern"),
        layer=layer, meaning=_text(raw["meaning"], f"{at} meaning"),
        read_next=_text(raw["read_next"], f"{at} read_next"), sources=_texts(raw["sources"], f"{at} sources"),
        confirm=_texts(raw.get("confirm", []), f"{at} confirm"),
        fields=tuple((str(k), _text(v, f"{at} fields.{k}")) for k, v in fields.items()),
        wraps=_texts(raw.get("wraps", []), f"{at} wraps"))


def load_catalogue(root: Path | None = None, order: tuple[str, ...] = ORDER) -> tuple[Signature, ...]:
    """Every layer's entries (``root``: the folder of the layers' packages, zdoctor's own by default), in
    ``order``; an entry in two files, one ``order`` does not list or an ``order`` id no file holds is an
    :class:`InputError`."""
    root = data_dir("layers") if root is None else root
    found: dict[str, Signature] = {}
    for layer in LAYERS:
        path = root / layer.package / LAYER_FILE
        if not path.is_file():
            continue
        table = load_toml_file(path)
        entries = table.get("signature", [])
        if set(table) - {"signature"} or not isinstance(entries, list):
            raise InputError(f"{path}: may hold only [[signature]] entries")
        for raw in entries:
            sig = entry_of(layer.id, raw, str(path))
            if sig.id in found:
                raise InputError(f"{path}: entry {sig.id!r} is also in the layer {found[sig.id].layer}")
            found[sig.id] = sig
    listed = set(order)
    problems = ([f"{i} is listed twice" for i in sorted(listed) if order.count(i) > 1]
                + [f"{i} is in no layer's {LAYER_FILE}" for i in order if i not in found]
                + [f"{i} ({found[i].layer}) is not in ORDER" for i in found if i not in listed])
    if problems:
        raise InputError("the symptom catalogue's ORDER does not match the layers' entries: " + "; ".join(problems))
    return tuple(found[i] for i in order)


#: Every layer's entries in ``ORDER``, and the same by id: read from the layers' files on first use, not at
#: import (their TOML and patterns take 25 ms, before a guide's first screen too): see :func:`__getattr__`.
SIGNATURES: tuple[Signature, ...]
BY_ID: dict[str, Signature]
_LOADING = threading.Lock()


def _loaded() -> dict[str, Any]:
    """This module's globals, with ``SIGNATURES`` and ``BY_ID`` read once (thread-safe)."""
    here = globals()
    if "BY_ID" not in here:
        with _LOADING:
            if "BY_ID" not in here:
                signatures = load_catalogue()
                here["SIGNATURES"] = signatures
                here["BY_ID"] = {s.id: s for s in signatures}  # last: its presence says both are read
    return here


def __getattr__(name: str) -> Any:
    if name in ("SIGNATURES", "BY_ID"):
        return _loaded()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def signature(sid: str | None) -> Signature | None:
    """The signature called ``sid``, or None."""
    return _loaded()["BY_ID"].get(sid) if sid else None
