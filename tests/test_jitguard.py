"""A re-run zdoctor kills while torch builds an op leaves no stale JIT lock behind."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

from prockit import BUILDER, wait_for

from zdoctor.trials.jitguard import clean_left_locks, lock_files, run_guarded
from zdoctor.trials.remedies import Plan, verify


def _env(cache: Path) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "TORCH_EXTENSIONS_DIR": str(cache)}


def test_a_killed_builder_lock_is_removed_and_an_old_one_is_kept(tmp_path):
    cache = tmp_path / "ext"
    (cache / "cpu_adam").mkdir(parents=True)
    (cache / "old_op").mkdir()
    (cache / "old_op" / "lock").write_text("")  # a stale lock the user already had: zdoctor's finding, not its own
    lock = cache / "cpu_adam" / "lock"
    ev = run_guarded([sys.executable, "-c", BUILDER, str(lock), str(tmp_path / "started")], _env(cache), timeout=3)
    assert ev.error and ev.error.startswith("timed out")
    assert not lock.exists()
    assert f"removed the JIT build lock the killed run left (it was not there before): {lock}" in ev.error
    assert (cache / "old_op" / "lock").exists()
    assert lock_files(_env(cache)) == {str(cache / "old_op" / "lock"): (cache / "old_op" / "lock").stat().st_ino}


def test_a_new_lock_held_by_a_live_build_is_reported_not_removed(tmp_path, spawn):
    cache = tmp_path / "ext"
    (cache / "op").mkdir(parents=True)
    before = lock_files(_env(cache))
    lock = cache / "op" / "lock"
    spawn(BUILDER, extra=[str(lock), str(tmp_path / "started")])  # someone else's build, still running
    assert wait_for((tmp_path / "started").exists)
    notes = clean_left_locks(before, _env(cache))
    assert lock.exists()
    assert len(notes) == 1 and "still held by pid" in notes[0] and str(lock) in notes[0]


def test_a_verify_rerun_that_times_out_while_torch_builds_leaves_the_cache_as_found(tmp_path):
    from dsenv import ensure

    python = ensure()
    src = tmp_path / "slow_op.cpp"
    src.write_text("#include <torch/extension.h>\nint answer() { return 42; }\n"
                   "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"answer\", &answer); }\n")
    code = textwrap.dedent(f"""
        from torch.utils.cpp_extension import load
        load(name="slow_op", sources=[{str(src)!r}])
    """)
    cache = tmp_path / "ext"
    env = dict(_env(cache), PATH=f"{python.parent}{os.pathsep}{os.environ['PATH']}")
    plan = Plan(key="ld-preload", title="re-run")
    # about 23 s for the whole build on a quiet two-core machine, import torch and the lock within the first
    # 10: the limit comes mid-compile
    ev = verify(plan, [str(python), "-c", code], env, timeout=15)
    assert ev.error and ev.error.startswith("timed out"), (ev.error, ev.stderr[-2000:])
    # torch created the lock when the build started; the kill came mid-build; zdoctor removed it.
    assert "removed the JIT build lock the killed run left" in ev.error, ev.error
    assert (cache / "slow_op").is_dir() and not (cache / "slow_op" / "lock").exists()
    assert plan.verified is False


def test_a_new_lock_whose_build_directory_a_compiler_still_works_in_is_left(tmp_path, spawn):
    """torch's python is gone (nobody has the lock open) but a compiler of its build still runs in the op's
    build directory, as ninja's jobs do: the build is still held, so the lock stays and is reported."""
    cache = tmp_path / "ext"
    (cache / "op").mkdir(parents=True)
    before = lock_files(_env(cache))
    lock = cache / "op" / "lock"
    lock.write_text("")
    compiler = spawn("import time; time.sleep(600)", cwd=str(cache / "op"), argv0="cc1plus")
    notes = clean_left_locks(before, _env(cache))
    assert lock.exists()
    assert notes == [f"a JIT build lock appeared during the run and is still held by pid {compiler}: "
                     f"left in place: {lock}"]
