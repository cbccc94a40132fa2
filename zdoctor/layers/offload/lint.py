"""DeepSpeed's config fields and defaults, and the lints zdoctor runs over a ds_config.

The field lists come from the installed DeepSpeed's own source, read with :mod:`ast` (never imported:
importing DeepSpeed can start a JIT build): ``runtime/zero/config.py`` (``DeepSpeedZeroConfig``),
``runtime/zero/offload_config.py`` (the two offload models) and ``runtime/swap_tensor/constants.py``
(the ``aio`` block). The pydantic models forbid unknown keys (``extra="forbid"``); the ``aio`` block is
a plain dict read key by key, so unknown keys there are silently ignored. Without DeepSpeed the static
copy below (DeepSpeed 0.19.8) stands in, adjusted for the version when it is known.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import os
import re
import stat
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from zdoctor.layers.offload.dsconfig import DsConfig
from zdoctor.layers.offload.hjsonreader import KeyPath, dotted
from zdoctor.proc.userfile import open_regular_text
from zdoctor.readers.mounts import fs_category, mount_of

STATIC_VERSION = "0.19.8"
#: Bucket sizes further than this factor from the HF Trainer's rule are flagged.
FAR_FACTOR = 10.0

ZERO_MODEL = "DeepSpeedZeroConfig"
PARAM_MODEL = "DeepSpeedZeroOffloadParamConfig"
OPTIMIZER_MODEL = "DeepSpeedZeroOffloadOptimizerConfig"
_SOURCES = {ZERO_MODEL: "runtime/zero/config.py", PARAM_MODEL: "runtime/zero/offload_config.py",
            OPTIMIZER_MODEL: "runtime/zero/offload_config.py"}
AIO_SOURCE = "runtime/swap_tensor/constants.py"


@dataclass(frozen=True)
class FieldSpec:
    """One config field: its name, the alias DeepSpeed also accepts, default, kind and deprecation."""

    name: str
    alias: str | None = None
    default: Any = None
    kind: str = "other"  # bool | int | float | path | device | stage | model | other
    optional: bool = False
    deprecated: bool = False

    def accepted(self) -> tuple[str, ...]:
        return (self.name, self.alias) if self.alias else (self.name,)


@dataclass
class FieldTables:
    """The fields of zero_optimization, offload_param, offload_optimizer and aio, and where they came from."""

    zero: dict[str, FieldSpec]
    offload_param: dict[str, FieldSpec]
    offload_optimizer: dict[str, FieldSpec]
    aio: dict[str, Any]
    source: str
    version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "version": self.version,
                "zero": {k: asdict(v) for k, v in self.zero.items()},
                "offload_param": {k: asdict(v) for k, v in self.offload_param.items()},
                "offload_optimizer": {k: asdict(v) for k, v in self.offload_optimizer.items()},
                "aio": dict(self.aio)}


# -- reading the installed DeepSpeed's source -----------------------------------------------------------

class _Unknown(Exception):
    pass


def _value(node: ast.AST) -> Any:
    """A default written in DeepSpeed's source: literals, ``pp_int(5e8)``, ``sys.maxsize``, negatives."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
            (node.value.id, node.attr) == ("sys", "maxsize"):
        return sys.maxsize
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "pp_int" and node.args:
        return int(_value(node.args[0]))
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id.endswith("Enum"):
        return node.attr
    raise _Unknown(ast.dump(node)[:80])


