"""Removing a stale lock directory tree through :func:`zdoctor.edit.atomic.remove_checked`, under Python 3.8 as
under this one: everything under it goes, nothing a link inside it points at does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from bundlekit import interpreter

ROOT = Path(__file__).resolve().parent.parent
REMOVE = "import sys\nfrom zdoctor.edit.atomic import remove_checked\nprint(remove_checked(sys.argv[1], 'dir'))\n"


@pytest.mark.parametrize("version", ["3.8", "this"])
def test_a_directory_tree_is_removed_without_following_the_links_in_it(tmp_path: Path, version: str):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not the lock's\n")
    lock = tmp_path / "lock"
    (lock / "sub" / "deeper").mkdir(parents=True)
    (lock / "sub" / "deeper" / "f").write_text("x")
    (lock / "file").write_text("y")
    (lock / "link-to-dir").symlink_to(outside)
    (lock / "sub" / "link-to-file").symlink_to(outside / "keep")
    python = sys.executable if version == "this" else interpreter(version)
    proc = subprocess.run([python, "-c", REMOVE, str(lock)], cwd=ROOT, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"removed {lock}"
    assert not lock.exists() and (outside / "keep").read_text() == "not the lock's\n"


def test_a_directory_that_is_a_link_is_refused(tmp_path: Path):
    from zdoctor.core.errors import InputError
    from zdoctor.edit.atomic import remove_checked

    (tmp_path / "real").mkdir()
    (tmp_path / "lock").symlink_to(tmp_path / "real")
    with pytest.raises(InputError, match="not removed"):
        remove_checked(str(tmp_path / "lock"), "dir")
    assert (tmp_path / "real").is_dir()
