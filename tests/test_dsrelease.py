"""The rules of the installed DeepSpeed release, read from its own files: excerpts of the 0.3.16 and 0.4.0
source distributions laid out as installed packages, the real 0.19.8 of the test environment where it is
built, a JIT op dir written the way torch writes it (with a real gcc-built .so), and older-release
wall_clock_breakdown logs."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from test_gpu_checks import base, by_id, with_nvcc
from test_gpu_facts import h200

from zdoctor.layers.gpu import check_cuda as g
from zdoctor.layers.offload import walllog
from zdoctor.layers.python_env import check_dsrelease as cdr
from zdoctor.layers.python_env import dsrules as dsr
from zdoctor.layers.python_env.probe_dsrelease import collect_dsrelease
from zdoctor.layers.toolchain.probe_hangs import collect_jitcache

RELEASES = Path(__file__).parent / "fixtures" / "deepspeed-releases"
DS_ENV = Path(os.environ.get("ZDOCTOR_TEST_DS_ENV", Path.home() / ".cache" / "zdoctor-tests" / "ds-env"))


def install(tmp_path: Path, release: str) -> Path:
    """The release's files as ``site-packages/deepspeed`` under ``tmp_path``."""
    dest = tmp_path / "site-packages" / "deepspeed"
    shutil.copytree(RELEASES / release, dest)
    return dest


def pyenv_with(location: Path | None, version: str, torch_cuda: str = "11.3") -> dict:
    py = base("pyenv")
    py["torch"]["cuda"] = torch_cuda
    py["deepspeed"] = {"installed": True, "version": version, "location": str(location) if location else None,
                       "prebuilt_ops": []}
    return py


def release_facts(tmp_path: Path, release: str, nvcc: str, torch_cuda: str, **extra):
    loc = install(tmp_path, release)
    py = pyenv_with(loc, release, torch_cuda)
    dsf, _ = collect_dsrelease(py, {})
    return h200(cuda_stack=with_nvcc(nvcc), pyenv=py, dsrelease=dsf, **extra), dsf


def test_the_rules_are_data_with_their_sources():
    for rule in dsr.RULES:
        assert rule["sources"] and rule["old"] and rule["current"] and rule["release"]
    assert any("PR 1139" in s for s in dsr.RULES_BY_ID["nvcc-minor-tolerance"]["sources"])
    assert any("PR 2211" in s for s in dsr.RULES_BY_ID["nvcc-minor-tolerance"]["sources"])


def test_040_has_its_own_smaller_table_and_refuses_114_with_torch_113(tmp_path):
    facts, dsf = release_facts(tmp_path, "0.4.0", "11.4", "11.3")
    rule = dsf["rules"]["nvcc-minor-tolerance"]
    assert rule["state"] == "current" and rule["table"] == {10: ["10.0", "10.1", "10.2"],
                                                            11: ["11.0", "11.1", "11.2", "11.3"]}
    assert rule["skip_env"] is False  # DS_SKIP_CUDA_CHECK came later (PR 3436)
    v = by_id(g.check_toolkit(facts))["gpu.toolkit.nvcc-version"]
    assert v.status == "fail" and "Installed CUDA version 11.4 does not match" in v.detail
    # today's table accepts the same pair: the version-blind rule said "accepted as compatible"
    assert cdr.__name__ and g.cuda.deepspeed_nvcc_rule("11.4", "11.3", {})["verdict"] == "compatible"
    # inside 0.4.0's table the pair passes, and says which release accepted it
    facts, _ = release_facts(tmp_path / "b", "0.4.0", "11.2", "11.1")
    v = by_id(g.check_toolkit(facts))["gpu.toolkit.nvcc-version"]
    assert v.status == "ok" and "accepted as compatible by DeepSpeed 0.4.0" in v.title


def test_0316_predates_the_table_and_refuses_any_minor_mismatch_but_111_with_110(tmp_path):
    facts, dsf = release_facts(tmp_path, "0.3.16", "11.2", "11.1")
    assert dsf["rules"]["nvcc-minor-tolerance"]["state"] == "old"
    v = by_id(g.check_toolkit(facts))["gpu.toolkit.nvcc-version"]
    assert v.status == "fail" and "predates the minor-version table (DeepSpeed PR 1139" in v.detail
    facts, _ = release_facts(tmp_path / "b", "0.3.16", "11.1", "11.0")
    assert by_id(g.check_toolkit(facts))["gpu.toolkit.nvcc-version"].status == "ok"


def test_an_unread_old_release_is_not_called_compatible(tmp_path):
    py = pyenv_with(None, "0.5.10", "12.1")
    facts = h200(cuda_stack=with_nvcc("12.4"), pyenv=py)
    v = by_id(g.check_toolkit(facts))["gpu.toolkit.nvcc-version"]
    assert v.status == "warn" and "installed release's rule is unknown" in v.title