def _annotation_text(node: ast.AST) -> str:
    """Source text of a type annotation, as ``ast.unparse`` writes it (which Python 3.8 lacks)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_annotation_text(node.value)}.{node.attr}"
    if isinstance(node, ast.Constant):
        return repr(node.value) if isinstance(node.value, str) else str(node.value)
    if isinstance(node, ast.Subscript):
        inner = getattr(node.slice, "value", node.slice) if type(node.slice).__name__ == "Index" else node.slice
        return f"{_annotation_text(node.value)}[{_annotation_text(inner)}]"
    if isinstance(node, ast.Tuple):
        return ", ".join(_annotation_text(e) for e in node.elts)
    if isinstance(node, ast.List):
        return "[" + ", ".join(_annotation_text(e) for e in node.elts) + "]"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return f"{_annotation_text(node.left)} | {_annotation_text(node.right)}"
    return type(node).__name__


def _kind(annotation: ast.AST) -> tuple[str, bool]:
    text = _annotation_text(annotation)
    optional = text.startswith("Optional[") or "None" in text
    inner = re.sub(r"^Optional\[(.*)\]$", r"\1", text)
    kinds = {"bool": "bool", "int": "int", "float": "float", "Path": "path", "str": "other",
             "OffloadDeviceEnum": "device", "ZeroStageEnum": "stage"}
    if inner in kinds:
        return kinds[inner], optional
    return ("model" if inner.endswith("Config") else "other"), optional


def _field(stmt: ast.AnnAssign) -> FieldSpec | None:
    if not isinstance(stmt.target, ast.Name):
        return None
    name = stmt.target.id
    if name.startswith("_") or name == "model_config":
        return None
    kind, optional = _kind(stmt.annotation)
    alias, deprecated, default = None, False, None
    node = stmt.value
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)) and \
            (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) == "Field":
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if "alias" in kw and isinstance(kw["alias"], ast.Constant):
            alias = kw["alias"].value
        if isinstance(kw.get("deprecated"), ast.Constant) and kw["deprecated"].value is True:
            deprecated = True
        extra = kw.get("json_schema_extra")
        if isinstance(extra, ast.Dict):
            for k, v in zip(extra.keys, extra.values):
                if isinstance(k, ast.Constant) and k.value == "deprecated" and isinstance(v, ast.Constant):
                    deprecated = bool(v.value)
        src = node.args[0] if node.args else kw.get("default")
        if src is None:
            default = "<factory>" if "default_factory" in kw else None
        else:
            try:
                default = _value(src)
            except _Unknown:
                default = "<computed>"
    elif node is not None:
        try:
            default = _value(node)
        except _Unknown:
            default = "<computed>"
    return FieldSpec(name=name, alias=alias, default=default, kind=kind, optional=optional, deprecated=deprecated)


def _classes(path: str) -> dict[str, dict[str, FieldSpec]]:
    with open_regular_text(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), filename=path)
    out: dict[str, dict[str, FieldSpec]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            fields = [f for f in (_field(s) for s in node.body if isinstance(s, ast.AnnAssign)) if f]
            out[node.name] = {f.name: f for f in fields}
    return out


def _aio(path: str) -> dict[str, Any]:
    with open_regular_text(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), filename=path)
    consts: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            with contextlib.suppress(_Unknown):
                consts[node.targets[0].id] = _value(node.value)
    out = {}
    for name, key in consts.items():
        if name.startswith("AIO_") and not name.endswith("_DEFAULT") and isinstance(key, str) \
                and f"{name}_DEFAULT" in consts:
            out[key] = consts[f"{name}_DEFAULT"]
    return out


def fields_from_source(ds_dir: str, version: str | None = None) -> FieldTables:
    """The field tables of the DeepSpeed package in ``ds_dir`` (its ``deepspeed/`` directory).

    Raises OSError or SyntaxError when the files are missing or unreadable, ValueError when a model
    is not where it should be.
    """
    models: dict[str, dict[str, FieldSpec]] = {}
    for rel in sorted(set(_SOURCES.values())):
        models.update(_classes(os.path.join(ds_dir, rel)))
    for cls in _SOURCES:
        if not models.get(cls):
            raise ValueError(f"{cls} not found in {ds_dir}")
    aio = _aio(os.path.join(ds_dir, AIO_SOURCE))
    if not aio:
        raise ValueError(f"no aio constants in {ds_dir}")
    return FieldTables(zero=models[ZERO_MODEL], offload_param=models[PARAM_MODEL],
                       offload_optimizer=models[OPTIMIZER_MODEL], aio=aio,
                       source=f"installed DeepSpeed source ({ds_dir})", version=version)


def _f(name: str, default: Any, kind: str, alias: str | None = None, optional: bool = False,
       deprecated: bool = False) -> tuple[str, FieldSpec]:
    return name, FieldSpec(name, alias, default, kind, optional, deprecated)


#: DeepSpeed 0.19.8's fields, as :func:`fields_from_source` reads them (a test keeps the two equal).
STATIC_ZERO = dict([
    _f("stage", 0, "stage"), _f("contiguous_gradients", True, "bool"), _f("reduce_scatter", True, "bool"),
    _f("reduce_bucket_size", 500000000, "int"), _f("use_multi_rank_bucket_allreduce", True, "bool"),
    _f("allgather_partitions", True, "bool"), _f("allgather_bucket_size", 500000000, "int"),
    _f("overlap_comm", None, "bool", optional=True), _f("compute_grad_norm", True, "bool"),
    _f("load_from_fp32_weights", True, "bool"), _f("elastic_checkpoint", False, "bool"),
    _f("offload_param", None, "model", optional=True), _f("offload_optimizer", None, "model", optional=True),
    _f("zenflow", None, "model", optional=True), _f("sub_group_size", 1000000000, "int"),
    _f("cpu_offload_param", None, "bool", optional=True, deprecated=True),
    _f("cpu_offload_use_pin_memory", None, "bool", optional=True, deprecated=True),
    _f("cpu_offload", None, "bool", optional=True, deprecated=True),
    _f("prefetch_bucket_size", 50000000, "int", alias="stage3_prefetch_bucket_size"),
    _f("param_persistence_threshold", 100000, "int", alias="stage3_param_persistence_threshold"),
    _f("model_persistence_threshold", sys.maxsize, "int", alias="stage3_model_persistence_threshold"),
    _f("max_live_parameters", 1000000000, "int", alias="stage3_max_live_parameters"),
    _f("max_reuse_distance", 1000000000, "int", alias="stage3_max_reuse_distance"),
    _f("gather_16bit_weights_on_model_save", False, "bool", alias="stage3_gather_16bit_weights_on_model_save"),
    _f("module_granularity_threshold", 0, "int", alias="stage3_module_granularity_threshold"),
    _f("use_all_reduce_for_fetch_params", False, "bool", alias="stage3_use_all_reduce_for_fetch_params"),
    _f("allgather_sequential", False, "bool", alias="stage3_allgather_sequential"),
    _f("stage3_gather_fp16_weights_on_model_save", False, "bool", deprecated=True),
    _f("ignore_unused_parameters", True, "bool"), _f("legacy_stage1", False, "bool"),
    _f("round_robin_gradients", False, "bool"), _f("parameter_alignment", False, "bool"),
    _f("zero_hpz_partition_size", 1, "int"), _f("zero_quantized_weights", False, "bool"),
    _f("zero_quantized_nontrainable_weights", False, "bool"), _f("zero_quantized_gradients", False, "bool"),
    _f("memory_efficient_linear", True, "bool"), _f("pipeline_loading_checkpoint", False, "bool"),
    _f("override_module_apply", True, "bool"), _f("log_trace_cache_warnings", False, "bool"),
    _f("enable_sanity_checks", False, "bool"), _f("save_muon_momentum_buffer_in_memory", False, "bool"),
    _f("leaf_module", "<factory>", "model"),
])
STATIC_OFFLOAD_PARAM = dict([
    _f("device", "none", "device"), _f("nvme_path", None, "path", optional=True), _f("buffer_count", 5, "int"),
    _f("buffer_size", 100000000, "int"), _f("max_in_cpu", 1000000000, "int"), _f("pin_memory", True, "bool"),
])
STATIC_OFFLOAD_OPTIMIZER = dict([
    _f("device", "none", "device"), _f("nvme_path", None, "path", optional=True), _f("buffer_count", 4, "int"),
    _f("pin_memory", True, "bool"), _f("pipeline_read", False, "bool"), _f("pipeline_write", False, "bool"),
    _f("fast_init", False, "bool"), _f("ratio", 1.0, "float"), _f("super_offload", False, "bool"),
    _f("cpuadam_cores_perc", 0.8, "float"),
])
STATIC_AIO = {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": False,
              "overlap_events": True, "use_gds": False}


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """``"0.19.5+abc"`` -> ``(0, 19, 5)``; None when there is no leading number."""
    if not version:
        return None
    m = re.match(r"(\d+(?:\.\d+)*)", str(version).strip())
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def static_tables(version: str | None) -> FieldTables:
    """The static copy, adjusted to ``version`` where the history is known (pin_memory, aio threads)."""
    param, opt, aio = dict(STATIC_OFFLOAD_PARAM), dict(STATIC_OFFLOAD_OPTIMIZER), dict(STATIC_AIO)
    vt = version_tuple(version)
    if vt is not None and vt < (0, 19, 5):
        for table in (param, opt):
            table["pin_memory"] = FieldSpec("pin_memory", None, False, "bool")
    if vt is not None and vt < (0, 16, 4):
        aio.pop("intra_op_parallelism", None)
        aio["thread_count"] = 1
    src = f"static copy of DeepSpeed {STATIC_VERSION}'s fields"
    if vt is not None and vt[:3] != version_tuple(STATIC_VERSION):
        src += f", pin_memory and aio defaults adjusted for {version}"
    return FieldTables(zero=dict(STATIC_ZERO), offload_param=param, offload_optimizer=opt, aio=aio, source=src,
                       version=version)


def tables_for(ds: dict[str, Any] | None) -> tuple[FieldTables, str | None]:
    """The field tables for the DeepSpeed described by pyenv's ``deepspeed`` facts, and why the static
    copy was used when it was (None when the installed source was read)."""
    ds = ds or {}
    version = ds.get("version") if isinstance(ds.get("version"), str) else None
    loc = ds.get("location") if isinstance(ds.get("location"), str) else None
    if not ds.get("installed") or not loc:
        why = "DeepSpeed is not installed in the training environment" if ds.get("installed") is False \
            else "the training environment's DeepSpeed is unknown"
        return static_tables(version), why
    try:
        return fields_from_source(loc, version), None
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError) as exc:
        return static_tables(version), f"reading DeepSpeed's source in {loc} failed ({exc})"


# -- effective settings -----------------------------------------------------------------------------------

def _member(block: Any, spec: FieldSpec) -> tuple[str | None, Any]:
    """The key the config uses for ``spec`` (name or alias) and its value; (None, None) when unset."""
    if not isinstance(block, dict):
        return None, None
    for key in spec.accepted():
        if key in block:
            return key, block[key]
    return None, None


def _effective_block(cfg: DsConfig, prefix: KeyPath, specs: dict[str, FieldSpec], stage: int) -> dict[str, Any]:
    block = cfg.get(prefix)
    out: dict[str, Any] = {}
    for name, spec in specs.items():
        if spec.kind == "model" or spec.deprecated:
            continue
        key, val = _member(block, spec)
        default = spec.default
        if name == "overlap_comm" and default is None:
            default = stage == 3  # DeepSpeed's validator: True at stage 3, False below
        if key is None:
            source, value = "default", default
        elif val == "auto":
            source, value = "auto", default
        else:
            source, value = "set", val
        pos = cfg.pos((*prefix, key)) if key else None
        out[name] = {"key": dotted((*prefix, key or name)), "value": value, "source": source, "default": default,
                     "line": pos[0] if pos else None}
    return out


def offload_block(cfg: DsConfig, which: str) -> dict[str, Any] | None:
    """``zero_optimization.<which>`` as DeepSpeed sees it (None: not configured, as with "auto" or null)."""
    block = cfg.get(("zero_optimization", which))
    return block if isinstance(block, dict) else None


def effective(cfg: DsConfig, tables: FieldTables) -> dict[str, Any]:
    """Every zero_optimization/offload/aio setting with its value, source (set|default|auto) and default."""
    zero = cfg.get(("zero_optimization",))
    stage_val = zero.get("stage") if isinstance(zero, dict) else None
    stage = stage_val if isinstance(stage_val, int) and not isinstance(stage_val, bool) and stage_val != "auto" \
        else 0
    out: dict[str, Any] = {"stage": stage, "zero_optimization": _effective_block(
        cfg, ("zero_optimization",), tables.zero, stage)}
    for which, specs in (("offload_param", tables.offload_param), ("offload_optimizer", tables.offload_optimizer)):
        block = offload_block(cfg, which)
        out[which] = None if block is None else _effective_block(cfg, ("zero_optimization", which), specs, stage)
    aio = cfg.get(("aio",))
    out["aio"] = {k: {"key": f"aio.{k}", "value": aio[k] if isinstance(aio, dict) and k in aio else d,
                      "source": "set" if isinstance(aio, dict) and k in aio else "default", "default": d}
                  for k, d in tables.aio.items()}
    return out


def device_of(eff: dict[str, Any], which: str) -> str:
    """The effective device of an offload block ("none" when not configured)."""
    block = eff.get(which)
    if not block:
        return "none"
    dev = block.get("device", {}).get("value")
    return dev if isinstance(dev, str) else "none"


# -- the nvme_path on this machine ---------------------------------------------------------------------

def _block_info(source: str) -> dict[str, Any]:
    info: dict[str, Any] = {"device": source, "is_block": False, "name": None, "nvme": False, "rotational": None}
    try:
        st = os.stat(source)
    except OSError:
        return info
    info["is_block"] = stat.S_ISBLK(st.st_mode)
    if not info["is_block"]:
        return info
    sysdir = f"/sys/dev/block/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    name = os.path.basename(os.path.realpath(sysdir)) if os.path.exists(sysdir) else os.path.basename(source)
    info["name"] = name
    info["nvme"] = name.startswith("nvme")
    for rot in (f"{sysdir}/queue/rotational", f"/sys/class/block/{name}/queue/rotational"):
        with contextlib.suppress(OSError, ValueError):
            with open(rot, encoding="ascii") as fh:
                info["rotational"] = fh.read().strip() == "1"
            break
    return info


def inspect_path(path: str, mounts: str = "/proc/self/mountinfo") -> dict[str, Any]:
    """What DeepSpeed would meet writing under ``path`` on this machine (for the user zdoctor runs as)."""
    out: dict[str, Any] = {"path": path, "absolute": os.path.isabs(path), "exists": False, "is_dir": False,
                           "anchor": None, "writable": None, "owner_uid": None, "mode": None, "mount": None,
                           "category": "unknown", "block": None, "free_bytes": None, "total_bytes": None,
                           "uid": os.geteuid() if hasattr(os, "geteuid") else None}
    anchor = os.path.abspath(path)
    while not os.path.exists(anchor) and anchor != os.path.dirname(anchor):
        anchor = os.path.dirname(anchor)
    out["exists"] = os.path.exists(path)
    out["is_dir"] = os.path.isdir(path)
    out["anchor"] = anchor
    with contextlib.suppress(OSError):
        st = os.stat(anchor)
        out["owner_uid"], out["mode"] = st.st_uid, oct(stat.S_IMODE(st.st_mode))
    out["writable"] = os.path.isdir(anchor) and os.access(anchor, os.W_OK | os.X_OK)
    with contextlib.suppress(OSError):
        vfs = os.statvfs(anchor)
        out["free_bytes"], out["total_bytes"] = vfs.f_bavail * vfs.f_frsize, vfs.f_blocks * vfs.f_frsize
    mount = mount_of(anchor, mounts)
    out["mount"] = mount
    if mount:
        out["category"] = fs_category(mount.get("fstype"), mount.get("source"))
        if out["category"] == "block":
            out["block"] = _block_info(mount["source"])
    return out


# -- lints ---------------------------------------------------------------------------------------------

@dataclass
class Lint:
    """One problem in a ds_config: the rule, how bad, the key path and value, and where it is."""

    rule: str
    severity: str  # fail | warn | info
    key: str
    value: Any
    message: str
    line: int | None = None
    col: int | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LintContext:
    """What the lints know besides the config (each part optional)."""

    tables: FieldTables
    ds_version: str | None = None
    python_version: tuple[int, ...] | None = None
    hidden_size: int | None = None
    memlock_soft: int | None = -1  # bytes; None = unlimited; -1 = unknown
    memlock_source: str = "zdoctor's own process (RLIMIT_MEMLOCK)"
    pinned_need: int | None = None  # bytes the offload would pin per node, when the planner knows
    gpu_memory: int | None = None  # bytes of the smallest GPU
    paths: dict[str, dict[str, Any]] = field(default_factory=dict)  # inspect_path() by nvme_path
    command: str | None = None
    log_lines: list[tuple[int, str]] = field(default_factory=list)  # (line number, text) mentioning a flag


def _lint(cfg: DsConfig, rule: str, severity: str, path: KeyPath, value: Any, message: str, detail: str = "") -> Lint:
    pos = cfg.pos(path)
    return Lint(rule, severity, dotted(path), value, message, pos[0] if pos else None, pos[1] if pos else None,
                detail)


def _gib(n: float | None) -> str:
    """Bytes for people: ``8.00 MiB``, ``71.69 GiB``."""
    if n is None:
        return "?"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def _int_like(v: Any) -> bool:
    if isinstance(v, bool):
        return True
    if isinstance(v, int):
        return True
    if isinstance(v, float):
        return v.is_integer()
    if isinstance(v, str):
        return re.fullmatch(r"\s*[-+]?\d+\s*", v) is not None
    return False


_BOOL_WORDS = {"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"}


def _bad_value(spec: FieldSpec, value: Any) -> str | None:
    """pydantic's complaint about ``value`` for ``spec`` (lax mode), or None when it passes."""
    if value is None:
        return None if spec.optional else f"Input should be a valid {'boolean' if spec.kind == 'bool' else spec.kind}"
    if spec.kind == "device" and value not in ("none", "cpu", "nvme"):
        return "Input should be 'none', 'cpu' or 'nvme'"
    if spec.kind == "stage" and (not _int_like(value) or int(float(value)) not in (0, 1, 2, 3)):
        return "Input should be 0, 1, 2 or 3"
    if spec.kind == "int" and not _int_like(value):
        if isinstance(value, float):
            return "Input should be a valid integer, got a number with a fractional part"
        return "Input should be a valid integer"
    if spec.kind == "float" and not (isinstance(value, (int, float)) or
                                     isinstance(value, str) and re.fullmatch(r"\s*[-+]?[\d.eE+-]+\s*", value)):
        return "Input should be a valid number"
    if spec.kind == "bool" and not (isinstance(value, bool) or value in (0, 1) or
                                    isinstance(value, str) and value.strip().lower() in _BOOL_WORDS):
        return "Input should be a valid boolean"
    return None


