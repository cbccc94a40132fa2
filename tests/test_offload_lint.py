"""The field lists, defaults and lints, held against the real DeepSpeed: what zdoctor says DeepSpeed refuses,
DeepSpeed refuses; what it says DeepSpeed uses, DeepSpeed uses."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import FIXTURES
from dsenv import ensure
from test_dsconfig import as_other_user

from zdoctor.layers.offload import lint
from zdoctor.layers.offload.dsconfig import load_config, parse_config
from zdoctor.readers import mounts

OFF = FIXTURES / "offload"
CONFIGS = sorted(p for p in OFF.glob("*json") if "duplicate" not in p.name and "truncated" not in p.name)

REAL = r"""
import json, sys, types
import hjson
from pydantic import ValidationError
from deepspeed.runtime.config_utils import dict_raise_error_on_duplicate_keys
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
from deepspeed.runtime.zero.offload_config import (DeepSpeedZeroOffloadParamConfig,
    DeepSpeedZeroOffloadOptimizerConfig, OffloadDeviceEnum)
from deepspeed.runtime.swap_tensor.aio_config import get_aio_config, AIO_DEFAULT_DICT
import deepspeed.runtime.zero.partition_parameters as pp

def fields(model):
    out = {}
    for name, f in model.model_fields.items():
        extra = f.json_schema_extra or {}
        d = f.get_default() if f.default_factory is None else "<factory>"
        if hasattr(d, "model_dump") or d is None or isinstance(d, (bool, int, float, str)):
            d = d if not hasattr(d, "value") else d.value
        else:
            d = str(d)
        out[name] = {"alias": f.alias, "default": d, "deprecated": bool(extra.get("deprecated", False))}
    return out

def plain(v):
    if hasattr(v, "value"):
        return v.value
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)

res = {"fields": {"zero": fields(DeepSpeedZeroConfig), "offload_param": fields(DeepSpeedZeroOffloadParamConfig),
                  "offload_optimizer": fields(DeepSpeedZeroOffloadOptimizerConfig)},
       "aio": AIO_DEFAULT_DICT, "configs": {}}
for path in sys.argv[1:]:
    d = hjson.load(open(path), object_pairs_hook=dict_raise_error_on_duplicate_keys)
    rec = {"aio": get_aio_config(d)}
    try:
        z = DeepSpeedZeroConfig(**d.get("zero_optimization", {}))
        rec["ok"] = True
        rec["zero"] = {k: plain(getattr(z, k)) for k in DeepSpeedZeroConfig.model_fields
                       if k not in ("offload_param", "offload_optimizer", "zenflow", "leaf_module")
                       and not (DeepSpeedZeroConfig.model_fields[k].json_schema_extra or {}).get("deprecated")}
        for which in ("offload_param", "offload_optimizer"):
            blk = getattr(z, which)
            rec[which] = None if blk is None else {k: plain(getattr(blk, k)) for k in type(blk).model_fields}
    except ValidationError as e:
        rec["ok"] = False
        rec["errors"] = [[".".join(str(x) for x in err["loc"]), err["type"]] for err in e.errors()]
    res["configs"][path] = rec
cfg = types.SimpleNamespace(zero_config=DeepSpeedZeroConfig(stage=3, offload_param={"device": "nvme"}))
try:
    pp.Init._validate_remote_device(None, OffloadDeviceEnum.nvme, cfg)
except AssertionError as e:
    res["nvme_error"] = str(e)
