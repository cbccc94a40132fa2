"""The glibc-too-old remedy names the package the refused library belongs to: a real pip RECORD of a
package next to torch, whose extension (built here, its GLIBC_2.34 need rewritten to GLIBC_2.99) the real
loader refuses; the real dpkg database for a system library; no owner for a file copied by hand."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest
from conftest import run_cli
from test_glibc import newer_glibc_lib

from zdoctor.readers.owner import owner_of

PY = sys.executable


def _site_with_fastkern(tmp_path):
    site = tmp_path / "site"
    torch = site / "torch"
    torch.mkdir(parents=True)
    (torch / "__init__.py").write_text("__version__ = '9.9.9'\n")
    (site / "torch-9.9.9.dist-info").mkdir()
    (site / "torch-9.9.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 9.9.9\n")
    (site / "torch-9.9.9.dist-info" / "RECORD").write_text("torch/__init__.py,,\n")
    pkg = site / "fastkern"
    pkg.mkdir()
    newer_glibc_lib(pkg / "_ext.so")
    (pkg / "__init__.py").write_text("import ctypes, os\nctypes.CDLL(os.path.join(os.path.dirname(__file__), "
                                     "'_ext.so'))\n")
    info = site / "fastkern-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fastkern\nVersion: 1.2.3\n")
    (info / "RECORD").write_text("fastkern/__init__.py,,\nfastkern/_ext.so,sha256=x,100\n"
                                 "fastkern-1.2.3.dist-info/RECORD,,\n")
    return site


def test_the_remedy_reinstalls_the_package_that_needs_the_newer_glibc_not_torch(tmp_path):
    site = _site_with_fastkern(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
    env["PYTHONPATH"] = str(site)
    cmd = shlex.join([PY, "-c", "import torch, fastkern"])
    real = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=60)
    assert "version `GLIBC_2.99' not found" in real.stderr and "fastkern/_ext.so" in real.stderr
    proc = run_cli(["check", "--json", "--no-log", "--timeout", "60", "--python", PY, "--command", cmd,
                    "--playbook", "zero3-launch"], env=env, timeout=300)
    doc = json.loads(proc.stdout)
    (f,) = [x for x in doc["findings"] if x["id"] == "libs.glibc"]
    assert f["status"] == "fail" and "GLIBC_2.99" in f["title"]
    assert f"{site}/fastkern/_ext.so belongs to the pip package fastkern 1.2.3" in f["detail"]
    first = f["remedies"][0]
    assert "fastkern" in first["title"]
    install = next(c for c in first["commands"] if "pip install" in c)
    assert install.endswith("--only-binary :all: fastkern") and shlex.split(install)[0] == PY
    commands = [c for r in f["remedies"] for c in r["commands"]]
    assert not any(shlex.split(c)[-1:] == ["torch"] for c in commands if not c.startswith("#"))


def test_a_system_library_is_owned_by_its_os_package():
    if shutil.which("dpkg") is None:
        pytest.skip("dpkg is the package manager this test reads; this machine has none")
    lib = next((p for p in ("/lib/x86_64-linux-gnu/libz.so.1", "/usr/lib/x86_64-linux-gnu/libz.so.1")
                if os.path.exists(p)), None)
    assert lib, "zlib is part of every Debian/Ubuntu base image"
    o = owner_of(lib, [])
    assert (o["manager"], o["name"]) == ("dpkg", "zlib1g")


def test_a_file_copied_by_hand_has_no_owner_and_no_torch_remedy(tmp_path):
    lib = newer_glibc_lib(tmp_path / "libhand.so")
    assert owner_of(str(lib), [str(tmp_path)])["manager"] == "unknown"
    from test_gpu_facts import facts_of

    from zdoctor.layers.libraries.check_glibc import check_glibc

    err = {"provider": "libc.so.6", "version": "GLIBC_2.99", "required_by": str(lib),
           "message": f"libc.so.6: version `GLIBC_2.99' not found (required by {lib})"}
    facts = facts_of(glibc={"host": "2.36", "torch_location": "/opt/site/torch", "owners": {
        str(lib): owner_of(str(lib), [str(tmp_path)])}}, livetrace={"version_errors": [err]})
    (f,) = check_glibc(facts)
    assert f.status == "fail" and "no package was found" in f.remedies[0].title
    assert not any("torch" in c for c in f.remedies[0].commands)