def _known_keys(specs: dict[str, FieldSpec]) -> list[str]:
    return sorted({k for s in specs.values() for k in s.accepted()})


def _model_lints(cfg: DsConfig, prefix: KeyPath, specs: dict[str, FieldSpec], model: str) -> list[Lint]:
    block = cfg.get(prefix)
    out: list[Lint] = []
    if not isinstance(block, dict):
        return out
    known = _known_keys(specs)
    by_key = {k: s for s in specs.values() for k in s.accepted()}
    loc = ".".join(str(p) for p in prefix[1:])
    for key, value in block.items():
        spec = by_key.get(key)
        path = (*prefix, key)
        if spec is None:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            if key == "thread_count":
                hint = " In 0.16.4 DeepSpeed renamed the aio setting thread_count to intra_op_parallelism; it " \
                       "belongs in the top-level \"aio\" block, never in the offload blocks."
            out.append(_lint(cfg, "unknown-key", "fail", path, value,
                             f"{dotted(path)}: DeepSpeed refuses unknown keys here: 1 validation error for "
                             f"DeepSpeedZeroConfig: {(loc + '.' if loc else '') + key}: Extra inputs are not "
                             f"permitted [type=extra_forbidden].{hint}",
                             f"{model} forbids extra fields (pydantic extra=\"forbid\"). Known keys: "
                             + ", ".join(known)))
            continue
        if value == "auto":
            continue
        if spec.deprecated and value is not None:
            out.append(_lint(cfg, "deprecated-key", "warn", path, value,
                             f"{dotted(path)} is deprecated: DeepSpeed logs \"Config parameter {key} is deprecated\" "
                             "and maps it to the offload blocks; write zero_optimization.offload_optimizer / "
                             "offload_param instead."))
            continue
        bad = _bad_value(spec, value)
        if bad:
            out.append(_lint(cfg, "bad-value", "fail", path, value,
                             f"{dotted(path)} = {value!r}: DeepSpeed refuses it: {bad}"))
    return out


