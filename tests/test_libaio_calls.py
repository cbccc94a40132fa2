"""libaio judged by the calls DeepSpeed's async_io op makes, read from the installed DeepSpeed's own
csrc/aio sources: a libaio built here over the kernel's real AIO system calls, once with io_pgetevents
and once as a libaio before 0.3.111 without it (CentOS 7's 0.3.109). A test that calls only io_setup
passes on both; DeepSpeed's build fails on the second."""

from __future__ import annotations

import os
import subprocess

import dsenv
from aiokit import build_libaio
from test_gpu_facts import facts_of

from zdoctor.core.registry import load_vocabulary
from zdoctor.host import LiveHost
from zdoctor.layers.offload import aiocalls
from zdoctor.layers.offload import iotest as io
from zdoctor.layers.offload.check_storage import check_libaio


def _ds_location() -> str:
    python = dsenv.ensure()
    code = "import importlib.util as u; print(u.find_spec('deepspeed').submodule_search_locations[0])"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True,
                          timeout=120).stdout.strip()


def test_the_installed_deepspeed_calls_io_pgetevents():
    ds = aiocalls.deepspeed_aio_calls(_ds_location())
    assert {"io_queue_init", "io_submit", "io_pgetevents", "io_queue_release", "io_prep_pread"} <= set(ds["calls"])
    assert any(p.endswith("deepspeed_aio_common.cpp") for p in ds["sources"])
    assert aiocalls.plan(ds["calls"]) == {"init": "io_queue_init", "wait": "io_pgetevents",
                                          "release": "io_queue_release"}
    assert aiocalls.deepspeed_aio_calls(None)["calls"] is None


def test_an_old_libaio_links_io_setup_but_not_what_deepspeed_calls(tmp_path):
    env = build_libaio(tmp_path / "old", with_pgetevents=False)
    ds_loc = _ds_location()
    basic, _ = io.libaio_status(env)  # DeepSpeed unknown: libaio's basic calls, which this libaio has
    assert basic["ok"] is True and basic["link_test"]["ran_ok"] is True
    assert basic["link_test"]["calls"] is None and "unknown" in basic["link_test"]["calls_why"]
    facts, ev = io.libaio_status(env, ds_location=ds_loc)
    assert facts["ok"] is False and facts["link_test"]["failed_call"] == "io_pgetevents"
    (f,) = check_libaio(facts_of(storage={"libaio": facts}))
    assert f.status == "fail"
    assert f.title == "libaio has no io_pgetevents, which DeepSpeed's async_io calls: the op cannot be built"
    assert "0.3.111" in f.detail and "io_pgetevents" in f.detail
    (basic_f,) = check_libaio(facts_of(storage={"libaio": basic}))
    assert basic_f.status == "ok" and "which calls the installed DeepSpeed makes is unknown" in basic_f.title


def test_a_libaio_with_deepspeeds_calls_runs_them_for_real(tmp_path):
    env = build_libaio(tmp_path / "new", with_pgetevents=True)
    facts, ev = io.libaio_status(env, ds_location=_ds_location())
    assert facts["ok"] is True, facts
    ran = next(e for e in ev if e.label.startswith("run the libaio test program"))
    assert ran.exit_code == 0 and ran.stdout.strip() == "OK"
    (f,) = check_libaio(facts_of(storage={"libaio": facts}))
    assert f.status == "ok"
    assert f.title == ("libaio makes the calls DeepSpeed's async_io makes (io_queue_init, io_submit, io_pgetevents, "
                       "io_queue_release)")


def test_the_storage_probe_reads_deepspeed_from_the_training_interpreter(tmp_path):
    env = {**os.environ, **build_libaio(tmp_path / "old", with_pgetevents=False)}
    load_vocabulary()
    host = LiveHost(python=str(dsenv.ensure()), env=env, options={"offload_path": str(tmp_path)})
    facts = host.results(["pyenv", "storage"])
    lt = facts.of("storage")["libaio"]["link_test"]
    assert "io_pgetevents" in (lt["calls"] or []) and lt["failed_call"] == "io_pgetevents"
    assert check_libaio(facts)[0].status == "fail"
