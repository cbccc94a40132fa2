"""A newer libstdc++ held only as its versioned file (no libstdc++.so.6 link, pytorch#157709): zdoctor
offers the preload of that file and the missing link, and tries both without changing the machine."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from envkit import build_extension, make_conda_like_python, make_old_libstdcxx, system_libstdcxx

import zdoctor.layers.libraries.probe_libs  # noqa: F401 - registers the library probes
import zdoctor.layers.python_env.probe_pyenv  # noqa: F401 - and the interpreter probe
from zdoctor.host import LiveHost


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("versioned")
    python = make_conda_like_python(root / "env")  # DT_RPATH $ORIGIN/../lib, as conda's python has
    versioned = root / "env" / "lib" / "libstdc++.so.6.0.30"
    shutil.copy2(system_libstdcxx(), versioned)  # the env's newer runtime, without its libstdc++.so.6 link
    old = make_old_libstdcxx(root / "old").parent  # an older copy further down the search path
    ext = build_extension(root / "ext", "cvneeds", needs_new=True)  # needs GLIBCXX_3.4.30
    return {"root": root, "python": python, "versioned": versioned, "old": old, "ext": ext}


def _env(lab: dict[str, Path]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "CONDA", "PYTHON"))}
    env["LD_LIBRARY_PATH"] = str(lab["old"])
    return env


def _command(lab: dict[str, Path]) -> str:
    return shlex.join([str(lab["python"]), "-c", f"import sys; sys.path.insert(0, {str(lab['ext'].parent)!r}); "
                       "import cvneeds; cvneeds.touch(); print('loaded')"])


def test_the_link_and_the_preload_are_tried_and_the_link_really_fixes_it(lab):
    env, cmd = _env(lab), _command(lab)
    real = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=120)
    assert real.returncode != 0 and "GLIBCXX_3.4.30' not found" in real.stderr  # the failure, for real
    host = LiveHost(python=str(lab["python"]), env=env, command=cmd, timeout=120)
    res = host.result("libfix")
    assert res.status == "ok", res.error
    plans = {p["key"]: p for p in res.facts["plans"]}
    link = plans["libstdcxx-link"]
    pre = plans["ld-preload-versioned"]
    assert pre["verified"] and pre["env_changes"]["LD_PRELOAD"].split()[0] == str(lab["versioned"])
    assert link["verified"], link["verification"]
    assert "private temp directory" in link["verification"]
    assert link["commands"] == [shlex.join(["ln", "-s", "--", "libstdc++.so.6.0.30",
                                            str(lab["versioned"].parent / "libstdc++.so.6")])]
    # Trying changed nothing: the env still has no link, and no trial directory is left behind.
    assert not os.path.lexists(lab["versioned"].parent / "libstdc++.so.6")
    # The offered link, made for real (in the test's env), fixes the command: the trial told the truth.
    fixed = subprocess.run(["bash", "-c", "\n".join([*link["commands"], cmd])], env=env, cwd=lab["root"],
                           capture_output=True, text=True, timeout=120)
    try:
        assert fixed.returncode == 0 and "loaded" in fixed.stdout, fixed.stderr
    finally:
        os.unlink(lab["versioned"].parent / "libstdc++.so.6")


def test_no_link_is_offered_where_the_loader_would_never_look(lab):
    """For an interpreter without conda's RPATH the env's lib dir is never searched: a link there would not
    change what loads, so only the preload is offered (a trial through LD_LIBRARY_PATH would have lied)."""
    from zdoctor.layers.libraries.versioned import propose_versioned, searched_before_winner

    env = _env(lab)
    libdir = os.path.normpath(str(lab["versioned"].parent))
    assert libdir in searched_before_winner(str(lab["ext"]), env, [libdir])  # with the RPATH: reached
    assert libdir not in searched_before_winner(str(lab["ext"]), env, [])  # without it: never
    failures = [{"version": "GLIBCXX_3.4.30", "required_by": str(lab["ext"]),
                 "provider": str(lab["old"] / "libstdc++.so.6")}]
    libs = {"interpreter": {"path": "/usr/bin/python3", "rpath_dirs": [], "runpath_dirs": [],
                            "prefix": str(lab["versioned"].parent.parent)}}
    plans = propose_versioned(libs, env, ["GLIBCXX_3.4.30"], failures, ["x"])
    assert [p.key for p in plans] == ["ld-preload-versioned"]
    libs["interpreter"]["rpath_dirs"] = [libdir]
    plans = propose_versioned(libs, env, ["GLIBCXX_3.4.30"], failures, ["x"])
    assert [p.key for p in plans] == ["ld-preload-versioned", "libstdcxx-link"]