res["stage_auto"] = int(DeepSpeedZeroConfig(stage="auto").stage)
sys.stdout.write("@@R@@" + json.dumps(res))
"""


@pytest.fixture(scope="module")
def real() -> dict:
    """What the installed DeepSpeed itself says about the fixtures."""
    python = ensure()
    proc = subprocess.run([str(python), "-c", REAL, *map(str, CONFIGS)], capture_output=True, text=True, timeout=300)
    assert "@@R@@" in proc.stdout, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("@@R@@", 1)[1])
    out["location"] = subprocess.run([str(python), "-c", "import deepspeed, os; print(os.path.dirname("
                                      "deepspeed.__file__))"], capture_output=True, text=True,
                                     timeout=300).stdout.strip().splitlines()[-1]
    return out


def ctx(**kw) -> lint.LintContext:
    base = {"tables": lint.static_tables("0.19.8"), "ds_version": "0.19.8", "python_version": (3, 11, 7),
            "memlock_soft": None}
    base.update(kw)
    return lint.LintContext(**base)


def by_rule(lints: list[lint.Lint], rule: str) -> list[lint.Lint]:
    return [x for x in lints if x.rule == rule]


# -- field lists ----------------------------------------------------------------------------------------

def _as_real(table: dict[str, lint.FieldSpec]) -> dict[str, dict]:
    return {k: {"alias": v.alias, "default": v.default, "deprecated": v.deprecated} for k, v in table.items()}


def test_static_copy_equals_the_installed_source_and_the_live_models(real):
    from_source = lint.fields_from_source(real["location"], "0.19.8")
    static = lint.static_tables("0.19.8")
    for name in ("zero", "offload_param", "offload_optimizer"):
        assert getattr(from_source, name) == getattr(static, name), name
        live = real["fields"][name]
        assert _as_real(getattr(static, name)) == live, name  # names, aliases, defaults, deprecations
    assert from_source.aio == static.aio == real["aio"]


def test_fields_come_from_the_installed_source_when_there_is_one(tmp_path, real):
    ds = tmp_path / "deepspeed"
    for rel in ("runtime/zero/config.py", "runtime/zero/offload_config.py", "runtime/swap_tensor/constants.py"):
        (ds / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(real["location"]) / rel, ds / rel)
    src = (ds / "runtime/zero/offload_config.py").read_text(encoding="utf-8")
    (ds / "runtime/zero/offload_config.py").write_text(src.replace("pin_memory: bool = True",
                                                                   "pin_memory: bool = False"), encoding="utf-8")
    tables, why = lint.tables_for({"installed": True, "version": "0.19.4", "location": str(ds)})
    assert why is None and tables.source.startswith("installed DeepSpeed source")
    assert tables.offload_param["pin_memory"].default is False
    (ds / "runtime/zero/config.py").unlink()
    tables, why = lint.tables_for({"installed": True, "version": "0.19.4", "location": str(ds)})
    assert "failed" in why and tables.offload_param["pin_memory"].default is False  # the version rule
    tables, why = lint.tables_for({"installed": False})
    assert why == "DeepSpeed is not installed in the training environment"


def test_version_rules_of_the_static_copy():
    assert lint.static_tables("0.19.4").offload_optimizer["pin_memory"].default is False
    assert lint.static_tables("0.19.5").offload_optimizer["pin_memory"].default is True
    assert "thread_count" in lint.static_tables("0.16.3").aio
    assert "intra_op_parallelism" in lint.static_tables("0.16.4").aio


# -- refusals and effective values against DeepSpeed ------------------------------------------------------

@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_refusals_match_deepspeed(path, real):
    cfg = load_config(str(path))
    rec = real["configs"][str(path)]
    lints = lint.lint_config(cfg, ctx())
    field_errors = {re.sub(r"^zero_optimization\.", "", x.key) for x in lints
                    if x.rule in ("unknown-key", "bad-value") and x.severity == "fail"}
    if rec["ok"]:
        assert not field_errors and not by_rule(lints, "ratio-below-stage3")
    else:
        assert field_errors == {loc for loc, _type in rec["errors"] if loc}
    # what zdoctor says the aio block ends up as is what DeepSpeed builds
    eff = lint.effective(cfg, lint.static_tables("0.19.8"))
    assert {k: v["value"] for k, v in eff["aio"].items()} == rec["aio"]


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_effective_values_match_deepspeed(path, real):
    rec = real["configs"][str(path)]
    if not rec["ok"]:
        return
    eff = lint.effective(load_config(str(path)), lint.static_tables("0.19.8"))
    got = {k: v["value"] for k, v in eff["zero_optimization"].items()}
    assert {k: got[k] for k in rec["zero"]} == {k: v for k, v in rec["zero"].items()}, path.name
    for which in ("offload_param", "offload_optimizer"):
        if rec[which] is None:
            assert eff[which] is None
            continue
        mine = {k: v["value"] for k, v in eff[which].items()}
        assert {k: (str(v) if k == "nvme_path" and v is not None else v) for k, v in mine.items()} == rec[which]


def test_broken_keys_lints(real):
    cfg = load_config(str(OFF / "broken-keys.json"))
    lints = lint.lint_config(cfg, ctx())
    typo = next(x for x in lints if x.key == "zero_optimization.stage3_max_live_params")
    assert (typo.severity, typo.line, typo.col) == ("fail", 5, 31)
    assert "Extra inputs are not permitted" in typo.message and "stage3_max_live_parameters" in typo.message
    tc = next(x for x in lints if x.key == "zero_optimization.offload_optimizer.thread_count")
    assert "intra_op_parallelism" in tc.message and "aio" in tc.message
    aio = next(x for x in lints if x.key == "aio.queue_dept")
    assert aio.severity == "warn" and "silently ignores" in aio.message and "'queue_depth'" in aio.message
    ratio = by_rule(lints, "ratio-below-stage3")[0]
    assert ratio.severity == "fail" and ratio.message.endswith(
        "Assertion failed, Partial offloading only supported for ZeRO Stage 3.")
    assert by_rule(lints, "offload-param-below-stage3")[0].severity == "warn"
    assert by_rule(lints, "aio-thread-count")[0].severity == "warn"


def test_ratio_below_stage3_is_what_deepspeed_asserts():
    code = ("from deepspeed.runtime.zero.config import DeepSpeedZeroConfig\ntry:\n    DeepSpeedZeroConfig(stage=2, "
            "offload_optimizer={'device': 'cpu', 'ratio': 0.3})\nexcept Exception as e:\n    print('@@R@@' + str(e))\n")
    out = subprocess.run([str(ensure()), "-c", code], capture_output=True, text=True, timeout=300).stdout
    assert "Assertion failed, Partial offloading only supported for ZeRO Stage 3." in out.split("@@R@@", 1)[1]
    cfg = parse_config('{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}}')
    assert by_rule(lint.lint_config(cfg, ctx()), "ratio-below-stage3")


def test_nvme_without_path_quotes_deepspeed(real):
    cfg = load_config(str(OFF / "broken-nvme-no-path.json"))
    lints = lint.lint_config(cfg, ctx())
    nv = by_rule(lints, "nvme-without-path")
    assert [x.key for x in nv] == ["zero_optimization.offload_optimizer.device"]
    assert "TypeError: expected str, bytes or os.PathLike object, not NoneType" in nv[0].message
    assert lint._nvme_error((3, 11, 7)) == real["nvme_error"]  # DeepSpeed's own text under Python 3.11
    assert lint._nvme_error((3, 10, 12)).endswith("cannot be None if remote device is nvme")
    param = parse_config('{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}')
    msg = by_rule(lint.lint_config(param, ctx()), "nvme-without-path")[0].message
    assert real["nvme_error"] in msg
    bad = {x.key: x for x in by_rule(lints, "bad-value")}
    assert "Input should be 'none', 'cpu' or 'nvme'" in bad["zero_optimization.offload_param.device"].message
    assert "fractional part" in bad["zero_optimization.stage3_max_reuse_distance"].message


def test_auto_values_say_what_plain_deepspeed_does(real):
    lints = lint.lint_config(load_config(str(OFF / "hf-zero3-auto.json")), ctx())
    auto = {x.key: x for x in by_rule(lints, "auto-value")}
    assert len(auto) == 16
    assert "uses the default (500000000)" in auto["zero_optimization.reduce_bucket_size"].message
    assert "TypeError: '>' not supported" in auto["train_batch_size"].message
    assert "passes the string \"auto\" on" in auto["optimizer.params.lr"].message
    assert "default (False)" in auto["fp16.enabled"].message
    assert real["stage_auto"] == 0
    stage = parse_config('{"zero_optimization": {"stage": "auto"}}')
    assert "ZeRO is off" in by_rule(lint.lint_config(stage, ctx()), "auto-value")[0].message


def test_bucket_sizes_against_the_hidden_size():
    lints = lint.lint_config(load_config(str(OFF / "hf-zero3-auto.json")), ctx(hidden_size=4096))
    b = {x.key: x for x in by_rule(lints, "bucket-sizes")}
    assert b["zero_optimization.reduce_bucket_size"].severity == "warn"  # 5e8 vs 4096^2: 30x
    assert "hidden_size^2 = 16,777,216" in b["zero_optimization.reduce_bucket_size"].message
    assert b["zero_optimization.stage3_prefetch_bucket_size"].severity == "info"  # 5e7 vs 0.9*4096^2: 3.3x
    assert not by_rule(lint.lint_config(load_config(str(OFF / "hf-zero3-auto.json")), ctx()), "bucket-sizes")


def test_pin_memory_against_memlock():
    cfg = load_config(str(OFF / "zero3-cpu-offload.json"))  # pin_memory not set: the version's default
    assert not by_rule(lint.lint_config(cfg, ctx(memlock_soft=None)), "pin-memory-memlock")
    tight = by_rule(lint.lint_config(cfg, ctx(memlock_soft=8 * 2**20)), "pin-memory-memlock")
    assert [x.severity for x in tight] == ["warn", "warn"]
    assert "true by default in DeepSpeed 0.19.8" in tight[0].message and "8.00 MiB" in tight[0].message
    old = ctx(memlock_soft=8 * 2**20, tables=lint.static_tables("0.19.4"), ds_version="0.19.4")
    assert not by_rule(lint.lint_config(cfg, old), "pin-memory-memlock")  # False by default before 0.19.5
    roomy = by_rule(lint.lint_config(cfg, ctx(memlock_soft=2**40, pinned_need=2**30)), "pin-memory-memlock")
    assert {x.severity for x in roomy} == {"info"}


def test_stage3_knobs_only_when_changed_and_against_gpu_memory():
    cfg = parse_config('{"zero_optimization": {"stage": 3, "stage3_max_live_parameters": 1e9, '
                       '"stage3_prefetch_bucket_size": 5e10}}')
    knobs = by_rule(lint.lint_config(cfg, ctx(gpu_memory=80 * 2**30)), "stage3-knobs")
    assert [x.key for x in knobs] == ["zero_optimization.stage3_prefetch_bucket_size"]
    assert knobs[0].severity == "warn" and "more than the GPU's 80.00 GiB" in knobs[0].message


def test_thread_count_by_version():
    cfg = load_config(str(OFF / "zero3-nvme-offload.json"))
    new = by_rule(lint.lint_config(cfg, ctx()), "aio-thread-count")[0]
    assert new.severity == "warn" and (new.line, new.col) == (35, 21)
    old = ctx(tables=lint.static_tables("0.16.3"), ds_version="0.16.3")
    assert by_rule(lint.lint_config(cfg, old), "aio-thread-count")[0].severity == "info"


def test_zero_offload_flag_and_hjson_only():
    cfg = load_config(str(OFF / "zero3-comments.hjson"))
    lints = lint.lint_config(cfg, ctx(command="deepspeed --zero-offload train.py --deepspeed ds.json"))
    assert by_rule(lints, "zero-offload-flag")[0].severity == "fail"
    hj = by_rule(lints, "hjson-only")[0]
    assert hj.severity == "warn" and "json.load" in hj.message and "1:1: Expecting value" in hj.message


# -- the nvme_path on this machine ------------------------------------------------------------------------

def path_lints(path: str, info: dict) -> list[lint.Lint]:
    cfg = parse_config(json.dumps({"zero_optimization": {"stage": 3, "offload_optimizer": {
        "device": "nvme", "nvme_path": path}}}))
    return by_rule(lint.lint_config(cfg, ctx(paths={path: info})), "nvme-path")


def test_nvme_path_on_tmpfs_is_memory():
    assert mounts.mount_of("/dev/shm")["fstype"] == "tmpfs"
    info = lint.inspect_path("/dev/shm/zdoctor-offload")
    assert info["category"] == "memory" and info["writable"] and not info["exists"]
    lints = path_lints("/dev/shm/zdoctor-offload", info)
    assert any(x.severity == "fail" and "that is RAM, not a disk" in x.message for x in lints)


def test_nvme_path_missing_but_creatable(tmp_path):
    target = str(tmp_path / "not" / "yet")
    info = lint.inspect_path(target)
    assert info["anchor"] == str(tmp_path) and info["writable"] and info["free_bytes"] > 0
    msgs = [x.message for x in path_lints(target, info)]
    assert any("does not exist: DeepSpeed creates it (os.makedirs)" in m for m in msgs)


@pytest.fixture
def open_dir():
    """A temporary directory every user can reach (pytest's own tmp dirs are private to their owner)."""
    d = Path(tempfile.mkdtemp(prefix="zdoctor-lint-"))
    d.chmod(0o755)
    yield d
    for sub in d.rglob("*"):
        sub.chmod(0o755)
    shutil.rmtree(d)


def test_nvme_path_not_writable_for_the_training_user(open_dir):
    target = open_dir / "offload"
    target.mkdir()
    target.chmod(0o555)
    info = json.loads(as_other_user(lambda p: json.dumps(lint.inspect_path(p)), str(target)))
    assert info["writable"] is False and info["exists"] and info["mode"] == "0o555"
    uid = 65534 if os.geteuid() == 0 else os.geteuid()
    lints = path_lints(str(target), info)
    assert any(x.severity == "fail" and f"is not writable for uid {uid}" in x.message for x in lints)


def test_container_mounts_are_categorised():
    mi = str(OFF / "mountinfo-container.txt")
    cases = {"/mnt/shared/job": ("nfs4", "network"), "/mnt/bucket/x": ("fuse.s3fs", "fuse"),
             "/work": ("overlay", "overlay"), "/dev/shm/x": ("tmpfs", "memory"),
             "/mnt/nvme/offload": ("ext4", "block"), "/mnt/with space/a": ("xfs", "block")}
    for path, (fstype, cat) in cases.items():
        m = mounts.mount_of(path, mi)
        assert m["fstype"] == fstype, path
        assert mounts.fs_category(m["fstype"], m["source"]) == cat, path
    real = lint.inspect_path("/")
    for path, needle in (("/mnt/shared/job", "a network file system"), ("/mnt/bucket/x", "FUSE"),
                         ("/work", "copy-on-write layer")):
        m = mounts.mount_of(path, mi)
        info = {**real, "path": path, "exists": True, "is_dir": True, "mount": m,
                "category": mounts.fs_category(m["fstype"], m["source"])}
        lints = path_lints(path, info)
        assert any(x.severity == "fail" and needle in x.message for x in lints), path
