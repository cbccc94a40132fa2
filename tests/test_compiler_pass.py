"""A compiler driver whose own pass is missing (GCC's "cannot execute 'cc1plus'"): the real driver fails on a
real file, zdoctor names the pass, where this GCC looks for it and the package of this distribution that
holds it. The pass is hidden in a private mount namespace (a folder of links to every file of GCC's
program folder but cc1plus, bind-mounted over it), so the machine's compiler is untouched."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dsenv
import pytest
from conftest import REPO

from zdoctor.core.packages import cxx_back_end_package

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a private mount namespace needs root")


def gcc_pass_dir() -> Path:
    found = subprocess.run(["g++", "-print-prog-name=cc1plus"], capture_output=True, text=True).stdout.strip()
    assert os.path.isabs(found), "this machine's g++ has no cc1plus to hide"
    return Path(found).parent


@pytest.fixture()
def without_cc1plus(tmp_path: Path) -> tuple[Path, Path]:
    """(GCC's program folder, a folder of links to all of it but cc1plus) to bind-mount over it."""
    real = gcc_pass_dir()
    hidden = tmp_path / "gcc-without-cc1plus"
    hidden.mkdir()
    for entry in real.iterdir():
        if entry.name != "cc1plus":
            (hidden / entry.name).symlink_to(entry)
    return real, hidden


def in_namespace(real: Path, hidden: Path, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    script = f"mount --bind {hidden} {real} && exec \"$@\""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", *argv], capture_output=True, text=True,
                          cwd=str(cwd), env=env, timeout=600)


def test_a_driver_without_cc1plus_is_named_with_the_package_that_holds_it(without_cc1plus, tmp_path):
    real, hidden = without_cc1plus
    source = tmp_path / "x.cpp"
    source.write_text("int main() { return 0; }\n")
    command = f"c++ -c {source} -o {tmp_path / 'x.o'}"
    # the real failure, as the user sees it
    seen = in_namespace(real, hidden, ["sh", "-c", command], tmp_path)
    assert seen.returncode != 0 and "cannot execute" in seen.stderr and "cc1plus" in seen.stderr
    proc = in_namespace(real, hidden, [sys.executable, "-m", "zdoctor", "check", "--json", "--python",
                                       str(dsenv.ensure()), "--command", command], tmp_path)
    report = json.loads(proc.stdout)
    symptom = next(s for s in report["symptoms"] if s["kind"] == "compiler-pass-missing")
    assert symptom["explained_by"] == ["toolchain.jit-prereq.compile"]
    assert symptom["answered_by"]["diagnosis"] == "diag-jit-prereq"
    first = report["findings"][0]
    assert first["id"] == "toolchain.jit-prereq.compile" and first["status"] == "fail"
    version = subprocess.run(["g++", "-dumpversion"], capture_output=True, text=True).stdout.strip()
    assert f"looks for it in {real / 'cc1plus'}" in first["detail"] and f"GCC {version}" in first["title"]
    remedy = first["remedies"][0]
    assert remedy["verification"]["state"] == "not_tried" and remedy["requires_root"]
    # the package the remedy installs is the one this distribution ships the hidden file in
    if shutil.which("dpkg"):
        owner = subprocess.run(["dpkg", "-S", str(real / "cc1plus")], capture_output=True, text=True).stdout
        package = owner.split(":")[0]
    else:
        package = subprocess.run(["rpm", "-qf", "--qf", "%{NAME}", str(real / "cc1plus")], capture_output=True,
                                 text=True).stdout.strip()
    assert f"install -y {package}" in remedy["commands"][-1]


def test_the_package_of_the_back_end_fits_each_distribution():
    assert cxx_back_end_package(12, "apt") == "g++-12"
    assert cxx_back_end_package(None, "apt") == "g++"
    assert cxx_back_end_package(13, "zypper") == "gcc13-c++"
    assert cxx_back_end_package(11, "dnf") == "gcc-c++"
    assert cxx_back_end_package(13, "dnf", "/opt/rh/gcc-toolset-13/root/usr/bin/g++") == "gcc-toolset-13-gcc-c++"
    assert cxx_back_end_package(9, "dnf", "/opt/rh/devtoolset-9/root/usr/bin/g++") == "devtoolset-9-gcc-c++"
