"""Sentences of the library checks are checked against the facts they rest on, on real broken states: real
libstdc++ copies, modules built with g++, the real loader."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from envkit import build_extension, make_old_libstdcxx
from test_forensics_e2e import PY, bash, check, env_with, findings, import_cmd

from zdoctor.forensics.elf import read_elf


@pytest.fixture(scope="module")
def copies(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("h1copies")
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

