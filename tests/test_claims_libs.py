"""Sentences of the library checks are checked against the facts they rest on, on real broken states: real
libstdc++ copies, modules built with g++, the real loader."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
from envkit import build_extension, make_old_libstdcxx
from test_forensics_e2e import PY, bash, check, env_with, findings, import_cmd

from zdoctor.readers.elf import read_elf


@pytest.fixture(scope="module")
def copies(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("copies")
    return {
        # GCC 10's copy: lacks GLIBCXX_3.4.30, the node the module's error names
        "old": make_old_libstdcxx(root / "old").parent,
        # has GLIBCXX_3.4.30 but lacks GLIBCXX_3.4.11, a node the same module needs (checked before 3.4.30,
        # so the loader's message never names it)
        "holey": make_old_libstdcxx(root / "holey", drop=("GLIBCXX_3.4.11",)).parent,
        "exts": root / "exts",
        "mod": build_extension(root / "exts", "runmod"),
    }


def test_the_copy_named_as_having_every_version_has_those_of_the_runs_own_module(copies):
    """The failing command's own module is no library of the training's: its needs still count, all of them,
    not only the one node the loader's message names."""
    env = env_with(LD_LIBRARY_PATH=f"{copies['old']}:{copies['holey']}")
    cmd = import_cmd(PY, copies["exts"], "runmod")
    real = bash(cmd, env)
    assert real.returncode == 1 and "GLIBCXX_3.4.30' not found" in real.stderr
    assert "GLIBCXX_3.4.11" not in real.stderr

    rc, doc = check(["--python", PY, "--command", cmd], env)
    assert rc == 1
    (f,) = findings(doc, "libs.glibcxx", "fail")
    m = re.search(r"^A copy with every needed version(?: \(.*\))?: (?P<path>/\S+)\.$", f["detail"], re.M)
    assert m, f["detail"]
    named = m.group("path")
    assert Path(named).resolve().parent not in (copies["old"], copies["holey"])
    module_needs = {v for v, weak in read_elf(str(copies["mod"])).needs_from("libstdc++.so.6") if not weak}
    assert module_needs <= set(read_elf(named).verdef or []), named
    # the real loader agrees: with that copy forced first, the command runs
    assert bash(shlex.join(["env", f"LD_PRELOAD={named}"]) + " " + cmd, env).returncode == 0

    (inv,) = findings(doc, "libs.inventory")
    holey = next(line for line in inv["detail"].splitlines() if line.startswith(str(copies["holey"])))
    assert "lacks GLIBCXX_3.4.11" in holey
    assert "2 lack a version the training needs" in inv["title"]



OP_SOURCE = r"""
#include <Python.h>
static PyMethodDef methods[] = {{nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "jitop", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_jitop(void) { return PyModule_Create(&mod); }
"""


@pytest.fixture(scope="module")
def torch_op(tmp_path_factory) -> dict[str, Path]:
    """A JIT-built op as torch leaves one: it needs libc10.so with no RUNPATH (torch has loaded it by then)."""
    import dsenv

    python = dsenv.ensure()
    root = tmp_path_factory.mktemp("jitop")
    torch_lib = subprocess.run([str(python), "-c", "import os, torch; print(os.path.dirname(torch.__file__))"],
                               capture_output=True, text=True, check=True).stdout.strip() + "/lib"
    include = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    cache = root / "cache"
    op_dir = cache / "jitop"
    op_dir.mkdir(parents=True)
    (op_dir / "build.ninja").write_text("ninja_required_version = 1.3\ncxx = c++\n")
    src = root / "jitop.cpp"
    src.write_text(OP_SOURCE)
    subprocess.run(["g++", "-shared", "-fPIC", f"-I{include}", str(src), f"-L{torch_lib}", "-Wl,--no-as-needed",
                    "-lc10", "-o", str(op_dir / "jitop.so")], check=True, capture_output=True)
    shadow = root / "shadow"
    shadow.mkdir()
    (shadow / "typing_extensions.py").write_text('raise ImportError("typing_extensions is broken here")\n')
    return {"python": python, "cache": cache, "shadow": shadow, "op": op_dir / "jitop.so"}


