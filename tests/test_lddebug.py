"""LD_DEBUG parsing on real captures: an H200 CUDA torch import and small traces made with g++ and glibc 2.36."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from zdoctor.layers.libraries.lddebug import (
    CACHE,
    LD_LIBRARY_PATH,
    SYSTEM,
    all_version_errors,
    parse_ld_debug,
    parse_ld_debug_dir,
    summarize,
    via_label,
    which_loaded,
)
from zdoctor.readers.versions import newest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
LD = FIXTURES / "lddebug"
VENV = "/opt/torch/.venv/lib/python3.12/site-packages"
PYTHON = "/root/.pyenv/versions/3.11.7"
CTYPES = f"{PYTHON}/lib/python3.11/lib-dynload/_ctypes.cpython-311-x86_64-linux-gnu.so"


def load(name: str):
    return parse_ld_debug((LD / name).read_text())


@pytest.fixture(scope="module")
def h200():
    with gzip.open(FIXTURES / "gpu-node-h200" / "ld-debug-torch-cuda.txt.gz", "rt") as fh:
        return parse_ld_debug(fh.read())


# --- the H200 capture: `import torch` with CUDA, LD_DEBUG=libs,versions (no "files" lines) ---------------

def test_h200_one_process_and_every_lookup_resolved(h200):
    assert list(h200) == [719]
    t = h200[719]
    assert not t.files_category
    assert len(t.lookups) == 30
    assert all(lk.found for lk in t.lookups)
    assert len(t.inits) == 63
    assert t.inits[-1] == "/usr/local/nvidia/lib64/libnvidia-ml.so.1"


def test_h200_torch_got_the_system_libstdcxx_from_the_cache(h200):
    rows = which_loaded(h200)
    assert rows == [(719, "/lib/x86_64-linux-gnu/libstdc++.so.6", "[ld.so.cache]",
                     f"{VENV}/nvidia/cudnn/lib/libcudnn.so.9")]
    lk = next(lk for lk in h200[719].lookups if lk.name == "libstdc++.so.6")
    # searched LD_LIBRARY_PATH, then cuDNN's RUNPATH (4 dirs with hwcaps), then the cache
    assert [s.source for s in lk.search_steps] == [
        LD_LIBRARY_PATH, f"RUNPATH from file {VENV}/nvidia/cudnn/lib/libcudnn.so.9", CACHE]
    assert lk.search_steps[0].dirs == ["/usr/local/nvidia/lib64", "/usr/local/nvidia/lib"]
    assert len(lk.tried) == 7 and lk.tried[-1] == "/lib/x86_64-linux-gnu/libstdc++.so.6"
    assert lk.needed_by_inferred  # no "file=" lines: taken from the version checks of that load


def test_h200_version_needs_against_libstdcxx(h200):
    t = h200[719]
    need = [v for v, prov, _ in t.version_checks if prov == "/lib/x86_64-linux-gnu/libstdc++.so.6"]
    assert len(need) == 132
    assert newest(need, "GLIBCXX") == "GLIBCXX_3.4.22"
    assert newest(need, "CXXABI") == "CXXABI_1.3.11"
    assert t.version_errors == [] and all_version_errors(h200) == []


def test_h200_where_cuda_and_torch_libraries_came_from(h200):
    t = h200[719]
    assert which_loaded(h200, "libcuda.so") == [(719, "/usr/local/nvidia/lib64/libcuda.so.1",
                                                 "[LD_LIBRARY_PATH]", None)]
    by_name = {lk.name: lk for lk in t.lookups}
    assert via_label(by_name["libtorch_python.so"]) == (
        f"[rpath of {VENV}/torch/_C.cpython-312-x86_64-linux-gnu.so]")
    assert by_name["libtorch_python.so"].found == f"{VENV}/torch/lib/libtorch_python.so"
    assert by_name["libcudart.so.13"].found == f"{VENV}/torch/lib/../../nvidia/cu13/lib/libcudart.so.13"
    assert via_label(by_name["libgomp.so.1"]) == f"[rpath of {VENV}/torch/lib/libtorch_global_deps.so]"
    assert t.loaded["libgomp.so.1"] == f"{VENV}/torch/lib/libgomp.so.1"


def test_h200_loader_errors_kept(h200):
    assert h200[719].errors == [
        "python3: error: symbol lookup error: undefined symbol: InitializeInjectionCaskEnhanced (fatal)"]


# --- traces captured here (generate.sh) ----------------------------------------------------------------

def test_old_libstdcxx_on_ld_library_path_fails_the_import():
    traces = load("import-old-libstdcxx.ld")
    (pid,) = traces
    t = traces[pid]
    assert t.files_category
    assert which_loaded(traces) == [(pid, "/tmp/zdemo/old/libstdc++.so.6", "[LD_LIBRARY_PATH]",
                                     "/tmp/zdemo/cvwait.so")]
    (err,) = t.version_errors
    assert (err.provider, err.version, err.required_by, err.fatal, err.pid) == (
        "/tmp/zdemo/old/libstdc++.so.6", "GLIBCXX_3.4.30", "/tmp/zdemo/cvwait.so", True, pid)
    # the need was checked against the copy that won
    assert ("GLIBCXX_3.4.30", "/tmp/zdemo/old/libstdc++.so.6", "/tmp/zdemo/cvwait.so") in t.version_checks
    # libgcc_s was not in that dir: the first candidate failed, the cache one was loaded
    gcc = next(lk for lk in t.lookups if lk.name == "libgcc_s.so.1")
    assert gcc.tried == ["/tmp/zdemo/old/libgcc_s.so.1", "/lib/x86_64-linux-gnu/libgcc_s.so.1"]
    assert gcc.found == "/lib/x86_64-linux-gnu/libgcc_s.so.1" and gcc.found_via == CACHE
    assert not gcc.needed_by_inferred and gcc.needed_by == "/tmp/zdemo/cvwait.so"


def test_dlopen_reuse_and_a_library_that_is_nowhere():
    traces = load("ctypes-reuse-missing.ld")
    (pid,) = traces
    t = traces[pid]
    assert which_loaded(traces) == [
        (pid, "/lib/x86_64-linux-gnu/libstdc++.so.6", "[ld.so.cache]", CTYPES),
        (pid, "/lib/x86_64-linux-gnu/libstdc++.so.6", "[already loaded]", None),
    ]
    first = next(lk for lk in t.lookups if lk.name == "libstdc++.so.6")
    assert first.dynamically_loaded
    missing = next(lk for lk in t.lookups if lk.name == "libnothere.so.1")
    assert missing.found is None and missing.found_via is None
    assert [s.source for s in missing.search_steps][-1] == SYSTEM
    assert missing.tried[-1] == missing.candidate == "/usr/lib/libnothere.so.1"
    assert "libnothere.so.1" not in t.loaded


def test_libs_only_trace_tells_found_from_not_found():
    traces = load("ctypes-libs-only.ld")
    t = next(iter(traces.values()))
    assert not t.files_category
    lk = {x.name: x for x in t.lookups}
    assert lk["libstdc++.so.6"].found == "/lib/x86_64-linux-gnu/libstdc++.so.6"
    assert lk["libstdc++.so.6"].found_via == CACHE
    # the search ran to the last system directory and nothing shows that file loaded
    assert lk["libnothere.so.1"].found is None
    assert lk["libnothere.so.1"].candidate == "/usr/lib/libnothere.so.1"


def test_wrong_elf_class_copy_is_skipped():
    traces = load("wrong-class-skipped.ld")
    lk = next(x for t in traces.values() for x in t.lookups if x.name == "libstdc++.so.6")
    assert lk.tried[0] == "/tmp/zdemo/wrongclass/libstdc++.so.6"
    assert lk.found == "/lib/x86_64-linux-gnu/libstdc++.so.6"
    assert via_label(lk) == "[ld.so.cache]"


def test_preload_is_labelled_when_the_preload_list_is_known():
    traces = load("preload.ld")
    (pid,) = traces
    exe = f"{PYTHON}/bin/python3"
    assert which_loaded(traces) == [(pid, "/lib/x86_64-linux-gnu/libstdc++.so.6", "[ld.so.cache]", exe)]
    assert which_loaded(traces, preload=["libstdc++.so.6"]) == [
        (pid, "/lib/x86_64-linux-gnu/libstdc++.so.6", "[LD_PRELOAD]", exe)]
    assert which_loaded(traces, system_preload=["libstdc++.so.6"])[0][2] == "[/etc/ld.so.preload]"


def test_rpath_and_runpath_in_two_interleaved_processes():
    traces = load("rpath-runpath-stderr.ld")
    assert len(traces) == 2
    a, b = which_loaded(traces)
    assert a[1:] == ("/tmp/zdemo/rp/libstdc++.so.6", "[rpath of /tmp/zdemo/cvrpath.so]", "/tmp/zdemo/cvrpath.so")
    assert b[1:] == ("/tmp/zdemo/rn/libstdc++.so.6", "[runpath of /tmp/zdemo/cvrunpath.so]",
                     "/tmp/zdemo/cvrunpath.so")


def test_missing_version_at_program_start():
    traces = load("startup-missing-versions.ld")
    (err,) = all_version_errors(traces)
    assert (err.version, err.required_by, err.fatal) == ("GLIBCXX_3.4.30", "/tmp/zdemo/prog", False)
    assert err.message.endswith("(continued)")
    assert which_loaded(traces)[0][1:3] == ("/tmp/zdemo/old/libstdc++.so.6", "[LD_LIBRARY_PATH]")


def test_other_text_mixed_in_is_ignored():
    text = (LD / "import-old-libstdcxx.ld").read_text()
    noisy = "\n".join(f"Traceback noise {i}\n{line}\n  12: not a debug line" for i, line in
                      enumerate(text.splitlines()))
    assert which_loaded(parse_ld_debug(noisy)) == which_loaded(parse_ld_debug(text))
    assert parse_ld_debug("") == {}
    assert parse_ld_debug("garbage\n\x00\xff\n  42:\tfile=x [0];  generating link map\n")[42].loaded == {
        "x": "x"}


def test_summary_is_json():
    doc = summarize(load("ctypes-reuse-missing.ld"))
    (entry,) = doc.values()
    assert entry["not_found"] == ["libnothere.so.1"]
    assert {"name": "libstdc++.so.6", "path": "/lib/x86_64-linux-gnu/libstdc++.so.6", "via": "[ld.so.cache]",
            "needed_by": CTYPES} in entry["loaded"]
    json.dumps(doc)
    json.dumps(next(iter(load("import-old-libstdcxx.ld").values())).to_dict())


def test_parse_dir_reads_pid_files_only_and_bounds_them(tmp_path):
    text = (LD / "import-old-libstdcxx.ld").read_text()
    pid = next(iter(parse_ld_debug(text)))
    (tmp_path / f"ld.{pid}").write_text(text)
    (tmp_path / "ld.notapid").write_text(text.replace(f"{pid}:", "1:"))
    (tmp_path / "other.77").write_text(text.replace(f"{pid}:", "77:"))
    big = (LD / "ctypes-reuse-missing.ld").read_text()
    big_pid = next(iter(parse_ld_debug(big)))
    (tmp_path / f"ld.{big_pid}").write_text(big)
    traces = parse_ld_debug_dir(str(tmp_path), "ld")
    assert sorted(traces) == sorted({pid, big_pid})
    assert not any(t.truncated for t in traces.values())
    cut = parse_ld_debug_dir(str(tmp_path), "ld", limit=4096)
    assert all(t.truncated for t in cut.values())
    assert all(t.lines < traces[p].lines for p, t in cut.items())
    assert parse_ld_debug_dir(str(tmp_path / "missing"), "ld") == {}