_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def _auto_lints(cfg: DsConfig, eff: dict[str, Any]) -> list[Lint]:
    out: list[Lint] = []

    def walk(node: Any, path: KeyPath) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, (*path, k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, (*path, i))
        elif node == "auto":
            out.append(_auto_lint(cfg, eff, path))

    walk(cfg.data, ())
    return out


def _auto_lint(cfg: DsConfig, eff: dict[str, Any], path: KeyPath) -> Lint:
    key = dotted(path)
    base = f"{key} is \"auto\": only the Hugging Face Trainer / Accelerate fill it in."
    if path[:1] == ("zero_optimization",) and len(path) >= 2:
        if len(path) == 2 and path[1] in ("offload_param", "offload_optimizer"):
            then = f"Without them DeepSpeed drops the value, so {path[1]} is not configured (no offload)."
        elif len(path) == 2 and path[1] == "stage":
            then = "Without them DeepSpeed drops the value and uses the default stage 0: ZeRO is off."
        else:
            then = "Without them DeepSpeed drops the value and uses the default"
            block = eff.get(path[1]) if len(path) == 3 else eff.get("zero_optimization")
            name = path[-1]
            entry = None
            if isinstance(block, dict):
                entry = block.get(name) or next((e for e in block.values() if e["key"] == key), None)
            then += f" ({entry['default']!r})." if entry else "."
            if path[-1] == "device":
                then = "Without them DeepSpeed drops the value and uses the default device \"none\": no offload."
        return _lint(cfg, "auto-value", "warn", path, "auto", f"{base} {then}")
    if path[:1] in (("fp16",), ("bf16",)) and len(path) == 2:
        return _lint(cfg, "auto-value", "warn", path, "auto",
                     f"{base} Without them DeepSpeed drops the value and uses the default (False).")
    if len(path) == 1 and path[0] in _BATCH_KEYS:
        return _lint(cfg, "auto-value", "warn", path, "auto",
                     f"{base} Without them DeepSpeed cannot compute the batch sizes and stops while reading the "
                     "config (DeepSpeed 0.19: TypeError: '>' not supported between instances of 'str' and 'int').")
    return _lint(cfg, "auto-value", "warn", path, "auto",
                 f"{base} Without them DeepSpeed passes the string \"auto\" on as the value.")


