"""The driver's state on this boot (layer driver-parts): the running kernel without an NVIDIA module while
another installed kernel has one (gpu.driver-for-kernel).

The module trees are real: ELF relocatable objects built with gcc and ``ld -r``, carrying a ``.modinfo``
section as a kernel module does, under kernel release directories in tmp_path. End to end, a real zdoctor
process sees the tree as /lib/modules inside a private mount namespace (``unshare -m``, an overlay over
/usr/lib whose upper layer holds ``modules/``); the machine's own file systems are never changed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_gpu_facts import facts_of

import zdoctor
from zdoctor.core.symptom import Symptom
from zdoctor.layers.driver_parts import kernelmods
from zdoctor.layers.driver_parts.check_kernelmods import check_driver_for_kernel
from zdoctor.layers.driver_parts.probe_kernelmods import collect
from zdoctor.symptoms.extract import from_text
from zdoctor.symptoms.links import Said, derive

RUNNING = os.uname().release
OLD_KERNEL, DRIVER = "6.8.0-45-generic", "550.127.05"
MODPROBE = f"modprobe: FATAL: Module nvidia not found in directory /lib/modules/{RUNNING}"
SMI = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
       "NVIDIA driver is installed and running.")
#: ``dkms status`` as DKMS 3.x prints it (nvidia built for the old kernel only), and as DKMS 2.x did.
DKMS3 = f"nvidia/{DRIVER}, {OLD_KERNEL}, x86_64: installed\n"
DKMS2 = f"nvidia, {DRIVER}, {OLD_KERNEL}, x86_64: installed\n"
UBUNTU = {"id": "ubuntu", "id_like": ["debian"], "version_id": "24.04"}
ROCKY = {"id": "rocky", "id_like": ["rhel", "centos", "fedora"], "version_id": "9.4"}
NEEDS_TOOLS = pytest.mark.skipif(not shutil.which("gcc") or not shutil.which("ld"), reason="needs gcc and ld")
NEEDS_NS = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")


def kernel_module(path: Path, version: str, vermagic: str) -> Path:
    """A real relocatable ELF object with a module's ``.modinfo`` section, at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.parent / "zdh-mod.c"
    src.write_text('static const char zd_modinfo[] __attribute__((section(".modinfo"), used, aligned(1))) = '
                   f'"version={version}\\0license=Dual MIT/GPL\\0vermagic={vermagic} SMP preempt mod_unload";\n'
                   "int init_module(void) { return 0; }\n")
    obj = path.parent / "zdh-mod.o"
    subprocess.run(["gcc", "-c", "-O2", "-o", str(obj), str(src)], check=True)
    subprocess.run(["ld", "-r", "-o", str(path), str(obj)], check=True)
    src.unlink()
    obj.unlink()
    return path


def upgraded_tree(root: Path) -> Path:
    """/lib/modules after a kernel upgrade DKMS did not follow: the old kernel has nvidia.ko (and its headers,
    ``build``), the running one has a module tree without it."""
    modules = root / "modules"
    kernel_module(modules / OLD_KERNEL / "updates" / "dkms" / "nvidia.ko", DRIVER, OLD_KERNEL)
    (modules / OLD_KERNEL / "build").mkdir()
    kernel_module(modules / RUNNING / "kernel" / "drivers" / "net" / "dummy.ko", "1.0", RUNNING)
    return modules


def symptoms(*texts: str) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    for t in texts:
        out += [s.to_dict() for s in from_text(t, "symptom", "--symptom", start=len(out) + 1)]
    return {"symptoms": out}


def explained(sym: dict[str, Any], findings: list[Any]) -> dict[str, list[str]]:
    """What explains each symptom, through the catalogue's links."""
    syms = [s for s in (Symptom.from_dict(d) for d in sym["symptoms"]) if s is not None]
    return derive(syms, [Said(f.id, f.status, tuple(f.explains)) for f in findings])


@NEEDS_TOOLS
def test_the_module_root_and_modinfo_are_read_from_a_real_tree(tmp_path):
    modules = upgraded_tree(tmp_path)
    info = kernelmods.modinfo(str(modules / OLD_KERNEL / "updates" / "dkms" / "nvidia.ko"))
    assert info["version"] == DRIVER and info["vermagic"].startswith(OLD_KERNEL + " ")
    facts, ev = collect(root=str(modules), path="/nonexistent-bin", proc_modules=str(tmp_path / "no-modules"))
    assert facts["running"] == RUNNING and facts["others_with_module"] == [OLD_KERNEL]
    assert facts["running_tree"]["nvidia"] == [] and facts["running_tree"]["headers"] is False
    old = next(k for k in facts["kernels"] if k["release"] == OLD_KERNEL)
    assert old["nvidia"][0]["version"] == DRIVER and old["headers"] is True
    assert facts["loaded"] is None  # /proc/modules unreadable: unknown, not "not loaded"
    table = ev[0].table
    assert table is not None
    running_row = next(i for i, r in enumerate(table.rows) if r[0].startswith(RUNNING))
    assert table.rows[running_row][1] == "none" and table.highlight == [running_row]


