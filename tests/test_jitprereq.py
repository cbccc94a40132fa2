"""JIT build prerequisites with real tools where this machine has them (the system g++, this interpreter's
Python.h) and stand-ins on PATH where it cannot break its own: a venv-style bin directory holding ninja,
a pdsh/ssh PATH from an /etc/environment file, an interpreter without headers, a compiler driver without
its back end."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

from envkit import make_conda_like_python
from test_gpu_facts import h200

from zdoctor.core.model import Remedy
from zdoctor.core.present import TOOL_STARTS, verification_of, verification_text
from zdoctor.layers.toolchain.check_jitprereq import check_jitprereq
from zdoctor.layers.toolchain.probe_jitprereq import collect_jitprereq

CXX = shutil.which("c++") or shutil.which("g++")


def script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def venv_with_ninja(tmp: Path) -> Path:
    """An environment's bin/ with a python (this interpreter) and ninja, as `pip install ninja` leaves it."""
    bindir = tmp / "venv" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "python").symlink_to(sys.executable)
    script(bindir / "ninja", "echo 1.11.1\n")
    return bindir


def etc_env(tmp: Path, path: str) -> str:
    f = tmp / "environment"
    f.write_text(f'PATH="{path}"\n')
    return str(f)


def findings(facts_doc):
    return {f.id: f for f in check_jitprereq(h200(jitprereq=facts_doc))}


def test_everything_in_place_with_the_real_compiler_and_headers(tmp_path):
    bindir = venv_with_ninja(tmp_path)
    env = {"PATH": f"{bindir}:/usr/bin:/bin"}
    f, _ = collect_jitprereq(env, str(bindir / "python"), CXX, etc_env(tmp_path, f"{bindir}:/usr/bin:/bin"))
    found = findings(f)
    assert found["toolchain.jit-prereq.ninja"].status == "ok"
    assert found["toolchain.jit-prereq.python-h"].status == "ok"
    c = found["toolchain.jit-prereq.compile"]
    assert c.status == "ok" and "includes Python.h" in c.title


