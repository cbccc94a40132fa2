"""A remedy that writes under /etc goes through the careful create: a drop-in named so that no file the node
has is replaced, refused when the name appears, the folder is not root's alone, or the text is not what
pam_limits reads; its undo removes only the file it wrote. Tried for real in a stand-in folder: the printed
block pasted into bash, and the guide's own apply."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from zdoctor.core.present import pasted_script
from zdoctor.core.registry import CHECKS, load_vocabulary
from zdoctor.edit.sysfile import create_system_file
from zdoctor.layers.gpu.check_limits import _memlock
from zdoctor.layers.gpu.probe_gpu import limits_dropins
from zdoctor.walk.apply import core_action, run_remedy

ADMIN = "# the admin's own limits\n@hpc - memlock 65536\n"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the stand-in folder must be root's, like /etc")


def stand_in(tmp_path: Path) -> Path:
    """A folder like /etc/security/limits.d: root's, mode 0755, with files an admin wrote."""
    folder = tmp_path / "limits.d-h5"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    (folder / "90-memlock.conf").write_text(ADMIN)
    (folder / "90-zdoctor-memlock.conf").write_text(ADMIN)
    return folder


def memlock_remedy(folder: Path):
    facts = {"target": {"memlock_soft_kb": 8192, "memlock_hard_kb": 8192}, "limits_d": limits_dropins(str(folder))}
    load_vocabulary()
    finding = _memlock(CHECKS["gpu.limits"], facts, [])
    (remedy,) = [r for r in finding.remedies if r.action]
    return remedy


def paste(lines: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash"], input="\n".join(pasted_script(lines)) + "\n", text=True, capture_output=True,
                          cwd=str(cwd), timeout=60)