@NEEDS_TOOLS
def test_dkms_missing_is_said_so_and_the_remedy_is_the_kernel_that_has_the_module(tmp_path):
    facts, _ = collect(root=str(upgraded_tree(tmp_path)), path="/nonexistent-bin")
    if shutil.which("dkms", path="/usr/sbin:/sbin:/usr/bin:/bin:/usr/local/sbin"):
        pytest.skip("dkms is installed on this machine: the dkms-missing path is not this machine's state")
    assert facts["dkms"]["installed"] is False and "dkms is not installed" in facts["dkms"]["error"]
    sym = symptoms(MODPROBE, SMI)
    (f,) = check_driver_for_kernel(facts_of(kernel_modules=facts, symptoms=sym))
    assert f.id == "gpu.driver-for-kernel" and f.status == "fail"
    assert f.title == f"No NVIDIA module for the running kernel {RUNNING}; kernel {OLD_KERNEL} has one"
    assert "Not offered: a DKMS rebuild, because dkms is not here" in f.detail
    assert [r.title for r in f.remedies] == [f"Boot kernel {OLD_KERNEL}, which has the NVIDIA module"]
    assert f.explains == ["S1", "S2"]  # the modprobe line names the running kernel
    assert explained(sym, [f]) == {"S1": [f.id], "S2": [f.id]}


@NEEDS_TOOLS
@pytest.mark.parametrize("distro,dkms_out,install,build", [
    (UBUNTU, DKMS3, f"apt-get install -y linux-headers-{RUNNING}", f"dkms install nvidia/{DRIVER} -k {RUNNING}"),
    (ROCKY, DKMS2, f"dnf install -y kernel-devel-{RUNNING}", f"dkms install nvidia/{DRIVER} -k {RUNNING}"),
    (UBUNTU, "", f"apt-get install -y linux-headers-{RUNNING}", f"dkms autoinstall -k {RUNNING}"),
])
def test_with_dkms_the_rebuild_names_the_version_and_installs_the_headers_first(tmp_path, distro, dkms_out,
                                                                              install, build):
    facts, _ = collect(root=str(upgraded_tree(tmp_path)), path="/nonexistent-bin")
    facts["distro"] = distro
    facts["dkms"] = {"installed": True, "path": "/usr/sbin/dkms", "exit_code": 0, "error": None,
                     "entries": kernelmods.parse_dkms_status(dkms_out)}
    (f,) = check_driver_for_kernel(facts_of(kernel_modules=facts, symptoms=symptoms(MODPROBE)))
    rebuild, boot = f.remedies
    assert install in " && ".join(rebuild.commands) and build in rebuild.commands
    assert rebuild.commands[-2:] == ["modprobe nvidia", "nvidia-smi"] and rebuild.requires_root
    assert rebuild.note.startswith("not tried:") and not rebuild.tried
    assert ("grubby --set-default /boot/vmlinuz-" + OLD_KERNEL in boot.commands) == (distro is ROCKY)
    assert f"`dkms status` ran (exit 0) and lists: {dkms_out.strip() or 'no module'}" in f.detail


@NEEDS_TOOLS
def test_a_running_kernel_with_its_module_is_ok_and_no_tree_is_not_checked(tmp_path):
    modules = upgraded_tree(tmp_path)
    kernel_module(modules / RUNNING / "updates" / "dkms" / "nvidia.ko", DRIVER, RUNNING)
    facts, _ = collect(root=str(modules), path="/nonexistent-bin")
    (f,) = check_driver_for_kernel(facts_of(kernel_modules=facts))
    assert f.status == "ok" and DRIVER in f.title and f"built for {RUNNING} SMP" in f.detail
    facts, _ = collect(root=str(tmp_path / "absent"), path="/nonexistent-bin")
    (f,) = check_driver_for_kernel(facts_of(kernel_modules=facts))
    assert f.status == "skip" and f.title.endswith(": not checked") and "No such file" in f.detail


def test_dkms_status_lines_of_both_formats():
    assert [(e["module"], e["version"], e["kernel"], e["state"]) for e in kernelmods.parse_dkms_status(
        DKMS3 + DKMS2 + f"nvidia/{DRIVER}: added\nnot a dkms line\n")] == [
        ("nvidia", DRIVER, OLD_KERNEL, "installed"), ("nvidia", DRIVER, OLD_KERNEL, "installed"),
        ("nvidia", DRIVER, None, "added")]


@NEEDS_TOOLS
@NEEDS_NS
def test_end_to_end_the_modprobe_message_is_answered_by_the_missing_module(tmp_path):
    """A real zdoctor check in a namespace whose /lib/modules is the upgraded tree: the user's modprobe line
    leads the report, explained by the finding, and the gpu-stack walk ends at its diagnosis."""
    upgraded_tree(tmp_path / "upper")
    (tmp_path / "work").mkdir()
    setup = (f"mount -t overlay zdh-modules -o lowerdir=/usr/lib,upperdir={tmp_path / 'upper'},"
             f"workdir={tmp_path / 'work'} /usr/lib && exec \"$@\"")
    code = str(Path(zdoctor.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": code, "NO_COLOR": "1", "XDG_STATE_HOME": str(tmp_path / "state")}
    res = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", setup, "sh", sys.executable,
                          "-m", "zdoctor", "check", "--no-log", "--json", "--playbook", "gpu-stack",
                          "--symptom", MODPROBE, "--symptom", SMI],
                         capture_output=True, text=True, env=env, cwd=code, timeout=300, stdin=subprocess.DEVNULL)
    doc = json.loads(res.stdout)
    s1, s2 = doc["symptoms"]
    assert s1["signature"] == "driver.module-not-found" and s2["signature"] == "driver.smi-no-driver"
    assert "gpu.driver-for-kernel" in s1["explained_by"] and "gpu.driver-for-kernel" in s2["explained_by"]
    lead = doc["findings"][0]
    assert lead["id"] == "gpu.driver-for-kernel" and lead["status"] == "fail"
    assert OLD_KERNEL in lead["title"] and RUNNING in lead["title"]
    assert s1["answered_by"] and s1["answered_by"]["playbook"] == "gpu-stack"
    assert Path("/usr/lib/modules").exists() is False  # the tree was the namespace's only
