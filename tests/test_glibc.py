"""A library built for a newer glibc than the host's: a gcc-built library whose GLIBC_2.34 need is
rewritten to GLIBC_2.99 in its own bytes, so that the real loader refuses it the way it refuses a wheel
built on a newer OS; placed as torch's library, with a wheel tag, for the static side."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from conftest import run_cli

from zdoctor.layers.libraries import probe_glibc as pg

PY = sys.executable


def newer_glibc_lib(path: Path) -> Path:
    """A shared library needing GLIBC_2.99 (pthread_create is GLIBC_2.34 since glibc 2.34)."""
    src = path.with_suffix(".c")
    src.write_text("#include <pthread.h>\nstatic void* f(void* a) { return a; }\n"
                   "int start(void) { pthread_t t; return pthread_create(&t, 0, f, 0); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(path), str(src)], check=True)
    data = path.read_bytes()
    assert data.count(b"GLIBC_2.34\x00") >= 1, "the toolchain here no longer versions pthread_create at 2.34"
    path.write_bytes(data.replace(b"GLIBC_2.34\x00", b"GLIBC_2.99\x00"))
    return path


def torch_like(site: Path, tag: str) -> Path:
    torch = site / "torch"
    (torch / "lib").mkdir(parents=True)
    (torch / "__init__.py").write_text("import ctypes, os\nctypes.CDLL(os.path.join(os.path.dirname(__file__), "
                                       "'lib', 'libtorch_cpu.so'))\n")
    newer_glibc_lib(torch / "lib" / "libtorch_cpu.so")
    info = site / "torch-9.9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 9.9.9\n")
    (info / "WHEEL").write_text(f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n")
    return torch


def test_wheel_tags_map_to_glibc():
    assert pg.tag_glibc("cp311-cp311-manylinux_2_28_x86_64") == "2.28"
    assert pg.tag_glibc("cp38-cp38-manylinux2014_x86_64") == "2.17"
    assert pg.tag_glibc("py3-none-any") is None


def test_glibc_too_old_is_named_as_glibc_with_real_options(tmp_path):
    site = tmp_path / "site"
    torch_like(site, "cp311-cp311-manylinux_2_99_x86_64")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
    env["PYTHONPATH"] = str(site)
    cmd = shlex.join([PY, "-c", "import torch"])
    real = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=60)
    assert "version `GLIBC_2.99' not found" in real.stderr
    proc = run_cli(["check", "--json", "--no-log", "--timeout", "60", "--python", PY, "--command", cmd,
                    "--playbook", "zero3-launch"], env=env, timeout=300)
    doc = json.loads(proc.stdout)
    (f,) = [x for x in doc["findings"] if x["id"] == "libs.glibc"]
    host = os.confstr("CS_GNU_LIBC_VERSION").split()[-1]
    assert f["status"] == "fail" and "GLIBC_2.99" in f["title"] and f"glibc {host}" in f["title"]
    assert "torch's own libraries need up to GLIBC_2.99" in f["detail"] and "manylinux_2_99" in f["detail"]
    commands = [c for r in f["remedies"] for c in r["commands"]]
    assert any("pip debug --verbose" in c for c in commands)
    # never libstdc++ advice for libc: no LD_PRELOAD/LD_LIBRARY_PATH swap, and libs.glibcxx does not claim it
    assert not any("LD_PRELOAD" in c or "LD_LIBRARY_PATH" in c or "libstdc++" in c for c in commands)
    assert not [x for x in doc["findings"] if x["id"] == "libs.glibcxx" and x["status"] == "fail"]
    path = next(p["path"] for p in doc["playbooks"] if p["id"] == "zero3-launch")
    assert path[-1] == "diag-glibc"