def test_the_memlock_drop_in_takes_a_free_name_and_its_pasted_undo_removes_only_it(tmp_path: Path):
    folder = stand_in(tmp_path)
    remedy = memlock_remedy(folder)
    target = folder / "90-zdoctor-memlock-2.conf"
    assert remedy.action["path"] == str(target)
    assert not any("tee" in c for c in remedy.commands)
    done = paste(remedy.commands, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "* - memlock unlimited" in target.read_text().splitlines()
    assert (folder / "90-memlock.conf").read_text() == ADMIN == (folder / "90-zdoctor-memlock.conf").read_text()
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    # Pasted again, the name is taken now: the first line stops the block, nothing changes.
    before = target.read_text()
    again = paste(remedy.commands, tmp_path)
    assert again.returncode != 0 and target.read_text() == before
    assert paste(remedy.undo, tmp_path).returncode == 0
    assert sorted(p.name for p in folder.iterdir()) == ["90-memlock.conf", "90-zdoctor-memlock.conf"]


def test_the_undo_leaves_a_file_someone_else_put_under_that_name(tmp_path: Path):
    folder = stand_in(tmp_path)
    remedy = memlock_remedy(folder)
    Path(remedy.action["path"]).write_text(ADMIN)  # the admin took the name after the check
    paste(remedy.undo, tmp_path)
    assert Path(remedy.action["path"]).read_text() == ADMIN


def test_the_guide_applies_it_through_the_core_and_refuses_a_taken_name(tmp_path: Path):
    folder = stand_in(tmp_path)
    remedy = memlock_remedy(folder)
    assert "careful create" in core_action(remedy)
    out = run_remedy(remedy, dict(os.environ), timeout=60)
    target = Path(remedy.action["path"])
    assert out.exit_code == 0, out.output
    assert out.changed == [f"created {target}"]
    assert target.read_text() == remedy.action["text"]
    target.write_text(ADMIN)  # an admin's file of that name now: the core never replaces it
    again = run_remedy(remedy, dict(os.environ), timeout=60)
    assert again.exit_code == 1 and "already exists" in again.output
    assert target.read_text() == ADMIN
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temp file left behind


def test_the_core_refuses_an_unsafe_folder_and_a_text_pam_limits_would_misread(tmp_path: Path):
    folder = stand_in(tmp_path)
    folder.chmod(0o775)
    rec = create_system_file(str(folder / "91-x.conf"), "* - memlock unlimited\n", check="limits.conf")
    assert not rec.ok and "someone other than root" in rec.error
    folder.chmod(0o755)
    link = tmp_path / "linked.d"
    link.symlink_to(folder)
    rec = create_system_file(str(link / "91-x.conf"), "* - memlock unlimited\n", check="limits.conf")
    assert not rec.ok and "symbolic link" in rec.error
    rec = create_system_file(str(folder / "91-x.conf"), "* - memlok unlimited\n", check="limits.conf")
    assert not rec.ok and "not a limit pam_limits knows" in rec.error
    assert not (folder / "91-x.conf").exists()
    rec = create_system_file(str(folder / "91-x.conf"), "* soft memlock unlimited\n", check="limits.conf")
    assert rec.ok and (folder / "91-x.conf").read_text() == "* soft memlock unlimited\n"


GRUB = 'GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX="console=ttyS0"\n'


def grub_stand_in(tmp_path: Path) -> Path:
    folder = tmp_path / "default-h5"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    grub = folder / "grub"
    grub.write_text(GRUB)
    grub.chmod(0o644)
    (folder / "grub.bak").write_text("# the admin's own backup\n")
    return grub


def iommu_remedy(grub: Path, then: str):
    from zdoctor.edit.sysfile import kernel_parameters_remedy

    remedy = kernel_parameters_remedy(["intel_iommu=on", "iommu=pt"], title="iommu=pt", explanation="",
                                      grub=str(grub))
    remedy.action["then"] = then  # the stand-in has no boot loader to rebuild
    return remedy


def test_the_grub_edit_backs_up_under_its_own_name_and_is_undone(tmp_path: Path):
    from zdoctor.layers.gpu.check_p2p import _iommu_fix

    assert _iommu_fix({"units": ["dmar0"]}).action["kind"] == "file-edit"  # the IOMMU fix goes through the core
    grub = grub_stand_in(tmp_path)
    remedy = iommu_remedy(grub, "true")
    assert "careful edit" in core_action(remedy)
    out = run_remedy(remedy, dict(os.environ), timeout=60)
    assert out.exit_code == 0, out.output
    assert 'GRUB_CMDLINE_LINUX="console=ttyS0 intel_iommu=on iommu=pt"' in grub.read_text()
    backup = Path(remedy.action["backup"])
    assert backup.read_text() == GRUB and (grub.parent / "grub.bak").read_text() == "# the admin's own backup\n"
    again = run_remedy(remedy, dict(os.environ), timeout=60)  # already there: nothing changes, backup kept
    assert again.exit_code == 0 and grub.read_text().count("iommu=pt") == 1 and backup.read_text() == GRUB
    paste(remedy.undo[:1], tmp_path)
    assert grub.read_text() == GRUB


def test_the_grub_edit_is_put_back_when_the_rebuild_fails_and_refuses_a_link(tmp_path: Path):
    grub = grub_stand_in(tmp_path)
    out = run_remedy(iommu_remedy(grub, "false"), dict(os.environ), timeout=60)
    assert out.exit_code == 1 and f"put the old {grub} back" in out.output
    assert grub.read_text() == GRUB
    real = tmp_path / "elsewhere"
    real.write_text(GRUB)
    grub.unlink()
    grub.symlink_to(real)
    out = run_remedy(iommu_remedy(grub, "true"), dict(os.environ), timeout=60)
    assert out.exit_code == 1 and "without following links" in out.output
    assert real.read_text() == GRUB and grub.is_symlink()


def test_a_pasted_grub_block_stops_when_its_backup_name_is_taken(tmp_path: Path):
    grub = grub_stand_in(tmp_path)
    remedy = iommu_remedy(grub, "true")
    Path(remedy.action["backup"]).write_text("# something else\n")
    done = paste(remedy.commands, tmp_path)
    assert done.returncode != 0
    assert grub.read_text() == GRUB and Path(remedy.action["backup"]).read_text() == "# something else\n"