def _nvme_error(python_version: tuple[int, ...] | None) -> str:
    """DeepSpeed's assertion text: the enum is formatted as ``OffloadDeviceEnum.nvme`` from Python 3.11."""
    if python_version is None:
        return ("\"nvme_path\" in DeepSpeed Config cannot be None if remote device is OffloadDeviceEnum.nvme "
                "(Python 3.11 and later; \"... remote device is nvme\" before)")
    dev = "OffloadDeviceEnum.nvme" if tuple(python_version[:2]) >= (3, 11) else "nvme"
    return f"\"nvme_path\" in DeepSpeed Config cannot be None if remote device is {dev}"


#: What an nvme_path on a file system of each category (readers.mounts) that is no local disk means for the
#: offload: the lint's severity and the rest of its sentence (a block device is judged by its mount and disk).
NVME_PATH_FILE_SYSTEMS: dict[str, tuple[str, str]] = {
    "memory": ("fail", ": that is RAM, not a disk. Offloading to it uses the very memory offloading was meant to "
                       "free (and tmpfs pages count against /dev/shm and the page cache)."),
    "overlay": ("fail", ": a container's copy-on-write layer, not a local NVMe. DeepSpeed's async I/O opens swap "
                        "files with O_DIRECT, which overlayfs may refuse (EINVAL) and which never reaches a "
                        "dedicated disk. Mount the NVMe into the container (a bind mount or volume) and point "
                        "nvme_path there."),
    "network": ("fail", ": a network file system. Every swap crosses the network and O_DIRECT behaves differently "
                        "or not at all; ZeRO-Infinity expects a local NVMe."),
    "fuse": ("fail", ": a user-space (FUSE) file system; most refuse O_DIRECT (EINVAL), which DeepSpeed's async I/O "
                     "needs."),
    "other": ("warn", ", which is not backed by a local block device that zdoctor can name; O_DIRECT support and "
                      "bandwidth depend on it."),
}


