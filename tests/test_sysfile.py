"""A remedy that writes under /etc goes through the careful create: a drop-in named so that no file the node
has is replaced, refused when the name appears, the folder is not root's alone, or the text is not what
pam_limits reads; its undo removes only the file it wrote. Tried for real in a stand-in folder: the printed
block pasted into bash, and the guide's own apply."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from zdoctor.apply import core_action, run_remedy
from zdoctor.checks.gpu import _memlock
from zdoctor.present import pasted_script
from zdoctor.probes.gpu import limits_dropins
from zdoctor.sysfile import create_system_file

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
    finding = _memlock(facts, [])
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