def test_an_op_is_not_blamed_when_import_torch_failed(torch_op):
    """torch fails to import (a stray module on PYTHONPATH): the op, which needs torch's libc10.so, is not
    loaded on its own (it would fail with 'libc10.so: cannot open shared object file'); the failure named is
    torch's, and the op is listed as not loaded because of it."""
    env = env_with(TORCH_EXTENSIONS_DIR=str(torch_op["cache"]), PYTHONPATH=str(torch_op["shadow"]))
    alone = bash(shlex.join([str(torch_op["python"]), "-c",
                             f"import ctypes; ctypes.CDLL({str(torch_op['op'])!r})"]), env)
    assert "libc10.so: cannot open shared object file" in alone.stderr  # what loading it first would say
    rc, doc = check(["--python", str(torch_op["python"])], env)
    assert rc == 1
    (live,) = findings(doc, "libs.live", "fail")
    assert "import torch fails" in live["title"]
    assert "typing_extensions is broken here" in live["detail"]
    assert "libc10.so" not in live["detail"]
    assert "load jitop (import torch failed; the launch loads it after torch)" in live["detail"]
    assert not [f for f in doc["findings"] if "libc10.so: cannot open" in f["title"] + f["detail"]]


def test_the_same_op_is_loaded_after_a_working_torch(torch_op):
    env = env_with(TORCH_EXTENSIONS_DIR=str(torch_op["cache"]))
    rc, doc = check(["--python", str(torch_op["python"])], env)
    (live,) = findings(doc, "libs.live")
    assert live["status"] == "ok", live
    assert "loads cleanly" in live["title"] and "jitop" in live["title"]


def test_the_toolchain_walk_never_ends_in_place_when_ninja_cannot_start(copies, tmp_path):
    """torch imports and a compiler compiles, but ninja (first on PATH) is stopped by the loader: the old
    libstdc++ an LD_LIBRARY_PATH entry supplies lacks a node it needs. The walk ends at the missing
    prerequisite, not at "The toolchain is in place"."""
    import dsenv
    from test_jitprereq import cxx_ninja

    python = dsenv.ensure()
    ninja = cxx_ninja(tmp_path / "bin")
    env = env_with(LD_LIBRARY_PATH=str(copies["old"]))
    env["PATH"] = f"{ninja.parent}:{env['PATH']}"
    assert "GLIBCXX_3.4.30' not found" in bash("ninja --version", env).stderr
    seen = "RuntimeError: Ninja is required to load C++ extensions"  # what torch said to the user
    rc, doc = check(["--python", str(python), "--playbook", "toolchain", "--symptom", seen], env)
    assert rc == 1
    path = next(p["path"] for p in doc["playbooks"] if p["id"] == "toolchain")
    assert path[-1] == "diag-jit-prereq" and "diag-layers" not in path
    (n,) = findings(doc, "toolchain.jit-prereq.ninja", "fail")
    (symptom,) = [s for s in doc["symptoms"] if s["text"] == seen]
    assert n["explains"] == [symptom["id"]] and symptom["explained_by"] == [n["id"]]
    drop = n["remedies"][0]  # only `ninja --version` was re-run with it: the tool starts, not "fixed"
    assert drop["commands"] == ["unset LD_LIBRARY_PATH"] and drop["verification"]["state"] == "tool_starts"
    assert not drop["verified"]