def test_ninja_beside_an_unactivated_interpreter(tmp_path):
    bindir = venv_with_ninja(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    f, _ = collect_jitprereq({"PATH": str(empty)}, str(bindir / "python"), CXX, etc_env(tmp_path, str(empty)))
    n = findings(f)["toolchain.jit-prereq.ninja"]
    assert n.status == "fail" and "Ninja is required to load C++ extensions" in n.title
    assert n.remedies[0].commands == [f'export PATH={bindir}:"$PATH"']


def test_ninja_missing_from_the_path_pdsh_ranks_get(tmp_path):
    bindir = venv_with_ninja(tmp_path)
    sysbin = tmp_path / "sysbin"
    sysbin.mkdir()
    f, _ = collect_jitprereq({"PATH": f"{bindir}:/usr/bin"}, str(bindir / "python"), CXX,
                             etc_env(tmp_path, str(sysbin)))
    n = findings(f)["toolchain.jit-prereq.ninja"]
    assert n.status == "warn" and f"only in {bindir}" in n.title and "pdsh" in n.title
    assert str(sysbin) in n.detail and ".deepspeed_env" in n.detail
    assert n.remedies[0].commands == ['printf \'PATH=%s\\n\' "$PATH" >> ~/.deepspeed_env']


def test_python_h_missing_for_a_system_interpreter(tmp_path):
    inc = tmp_path / "include" / "python3.11"
    inc.mkdir(parents=True)
    answer = json.dumps({"paths": {"include": str(inc)}, "version": "3.11", "prefix": "/usr"})
    py = script(tmp_path / "bin" / "python3", f"echo '{answer}'\n")
    f, _ = collect_jitprereq({"PATH": "/usr/bin:/bin"}, str(py), CXX, etc_env(tmp_path, "/usr/bin:/bin"))
    h = findings(f)["toolchain.jit-prereq.python-h"]
    assert h.status == "fail" and "Python.h is missing" in h.title and "Python.h: No such file" in h.detail
    assert h.remedies[0].commands == ["apt-get update", "apt-get install -y python3.11-dev"]


def test_a_compiler_that_cannot_compile_one_line(tmp_path):
    broken = script(tmp_path / "bin" / "c++", "echo \"c++: fatal error: cannot execute 'cc1plus': execvp: No "
                    "such file or directory\" >&2\nexit 1\n")
    f, _ = collect_jitprereq({"PATH": os.environ["PATH"]}, sys.executable, str(broken),
                             etc_env(tmp_path, "/usr/bin:/bin"))
    c = findings(f)["toolchain.jit-prereq.compile"]
    assert c.status == "fail" and "cannot compile a one-line C++ file" in c.title and "cc1plus" in c.detail
    assert any("g++" in cmd or "gcc-c++" in cmd for r in c.remedies for cmd in r.commands)


def headers_without(prefix: Path, missing: str) -> Path:
    """This interpreter's headers copied into ``prefix``'s include dir, less the header ``missing``."""
    import sysconfig

    src = Path(sysconfig.get_paths()["include"])
    dest = prefix / "include" / src.name
    shutil.copytree(src, dest, symlinks=True)
    (dest / missing).unlink()
    return dest


def test_python_h_present_but_a_header_it_includes_is_missing(tmp_path):
    """Python.h is there, pyconfig.h (which it includes) is not: the compile of a file including Python.h
    fails, and that compile's error is the finding, never an ok."""
    prefix = tmp_path / "env"
    python = make_conda_like_python(prefix)
    (prefix / "conda-meta").mkdir()
    inc = headers_without(prefix, "pyconfig.h")
    env = {"PATH": "/usr/bin:/bin"}
    f, _ = collect_jitprereq(env, str(python), CXX, etc_env(tmp_path, "/usr/bin:/bin"))
    assert f["python_headers"]["include"] == str(inc) and f["python_headers"]["python_h"] is True
    c = findings(f)["toolchain.jit-prereq.compile"]
    assert c.status == "fail", c.title
    assert "cannot compile a file that includes Python.h" in c.title and "pyconfig.h" in c.title
    assert "No such file or directory" in c.detail
    ver = "{}.{}".format(*sys.version_info[:2])
    assert c.remedies[0].commands == [f"conda install -y -p {prefix} --force-reinstall python={ver}"]


def test_a_venvs_headers_come_from_its_base_interpreter(tmp_path):
    """A venv made from that interpreter has no headers of its own: the remedy completes the base."""
    import subprocess

    base = tmp_path / "base"
    python = make_conda_like_python(base)
    (base / "conda-meta").mkdir()
    headers_without(base, "pyconfig.h")
    venv = tmp_path / "venv"
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    f, _ = collect_jitprereq({"PATH": "/usr/bin:/bin"}, str(venv / "bin" / "python"), CXX,
                             etc_env(tmp_path, "/usr/bin:/bin"))
    assert f["python_headers"]["base_prefix"] == str(base)
    c = findings(f)["toolchain.jit-prereq.compile"]
    assert c.status == "fail"
    (r,) = c.remedies
    assert f"conda environment {base} (the base interpreter of the venv {venv})" in r.title
    assert r.commands[0].startswith(f"conda install -y -p {base} ")


def test_headers_of_a_pyenv_base_and_of_a_system_python_per_distribution(tmp_path):
    from zdoctor.layers.toolchain.check_jitprereq import header_remedies

    pyenv = {"version": "3.11", "prefix": "/home/u/v", "base_prefix": "/home/u/.pyenv/versions/3.11.7"}
    (r,) = header_remedies(pyenv, h200())
    assert r.commands == ["pyenv install --force 3.11.7"] and "the venv /home/u/v" in r.title
    system = {"version": "3.11", "prefix": "/usr", "base_prefix": "/usr", "base_executable": "/usr/bin/python3.11"}
    rocky = {"id": "rocky", "id_like": ["rhel", "centos", "fedora"], "version_id": "9.3"}
    suse = {"id": "opensuse-leap", "id_like": ["suse", "opensuse"]}
    ubuntu = {"id": "ubuntu", "id_like": ["debian"]}
    for distro, want in ((rocky, ["dnf install -y python3.11-devel"]), (suse, ["zypper install -y python311-devel"]),
                         (ubuntu, ["apt-get update", "apt-get install -y python3.11-dev"])):
        facts = h200(toolchain=dict(h200()["toolchain"].facts, distro=distro))
        (r,) = header_remedies(system, facts)
        assert r.commands == want and r.requires_root


NINJA_SOURCE = r"""
#include <condition_variable>
#include <cstdio>
#include <mutex>
static std::mutex m;
static std::condition_variable cv;
int main() {
    static volatile int never = 0;
    std::unique_lock<std::mutex> lk(m);
    if (never) cv.wait(lk);   /* GLIBCXX_3.4.30, as a ninja built by GCC 12 needs */
    std::puts("1.11.1");
    return 0;
}
"""


def cxx_ninja(bindir: Path) -> Path:
    """A ninja built with the system g++: a real C++ program that needs the system libstdc++'s newest nodes."""
    import subprocess

    bindir.mkdir(parents=True, exist_ok=True)
    src = bindir.parent / "ninja.cpp"
    src.write_text(NINJA_SOURCE)
    subprocess.run(["g++", "-O0", str(src), "-o", str(bindir / "ninja")], check=True, capture_output=True)
    return bindir / "ninja"


def test_ninja_found_but_unable_to_start_under_the_loaded_libstdcxx(tmp_path):
    """ninja is on PATH, but an LD_LIBRARY_PATH entry gives it an older libstdc++: `ninja --version` fails
    in the loader, so the finding fails; dropping the entry was tried and made ninja start, which is "tried:
    the tool starts", never "tried: fixed" (the failing command itself was not re-run)."""
    from envkit import make_old_libstdcxx

    ninja = cxx_ninja(tmp_path / "bin")
    old = make_old_libstdcxx(tmp_path / "old").parent
    keep = tmp_path / "keep"
    keep.mkdir()
    env = {"PATH": f"{ninja.parent}:/usr/bin:/bin", "LD_LIBRARY_PATH": f"{old}:{keep}"}
    f, _ = collect_jitprereq(env, sys.executable, CXX, etc_env(tmp_path, f"{ninja.parent}:/usr/bin:/bin"))
    n = findings(f)["toolchain.jit-prereq.ninja"]
    assert n.status == "fail", n.title
    assert f"ninja at {ninja} cannot start under the training environment" in n.title
    assert "GLIBCXX_3.4.30' not found" in n.title
    drop = n.remedies[0]
    assert drop.commands == [f"export LD_LIBRARY_PATH={keep}"]
    assert drop.tried and not drop.verified and "1.11.1" in drop.note
    v = verification_of(drop)
    assert v.state == TOOL_STARTS and verification_text(v).startswith("tried: the tool starts — ")
    said = drop.to_dict()
    assert said["verified"] is False and said["verification"]["state"] == "tool_starts"
    assert verification_of(Remedy.from_dict(said)).state == TOOL_STARTS  # a recorded session reads it back
    assert not n.remedies[1].tried and n.remedies[1].note.startswith("not tried, because")
    # and the same ninja is ok, saying it ran, where nothing shadows the libstdc++ it needs
    f, _ = collect_jitprereq({"PATH": env["PATH"]}, sys.executable, CXX, etc_env(tmp_path, env["PATH"]))
    ok = findings(f)["toolchain.jit-prereq.ninja"]
    assert ok.status == "ok" and "runs (`ninja --version`: 1.11.1)" in ok.title