def _path_lints(cfg: DsConfig, ctx: LintContext, path: KeyPath, nvme_path: Any) -> list[Lint]:
    out: list[Lint] = []
    info = ctx.paths.get(str(nvme_path))
    if not isinstance(nvme_path, str) or info is None:
        return out
    key = dotted(path)
    if not info["absolute"]:
        out.append(_lint(cfg, "nvme-path", "warn", path, nvme_path,
                         f"{key} = {nvme_path!r} is relative: DeepSpeed resolves it against the training's working "
                         "directory, which may differ per launch and per node (checked here against zdoctor's)."))
    who = f"uid {info['uid']}" if info.get("uid") is not None else "this user"
    if not info["exists"]:
        if info["writable"]:
            mnt = info.get("mount") or {}
            out.append(_lint(cfg, "nvme-path", "warn", path, nvme_path,
                             f"{key} = {nvme_path!r} does not exist: DeepSpeed creates it (os.makedirs) inside "
                             f"{info['anchor']}, on {mnt.get('fstype', '?')} {mnt.get('source', '?')} mounted at "
                             f"{mnt.get('point', '?')}. If a disk should be mounted there, it is not mounted."))
        else:
            out.append(_lint(cfg, "nvme-path", "fail", path, nvme_path,
                             f"{key} = {nvme_path!r} does not exist and cannot be created: {info['anchor']} is not "
                             f"writable for {who}; DeepSpeed's os.makedirs fails with PermissionError."))
    elif not info["is_dir"]:
        out.append(_lint(cfg, "nvme-path", "fail", path, nvme_path,
                         f"{key} = {nvme_path!r} is not a directory: DeepSpeed's os.makedirs under it fails."))
    elif not info["writable"]:
        out.append(_lint(cfg, "nvme-path", "fail", path, nvme_path,
                         f"{key} = {nvme_path!r} is not writable for {who} (owner uid {info.get('owner_uid')}, mode "
                         f"{info.get('mode')}); checked for the user zdoctor runs as: the training user needs "
                         "write and search permission."))
    mnt = info.get("mount") or {}
    fs = f"{mnt.get('fstype')} ({mnt.get('source')} at {mnt.get('point')})"
    cat = info.get("category")
    unfit = NVME_PATH_FILE_SYSTEMS.get(cat) if isinstance(cat, str) else None
    if unfit is not None:
        severity, why = unfit
        out.append(_lint(cfg, "nvme-path", severity, path, nvme_path, f"{key} = {nvme_path!r} lies on {fs}{why}"))
    elif cat == "block":
        blk = info.get("block") or {}
        if mnt.get("point") == "/":
            out.append(_lint(cfg, "nvme-path", "warn", path, nvme_path,
                             f"{key} = {nvme_path!r} lies on the root file system ({mnt.get('source')}), not on a "
                             "dedicated mount: if an NVMe is meant to be mounted there it is not, and offload "
                             "traffic competes with the system disk."))
        elif blk.get("rotational"):
            out.append(_lint(cfg, "nvme-path", "warn", path, nvme_path,
                             f"{key} = {nvme_path!r} lies on {fs}, a rotational disk: far slower than NVMe for "
                             "offload."))
    return out


