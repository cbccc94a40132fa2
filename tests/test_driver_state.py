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
import tempfile
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


# -- class 2: CUDA 'unknown error' after a suspend/resume -----------------------------------------------------

TORCH_999 = ("CUDA initialization: CUDA unknown error - this may be due to an incorrectly set up environment, e.g. "
             "changing env variable CUDA_VISIBLE_DEVICES after program start. Setting the available devices to be "
             "zero. (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:119.)")
#: The kernel's own records of one suspend to RAM and its resume (kernel/power/suspend.c, drivers/acpi/sleep.c).
SLEEP_RECORDS = ("PM: suspend entry (deep)", "ACPI: PM: Preparing to enter system sleep state S3",
                 "ACPI: PM: Waking up from system sleep state S3", "PM: suspend exit")
#: /proc/modules of a node with the NVIDIA modules loaded and two processes on /dev/nvidia-uvm.
PROC_MODULES = ("nvidia_uvm 4956160 2 - Live 0x0000000000000000 (POE)\n"
                "nvidia_drm 122880 0 - Live 0x0000000000000000 (POE)\n"
                "nvidia 108183552 35 nvidia_uvm,nvidia_drm, Live 0x0000000000000000 (POE)\n")
HOLD = ("import sys, time\nf = open(sys.argv[1])\nopen(sys.argv[2], 'w').close()\n"
        "while True:\n    time.sleep(1)\n")


def _kmsg(tmp: Path, *texts: str, facility: int | None = None) -> Path:
    from kmsgkit import KERN, kmsg_file

    return kmsg_file(tmp / "kmsg", *texts, facility=KERN if facility is None else facility)


def _resume_facts(tmp: Path, kmsg: Path, device: Path) -> dict[str, Any]:
    from zdoctor.layers.driver_parts.probe_driverresume import collect as collect_resume

    (tmp / "modules").write_text(PROC_MODULES)
    (tmp / "refcnt").write_text("2\n")
    (tmp / "params").write_text("ResmanDebugLevel: 4294967295\nPreserveVideoMemoryAllocations: 0\n")
    facts, _ = collect_resume(kmsg=str(kmsg), use_journal=False, proc_modules=str(tmp / "modules"),
                              refcnt=str(tmp / "refcnt"), device=str(device), params=str(tmp / "params"),
                              systemctl="/nonexistent-systemctl")
    return facts


@pytest.fixture
def uvm_holder(tmp_path):
    """A real process of an unprivileged user holding the 'device' open: in a private mount namespace a real
    file is bind-mounted over the device's path, and the process opens that path."""
    from userkit import SYSTEM_PYTHON, unprivileged_user

    top = Path(tempfile.mkdtemp(prefix="zdoctor-uvm-"))
    top.chmod(0o755)
    device, real, ready = top / "nvidia-uvm", top / "uvm-backing", top / "ready"
    device.write_text("")
    real.write_text("")
    with unprivileged_user("uvm") as acct:
        os.chown(top, acct.uid, acct.gid)
        script = ('mount --bind "$1" "$2" && '
                  'exec setpriv --reuid "$3" --regid "$4" --clear-groups "$5" -c "$6" "$2" "$7"')
        proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(real),
                                 str(device), str(acct.uid), str(acct.gid), SYSTEM_PYTHON, HOLD, str(ready)],
                                stdin=subprocess.DEVNULL)
        try:
            from prockit import wait_for

            assert wait_for(ready.exists), "the holder did not start"
            yield {"pid": proc.pid, "user": acct.name, "device": device}
        finally:
            proc.kill()
            proc.wait(timeout=30)
            shutil.rmtree(top, ignore_errors=True)


