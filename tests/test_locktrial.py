"""A stale JIT build lock: before offering `rm`, zdoctor proves that the lock is the only thing in the way by
loading the op from a lock-free copy of the op cache, for real (torch + DeepSpeed's cpu_adam), changing
nothing on the node."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from dsenv import LOAD_CPU_ADAM, cpu_adam_op, ensure

import zdoctor.layers.toolchain.check_hangs  # noqa: F401 - registers the checks
import zdoctor.layers.toolchain.probe_hangs  # noqa: F401 - and the probes
from zdoctor.host import LiveHost
from zdoctor.layers import evaluate_check


@pytest.fixture(scope="module")
def ds() -> dict[str, Path]:
    python = ensure()
    return {"python": python, "so": cpu_adam_op(python)}


def _snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    out = {}
    for dp, dns, fs in os.walk(root):
        for n in [*fs, *dns]:
            st = os.lstat(os.path.join(dp, n))
            out[os.path.join(dp, n)] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def _cache_with_stale_lock(ds: dict[str, Path], tmp_path: Path) -> tuple[Path, Path]:
    cache = tmp_path / "torch ext"
    shutil.copytree(ds["so"].parent, cache / "cpu_adam", symlinks=True)
    lock = cache / "cpu_adam" / "lock"
    os.close(os.open(lock, os.O_CREAT | os.O_EXCL))  # what a builder killed mid-build leaves
    return cache, lock


def _env(ds: dict[str, Path], cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
    env.update(TORCH_EXTENSIONS_DIR=str(cache), PATH=f"{ds['python'].parent}{os.pathsep}{env['PATH']}")
    return env


def _lock_finding(host: LiveHost):
    facts = host.results(("jitcache", "processes", "locktrial"))
    (f,) = [f for f in evaluate_check("hangs.stale-lock", facts) if f.status == "fail"]
    (rem,) = f.remedies
    return facts, rem


@pytest.mark.parametrize("with_command", [False, True], ids=["op-load", "launch-command"])
def test_the_op_loads_from_a_lock_free_copy_so_rm_is_verified(ds, tmp_path, with_command):
    cache, lock = _cache_with_stale_lock(ds, tmp_path)
    env = _env(ds, cache)
    command = shlex.join([str(ds["python"]), "-c", LOAD_CPU_ADAM]) if with_command else None
    before = _snapshot(cache)
    host = LiveHost(python=str(ds["python"]), env=env, command=command, timeout=240)
    facts, rem = _lock_finding(host)
    (trial,) = facts["locktrial"].facts["trials"]
    assert trial["tried"] and trial["fixed"], trial
    assert rem.verified is True and "Tried without changing the node" in rem.explanation
    assert ("the launch command" if with_command else "the op loaded by the training interpreter") in trial["how"]
    assert _snapshot(cache) == before  # the real cache, lock included, exactly as it was
    # The verified remedy, applied: the real launch loads the op from the real cache.
    subprocess.run(["bash", "-c", "\n".join(rem.commands)], env=env, check=True, timeout=30)
    assert not lock.exists()
    done = subprocess.run([str(ds["python"]), "-c", LOAD_CPU_ADAM], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_broken_op_is_not_called_fixed_by_removing_its_lock(ds, tmp_path):
    cache, lock = _cache_with_stale_lock(ds, tmp_path)
    so = cache / "cpu_adam" / "cpu_adam.so"
    so.write_bytes(so.read_bytes()[:4096])  # the dead build also left a truncated op
    host = LiveHost(python=str(ds["python"]), env=_env(ds, cache), timeout=240)
    facts, rem = _lock_finding(host)
    (trial,) = facts["locktrial"].facts["trials"]
    assert trial["tried"] and not trial["fixed"]
    assert rem.verified is False and "did not work either" in rem.explanation
    assert "still fail to load" in rem.explanation and lock.exists()