def two_releases(tmp_path: Path, *link: str) -> tuple[Path, Path, Path]:
    """libzdfoo.so.1 as release 1 (node ZDFOO_1) in old/ and release 2 (adds ZDFOO_2: foo_b) in new/, and an
    op.so linked against release 2 that calls foo_b."""
    src = tmp_path / "foo.c"
    old_map, new_map = tmp_path / "old.map", tmp_path / "new.map"
    old_map.write_text("ZDFOO_1 { global: foo_a; local: *; };\n")
    new_map.write_text("ZDFOO_1 { global: foo_a; local: *; };\nZDFOO_2 { global: foo_b; } ZDFOO_1;\n")
    src.write_text("int foo_a(void) { return 1; }\nint foo_b(void) { return 2; }\n")
    old, new = tmp_path / "old", tmp_path / "new"
    for d, vmap in ((old, old_map), (new, new_map)):
        d.mkdir()
        subprocess.run(["gcc", "-shared", "-fPIC", str(src), f"-Wl,--version-script={vmap}",
                        "-Wl,-soname,libzdfoo.so.1", "-o", str(d / "libzdfoo.so.1")], check=True)
    (new / "libzdfoo.so").symlink_to("libzdfoo.so.1")
    op_src = tmp_path / "op.c"
    op_src.write_text("int foo_b(void);\nint run_it(void) { return foo_b(); }\n")
    op = tmp_path / "op.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(op_src), f"-L{new}", "-lzdfoo", *link, "-o", str(op)],
                   check=True)
    return old, new, op


def test_another_librarys_missing_version_node_is_no_libstdcxx_finding(tmp_path):
    """op.so needs node ZDFOO_2 of libzdfoo.so.1; the copy loaded defines only ZDFOO_1. The loader's message
    has the libstdc++ message's shape, but no libstdc++ copy lacks anything: no libstdc++ finding or remedy
    claims it. The finding names the library, the release loaded and the node it lacks."""
    old, new, op = two_releases(tmp_path, f"-Wl,-rpath,{tmp_path / 'old'}")
    cmd = shlex.join([PY, "-c", f"import ctypes; ctypes.CDLL({str(op)!r})"])
    env = env_with()
    real = bash(cmd, env)
    assert f"version `ZDFOO_2' not found (required by {op})" in real.stderr

    rc, doc = check(["--python", PY, "--command", cmd], env)
    assert rc == 1
    assert not [f for f in findings(doc, "libs.glibcxx") if "ZDFOO_2" in f["title"] + f["detail"]]
    assert not [r for f in doc["findings"] for r in f["remedies"] if "libstdc++" in r["title"]]
    (live,) = findings(doc, "libs.live", "fail")
    assert "ZDFOO_2" in live["detail"]
    (sym,) = findings(doc, "libs.symbols", "fail")
    assert sym["title"] == (f"op.so needs ZDFOO_2 of libzdfoo.so.1: the loaded copy ({old}/libzdfoo.so.1) is "
                            "another release, and no other copy found has it")
    assert "defines ZDFOO_1: it is another release" in sym["detail"]
    (symptom,) = [x for x in doc["symptoms"] if "ZDFOO_2" in x["text"]]
    assert "libs.symbols" in symptom["explained_by"]


def test_a_release_shadowed_by_an_ld_library_path_entry(tmp_path):
    """op.so's own RUNPATH names release 2, but LD_LIBRARY_PATH (searched first) holds release 1: the copy
    with the node is named, and dropping the entry was tried by re-running the command."""
    old, new, op = two_releases(tmp_path, f"-Wl,--enable-new-dtags,-rpath,{tmp_path / 'new'}")
    cmd = shlex.join([PY, "-c", f"import ctypes; ctypes.CDLL({str(op)!r})"])
    env = env_with(LD_LIBRARY_PATH=str(old))
    assert "ZDFOO_2' not found" in bash(cmd, env).stderr
    rc, doc = check(["--python", PY, "--command", cmd], env)
    (sym,) = findings(doc, "libs.symbols", "fail")
    assert f"{new}/libzdfoo.so.1 has it" in sym["title"]
    drop = sym["remedies"][0]
    assert drop["commands"] == ["unset LD_LIBRARY_PATH"] and drop["verified"]