@NEEDS_NS
def test_cuda_unknown_error_after_a_resume_names_the_holders_and_does_not_reload_under_them(tmp_path, uvm_holder):
    from test_gpu_facts import h200_nvml

    from zdoctor.layers.driver_parts.check_driverresume import RELOAD, check_driver_after_resume

    kmsg = _kmsg(tmp_path, "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.86.15", *SLEEP_RECORDS)
    facts = _resume_facts(tmp_path, kmsg, uvm_holder["device"])
    assert [s["kind"] for s in facts["sleeps"]] == ["suspend", "resume", "resume"]
    assert facts["uvm"] == {"loaded": True, "use_count": 2, "users": [], "refcnt": 2, "error": None}
    assert facts["preserve_allocations"] is False
    assert facts["services"] == {"nvidia-suspend.service": None, "nvidia-resume.service": None}
    (holder,) = facts["holders"]
    assert holder["pid"] == uvm_holder["pid"] and holder["user"] == uvm_holder["user"]  # unshare, sh, setpriv exec it
    assert holder["command"].endswith(f"{uvm_holder['device']} {uvm_holder['device'].parent / 'ready'}")
    sym = symptoms(TORCH_999)
    (f,) = check_driver_after_resume(facts_of(driver_resume=facts, nvml=h200_nvml(), symptoms=sym))
    assert f.id == "gpu.driver-after-resume" and f.status == "fail"
    assert f.title.startswith("CUDA 'unknown error' (999) after the node resumed from suspend at ")
    assert "the message you gave (S1" in f.detail and "NVML answers with the GPUs" in f.detail
    assert "The nvidia_uvm module is loaded (use count 2, sysfs refcnt 2)" in f.detail
    assert "Whether nvidia-suspend.service is enabled is unknown" in f.detail
    reload, reboot = f.remedies  # the services are unknown here: no services remedy offered
    assert reload.commands == [RELOAD] and reload.requires_root and not reload.tried
    assert reload.note.startswith(f"not tried, because 1 process holds {uvm_holder['device']}: pid {holder['pid']} "
                                  f"({uvm_holder['user']}: ")
    assert reboot.title == "Drain the node and reboot it"
    assert f.explains == ["S1"] and explained(sym, [f]) == {"S1": [f.id]}


def test_without_holders_the_reload_waits_for_a_yes_and_disabled_services_get_their_remedy(tmp_path):
    from test_gpu_facts import h200_nvml

    from zdoctor.layers.driver_parts.check_driverresume import check_driver_after_resume

    device = tmp_path / "nvidia-uvm"
    device.write_text("")
    facts = _resume_facts(tmp_path, _kmsg(tmp_path, *SLEEP_RECORDS), device)
    assert facts["holders"] == []
    facts["services"] = {"nvidia-suspend.service": "disabled", "nvidia-resume.service": "disabled"}
    # torch's "Error 999" line of cudaGetDeviceCount (the catalogue's cuda.init-error) is named by its number
    sym = symptoms("CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions "
                   "before calling NumCudaDevices() that might have already set an error? Error 999: unknown error "
                   "(Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:119.)", "RuntimeError: CUDA error: "
                   "unknown error")
    (f,) = check_driver_after_resume(facts_of(driver_resume=facts, nvml=h200_nvml(), symptoms=sym))
    assert f.status == "fail" and f.explains == ["S1", "S2"]
    reload, services, _reboot = f.remedies
    assert reload.note.startswith("not tried: reloading a kernel module changes the node; it runs only when you say "
                                  "yes, as root")
    assert services.commands == ["systemctl enable nvidia-suspend.service nvidia-resume.service "
                                 "nvidia-hibernate.service"]
    assert "NVreg_PreserveVideoMemoryAllocations=1" in services.explanation


def test_sleep_records_written_from_user_space_are_no_evidence(tmp_path):
    from kmsgkit import USER

    from zdoctor.layers.driver_parts.check_driverresume import check_driver_after_resume

    device = tmp_path / "nvidia-uvm"
    facts = _resume_facts(tmp_path, _kmsg(tmp_path, *SLEEP_RECORDS, facility=USER), device)
    assert facts["sleeps"] == []
    (f,) = check_driver_after_resume(facts_of(driver_resume=facts, symptoms=symptoms(TORCH_999)))
    assert f.status == "ok" and f.title == "No suspend/resume in this boot: the CUDA 'unknown error' is not a resume's"
    assert f.explains == []


def test_nvidia_uvm_not_loaded_is_the_cause_of_999_and_loading_it_the_remedy(tmp_path):
    from zdoctor.layers.driver_parts.check_driverresume import check_driver_after_resume

    facts = _resume_facts(tmp_path, _kmsg(tmp_path, "PM: suspend exit"), tmp_path / "nvidia-uvm")
    facts["uvm"] = {"loaded": False, "use_count": None, "users": [], "refcnt": None, "error": None}
    (f,) = check_driver_after_resume(facts_of(driver_resume=facts, symptoms=symptoms("cudaErrorUnknown")))
    assert f.status == "fail" and f.title == "CUDA 'unknown error' (999): nvidia_uvm is not loaded"
    assert [r.commands for r in f.remedies] == [["modprobe nvidia_uvm"]] and f.explains == ["S1"]


def test_systemd_sleeps_in_the_journal_are_read_by_journalds_trusted_fields():
    from zdoctor.layers.driver_parts import uvmstate

    lines = [json.dumps(d) for d in (
        {"MESSAGE": "Entering sleep state 'suspend'...", "_COMM": "systemd-sleep", "_UID": "0",
         "__REALTIME_TIMESTAMP": "1764835200000000"},
        {"MESSAGE": "System returned from sleep state.", "_COMM": "systemd-sleep", "_UID": "0",
         "__REALTIME_TIMESTAMP": "1764835260000000"},
        {"MESSAGE": "System resumed.", "SYSLOG_IDENTIFIER": "systemd-sleep", "_COMM": "logger", "_UID": "1000"},
        {"MESSAGE": "System resumed.", "_COMM": "systemd-sleep", "_UID": "1000"})]
    assert [(s["kind"], s["time"]) for s in uvmstate.journal_sleeps(lines)] == [
        ("suspend", 1764835200.0), ("resume", 1764835260.0)]


