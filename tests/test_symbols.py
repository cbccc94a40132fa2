"""Undefined symbols from g++-built libraries under the real loader: a C++11-ABI mismatch
(-D_GLIBCXX_USE_CXX11_ABI=0 against 1), a shadowed copy of a CUDA-named library on LD_LIBRARY_PATH, a
library that was never linked, and a prebuilt DeepSpeed op the default probe loads."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from conftest import run_cli

from zdoctor.core.registry import load_vocabulary
from zdoctor.host.live import LiveHost
from zdoctor.layers.libraries import symbols as sy
from zdoctor.layers.libraries.check_symbols import check_symbols

PY = sys.executable


def gxx(out: Path, code: str, *flags: str) -> Path:
    src = out.with_suffix(".cpp")
    src.write_text(code)
    subprocess.run(["g++", "-shared", "-fPIC", "-o", str(out), str(src), *flags], check=True,
                   capture_output=True, text=True)
    return out


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
    env.update(extra)
    return env


def dlopen_cmd(path: Path) -> str:
    return shlex.join([PY, "-c", f"import ctypes; ctypes.CDLL({str(path)!r})"])


def run(cmd: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=60)


def live_findings(cmd: str, env: dict[str, str], *probes: str):
    load_vocabulary()
    host = LiveHost(python=PY, env=env, command=cmd, timeout=60)
    facts = host.results(["livetrace", *probes, "symbols"])
    return facts, check_symbols(facts)


def symptom_ids(facts, kind: str) -> list[str]:
    return [s["id"] for s in facts.of("symptoms")["symptoms"] if s["kind"] == kind]


# libgreet stands for torch: many symbols, one of them taking a std::string
GREET = ('#include <string>\nstd::string greet(const std::string& s) { return "hi " + s; }\n'
         'extern "C" int greet_version() { return 1; }\n')
CALLER = ('#include <string>\nstd::string greet(const std::string&);\nextern "C" int greet_version();\n'
          'extern "C" int run_it() { return (int)greet("x").size() + greet_version(); }\n')


def abi_kit(tmp: Path, ext_abi: int) -> Path:
    lib = tmp / "lib"
    lib.mkdir(exist_ok=True)
    gxx(lib / "libgreet.so", GREET, "-D_GLIBCXX_USE_CXX11_ABI=1")
    return gxx(tmp / f"ext{ext_abi}.so", CALLER, f"-D_GLIBCXX_USE_CXX11_ABI={ext_abi}", f"-L{lib}", "-lgreet",
               f"-Wl,-rpath,{lib}")


def test_demangle_and_abi_of_real_symbols():
    assert sy.abi_of("_Z5greetRKSs") == 0
    assert sy.abi_of("_Z5greetRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE") == 1
    d = sy.demangle(["_Z5greetRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE", "_Z5greetRKSs", "cudaMalloc"])
    new, old = d["_Z5greetRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"], d["_Z5greetRKSs"]
    assert "__cxx11" in new and "__cxx11" not in old
    assert sy.normalize_abi(new) == sy.normalize_abi(old) == "greet(std::string const&)"
    assert d["cudaMalloc"] is None
    text = "ImportError: /x/y/op.so: undefined symbol: _ZN3c104cuda9SetDeviceEi\n"
    assert sy.parse_undefined(text) == [{"object": "/x/y/op.so", "symbol": "_ZN3c104cuda9SetDeviceEi", "version": None}]


def test_cxx11_abi_mismatch_end_to_end(tmp_path):
    ext = abi_kit(tmp_path, 0)
    env = clean_env()
    cmd = dlopen_cmd(ext)
    real = run(cmd, env)
    assert real.returncode == 1 and "undefined symbol: _Z5greetRKSs" in real.stderr
    proc = run_cli(["check", "--json", "--no-log", "--timeout", "60", "--python", PY, "--command", cmd,
                    "--playbook", "zero3-launch"], env=env, timeout=300)
    doc = json.loads(proc.stdout)
    (f,) = [x for x in doc["findings"] if x["id"] == "libs.symbols"]
    assert f["status"] == "fail" and "C++11 ABI mismatch with libgreet.so" in f["title"]
    assert "greet(std::basic_string<char" in f["title"]
    assert "_GLIBCXX_USE_CXX11_ABI=0" in f["detail"] and "_GLIBCXX_USE_CXX11_ABI=1" in f["detail"]
    assert "-D_GLIBCXX_USE_CXX11_ABI=1" in f["remedies"][0]["commands"][0]
    path = next(p["path"] for p in doc["playbooks"] if p["id"] == "zero3-launch")
    assert path[-1] == "diag-undefined-symbol"
    # the remedy's rebuild, with the ABI it names, loads
    assert run(dlopen_cmd(abi_kit(tmp_path, 1)), env).returncode == 0


def test_a_shadowed_copy_is_told_from_the_copy_that_has_the_symbol(tmp_path):
    old, new = tmp_path / "conda" / "lib", tmp_path / "torch" / "lib"
    old.mkdir(parents=True)
    new.mkdir(parents=True)
    gxx(old / "libcusparse.so.12", 'extern "C" int cusparseCreate(void** h) { return 0; }\n',
        "-Wl,-soname,libcusparse.so.12")
    gxx(new / "libcusparse.so.12", 'extern "C" int cusparseCreate(void** h) { return 0; }\n'
        'extern "C" int cusparseSpSV_updateMatrix(void* h) { return 0; }\n', "-Wl,-soname,libcusparse.so.12")
    ext = gxx(tmp_path / "sparse_op.so", 'extern "C" int cusparseSpSV_updateMatrix(void*);\n'
              'extern "C" int op() { return cusparseSpSV_updateMatrix(0); }\n',
              f"-L{new}", "-l:libcusparse.so.12", f"-Wl,--enable-new-dtags,-rpath,{new}")
    env = clean_env(LD_LIBRARY_PATH=str(old))
    cmd = dlopen_cmd(ext)
    assert "undefined symbol: cusparseSpSV_updateMatrix" in run(cmd, env).stderr
    facts, (f,) = live_findings(cmd, env)
    e = facts.of("symbols")["errors"][0]
    assert e["kind"] == "shadowed" and e["loaded_copy"] == str(old / "libcusparse.so.12")
    assert e["exporting_copy"] == str(new / "libcusparse.so.12")
    assert f.status == "fail" and str(old / "libcusparse.so.12") in f.title
    # in the loader's order: the shadowing entry dropped first, then the good copy's dir put first; both
    # were tried by re-running the command before being offered
    drop, first = f.remedies
    assert drop.commands == ["unset LD_LIBRARY_PATH"] and drop.tried and drop.verified
    assert first.title == f"Put {new} first on LD_LIBRARY_PATH" and first.tried and first.verified
    assert "the command succeeded with this change" in drop.note
    fixed = run("\n".join([*f.remedies[0].commands, cmd]), env)
    assert fixed.returncode == 0, fixed.stderr


def test_a_library_never_linked_is_not_called_shadowed(tmp_path):
    ext = gxx(tmp_path / "random_op.so", 'extern "C" int curandCreateGenerator(void**, int);\n'
              'extern "C" int op() { void* g; return curandCreateGenerator(&g, 100); }\n')
    env = clean_env()
    cmd = dlopen_cmd(ext)
    assert "undefined symbol: curandCreateGenerator" in run(cmd, env).stderr
    facts, (f,) = live_findings(cmd, env)
    assert facts.of("symbols")["errors"][0]["kind"] == "never-linked"
    assert "never linked against libcurand" in f.title and "-lcurand" in f.detail


def test_a_preload_workaround_names_the_file_that_loads_and_was_tried(tmp_path):
    """Only libcurand.so.10 is installed (as pip's CUDA wheels ship it): a bare `libcurand.so` preload loads
    nothing, so the workaround names the full path of the copy exporting the symbol, tried before offered."""
    curand = tmp_path / "nvidia" / "curand" / "lib"
    curand.mkdir(parents=True)
    gxx(curand / "libcurand.so.10", 'extern "C" int curandCreateGenerator(void** g, int t) { return 0; }\n',
        "-Wl,-soname,libcurand.so.10")
    ext = gxx(tmp_path / "random_op.so", 'extern "C" int curandCreateGenerator(void**, int);\n'
              'extern "C" int op() { void* g; return curandCreateGenerator(&g, 100); }\n')
    env = clean_env(LD_LIBRARY_PATH=str(curand))
    cmd = dlopen_cmd(ext)
    assert run(f"LD_PRELOAD=libcurand.so {cmd}", env).returncode != 0  # the bare name: nothing to load
    facts, (f,) = live_findings(cmd, env)
    workaround = f.remedies[-1]
    assert workaround.title == f"Workaround for one run: preload {curand / 'libcurand.so.10'}"
    assert workaround.tried and workaround.verified
    assert run("\n".join([*workaround.commands, cmd]), env).returncode == 0


def test_the_default_probe_loads_prebuilt_deepspeed_ops(tmp_path):
    pkg = tmp_path / "site" / "deepspeed"
    (pkg / "ops" / "adam").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    gxx(pkg / "ops" / "adam" / "cpu_adam_op.cpython-311-x86_64-linux-gnu.so",
        'extern "C" int curandCreateGenerator(void**, int);\n'
        'extern "C" int op() { void* g; return curandCreateGenerator(&g, 100); }\n')
    env = clean_env(PYTHONPATH=str(tmp_path / "site"), TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))
    load_vocabulary()
    host = LiveHost(python=PY, env=env, timeout=60)
    facts = host.results(["livetrace", "symbols"])
    steps = {s["step"]: s for s in facts.of("livetrace")["steps"]}
    assert steps["load prebuilt cpu_adam_op"]["ok"] is False
    (f,) = check_symbols(facts)
    assert "cpu_adam_op" in f.title and "libcurand" in f.title


DS_ENV = Path(os.environ.get("ZDOCTOR_TEST_DS_ENV", Path.home() / ".cache" / "zdoctor-tests" / "ds-env"))
TORCH_CALLER = ('#include <string>\n#include <cstdint>\nnamespace c10 { namespace detail {\n'
                '[[noreturn]] void torchCheckFail(const char*, const char*, uint32_t, const std::string&);\n'
                '[[noreturn]] void torchCheckFail(const char*, const char*, uint32_t, const char*);\n}}\n'
                'extern "C" void op_fail(int which) {\n'
                '  if (which) c10::detail::torchCheckFail("f", "file", 1, std::string("msg"));\n'
                '  c10::detail::torchCheckFail("f", "file", 1, "msg"); }\n')


def test_an_old_abi_extension_against_the_real_torch(tmp_path):
    """An op built with -D_GLIBCXX_USE_CXX11_ABI=0 against the real torch (built with the C++11 ABI)."""
    import pytest

    py = DS_ENV / "bin" / "python"
    libs = sorted(DS_ENV.glob("lib/python3*/site-packages/torch/lib"))
    if not py.exists() or not libs:
        pytest.skip("the torch+DeepSpeed test environment is not built here")
    ext = gxx(tmp_path / "old_abi_op.so", TORCH_CALLER, "-D_GLIBCXX_USE_CXX11_ABI=0", f"-L{libs[0]}", "-lc10",
              f"-Wl,-rpath,{libs[0]}")
    cmd = shlex.join([str(py), "-c", f"import torch, ctypes; ctypes.CDLL({str(ext)!r})"])
    env = clean_env()
    assert "undefined symbol: _ZN3c106detail14torchCheckFailEPKcS2_jRKSs" in run(cmd, env).stderr
    load_vocabulary()
    host = LiveHost(python=str(py), env=env, command=cmd, timeout=120)
    facts = host.results(["livetrace", "symbols"])
    e = facts.of("symbols")["errors"][0]
    assert e["kind"] == "abi-mismatch" and e["torch_abi"] is True and e["object_abi"] == 0
    assert e["provider"].endswith("libc10.so")
    (f,) = check_symbols(facts)
    assert "torch._C._GLIBCXX_USE_CXX11_ABI = True" in f.detail
    assert f.remedies[0].commands[0] == 'export CXXFLAGS="$CXXFLAGS -D_GLIBCXX_USE_CXX11_ABI=1"'
    rebuilt = gxx(tmp_path / "new_abi_op.so", TORCH_CALLER, "-D_GLIBCXX_USE_CXX11_ABI=1", f"-L{libs[0]}", "-lc10",
                  f"-Wl,-rpath,{libs[0]}")
    assert run(shlex.join([str(py), "-c", f"import torch, ctypes; ctypes.CDLL({str(rebuilt)!r})"]),
               env).returncode == 0


MAIN = ('#include <string>\nstd::string greet(const std::string&);\n'
        'int main() { return (int)greet("x").size(); }\n')


def link_cmd(tmp: Path, abi: int, *link: str) -> str:
    src = tmp / f"main{abi}.cpp"
    src.write_text(MAIN)
    return shlex.join(["g++", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", str(src), *link, "-o", str(tmp / "main")])


def test_a_link_time_undefined_reference_is_no_all_clear_and_gets_the_abi_rule(tmp_path):
    """The build's own `undefined reference to` (GNU ld, demangled): the library on the link line defines the
    same function under the C++11 ABI, so the finding is the ABI mismatch with that library, never "No
    undefined symbol"."""
    lib = tmp_path / "lib"
    lib.mkdir()
    gxx(lib / "libgreet.so", GREET, "-D_GLIBCXX_USE_CXX11_ABI=1")
    cmd = link_cmd(tmp_path, 0, f"-L{lib}", "-lgreet")
    real = run(cmd, clean_env())
    assert real.returncode == 1 and "undefined reference to `greet(std::string const&)'" in real.stderr

    facts, out = live_findings(cmd, clean_env(), "symptoms")
    (f,) = out
    assert f.status == "fail", f.title
    assert f.explains and f.explains == symptom_ids(facts, "undefined-reference")
    assert "No undefined symbol" not in f.title
    assert "C++11 ABI mismatch with libgreet.so" in f.title and "greet(std::string const&)" in f.title
    assert "std::__cxx11::basic_string" in f.detail and "_GLIBCXX_USE_CXX11_ABI=0" in f.detail
    assert f.remedies and "-D_GLIBCXX_USE_CXX11_ABI=1" in f.remedies[0].title
    # the remedy is right: the same link with the library's ABI succeeds
    assert run(link_cmd(tmp_path, 1, f"-L{lib}", "-lgreet"), clean_env()).returncode == 0


def test_a_mangled_undefined_reference_with_nothing_defining_it(tmp_path):
    """--no-demangle prints the mangled name; with no library on the link line defining it under either ABI
    the finding says so (demangled), and says what it read."""
    lib = tmp_path / "lib"
    lib.mkdir()
    gxx(lib / "libother.so", 'extern "C" int other() { return 1; }\n')
    cmd = link_cmd(tmp_path, 1, f"-L{lib}", "-lother", "-Wl,--no-demangle")
    real = run(cmd, clean_env())
    assert real.returncode == 1 and "undefined reference to `_Z5greetRKNSt7__cxx11" in real.stderr
    facts, out = live_findings(cmd, clean_env())
    (f,) = out
    assert f.status == "fail"
    assert f.title.startswith("Link failed: undefined reference to greet(std::__cxx11::basic_string")
    assert "libother.so" in f.detail and "missing from the link line" in f.detail


def test_gold_and_lld_undefined_references_are_read(tmp_path):
    """gold's quoting (real output) and lld's two-line form; an lld line is no run-time undefined symbol."""
    from zdoctor.layers.libraries.linkerrors import parse_link_errors

    lib = tmp_path / "lib"
    lib.mkdir()
    gxx(lib / "libgreet.so", GREET, "-D_GLIBCXX_USE_CXX11_ABI=1")
    real = run(link_cmd(tmp_path, 0, "-fuse-ld=gold", f"-L{lib}", "-lgreet"), clean_env())
    assert real.returncode == 1
    (ref,) = parse_link_errors(real.stderr)
    assert ref["demangled"] == "greet(std::string const&)"
    lld = "ld.lld: error: undefined symbol: greet(std::string const&)\n>>> referenced by main.cpp\n"
    assert parse_link_errors(lld) == [{"symbol": "greet(std::string const&)", "demangled":
                                       "greet(std::string const&)", "where": "main.cpp"}]
    assert sy.parse_undefined(lld) == []


def test_the_only_installed_copy_is_another_release_than_the_symbol_version_asks_for(tmp_path):
    """op.so was linked against release 2.0 of libzdfoo (version node libzdfoo.so.1, exporting foo_b); the
    only copy installed, by a pip package, is release 1.0: same node, no foo_b. The loader names the symbol
    and its version node; the finding names the library, its package release from the metadata, and that
    it is the only copy, never "cause unknown"."""
    vmap = tmp_path / "v.map"
    vmap.write_text("libzdfoo.so.1 { global: *; };\n")
    flags = (f"-Wl,--version-script={vmap}", "-Wl,-soname,libzdfoo.so.1")
    new = tmp_path / "build" / "libzdfoo.so.1"
    new.parent.mkdir()
    gxx(new, 'extern "C" int foo_a() { return 1; }\nextern "C" int foo_b() { return 2; }\n', *flags)
    (new.parent / "libzdfoo.so").symlink_to(new.name)
    site = tmp_path / "site-packages"
    libdir = site / "zdfoo" / "lib"
    libdir.mkdir(parents=True)
    gxx(libdir / "libzdfoo.so.1", 'extern "C" int foo_a() { return 1; }\n', *flags)
    info = site / "zdfoo-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: zdfoo\nVersion: 1.0\n\nThe library.\n")
    (info / "RECORD").write_text("zdfoo/lib/libzdfoo.so.1,sha256=x,10\nzdfoo-1.0.dist-info/METADATA,,\n")
    op = gxx(tmp_path / "op.so", 'extern "C" int foo_b();\nextern "C" int run_it() { return foo_b(); }\n',
             f"-L{new.parent}", "-lzdfoo", f"-Wl,-rpath,{libdir}")
    cmd = dlopen_cmd(op)
    real = run(cmd, clean_env())
    assert "undefined symbol: foo_b, version libzdfoo.so.1" in real.stderr

    facts, out = live_findings(cmd, clean_env(), "symptoms")
    (f,) = out
    assert f.status == "fail"
    assert f.explains and f.explains == symptom_ids(facts, "undefined-symbol")
    assert "the installed libzdfoo.so.1 (zdfoo 1.0) is another release: it lacks foo_b" in f.title
    assert "version node libzdfoo.so.1" in f.detail and "defines the node libzdfoo.so.1 but not foo_b" in f.detail
    assert "zdfoo 1.0, per its pip metadata" in f.detail and "the only copy of libzdfoo.so.1" in f.detail
    assert "unknown" not in f.detail and "no known library" not in f.detail
    assert f.remedies[0].commands[-1] == "python -m pip install --upgrade zdfoo"
    # the only copy lacks foo_b: rebuilding op.so against it cannot work, so it is named as not offered
    assert not any("rebuild" in r.title.lower() for r in f.remedies)
    assert (f"Not offered: rebuilding op.so against the installed libzdfoo.so.1, because {libdir}/libzdfoo.so.1 "
            "does not export foo_b") in f.detail


