"""A printed script of several lines, pasted into bash as a whole, stops at its first failing line: the
fstab block never moves its staged file into place after ``findmnt --verify`` refused it, whichever report
printed it; an ``export`` chain still reaches the shell it is pasted into."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from zdoctor.core.model import Finding, Remedy
from zdoctor.core.present import STOPS_NOTE, pasted_script, script_label
from zdoctor.layers.offload import fstab as fs
from zdoctor.report.export import render
from zdoctor.report.terminal import print_report
from zdoctor.walk.doctor import CheckReport
from zdoctor.walk.session import SessionLog, load_events

HOST = {"hostname": "gpu-node-7", "os": "Ubuntu 22.04.4 LTS", "kind": "live"}
OLD_FSTAB = "# the admin's fstab\nUUID=0b7e-11aa / ext4 defaults 0 1\n"


def paste(block: str, cwd: Path) -> subprocess.CompletedProcess:
    """``block`` fed to bash line by line on its standard input, as a terminal paste would."""
    return subprocess.run(["bash"], input=block + "\n", text=True, capture_output=True, cwd=str(cwd), timeout=60)


def fstab_setup(tmp_path: Path) -> tuple[Path, Remedy]:
    etc = tmp_path / "etc"
    etc.mkdir()
    table = etc / "fstab"
    table.write_text(OLD_FSTAB)
    # A filesystem UUID no disk of this machine has: findmnt --verify reports it unreachable (exit 1).
    remedy = fs.fstab_remedy(fs.new_uuid(), str(tmp_path / "mnt" / "nvme-h5"), "ext4", fstab_path=str(table))
    return table, remedy


def terminal_block(remedy: Remedy) -> str:
    buf = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    print_report(CheckReport(host=HOST, findings=[Finding("storage.fstab", "fail", "mount it", remedies=[remedy])]),
                 buf)
    buf.seek(0)
    lines = buf.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("mkdir -p"))
    end = next(i for i, line in enumerate(lines) if line.lstrip().startswith("mount --fstab"))
    return "\n".join(lines[start:end + 1])


def markdown_block(remedy: Remedy, state_home: Path) -> str:
    log = SessionLog.create("check", ["check"], HOST)
    log.record("finding", {"finding": Finding("storage.fstab", "fail", "mount it", remedies=[remedy]).to_dict()})
    log.close(1)
    md = render(load_events(log.id), "md")
    assert f"Run in bash, in order ({STOPS_NOTE}):" in md
    return next(b for b in re.findall(r"```bash\n(.*?)\n```", md, re.S) if "mkdir -p" in b)


@pytest.mark.skipif(shutil.which("findmnt") is None, reason="findmnt (util-linux) is not installed")
@pytest.mark.parametrize("where", ["terminal", "markdown"])
def test_a_pasted_fstab_block_stops_at_its_failed_findmnt(tmp_path: Path, state_home: Path, where: str):
    table, remedy = fstab_setup(tmp_path)
    block = terminal_block(remedy) if where == "terminal" else markdown_block(remedy, state_home)
    done = paste(block, tmp_path)
    assert "unreachable" in done.stdout + done.stderr  # findmnt itself ran, and refused the new line
    assert done.returncode != 0
    assert table.read_text() == OLD_FSTAB  # the refused file was not moved into place
    assert not list(table.parent.glob("fstab.bak.*"))  # nor the backup step run after the failure


def test_a_pasted_block_that_succeeds_runs_every_line_and_keeps_its_exports(tmp_path: Path):
    """The chain runs in the pasting shell: exports reach it, a here-document keeps its body, a trailing
    comment stays a comment."""
    remedy = Remedy("Set it up", [f"mkdir -p -- {tmp_path / 'a'}  # made here",
                                  f"cat > {tmp_path / 'a' / 'conf'} <<'ZD'\nx = 1\nZD",
                                  "# a note between the steps", "export H5_PASTED=yes", "unset H5_GONE"])
    done = paste("H5_GONE=1\n" + "\n".join(pasted_script(remedy.commands)) + '\necho "[$H5_PASTED|${H5_GONE-unset}]"',
                 tmp_path)
    assert done.returncode == 0, done.stderr
    assert "[yes|unset]" in done.stdout
    assert (tmp_path / "a" / "conf").read_text() == "x = 1\n"


def test_a_failing_first_line_stops_an_export_chain(tmp_path: Path):
    lines = pasted_script(["false", "export H5_AFTER=ran"])
    done = paste("\n".join(lines) + '\necho "[${H5_AFTER-not run}]"', tmp_path)
    assert "[not run]" in done.stdout


def test_the_label_says_a_block_stops_and_a_single_line_says_nothing_of_it():
    assert script_label(["export A=1", "unset B"]).endswith(f"before the launch command ({STOPS_NOTE})")
    assert script_label(["apt-get install -y libaio-dev"]) == "Run in bash, in order"
    assert pasted_script(["apt-get install -y libaio-dev"]) == ["apt-get install -y libaio-dev"]


def test_a_line_with_its_own_or_does_not_run_after_an_earlier_failure(tmp_path: Path):
    """``a && x || y`` would run ``y`` when ``a`` failed: such a line is grouped in braces."""
    marker = tmp_path / "ran"
    done = paste("\n".join(pasted_script(["false", f"false 2>/dev/null || touch {marker}"])), tmp_path)
    assert done.returncode != 0 and not marker.exists()
    done = paste("\n".join(pasted_script(["true", f"false 2>/dev/null || touch {marker}"])), tmp_path)
    assert done.returncode == 0 and marker.exists()