@NEEDS_NS
def test_end_to_end_torchs_unknown_error_is_explained_by_the_resume_in_a_private_kernel_log(tmp_path):
    """A real zdoctor check reading a private kernel log (bind-mounted over /dev/kmsg in its own mount
    namespace) with the kernel's suspend and resume records: the pasted torch error leads the report."""
    from kmsgkit import run_cli_on

    kmsg = _kmsg(tmp_path, *SLEEP_RECORDS)
    env = {**os.environ, "PYTHONPATH": str(Path(zdoctor.__file__).resolve().parent.parent),
           "XDG_STATE_HOME": str(tmp_path / "state")}
    res = run_cli_on(kmsg, ["check", "--no-log", "--json", "--playbook", "gpu-stack", "--symptom", TORCH_999],
                     env=env)
    doc = json.loads(res.stdout)
    (s1,) = doc["symptoms"]
    assert s1["signature"] == "driver.cuda-unknown-error" and s1["explained_by"] == ["gpu.driver-after-resume"]
    lead = doc["findings"][0]
    assert lead["id"] == "gpu.driver-after-resume" and lead["status"] == "fail"
    assert "after the node resumed from suspend at" in lead["title"]
    assert "(kernel log: 'PM: suspend exit'), 2 resumes in this boot" in lead["detail"]
    assert [r["title"] for r in lead["remedies"]][0] == "Reload nvidia_uvm (no reboot)"


def test_nvidia_uvm_from_sysfs_where_proc_modules_cannot_be_read(tmp_path):
    from zdoctor.layers.driver_parts import uvmstate

    (tmp_path / "refcnt").write_text("3\n")
    assert uvmstate.uvm_module(str(tmp_path / "absent"), str(tmp_path / "refcnt")) == {
        "loaded": True, "use_count": None, "users": [], "refcnt": 3,
        "error": f"{tmp_path / 'absent'} could not be read"}
    assert uvmstate.uvm_module(str(tmp_path / "absent"), str(tmp_path / "no-refcnt"))["loaded"] is None


def test_torchs_own_999_from_the_real_probe_script_comes_before_the_pasted_text(tmp_path):
    """The probe script run against a torch whose CUDA start warns as torch's does: its error is the one named."""
    from test_gpu_facts import h200_nvml, h200_pyenv
    from test_gpu_verdicts import FAKE_TORCH_CUDA_WARNS, _probe_cuda_record

    from zdoctor.layers.driver_parts.check_driverresume import check_driver_after_resume

    rec = _probe_cuda_record(tmp_path / "pkg", FAKE_TORCH_CUDA_WARNS % TORCH_999)
    py = h200_pyenv()
    py["torch"]["cuda"] = "13.0"
    py["torch"]["cuda_check"] = {"state": "ok", **{k: v for k, v in rec.items() if k != "t"}}
    device = tmp_path / "nvidia-uvm"
    facts = _resume_facts(tmp_path, _kmsg(tmp_path, *SLEEP_RECORDS), device)
    sym = symptoms("RuntimeError: CUDA error: unknown error")
    (f,) = check_driver_after_resume(facts_of(driver_resume=facts, nvml=h200_nvml(), pyenv=py, symptoms=sym))
    assert f.status == "fail" and "seen in torch's CUDA start in the training interpreter: CUDA initialization: " \
                                  "CUDA unknown error" in f.detail
    assert f.explains == ["S1"]  # the user's line is the same error, named by its number


@NEEDS_TOOLS
def test_the_newest_kernel_with_the_module_is_the_one_to_boot(tmp_path):
    modules = upgraded_tree(tmp_path)
    kernel_module(modules / "6.8.0-100-generic" / "updates" / "dkms" / "nvidia.ko", DRIVER, "6.8.0-100-generic")
    (modules / "6.8.0-9-generic").mkdir()
    listed = [k for k in kernelmods.installed_kernels(str(modules))[0] if k != RUNNING]
    assert listed == ["6.8.0-9-generic", OLD_KERNEL, "6.8.0-100-generic"]
    facts, _ = collect(root=str(modules), path="/nonexistent-bin")
    assert facts["others_with_module"] == [OLD_KERNEL, "6.8.0-100-generic"]
    (f,) = check_driver_for_kernel(facts_of(kernel_modules=facts))
    assert f.remedies[-1].title == "Boot kernel 6.8.0-100-generic, which has the NVIDIA module"