def test_package_metadata_of_a_dpkg_owned_library(tmp_path):
    """dpkg's file lists and status file, as dpkg writes them: the owner and its installed release."""
    from zdoctor.readers.owner import dpkg_owner, package_of

    info = tmp_path / "info"
    info.mkdir()
    (info / "libzdbar1:amd64.list").write_text("/.\n/usr\n/usr/lib/x86_64-linux-gnu/libzdbar.so.1\n")
    status = tmp_path / "status"
    status.write_text("Package: other\nVersion: 9\n\nPackage: libzdbar1\nStatus: install ok installed\n"
                      "Architecture: amd64\nVersion: 2.4-1\n\n")
    got = dpkg_owner("/lib/x86_64-linux-gnu/libzdbar.so.1", str(info), str(status))  # merged /usr spelling
    assert got is not None and (got["name"], got["version"]) == ("libzdbar1", "2.4-1")
    assert dpkg_owner("/usr/lib/x86_64-linux-gnu/libnothing.so", str(info), str(status)) is None
    if os.path.isdir("/var/lib/dpkg/info"):  # this node's own dpkg database, where there is one
        real = package_of("/usr/lib/x86_64-linux-gnu/libc.so.6")
        assert real is not None and real["manager"] == "dpkg" and real["name"].startswith("libc6")
