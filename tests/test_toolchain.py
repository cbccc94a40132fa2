"""The toolchain probe on real and scripted compilers, its checks, and the toolchain playbook."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path
from typing import Any

import pytest

import zdoctor.layers.python_env.check_pyenv
import zdoctor.layers.toolchain.check_toolchain  # noqa: F401 - registers checks and predicates

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from zdoctor.core.model import Evidence, ProbeResult
from zdoctor.core.registry import CHECKS, PREDICATES, PROBES, Facts
from zdoctor.core.resources import data_dir
from zdoctor.host import LiveHost, ReplayHost, snapshot_document
from zdoctor.layers import evaluate_check
from zdoctor.layers.python_env import probe_pyenv as pyenv_probe
from zdoctor.layers.toolchain import probe_toolchain as tc
from zdoctor.readers.gccver import glibcxx_for_gcc, parse_torch_config, parse_version_output, toolset_of, version_tuple
from zdoctor.walk.engine import Walk
from zdoctor.walk.playbook import load_playbook
from zdoctor.walk.playbook_lint import lint_playbook

FIXTURES = Path(__file__).parent / "fixtures" / "gpu-node-h200"
H200 = json.loads((FIXTURES / "python.json").read_text())
UBUNTU_GXX = "g++ (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0"
RH_GXX = "g++ (GCC) 13.3.1 20240611 (Red Hat 13.3.1-2)"
FSF = "Copyright (C) 2023 Free Software Foundation, Inc."


def fake_compiler(bindir: Path, name: str, banner: str, *, fsf: bool = True) -> Path:
    """A real executable that answers --version like a compiler and fails on anything else."""
    bindir.mkdir(parents=True, exist_ok=True)
    exe = bindir / name
    lines = " ".join(shlex.quote(ln) for ln in [banner, *([FSF] if fsf else [])])
    # Shell builtins only: the PATH under test may hold nothing but fake compilers.
    exe.write_text(f"#!/bin/sh\nif [ \"$1\" = --version ]; then printf '%s\\n' {lines}; exit 0; fi\n"
                   "echo \"fake compiler: $*\" >&2\nexit 1\n")
    exe.chmod(0o755)
    return exe


def os_release(tmp_path: Path, text: str) -> str:
    path = tmp_path / "os-release"
    path.write_text(textwrap.dedent(text))
    return str(path)


def facts_of(toolchain: dict[str, Any], pyenv: dict[str, Any] | None = None, evidence: list | None = None) -> Facts:
    results = {"toolchain": ProbeResult(probe="toolchain", facts=toolchain, evidence=list(evidence or []))}
    if pyenv is not None:
        results["pyenv"] = ProbeResult(probe="pyenv", facts=pyenv)
    return Facts(results)


def collect(env: dict[str, str], pyenv: dict[str, Any] | None = None, tmp_path: Path | None = None,
            **kw: Any):
    kw.setdefault("opt_rh", str(tmp_path / "no-opt-rh") if tmp_path else "/nonexistent")
    facts, evidence = tc.collect(env, pyenv, **kw)
    return facts, evidence, facts_of(facts, pyenv, evidence)


def h200_pyenv(**sysconfig: str) -> dict[str, Any]:
    t = H200["torch"]
    return {
        "error": None,
        "python": {"executable": H200["executable"],
                   "sysconfig": sysconfig or {"CC": H200["cc"], "CXX": H200["cxx"]}},
        "torch": {"installed": True, "version": t["version"], "config": t["config"], "cxx11_abi": t["cxx11_abi"],
                  "import": {"state": "ok"}},
        "deepspeed": {"installed": True, "version": "0.16.4"},
    }


# -- parsers on recorded data -----------------------------------------------------------------------

def test_parse_torch_config_from_the_h200_node():
    cfg = parse_torch_config(H200["torch"]["config"])
    assert (cfg["compiler"], cfg["version"], cfg["major"]) == ("GCC", "13.3", 13)
    assert cfg["cxx_compiler"] == "/opt/rh/gcc-toolset-13/root/usr/bin/c++"
    assert cfg["toolset"] == "gcc-toolset-13"
    assert cfg["cxx_std"] == "201703" and cfg["cuda_runtime"] == "13.0"
    assert cfg["settings"]["USE_NCCL"] == "1" and cfg["settings"]["TORCH_VERSION"] == "2.11.0"
    assert cfg["settings"]["CXX_FLAGS"].startswith("-fvisibility-inlines-hidden")
    assert parse_torch_config("")["compiler"] is None
    assert parse_torch_config("PyTorch built with:\n  - clang 15.0.0\n")["compiler"] == "clang"


def test_parse_version_banners_recorded_on_the_node():
    banners = (FIXTURES / "which.txt").read_text().split("\n\n")
    gcc = parse_version_output(next(b for b in banners if b.startswith("gcc ")))
    assert gcc == {"family": "gcc", "version": "13.3.0", "major": 13, "vendor": "Ubuntu 13.3.0-6ubuntu2~24.04.1",
                   "first_line": "gcc (Ubuntu 13.3.0-6ubuntu2~24.04.1) 13.3.0"}
    nvcc = parse_version_output(next(b for b in banners if b.startswith("nvcc")))
    assert nvcc["family"] == "unknown"


@pytest.mark.parametrize("banner, family, version, vendor", [
    ("gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0", "gcc", "11.4.0", "Ubuntu 11.4.0-1ubuntu1~22.04"),
    (RH_GXX, "gcc", "13.3.1", "Red Hat 13.3.1-2"),
    ("gcc (GCC) 4.8.5 20150623 (Red Hat 4.8.5-44)", "gcc", "4.8.5", "Red Hat 4.8.5-44"),
    ("x86_64-conda-linux-gnu-c++ (conda-forge gcc 12.3.0-3) 12.3.0", "gcc", "12.3.0", "conda-forge gcc 12.3.0-3"),
    ("Ubuntu clang version 14.0.0-1ubuntu1.1", "clang", "14.0.0", "Ubuntu"),
    ("clang version 17.0.6 (Fedora 17.0.6-1.fc39)", "clang", "17.0.6", "Fedora 17.0.6-1.fc39"),
    ("Intel(R) oneAPI DPC++/C++ Compiler 2024.0.0 (2024.0.0.20231017)", "unknown", "2024.0.0", None),
    ("", "unknown", None, None),
])
def test_parse_version_output(banner, family, version, vendor):
    got = parse_version_output(banner + "\n" + FSF if family == "gcc" else banner)
    assert (got["family"], got["version"], got["vendor"]) == (family, version, vendor)


def test_gcc_to_glibcxx_and_toolset_helpers():
    assert glibcxx_for_gcc("11.2.0") == glibcxx_for_gcc("11.4.0") == "GLIBCXX_3.4.29"
    assert glibcxx_for_gcc("13.1") == "GLIBCXX_3.4.31" and glibcxx_for_gcc("13.3") == "GLIBCXX_3.4.32"
    assert glibcxx_for_gcc("9.4.0") == "GLIBCXX_3.4.28" and glibcxx_for_gcc("4.8.5") == "GLIBCXX_3.4.19"
    assert glibcxx_for_gcc("3.4") is None and glibcxx_for_gcc(None) is None
    assert toolset_of("/opt/rh/devtoolset-9/root/usr/bin/g++") == "devtoolset-9"
    assert toolset_of("/tmp/x/opt/rh/gcc-toolset-13/root/usr/bin") == "gcc-toolset-13"
    assert toolset_of("/usr/bin/g++") is None
    assert version_tuple("12.2.0-14") == (12, 2, 0) and version_tuple("x") == ()


# -- the probe against real and scripted compilers ---------------------------------------------------

def test_the_real_compilers_of_this_machine(tmp_path):
    gxx = shutil.which("g++")
    assert gxx, "this test needs the real g++"
    env = {"PATH": os.environ["PATH"]}
    facts, evidence, f = collect(env, tmp_path=tmp_path)
    real = parse_version_output(subprocess.run([gxx, "--version"], capture_output=True, text=True).stdout)
    winner = next(c for c in facts["compilers"] if c["name"] == "g++" and c["wins"])
    assert winner["path"] == gxx and winner["version"] == real["version"] and winner["family"] == "gcc"
    assert len({c["realpath"] for c in facts["compilers"] if c["name"] == "g++"}) == \
        len([c for c in facts["compilers"] if c["name"] == "g++"]), "same-file matches are folded"
    assert facts["jit"]["path"] == shutil.which("c++") and facts["jit"]["source"] == "default"
    assert facts["jit"]["glibcxx_max"] == glibcxx_for_gcc(real["version"])
    assert evidence[0].kind == "table" and evidence[0].table.columns == ["layer", "compiler", "version", "source"]
    assert any(e.argv == [gxx, "--version"] and e.exit_code == 0 for e in evidence)
    [finding] = evaluate_check("toolchain.jit-compiler", f)
    assert finding.status == "ok" and finding.title.startswith(f"JIT ops will build with {shutil.which('c++')}")
    assert not PREDICATES["no_cxx_compiler"].func(f)


def test_several_compilers_on_path_first_wins_and_later_are_shadowed(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    fake_compiler(a, "g++", UBUNTU_GXX)
    (a / "c++").symlink_to(a / "g++")
    fake_compiler(b, "g++", RH_GXX)
    fake_compiler(b, "gcc", RH_GXX.replace("g++", "gcc"))
    env = {"PATH": f"{a}:{b}"}
    facts, evidence, f = collect(env, tmp_path=tmp_path)
    gxx = [c for c in facts["compilers"] if c["name"] == "g++"]
    assert [(c["path"], c["wins"], c["version"]) for c in gxx] == [
        (str(a / "g++"), True, "11.4.0"), (str(b / "g++"), False, "13.3.1")]
    assert facts["winners"] == {"gcc": str(b / "gcc"), "g++": str(a / "g++"), "cc": None, "c++": str(a / "c++")}
    assert facts["jit"]["path"] == str(a / "c++") and facts["jit"]["realpath"] == str(a / "g++")
    assert facts["jit"]["vendor"] == "Ubuntu 11.4.0-1ubuntu1~22.04"
    assert facts["cuda_host"]["path"] == str(b / "gcc")
    rows = {r[0]: r for r in evidence[0].table.rows}
    assert rows["g++ on PATH (shadowed)"][1] == str(b / "g++")
    assert rows["JIT ops (torch.utils.cpp_extension)"][2] == "GCC 11.4.0 (Ubuntu 11.4.0-1ubuntu1~22.04)"
    [layers] = evaluate_check("toolchain.layers", f)
    assert layers.status == "ok" and f"{b / 'g++'} (GCC 13.3.1)" in layers.detail
    assert "not an ABI break" in layers.detail


def test_no_compiler_warns_without_deepspeed_and_fails_with_it(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    deb = os_release(tmp_path, 'ID=ubuntu\nID_LIKE=debian\nVERSION_ID="22.04"\n')
    facts, _, f = collect({"PATH": str(empty)}, {"deepspeed": {"installed": False}}, tmp_path, os_release=deb)
    assert facts["jit"]["path"] is None and facts["compilers"] == []
    assert PREDICATES["no_cxx_compiler"].func(f) and facts["jit"]["source"] != "CXX"
    [warn] = evaluate_check("toolchain.jit-compiler", f)
    assert warn.status == "warn" and warn.title == "No C++ compiler for JIT-built ops: `c++` is not on PATH"
    assert [r.commands for r in warn.remedies] == [["apt-get update", "apt-get install -y g++"]]
    assert warn.remedies[0].requires_root
    facts, _, f = collect({"PATH": str(empty)}, {"deepspeed": {"installed": True}}, tmp_path, os_release=deb)
    [fail] = evaluate_check("toolchain.jit-compiler", f)
    assert fail.status == "fail" and "cpu_adam" in fail.detail
    el7 = os_release(tmp_path, 'ID="centos"\nID_LIKE="rhel fedora"\nVERSION_ID="7"\n')
    facts, _, f = collect({"PATH": str(empty)}, None, tmp_path, os_release=el7)
    assert [r.commands for r in evaluate_check("toolchain.jit-compiler", f)[0].remedies] == [
        ["yum install -y gcc-c++"]]
    facts, _, f = collect({"PATH": str(empty)}, None, tmp_path, os_release=str(tmp_path / "none"))
    assert len(evaluate_check("toolchain.jit-compiler", f)[0].remedies) == 2


def test_gxx_without_cxx_symlink_gets_a_working_export_remedy(tmp_path):
    bindir = tmp_path / "tools-1.0+x"
    gxx = fake_compiler(bindir, "g++", UBUNTU_GXX)
    facts, _, f = collect({"PATH": str(bindir)}, None, tmp_path)
    assert facts["jit"]["path"] is None
    [finding] = evaluate_check("toolchain.jit-compiler", f)
    remedy = finding.remedies[0]
    assert remedy.commands == [f"export CXX={shlex.quote(str(gxx))}"] and remedy.undo == ["unset CXX"]
    script = "\n".join(remedy.commands) + '\n"$CXX" --version\n'
    out = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert out.stdout.startswith(UBUNTU_GXX)
    assert not (tmp_path / "pwned").exists()
    # Applying the remedy really fixes the probe's verdict.
    facts, _, f = collect({"PATH": str(bindir), "CXX": str(gxx)}, None, tmp_path)
    assert evaluate_check("toolchain.jit-compiler", f)[0].status == "ok"


def test_hostile_compiler_path_is_never_offered_for_ninja(tmp_path):
    bindir = tmp_path / "tools $(touch pwned) 'q'"
    gxx = fake_compiler(bindir, "g++", UBUNTU_GXX)
    facts, _, f = collect({"PATH": str(bindir)}, None, tmp_path)
    assert facts["winners"]["g++"] == str(gxx)
    [finding] = evaluate_check("toolchain.jit-compiler", f)
    assert all("CXX" not in " ".join(r.commands) for r in finding.remedies)
    assert "unquoted into build.ninja" in finding.detail
    # A $CXX naming that file whole still resolves (no word splitting of a real path).
    facts, _, f = collect({"PATH": str(bindir), "CXX": str(gxx)}, None, tmp_path)
    assert facts["jit"]["path"] == str(gxx) and facts["jit"]["version"] == "11.4.0"
    assert not (tmp_path / "pwned").exists()


def test_broken_cxx_variable(tmp_path):
    bindir = tmp_path / "bin"
    fake_compiler(bindir, "c++", UBUNTU_GXX.replace("g++", "c++"))
    facts, _, f = collect({"PATH": str(bindir), "CXX": "g++-99 -O2"}, None, tmp_path)
    assert facts["jit"]["source"] == "CXX" and facts["jit"]["error"] == "g++-99: not found on PATH"
    assert facts["jit"]["path"] is None and PREDICATES["no_cxx_compiler"].func(f)
    [finding] = evaluate_check("toolchain.jit-compiler", f)
    assert finding.title == "$CXX='g++-99 -O2' does not resolve: g++-99: not found on PATH"
    assert finding.remedies[0].commands == ["unset CXX"]
    assert finding.remedies[0].undo == ["export CXX='g++-99 -O2'"]


def test_cxx_through_ccache_and_clang_and_unknown_compilers(tmp_path):
    bindir = tmp_path / "bin"
    fake_compiler(bindir, "ccache", "ccache version 4.8", fsf=False)
    fake_compiler(bindir, "g++", UBUNTU_GXX)
    fake_compiler(bindir, "c++", "Ubuntu clang version 14.0.0-1ubuntu1.1", fsf=False)
    facts, _, f = collect({"PATH": str(bindir), "CXX": "ccache g++"}, None, tmp_path)
    assert facts["jit"]["wrapper"] == "ccache" and facts["jit"]["path"] == str(bindir / "g++")
    assert "ccache wrapper" in evaluate_check("toolchain.jit-compiler", f)[0].detail
    facts, _, f = collect({"PATH": str(bindir)}, None, tmp_path)
    assert facts["jit"]["family"] == "clang"
    assert evaluate_check("toolchain.jit-compiler", f)[0].status == "ok"
    odd = tmp_path / "odd"
    fake_compiler(odd, "c++", "Intel(R) oneAPI DPC++/C++ Compiler 2024.0.0 (2024.0.0.20231017)", fsf=False)
    facts, _, f = collect({"PATH": str(odd)}, None, tmp_path)
    [finding] = evaluate_check("toolchain.jit-compiler", f)
    assert finding.status == "warn" and "not recognisably GCC or clang" in finding.title


def test_old_gcc_warns_only_for_a_cxx17_torch(tmp_path):
    bindir = tmp_path / "bin"
    fake_compiler(bindir, "c++", "c++ (GCC) 8.5.0 20210514 (Red Hat 8.5.0-4)")
    for torch_version, status in [("2.4.1", "warn"), ("1.13.1", "ok"), (None, "warn")]:
        pyenv = {"torch": {"installed": True, "version": torch_version}}
        _, _, f = collect({"PATH": str(bindir)}, pyenv, tmp_path)
        [finding] = evaluate_check("toolchain.jit-compiler", f)
        assert finding.status == status, torch_version


def test_devtoolset_on_path_is_flagged_and_explained(tmp_path):
    ts_bin = tmp_path / "opt" / "rh" / "gcc-toolset-13" / "root" / "usr" / "bin"
    fake_compiler(ts_bin, "g++", RH_GXX)
    fake_compiler(ts_bin, "c++", RH_GXX.replace("g++", "c++"))
    sysbin = tmp_path / "usr-bin"
    fake_compiler(sysbin, "g++", "g++ (GCC) 8.5.0 20210514 (Red Hat 8.5.0-4)")
    fake_compiler(sysbin, "scl", "", fsf=False).write_text("#!/bin/sh\necho gcc-toolset-13\n")
    env = {"PATH": f"{ts_bin}:{sysbin}"}
    facts, evidence, f = collect(env, None, tmp_path, opt_rh=str(tmp_path / "opt" / "rh"))
    assert facts["devtoolset_on_path"] is True
    assert facts["toolsets"]["on_path"] == [{"name": "gcc-toolset-13", "dir": str(ts_bin), "index": 0}]
    assert facts["toolsets"]["installed"] == ["gcc-toolset-13"]
    assert facts["toolsets"]["scl_list"] == ["gcc-toolset-13"]
    assert facts["jit"]["toolset"] == "gcc-toolset-13"
    [finding] = evaluate_check("toolchain.devtoolset", f)
    assert finding.status == "warn" and finding.title.startswith("gcc-toolset-13 on PATH")
    assert "still depends on the system libstdc++.so.6" in finding.detail
    assert "never makes the system libstdc++ provide a newer GLIBCXX" in finding.detail
    assert 0 in evidence[0].table.highlight
    # Installed but not on PATH: not flagged, but mentioned.
    facts, _, f = collect({"PATH": str(sysbin)}, None, tmp_path, opt_rh=str(tmp_path / "opt" / "rh"))
    assert facts["devtoolset_on_path"] is False
    [finding] = evaluate_check("toolchain.devtoolset", f)
    assert finding.status == "ok" and "Installed but not enabled: gcc-toolset-13" in finding.detail
    # Enabled through scl (X_SCLS) counts even when PATH was rewritten.
    facts, _, f = collect({"PATH": str(sysbin), "X_SCLS": "devtoolset-9 "}, None, tmp_path)
    assert facts["devtoolset_on_path"] and facts["toolsets"]["enabled"] == ["devtoolset-9"]


def test_h200_torch_build_layer_is_informational(tmp_path):
    bindir = tmp_path / "bin"
    fake_compiler(bindir, "c++", "c++ (Ubuntu 13.3.0-6ubuntu2~24.04.1) 13.3.0")
    fake_compiler(bindir, "x86_64-linux-gnu-gcc", "x86_64-linux-gnu-gcc (Ubuntu 13.3.0-6ubuntu2~24.04.1) 13.3.0")
    fake_compiler(bindir, "x86_64-linux-gnu-g++", "x86_64-linux-gnu-g++ (Ubuntu 13.3.0-6ubuntu2~24.04.1) 13.3.0")
    facts, evidence, f = collect({"PATH": str(bindir)}, h200_pyenv(), tmp_path)
    tb = facts["torch_build"]
    assert (tb["compiler"], tb["version"], tb["toolset"], tb["cxx11_abi"]) == ("GCC", "13.3", "gcc-toolset-13", True)
    assert facts["devtoolset_on_path"] is False, "a toolset on torch's build machine is not one on this PATH"
    assert facts["sysconfig"]["CXX"]["path"] == str(bindir / "x86_64-linux-gnu-g++")
    rows = {r[0]: r for r in evidence[0].table.rows}
    assert rows["torch build"][1:] == ["/opt/rh/gcc-toolset-13/root/usr/bin/c++", "GCC 13.3 [gcc-toolset-13]",
                                       "torch.__config__.show()"]
    assert rows["torch C++11 ABI"][2] == "_GLIBCXX_USE_CXX11_ABI=1"
    assert rows["Python sysconfig CXX"][1].startswith("'x86_64-linux-gnu-g++': ")
    [layers] = evaluate_check("toolchain.layers", f)
    assert layers.title == "Compiler layers: JIT GCC 13.3.0; torch built with GCC 13.3"
    assert "gcc-toolset-13 on its build machine" in layers.detail
    assert [e.kind for e in layers.evidence] == ["table"]
    assert evaluate_check("toolchain.sysconfig", f)[0].status == "ok"
    assert evaluate_check("toolchain.devtoolset", f)[0].status == "ok"


def test_sysconfig_compiler_missing_warns_with_exports(tmp_path):
    bindir = tmp_path / "gcc-13.2+local"
    gcc = fake_compiler(bindir, "gcc", UBUNTU_GXX.replace("g++", "gcc"))
    gxx = fake_compiler(bindir, "g++", UBUNTU_GXX)
    pyenv = h200_pyenv(CC="x86_64-conda-linux-gnu-cc -pthread", CXX="x86_64-conda-linux-gnu-c++ -pthread")
    facts, _, f = collect({"PATH": str(bindir)}, pyenv, tmp_path)
    assert facts["sysconfig"]["CC"]["error"] == "x86_64-conda-linux-gnu-cc: not found on PATH"
    assert PREDICATES["sysconfig_compiler_missing"].func(f)
    [finding] = evaluate_check("toolchain.sysconfig", f)
    assert finding.status == "warn" and finding.title == "Python's sysconfig CC and CXX not found on PATH"
    assert finding.remedies[0].commands == [f"export CC={shlex.quote(str(gcc))}",
                                            f"export CXX={shlex.quote(str(gxx))}"]
    assert finding.remedies[0].undo == ["unset CC", "unset CXX"]
    # With CC/CXX exported, setuptools no longer uses sysconfig's names.
    _, _, f = collect({"PATH": str(bindir), "CC": str(gcc), "CXX": str(gxx)}, pyenv, tmp_path)
    assert evaluate_check("toolchain.sysconfig", f)[0].status == "ok"
    assert not PREDICATES["sysconfig_compiler_missing"].func(f)
    # Compilers whose paths setuptools would split on spaces are not offered.
    spaced = tmp_path / "my bin"
    fake_compiler(spaced, "gcc", UBUNTU_GXX.replace("g++", "gcc"))
    fake_compiler(spaced, "g++", UBUNTU_GXX)
    _, _, f = collect({"PATH": str(spaced)}, pyenv, tmp_path)
    [finding] = evaluate_check("toolchain.sysconfig", f)
    assert finding.status == "warn" and finding.remedies == []


def test_checks_skip_without_facts():
    facts = Facts({"toolchain": ProbeResult(probe="toolchain", status="skip", error="not in snapshot")})
    for name in ("toolchain.jit-compiler", "toolchain.layers", "toolchain.sysconfig", "toolchain.devtoolset"):
        [finding] = evaluate_check(name, facts)
        assert finding.status == "skip", name
    assert not PREDICATES["no_cxx_compiler"].func(facts)


# -- end to end through LiveHost ---------------------------------------------------------------------

def fake_torch(site: Path, body: str | None = None) -> None:
    pkg = site / "torch"
    pkg.mkdir(parents=True)
    (pkg / "config.txt").write_text(H200["torch"]["config"])
    (pkg / "__init__.py").write_text(body or textwrap.dedent('''
        import os
        __version__ = "2.11.0+cu130"
        class version:
            cuda = "13.0"
            git_version = "70d99e9"
        class __config__:
            @staticmethod
            def show():
                return open(os.path.join(os.path.dirname(__file__), "config.txt")).read()
        class _C:
            _GLIBCXX_USE_CXX11_ABI = True
    '''))


def test_livehost_runs_pyenv_then_toolchain(tmp_path):
    site, bindir = tmp_path / "site", tmp_path / "bin"
    fake_torch(site)
    fake_compiler(bindir, "c++", "c++ (Debian 12.2.0-14+deb12u1) 12.2.0")
    host = LiveHost(python=sys.executable, env={"PATH": str(bindir), "PYTHONPATH": str(site)})
    facts = host.results(["pyenv", "toolchain"])
    assert facts["toolchain"].status == "ok", facts["toolchain"].error
    t = facts["toolchain"].facts
    assert t["torch_build"]["version"] == "13.3" and t["torch_version"] == "2.11.0+cu130"
    assert t["jit"]["version"] == "12.2.0" and t["pyenv_ok"] is True
    assert PROBES["toolchain"].needs == ("pyenv",) and PROBES["toolchain"].timeout > PROBES["pyenv"].timeout
    findings = {f.id: f for name in ("toolchain.jit-compiler", "toolchain.layers")
                for f in evaluate_check(name, facts)}
    assert findings["toolchain.jit-compiler"].status == "ok"
    assert findings["toolchain.layers"].title == "Compiler layers: JIT GCC 12.2.0; torch built with GCC 13.3"
    # The facts are plain JSON: a snapshot replays to the same findings elsewhere.
    replay = ReplayHost(json.loads(json.dumps(snapshot_document(host)))).results(["pyenv", "toolchain"])
    for name in ("pyenv.interpreter", "pyenv.torch-import", "toolchain.jit-compiler", "toolchain.layers",
                 "toolchain.sysconfig", "toolchain.devtoolset"):
        assert [x.to_dict() for x in evaluate_check(name, replay)] == \
            [x.to_dict() for x in evaluate_check(name, facts)], name


# -- the playbook --------------------------------------------------------------------------------------

PLAYBOOK = data_dir("playbooks") / "toolchain.toml"


def test_playbook_lints_clean_and_every_path_ends_in_a_diagnosis_naming_checks():
    assert lint_playbook(PLAYBOOK) == []
    pb = load_playbook(PLAYBOOK)
    assert pb.id == "toolchain" and pb.start == "interpreter"
    with open(PLAYBOOK, "rb") as fh:
        raw = tomllib.load(fh)
    assert set(raw) == {"id", "title", "summary", "start", "not_checked", "unexplained", "nodes"}
    diagnoses = {nid for nid, n in pb.nodes.items() if n.kind == "diagnosis"}
    for nid, node in pb.nodes.items():
        if node.kind == "diagnosis":  # the unexplained end shows the symptom ledger, not a check of its own
            assert not node.next and (node.checks or nid == pb.unexplained), nid
            assert all(c in CHECKS for c in node.checks)
        else:
            assert node.next and node.next[-1].when is None, f"{nid} needs a fallback edge"
    # Every sink of the graph is a diagnosis, and every node reaches one.
    g = pb.graph
    assert {n for n in g.nodes if g.out_degree(n) == 0} == diagnoses
    import networkx as nx
    for nid in pb.nodes:
        assert nid in diagnoses or nx.descendants(g, nid) & diagnoses, nid
    text = " ".join(n.explain for n in pb.nodes.values())
    assert "default version" in text and "weak or strong binding" in text
    assert "newer copy satisfies older needs" in text


def walk(host) -> list[str]:
    """Walk the toolchain playbook with the real engine; the path it took, ending in its diagnosis."""
    result = Walk(load_playbook(PLAYBOOK), host).run()
    assert result.stopped is None and result.diagnosis == result.path[-1], result.reason
    return result.path


def live(python: str, path_dirs: list[Path], site: Path | None = None) -> LiveHost:
    env = {"PATH": ":".join(map(str, path_dirs))}
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return LiveHost(python=python, env=env)


def test_playbook_walks_real_scenarios_to_the_right_diagnosis(tmp_path):
    good, none, ts = tmp_path / "good", tmp_path / "none", tmp_path / "opt/rh/gcc-toolset-13/root/usr/bin"
    names = {"c++", "g++", "gcc", "cc"}
    for var in ("CC", "CXX"):  # this Python's sysconfig CC/CXX must resolve too
        words = shlex.split(sysconfig.get_config_var(var) or "")
        if words and "/" not in words[0]:
            names.add(words[0])
    for name in names:
        fake_compiler(good, name, f"{name} (Debian 12.2.0-14+deb12u1) 12.2.0")
    fake_compiler(ts, "c++", RH_GXX.replace("g++", "c++"))
    none.mkdir()
    site_ok, site_glibcxx = tmp_path / "ok", tmp_path / "glibcxx"
    fake_torch(site_ok)
    fake_torch(site_glibcxx, "raise ImportError(\"/lib/libstdc++.so.6: version `GLIBCXX_3.4.32' not found "
                             "(required by /x/_C.so)\")\n")
    assert walk(live(str(tmp_path / "no-python"), [good])) == ["interpreter", "diag-interpreter"]
    assert walk(live(sys.executable, [good], site_glibcxx))[-1] == "diag-torch-glibcxx"
    assert walk(live(sys.executable, [good], tmp_path / "empty-site"))[-1] == "diag-torch-missing"
    assert walk(live(sys.executable, [none], site_ok)) == [
        "interpreter", "torch-import", "jit-compiler", "install-compiler", "diag-no-compiler"]
    assert walk(live(sys.executable, [ts, good], site_ok))[-1] == "diag-devtoolset"
    # compilers that only answer --version, and no ninja: the toolchain is not in place, and says why
    assert walk(live(sys.executable, [good], site_ok)) == [
        "interpreter", "torch-import", "jit-compiler", "layers", "diag-jit-prereq"]
    # the system's real compiler, ninja and this interpreter's headers: now it is
    if shutil.which("ninja", path="/usr/bin:/bin") and shutil.which("c++", path="/usr/bin:/bin"):
        assert walk(live(sys.executable, [Path("/usr/bin"), Path("/bin")], site_ok)) == [
            "interpreter", "torch-import", "jit-compiler", "layers", "diag-layers"]
    # A hang, replayed from the recorded partial output of a killed probe.
    out = ('@@zdoctor@@ {"stage": "hello", "version_info": [3, 11, 7]}\n'
           '@@zdoctor@@ {"stage": "basics", "packages": {"torch": {"installed": true}}}\n'
           '@@zdoctor@@ {"stage": "torch_import", "state": "started"}\n')
    target = {"requested": "python3", "resolved": "/usr/bin/python3", "explicit": False}

    def replayed(stuck: list[str] | None) -> ReplayHost:
        late = Evidence(label="x", error="timed out after 60s")
        facts = pyenv_probe.build_facts(pyenv_probe.parse_records(out), late, target, stuck,
                                        "this node: load 30.0 on 2 CPUs")
        return ReplayHost({"format": "zdoctor-snapshot", "version": 1,
                           "probes": {"pyenv": ProbeResult(probe="pyenv", facts=facts).to_dict()}})

    # a process of the import waited in the kernel: a hang
    assert walk(replayed(["pid 5 (python3): in the kernel (uninterruptible) in nfs_wait_bit_killable"])) == [
        "interpreter", "torch-import", "diag-torch-hang"]
    # every process working on a CPU, or no sample: zdoctor's time ran out, the walk says "not examined"
    for stuck in (["pid 5 (python3): running"], None):
        assert walk(replayed(stuck)) == ["interpreter", "torch-import", "diag-torch-late"]
