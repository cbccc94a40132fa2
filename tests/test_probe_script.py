"""The probe script itself, run for real under several interpreters, against fake torch packages."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zdoctor.layers.python_env.probe_pyenv import SCRIPT, SENTINEL, parse_records

PY38 = "/root/.pyenv/versions/3.8.18/bin/python"
OLD_PYTHONS = ["/root/.pyenv/versions/2.7.18/bin/python", "/root/.pyenv/versions/3.6.15/bin/python"]

FAKE_TORCH_OK = '''
import ctypes, sys
ctypes.CDLL("libstdc++.so.6")  # what the real torch does through its C++ libraries
__version__ = "2.11.0+cu130"
class version:
    cuda = "13.0"
    hip = None
    git_version = "70d99e998b4955e0049d13a98d77ae1b14db1f45"
class __config__:
    @staticmethod
    def show():
        return "PyTorch built with:\\n  - GCC 13.3\\n  - C++ Version: 201703\\n"
    @staticmethod
    def parallel_info():
        return "ATen/Parallel:\\n\\tat::get_num_threads() : 16\\n"
class _C:
    _GLIBCXX_USE_CXX11_ABI = True
class cuda:
    @staticmethod
    def is_available():
        return False
'''


def make_pkg(root: Path, name: str, body: str, version: str | None = None) -> Path:
    """A package ``name`` under ``root`` with ``__init__.py`` = body, plus dist-info when versioned."""
    pkg = root / name
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(body))
    if version:
        info = root / f"{name}-{version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return pkg


def run_script(python: str, pythonpath: Path | None = None, timeout: float = 60, **extra: str):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root")}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    env.update(extra)
    proc = subprocess.run([python, "-B", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    return proc, parse_records(proc.stdout)


def test_script_is_python38_syntax_and_stdlib_only():
    src = SCRIPT.read_text()
    tree = ast.parse(src, feature_version=(3, 8))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
        assert not isinstance(node, ast.JoinedStr), "f-strings would not parse on Python 2 targets"
    assert "zdoctor" not in imported
    assert imported <= set(sys.stdlib_module_names) | {"torch"}
    for banned in ("removeprefix", "removesuffix", "functools.cache"):
        assert banned not in src


@pytest.mark.parametrize("python", [sys.executable, PY38])
def test_real_interpreter_reports_every_stage(python, tmp_path):
    if not os.path.exists(python):
        pytest.skip(f"{python} is not installed on this machine")
    make_pkg(tmp_path, "deepspeed", "raise RuntimeError('the probe must not import deepspeed')", "0.16.4")
    make_pkg(tmp_path, "ninja", "raise RuntimeError('the probe must not import ninja')", "1.11.1")
    proc, parsed = run_script(python, tmp_path, LD_LIBRARY_PATH="/opt/x lib", DS_BUILD_OPS="1",
                              TORCH_CUDA_ARCH_LIST="9.0a", SECRET_TOKEN="nope")
    assert proc.returncode == 0, proc.stderr
    assert parsed["stages"] == ["hello", "basics", "deepspeed", "done"]
    assert parsed["bad"] == 0
    basics = parsed["records"]["basics"]
    code = "import sys, sysconfig; print(sys.prefix); print(sysconfig.get_config_var('CC'))"
    real = subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.splitlines()
    assert basics["prefix"] == real[0]
    assert basics["sysconfig"]["CC"] == real[1]
    assert set(basics["sysconfig"]) >= {"CC", "CXX", "LDSHARED", "CCSHARED", "CFLAGS", "LIBDIR", "Py_ENABLE_SHARED"}
    assert basics["env"]["LD_LIBRARY_PATH"] == "/opt/x lib"
    assert basics["env"]["DS_BUILD_OPS"] == "1" and basics["env"]["TORCH_CUDA_ARCH_LIST"] == "9.0a"
    assert "SECRET_TOKEN" not in basics["env"]
    assert basics["glibc"]["confstr"].startswith("glibc ")
    assert basics["packages"]["torch"]["installed"] is False
    assert basics["packages"]["deepspeed"] == {
        "installed": True, "origin": str(tmp_path / "deepspeed" / "__init__.py"),
        "location": str(tmp_path / "deepspeed"), "version": "0.16.4", "dist": "deepspeed"}
    assert basics["packages"]["ninja"]["version"] == "1.11.1"
    assert parsed["records"]["deepspeed"]["version"] == "0.16.4"
    assert "must not import" not in proc.stderr
    assert str(SCRIPT.parent) not in basics["sys_path"], "zdoctor's own modules must not shadow the target's"


@pytest.mark.parametrize("python", OLD_PYTHONS)
def test_too_old_interpreter_says_so_instead_of_a_syntax_error(python):
    if not os.path.exists(python):
        pytest.skip(f"{python} is not installed on this machine")
    proc, parsed = run_script(python)
    assert parsed["stages"] == ["hello", "too_old"]
    assert parsed["records"]["too_old"]["version_info"][:2] < [3, 8]
    assert "SyntaxError" not in proc.stderr


@pytest.mark.parametrize("python", [sys.executable, PY38])
def test_fake_torch_is_described_and_libstdcxx_mapping_is_real(python, tmp_path):
    if not os.path.exists(python):
        pytest.skip(f"{python} is not installed on this machine")
    make_pkg(tmp_path, "torch", FAKE_TORCH_OK, "2.11.0")
    proc, parsed = run_script(python, tmp_path)
    assert parsed["stages"] == ["hello", "basics", "torch_import", "torch", "torch_cuda_check",
                                "torch_cuda", "deepspeed", "done"], proc.stderr
    torch = parsed["records"]["torch"]
    assert torch["imported"] is True
    assert torch["version"] == "2.11.0+cu130" and torch["cuda"] == "13.0"
    assert torch["git_version"].startswith("70d99e9")
    assert "GCC 13.3" in torch["config"] and "get_num_threads" in torch["parallel_info"]
    assert torch["cxx11_abi"] is True
    assert torch["file"] == str(tmp_path / "torch" / "__init__.py")
    assert torch["libstdcxx"], "the libstdc++ mapped by ctypes must be read back from /proc/self/maps"
    assert all(os.path.basename(p).startswith("libstdc++.so") and os.path.exists(p) for p in torch["libstdcxx"])
    assert any(os.path.basename(p).startswith("libgcc_s.so") for p in torch["libgcc_s"])
    assert parsed["records"]["torch_cuda"]["available"] is False
    assert parsed["records"]["basics"]["packages"]["torch"]["version"] == "2.11.0"


def test_torch_printing_garbage_and_forged_records_cannot_corrupt_stdout(tmp_path):
    forged = SENTINEL + '{"stage": "torch", "imported": false}'
    body = FAKE_TORCH_OK + textwrap.dedent(f'''
        import os
        print("loading torch... no newline", end="")
        sys.stdout.flush()
        os.write(1, b"raw C-level write " + {forged!r}.encode() + b"\\n")
        print({forged!r})
    ''')
    make_pkg(tmp_path, "torch", body)
    proc, parsed = run_script(sys.executable, tmp_path)
    assert parsed["bad"] == 0
    assert parsed["records"]["torch"]["imported"] is True
    assert "loading torch... no newline" in proc.stderr and "raw C-level write" in proc.stderr
    assert proc.stdout.count(SENTINEL) == len(parsed["stages"])


def test_import_error_is_captured_with_message_and_traceback(tmp_path):
    msg = ("/usr/lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.32' not found "
           "(required by /opt/env/lib/python3.11/site-packages/torch/lib/libtorch_python.so)")
    make_pkg(tmp_path, "torch", f"raise ImportError({msg!r})")
    proc, parsed = run_script(sys.executable, tmp_path)
    assert proc.returncode == 0
    rec = parsed["records"]["torch"]
    assert rec["imported"] is False and rec["error_type"] == "ImportError"
    assert rec["error"] == msg
    assert "Traceback" in rec["traceback"] and msg in rec["traceback"]
    assert parsed["stages"][-2:] == ["deepspeed", "done"]


def test_real_loader_failure_inside_torch_import(tmp_path):
    """A real ld.so error: an extension whose DT_NEEDED library is gone."""
    (tmp_path / "dep.c").write_text("int dep(void) { return 1; }\n")
    (tmp_path / "ext.c").write_text("int dep(void); int ext(void) { return dep(); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "libdep.so"), str(tmp_path / "dep.c")],
                   check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "libext.so"), str(tmp_path / "ext.c"),
                    f"-L{tmp_path}", "-ldep"], check=True)
    (tmp_path / "libdep.so").unlink()
    site = tmp_path / "site"
    make_pkg(site, "torch", f"import ctypes\nctypes.CDLL({str(tmp_path / 'libext.so')!r})\n")
    _, parsed = run_script(sys.executable, site)
    rec = parsed["records"]["torch"]
    assert rec["imported"] is False and rec["error_type"] == "OSError"
    assert "libdep.so: cannot open shared object file" in rec["error"]


def test_hanging_import_leaves_partial_records(tmp_path):
    make_pkg(tmp_path, "torch", "import time\ntime.sleep(120)\n")
    with pytest.raises(subprocess.TimeoutExpired) as exc:
        run_script(sys.executable, tmp_path, timeout=3)
    out = exc.value.stdout
    parsed = parse_records(out.decode() if isinstance(out, bytes) else out or "")
    assert parsed["stages"] == ["hello", "basics", "torch_import"]
    assert parsed["records"]["torch_import"]["state"] == "started"


def test_parse_records_ignores_noise_and_counts_broken_records():
    out = "\n".join([
        "plain garbage",
        SENTINEL + '{"stage": "hello", "version_info": [3, 11, 7]}',
        "xx" + SENTINEL + '{"stage": "basics"}',  # not at line start: ignored
        SENTINEL + '{"stage": "basics", "prefix": "/p"',  # cut short
        SENTINEL + '["not", "a", "dict"]',
        SENTINEL + '{"no_stage": 1}',
        SENTINEL + '{"stage": "done"}',
    ])
    parsed = parse_records(out)
    assert parsed["stages"] == ["hello", "done"]
    assert parsed["bad"] == 3
    assert parsed["records"]["hello"] == {"version_info": [3, 11, 7]}
    assert parse_records("") == {"stages": [], "records": {}, "bad": 0}