def _bucket_lints(cfg: DsConfig, eff: dict[str, Any], hidden: int) -> list[Lint]:
    zero = eff["zero_optimization"]
    rules = [("reduce_bucket_size", hidden * hidden, "hidden_size^2")]
    if eff["stage"] == 3:
        rules += [("prefetch_bucket_size", int(0.9 * hidden * hidden), "0.9 * hidden_size^2"),
                  ("param_persistence_threshold", 10 * hidden, "10 * hidden_size")]
    out: list[Lint] = []
    for name, hf, rule in rules:
        entry = zero.get(name)
        if entry is None or not isinstance(entry["value"], (int, float)) or isinstance(entry["value"], bool):
            continue
        value = entry["value"]
        ratio = value / hf if hf else 0
        far = ratio >= FAR_FACTOR or (0 < ratio <= 1 / FAR_FACTOR)
        path = tuple(entry["key"].split("."))
        how = {"set": "set", "default": "DeepSpeed's default", "auto": "\"auto\", so DeepSpeed's default"}[
            entry["source"]]
        out.append(_lint(cfg, "bucket-sizes", "warn" if far else "info", path, value,
                         f"{entry['key']} = {value:,} ({how}); the HF Trainer's rule for hidden_size {hidden} gives "
                         f"{rule} = {hf:,} ({ratio:.2g}x)"
                         + (f": more than {FAR_FACTOR:g}x away." if far else ".")))
    return out


def _stage3_lints(cfg: DsConfig, eff: dict[str, Any], gpu_memory: int | None) -> list[Lint]:
    zero = eff["zero_optimization"]
    out: list[Lint] = []
    for name in ("max_live_parameters", "max_reuse_distance", "prefetch_bucket_size", "param_persistence_threshold",
                 "sub_group_size"):
        entry = zero.get(name)
        if not entry or entry["source"] != "set" or _same_number(entry["value"], entry["default"]):
            continue
        path = tuple(entry["key"].split("."))
        value, default = entry["value"], entry["default"]
        msg = f"{entry['key']} = {value!r} (DeepSpeed's default {default!r})"
        severity = "info"
        if name in ("max_live_parameters", "prefetch_bucket_size") and gpu_memory and _int_like(value):
            held = int(float(value)) * 2
            msg += f"; at 2 bytes per 16-bit parameter that is up to {_gib(held)} per GPU"
            if held > gpu_memory:
                severity = "warn"
                msg += f", more than the GPU's {_gib(gpu_memory)}"
        if name == "max_live_parameters":
            msg += ". It caps the parameters gathered on a GPU at once (not one allocation): lower means less GPU " \
                   "memory and more communication."
        out.append(_lint(cfg, "stage3-knobs", severity, path, value, msg))
    return out


def _same_number(a: Any, b: Any) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def lint_config(cfg: DsConfig, ctx: LintContext) -> list[Lint]:
    """Every lint for ``cfg``, in file order within each rule."""
    tables = ctx.tables
    eff = effective(cfg, tables)
    out: list[Lint] = []
    if cfg.syntax == "hjson":
        out.append(Lint("hjson-only", "warn", "", None,
                        f"Strict JSON readers refuse this file ({cfg.json_error}): the Hugging Face Trainer and "
                        "Accelerate read ds_config files with json.load and fail, while "
                        "deepspeed.initialize(config=path) reads HJSON and accepts it.",
                        int(cfg.json_error.split(":")[0]) if cfg.json_error else None))
    out += _model_lints(cfg, ("zero_optimization",), tables.zero, ZERO_MODEL)
    out += _model_lints(cfg, ("zero_optimization", "offload_param"), tables.offload_param, PARAM_MODEL)
    out += _model_lints(cfg, ("zero_optimization", "offload_optimizer"), tables.offload_optimizer, OPTIMIZER_MODEL)
    aio = cfg.get(("aio",))
    if isinstance(aio, dict):
        for key, value in aio.items():
            if key == "thread_count":
                continue
            if key not in tables.aio:
                close = difflib.get_close_matches(key, list(tables.aio), n=1, cutoff=0.75)
                out.append(_lint(cfg, "unknown-key", "warn", ("aio", key), value,
                                 f"aio.{key} is not an aio setting: DeepSpeed reads the aio block key by key and "
                                 "silently ignores the rest." + (f" Did you mean {close[0]!r}?" if close else ""),
                                 "Known aio keys: " + ", ".join(tables.aio)))
        if "thread_count" in aio:
            out.append(_thread_count_lint(cfg, ctx, aio))
    out += _auto_lints(cfg, eff)
    stage = eff["stage"]
    for which in ("offload_param", "offload_optimizer"):
        block = eff.get(which)
        if not block:
            continue
        dev = device_of(eff, which)
        if dev == "nvme" and not isinstance(block["nvme_path"]["value"], str):
            where = ("zero_optimization", which, "device")
            err = _nvme_error(ctx.python_version)
            how = (f"With zero.Init (as the HF Trainer uses at stage 3) DeepSpeed stops with AssertionError: {err}. "
                   "Without it the swapper stops with TypeError: expected str, bytes or os.PathLike object, not "
                   "NoneType.") if which == "offload_param" else \
                ("DeepSpeed stops while setting up the optimizer swapper: TypeError: expected str, bytes or "
                 "os.PathLike object, not NoneType (os.path.join(nvme_path, 'zero_stage_3')).")
            out.append(_lint(cfg, "nvme-without-path", "fail", where, "nvme",
                             f"zero_optimization.{which}.device is nvme but nvme_path is not set. {how}"))
        if dev == "nvme" and isinstance(block["nvme_path"]["value"], str):
            out += _path_lints(cfg, ctx, ("zero_optimization", which, "nvme_path"), block["nvme_path"]["value"])
        if which == "offload_param" and dev != "none" and stage != 3:
            out.append(_lint(cfg, "offload-param-below-stage3", "warn", ("zero_optimization", which, "device"), dev,
                             f"zero_optimization.offload_param.device is {dev} at stage {stage}: parameter offload "
                             "exists only at stage 3; DeepSpeed ignores it here."))
        if which == "offload_optimizer":
            ratio = block["ratio"]["value"] if "ratio" in block else 1.0
            if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and ratio < 1.0 and stage != 3:
                out.append(_lint(cfg, "ratio-below-stage3", "fail", ("zero_optimization", which, "ratio"), ratio,
                                 f"zero_optimization.offload_optimizer.ratio = {ratio} at stage {stage}: DeepSpeed "
                                 "refuses the config: Assertion failed, Partial offloading only supported for ZeRO "
                                 "Stage 3."))
        if dev in ("cpu", "nvme") and block.get("pin_memory", {}).get("value") is True:
            lint = _pin_lint(cfg, ctx, which, block["pin_memory"])
            if lint:
                out.append(lint)
    if ctx.hidden_size:
        out += _bucket_lints(cfg, eff, ctx.hidden_size)
    if stage == 3:
        out += _stage3_lints(cfg, eff, ctx.gpu_memory)
    out += _flag_lints(ctx)
    return out