def test_040_libaio_by_dpkg_and_pin_memory_ignored(tmp_path):
    facts, dsf = release_facts(tmp_path, "0.4.0", "11.3", "11.3")
    f = by_id(cdr.check_release(facts))
    aio = f["pyenv.deepspeed-release.libaio-dpkg"]
    assert aio.status == "warn" and "dpkg -l libaio-dev" in aio.detail and "PR 1247" in aio.detail
    # one alternative per package manager, each a list of steps for this node's distribution (the H200's)
    assert [r.commands for r in aio.remedies[:-1]] == [["apt-get update", "apt-get install -y libaio-dev"]]
    pin = f["pyenv.deepspeed-release.pin-memory-ignored"]
    assert pin.status == "warn" and "stage2.py" in pin.detail
    assert f["pyenv.deepspeed-release.timer-names"].status == "ok"


def test_the_real_0198_has_todays_rules():
    site = sorted(DS_ENV.glob("lib/python3*/site-packages/deepspeed"))
    if not site:
        import pytest

        pytest.skip("the torch+DeepSpeed test environment is not built here")
    rules = dsr.installed_rules(str(site[0]), "0.19.8")
    assert {r["state"] for r in rules.values()} == {"current"}
    assert rules["nvcc-minor-tolerance"]["table"][12][-1] == "12.9"


OLD_LOG = ("[2021-07-01 10:00:0{i},000] [INFO] [logging.py:60:log_dist] [Rank 0] time (ms) | forward_microstep: "
           "{f} | backward_microstep: {b} | backward_inner_microstep: {bi} | backward_allreduce_microstep: 50.0 | "
           "step_microstep: {s}")


def test_an_older_release_log_is_not_read_as_a_100_percent_step(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("\n".join(OLD_LOG.format(i=i, f=120.0, b=300.0, bi=250.0, s=40.0) for i in range(5)) + "\n")
    out = walllog.parse_log(str(log))
    assert out["timer_names"].startswith("older")
    assert out["dominant"] == "backward" and out["step_bound"] is False
    assert abs(out["shares"]["step"] - 40 / 460) < 1e-3
    assert out["backward_parts"]["bwd_inner"]["mean_ms"] == 250.0


def _gcc_so(path: Path) -> None:
    src = path.with_suffix(".cpp")
    src.write_text("extern \"C\" int op_entry() { return 1; }\n")
    subprocess.run(["g++", "-shared", "-fPIC", "-o", str(path), str(src)], check=True)
    src.unlink()


def jit_op(cache: Path, ds_dir: Path) -> Path:
    """An op dir as torch writes it: build.ninja naming the DeepSpeed sources, and the built .so."""
    op = cache / "cpu_adam"
    op.mkdir(parents=True)
    (ds_dir / "ops" / "csrc" / "adam").mkdir(parents=True, exist_ok=True)
    cpp = ds_dir / "ops" / "csrc" / "adam" / "cpu_adam.cpp"
    cpp.write_text("// cpu_adam\n")
    old = time.time() - 3600
    os.utime(cpp, (old, old))
    (op / "build.ninja").write_text(
        "ninja_required_version = 1.3\ncxx = c++\n\n"
        f"build cpu_adam.o: compile {cpp}\n\nbuild cpu_adam.so: link cpu_adam.o\n\ndefault cpu_adam.so\n")
    _gcc_so(op / "cpu_adam.so")
    os.utime(op / "cpu_adam.so", (old + 1800, old + 1800))
    return op


def test_a_jit_op_built_by_another_install_is_named_with_its_release(tmp_path):
    other = install(tmp_path / "other-env", "0.4.0")
    ours = install(tmp_path / "our-env", "0.3.16")
    cache = tmp_path / "ext"
    jit_op(cache, other)
    py = pyenv_with(ours, "0.3.16")
    env = {"TORCH_EXTENSIONS_DIR": str(cache), "HOME": str(tmp_path), "PATH": os.environ["PATH"]}
    jit, _ = collect_jitcache(env, py)
    dsf, ev = collect_dsrelease(py, jit)
    assert dsf["jit_origins"][0]["version"] == "0.4.0" and dsf["jit_origins"][0]["same_install"] is False
    f = [x for x in cdr.check_release(h200(pyenv=py, dsrelease=dsf))
         if x.id == "pyenv.deepspeed-release.jit-op-other-release"]
    assert len(f) == 1 and str(other) in f[0].title and "0.4.0" in f[0].title
    assert f[0].remedies[0].commands[0].startswith("export TORCH_EXTENSIONS_DIR=")
    # the same install, with its sources changed after the build (an in-place upgrade): older than its sources
    cpp = other / "ops" / "csrc" / "adam" / "cpu_adam.cpp"
    os.utime(cpp, None)
    py2 = pyenv_with(other, "0.4.0")
    dsf2, _ = collect_dsrelease(py2, collect_jitcache(env, py2)[0])
    f2 = [x for x in cdr.check_release(h200(pyenv=py2, dsrelease=dsf2))
          if x.id == "pyenv.deepspeed-release.jit-op-other-release"]
    assert len(f2) == 1 and "older than its sources" in f2[0].title