def _thread_count_lint(cfg: DsConfig, ctx: LintContext, aio: dict[str, Any]) -> Lint:
    vt = version_tuple(ctx.ds_version)
    path = ("aio", "thread_count")
    if "thread_count" in ctx.tables.aio or (vt is not None and vt < (0, 16, 4)):
        msg = (f"aio.thread_count is read by this DeepSpeed ({ctx.ds_version or 'before 0.16.4'}); from 0.16.4 on it "
               "is called intra_op_parallelism and thread_count is silently ignored.")
        return _lint(cfg, "aio-thread-count", "info", path, aio["thread_count"], msg)
    msg = ("aio.thread_count was renamed to intra_op_parallelism in DeepSpeed 0.16.4; "
           f"{'this DeepSpeed (' + ctx.ds_version + ')' if ctx.ds_version else 'DeepSpeed 0.16.4 and later'} "
           f"silently ignores it and uses intra_op_parallelism = "
           f"{aio.get('intra_op_parallelism', ctx.tables.aio.get('intra_op_parallelism'))}.")
    return _lint(cfg, "aio-thread-count", "warn", path, aio["thread_count"], msg)


def _pin_lint(cfg: DsConfig, ctx: LintContext, which: str, entry: dict[str, Any]) -> Lint | None:
    soft = ctx.memlock_soft
    if soft is None or soft == -1:
        return None
    how = "set to true" if entry["source"] == "set" else \
        f"true by default in DeepSpeed {ctx.ds_version or '0.19.5 and later'}"
    path = ("zero_optimization", which, "pin_memory") if entry["source"] == "set" else ("zero_optimization", which)
    msg = (f"zero_optimization.{which}.pin_memory is {how}, and the locked-memory limit (ulimit -l) is "
           f"{_gib(soft)} (as seen by {ctx.memlock_source}; a job inherits its limit from the shell, scheduler or "
           "systemd unit that starts it). DeepSpeed's documentation of pin_memory: \"Disable only on hosts with "
           "tight memlock limits (ulimit -l)\".")
    if ctx.pinned_need is not None:
        msg += f" The offload estimate for this node is {_gib(ctx.pinned_need)}."
        if soft >= ctx.pinned_need:
            return _lint(cfg, "pin-memory-memlock", "info", path, True, msg)
    return _lint(cfg, "pin-memory-memlock", "warn", path, True, msg)


_FLAG = re.compile(r"--zero[-_]offload\b")


def _flag_lints(ctx: LintContext) -> list[Lint]:
    out: list[Lint] = []
    msg = ("DeepSpeed has no --zero-offload option: before the script name the deepspeed launcher rejects it, after "
           "it the flag goes to the training script, which DeepSpeed never reads. Offload is set in the config: "
           "zero_optimization.offload_optimizer / offload_param.")
    if ctx.command and _FLAG.search(ctx.command):
        out.append(Lint("zero-offload-flag", "fail", "command", ctx.command, msg))
    for lineno, text in ctx.log_lines:
        if _FLAG.search(text):
            out.append(Lint("zero-offload-flag", "fail", "log", text.strip()[:200], msg, lineno))
            break
    return out


def memlock_soft() -> int | None:
    """This process's RLIMIT_MEMLOCK soft limit in bytes (None: unlimited; -1: unknown)."""
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    except (ImportError, OSError, ValueError, AttributeError):
        return -1
    return None if soft == resource.RLIM_INFINITY else int(soft)
