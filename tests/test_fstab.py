"""fstab lines by UUID, remedies whose shell text survives hostile names (run for real in bash), the
findmnt --verify parser on real findmnt output, and the careful apply: backup, validation, atomic
replace, a real mount, and rollback to the original bytes. /etc/fstab is never touched."""

from __future__ import annotations

import grp
import os
import pwd
import shlex
import subprocess
from pathlib import Path

import pytest

from zdoctor.core.model import Evidence
from zdoctor.layers.offload import fstab as fs
from zdoctor.readers import mounts as mt

FIX = Path(__file__).resolve().parent / "fixtures"
HOSTILE = "/mnt/off load/$(touch pwned)`id`\t;'x'\\"
UUID = "0bfe0b2c-4b45-4a3c-9d5e-6b1e5e0d9d11"


def etc_fstab() -> bytes | None:
    try:
        return Path("/etc/fstab").read_bytes()
    except OSError:
        return None


@pytest.fixture(autouse=True)
def etc_fstab_untouched():
    before = etc_fstab()
    yield
    assert etc_fstab() == before


# -- lines --------------------------------------------------------------------------------------------
def test_line_by_uuid_with_the_safe_options():
    assert fs.fstab_line(UUID, "/mnt/nvme", "ext4") == \
        f"UUID={UUID} /mnt/nvme ext4 defaults,noatime,nofail,x-systemd.device-timeout=10s 0 2"
    assert fs.fstab_line(UUID, "/mnt/nvme/", "xfs").endswith(" 0 0")  # xfs: no boot-time fsck pass


def test_hostile_mount_point_is_escaped_and_parses_back():
    line = fs.fstab_line(UUID, HOSTILE, "ext4")
    field = line.split()[1]
    assert field == "/mnt/off\\040load/$(touch\\040pwned)`id`\\011;'x'\\134"
    assert len(line.split()) == 6
    (entry,) = fs.parse_fstab(line)
    assert entry.file == HOSTILE and entry.spec == f"UUID={UUID}"


@pytest.mark.parametrize("uuid,mp,fstype", [("/dev/nvme0n1p1", "/mnt/x", "ext4"), ("nvme0n1", "/mnt/x", "ext4"),
                                            (UUID, "mnt/x", "ext4"), (UUID, "/mnt/x", "ext4 rw"), ("", "/x", "ext4")])
def test_line_refuses_device_names_and_bad_fields(uuid, mp, fstype):
    with pytest.raises(fs.FstabError):
        fs.fstab_line(uuid, mp, fstype)


def test_parse_and_unmounted_entries_on_the_recorded_node():
    entries = fs.read_fstab(str(FIX / "storage/nvme-node/fstab"))
    assert [e.file for e in entries] == ["/", "/boot/efi", "/data", "/scratch", "none"]
    mounts = mt.read_mountinfo(str(FIX / "storage/nvme-node/mountinfo"))
    missing = fs.unmounted_entries(entries, "/scratch/offload", mounts)
    assert [(e.file, e.line_no) for e in missing] == [("/scratch", 5)]
    assert fs.unmounted_entries(entries, "/data/offload", mounts) == []
    assert fs.read_fstab(str(FIX / "gpu-node-h200/fstab.txt")) == []  # "# UNCONFIGURED FSTAB FOR BASE SYSTEM"


# -- remedies, executed for real -------------------------------------------------------------------------------
def bash(commands: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", "set -e\n" + "\n".join(commands)], cwd=cwd, capture_output=True, text=True)


def test_offload_dir_remedy_runs_with_a_hostile_name(tmp_path):
    target = str(tmp_path) + HOSTILE
    user = pwd.getpwuid(os.geteuid()).pw_name
    group = grp.getgrgid(os.getegid()).gr_name
    rem = fs.offload_dir_remedy(target, user, group)
    # no mode that opens it to everyone (the folder's own name may hold any digits: pytest-777)
    assert rem.requires_root and not {"777", "0777", "a+rwx", "o+w"} & {w for c in rem.commands for w in shlex.split(c)}
    for cmd in rem.commands:
        assert target in shlex.split(cmd)
    proc = bash(rem.commands, tmp_path)
    assert proc.returncode == 0, proc.stderr
    st = os.stat(target)
    assert oct(st.st_mode & 0o7777) == "0o750" and st.st_uid == os.geteuid()
    assert not list(tmp_path.rglob("pwned")) and not Path("pwned").exists()
    assert bash(rem.undo, tmp_path).returncode == 0 and not os.path.exists(target)


def test_shared_offload_dir_is_sticky_not_777(tmp_path):
    rem = fs.offload_dir_remedy(str(tmp_path / "shared"), "u", "g", shared=True)
    assert bash(rem.commands, tmp_path).returncode == 0
    assert oct(os.stat(tmp_path / "shared").st_mode & 0o7777) == "0o1777"


def test_fstab_remedy_builds_validates_backs_up_then_moves_into_place(tmp_path):
    tab = tmp_path / "my fstab"
    original = b"# existing\nproc /proc proc defaults 0 0\n"
    tab.write_bytes(original)
    tab.chmod(0o644)
    mp = str(tmp_path) + HOSTILE
    rem = fs.fstab_remedy(UUID, mp, "ext4", fstab_path=str(tab), stamp="S", mount_now=False)
    assert rem.requires_root and not any(">>" in c for c in rem.commands)
    staged, backup = f"{tab}.zdoctor-new.S", f"{tab}.bak.S"
    kinds = [c.split()[0] for c in rem.commands]
    assert kinds[:6] == ["[", "cp", "printf", "findmnt", "cp", "mv"]  # as the folder's owner: build beside,
    assert rem.commands[0].startswith('[ "$(id -u)" = "$(stat -c %u -- ')  # validate, back up, move
    assert rem.commands[3] == f"findmnt --verify --tab-file {shlex.quote(staged)}"
    assert rem.action == {"kind": "fstab-add", "fstab": str(tab), "line": fs.fstab_line(UUID, mp, "ext4"),
                          "backup": backup, "mountpoint": os.path.normpath(mp), "mount": False}
    # As a whole, under set -e: findmnt rightly rejects the UUID no disk here has, and nothing has changed.
    proc = bash(rem.commands, tmp_path)
    assert proc.returncode != 0 and "unreachable on boot required source" in proc.stdout
    assert tab.read_bytes() == original and not os.path.exists(backup)
    parsed = fs.parse_fstab(Path(staged).read_text())
    assert parsed[-1].file == mp  # the staged copy parses back to the same hostile path
    os.unlink(staged)
    # Past the check (as on a node whose disk has this UUID): the old file is backed up, the new one moved in.
    proc = bash([c for c in rem.commands if not c.startswith(("findmnt", "if "))], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert tab.read_bytes() == original + fs.fstab_line(UUID, mp, "ext4").encode() + b"\n"
    assert oct(tab.stat().st_mode & 0o777) == "0o644" and not os.path.exists(staged)
    assert Path(backup).read_bytes() == original
    restore = [c for c in rem.undo if c.startswith("cp ")]
    assert restore == [f"cp -p -- {shlex.quote(backup)} {shlex.quote(str(tab))}"]  # the file the steps made
    assert bash(restore, tmp_path).returncode == 0 and tab.read_bytes() == original
    assert not list(tmp_path.rglob("pwned"))


def test_mkfs_remedy_is_separate_destructive_and_guarded():
    rem = fs.mkfs_remedy("/dev/nvme1n1", "ext4", UUID)
    assert rem.requires_root and "DESTRUCTIVE" in rem.explanation and "DESTROYS" in rem.title
    (cmd,) = rem.commands
    assert cmd.startswith('test -z "$(wipefs --no-act --noheadings -- /dev/nvme1n1)" && mkfs.ext4')
    assert f"-U {UUID}" in cmd and cmd.endswith("-- /dev/nvme1n1")
    with pytest.raises(fs.FstabError):
        fs.mkfs_remedy("/dev/x", "ntfs")


# -- findmnt --verify -----------------------------------------------------------------------------------------
def test_parse_verify_on_real_findmnt_output(tmp_path):
    (tmp_path / "ok").mkdir()
    bad = tmp_path / "tab"
    bad.write_text(f"tmpfs {tmp_path}/ok tmpfs defaults 0 0\nthis is not a line\n"
                   f"UUID={UUID} {tmp_path}/missing\\040dir ext4 defaults 0 2\n")
    res, ev = fs.verify(str(bad))
    assert res["available"] and ev.exit_code != 0
    assert res["parse_errors"] == 1 and res["errors"] >= 2 and not res["success"]
    mine = res["targets"][f"{tmp_path}/missing dir"]
    assert any("target" in e for e in mine["errors"]) and any(UUID in e for e in mine["errors"])
    good = tmp_path / "good"
    good.write_text(f"tmpfs {tmp_path}/ok tmpfs defaults 0 0\n")
    res, _ = fs.verify(str(good))
    assert res["success"] and res["errors"] == 0 and res["parse_errors"] == 0


def test_verify_without_findmnt(tmp_path):
    res, ev = fs.verify(str(tmp_path / "x"), findmnt=str(tmp_path / "no-findmnt"))
    assert res["available"] is False and "not found" in ev.error


# -- apply ----------------------------------------------------------------------------------------------------
ORIGINAL = b"# a node's fstab\nproc /proc proc defaults 0 0\n"


@pytest.fixture
def tab(tmp_path):
    p = tmp_path / "fstab"
    p.write_bytes(ORIGINAL)
    p.chmod(0o644)
    return p


def is_mounted(path: Path) -> bool:
    return any(m.point == str(path) for m in mt.read_mountinfo())


def test_apply_backs_up_validates_replaces_and_mounts(tab, tmp_path):
    mp = tmp_path / "mnt point"
    line = f"tmpfs {fs.escape(str(mp))} tmpfs size=1m,nofail 0 0"
    rec = fs.apply_fstab_line(str(tab), line, mount=["mount", "--fstab", str(tab), str(mp)], stamp="T1")
    try:
        assert rec.ok, rec.error
        assert is_mounted(mp)
        assert tab.read_bytes() == ORIGINAL + line.encode() + b"\n"
        assert oct(tab.stat().st_mode & 0o777) == "0o644"
        assert rec.backup == f"{tab}.bak.T1" and Path(rec.backup).read_bytes() == ORIGINAL
        assert f"+{line}" in rec.diff and rec.validation["summary"].startswith("Success")
        assert rec.created_mountpoint and rec.mount["exit_code"] == 0 and not rec.rolled_back
        assert [s.split(" ")[0] for s in rec.steps] == ["created", "wrote", "validated:", "backed", "replaced",
                                                          "mounted"]
        assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    finally:
        subprocess.run(["umount", str(mp)], capture_output=True)
    # a second entry for the same mount point is refused
    again = fs.apply_fstab_line(str(tab), line, mount=["true"])
    assert not again.ok and "already has an entry" in again.error


def test_apply_rolls_back_when_the_mount_fails(tab, tmp_path):
    mp = tmp_path / "m"
    line = f"tmpfs {mp} tmpfs size=1m,nofail 0 0"
    # a mount that really fails: another fstab that has no entry for this mount point
    other = tmp_path / "other-fstab"
    other.write_text("# empty\n")
    rec = fs.apply_fstab_line(str(tab), line, mount=["mount", "--fstab", str(other), str(mp)], stamp="T2")
    assert not rec.ok and rec.rolled_back and rec.restored_identical
    assert "mount failed" in rec.error and rec.mount["exit_code"] != 0
    assert tab.read_bytes() == ORIGINAL and Path(rec.backup).read_bytes() == ORIGINAL
    assert not mp.exists() and not is_mounted(mp)  # the mount point it created is gone again


def test_apply_rolls_back_and_reraises_on_keyboard_interrupt(tab, tmp_path):
    def interrupted() -> Evidence:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fs.apply_fstab_line(str(tab), f"tmpfs {tmp_path}/k tmpfs defaults 0 0", mount=interrupted)
    assert tab.read_bytes() == ORIGINAL


def test_apply_refuses_a_line_findmnt_rejects(tab, tmp_path):
    rec = fs.apply_fstab_line(str(tab), fs.fstab_line(UUID, str(tmp_path / "n"), "ext4"), mount=["true"])
    assert not rec.ok and "findmnt --verify rejects" in rec.error and UUID in rec.error
    assert tab.read_bytes() == ORIGINAL and rec.mount is None and not rec.rolled_back
    assert not (tmp_path / "n").exists()


def test_apply_refuses_without_findmnt(tab, tmp_path):
    rec = fs.apply_fstab_line(str(tab), f"tmpfs {tmp_path}/x tmpfs defaults 0 0", mount=["true"],
                              findmnt=str(tmp_path / "missing-findmnt"))
    assert not rec.ok and "not found" in rec.error and "util-linux" in rec.error
    assert rec.backup is None and tab.read_bytes() == ORIGINAL


def test_apply_tolerates_problems_that_were_already_there(tmp_path):
    tab = tmp_path / "fstab"
    stale = f"/dev/disk/by-uuid/{UUID} /old ext4 defaults 0 2\n".encode()
    tab.write_bytes(stale)
    mp = tmp_path / "new"
    rec = fs.apply_fstab_line(str(tab), f"tmpfs {mp} tmpfs size=1m 0 0",
                              mount=["mount", "--fstab", str(tab), str(mp)])
    try:
        assert rec.ok, rec.error
        assert rec.validation["errors_before"] == rec.validation["errors"] > 0
    finally:
        subprocess.run(["umount", str(mp)], capture_output=True)


def test_apply_rejects_more_than_one_line(tab):
    rec = fs.apply_fstab_line(str(tab), "tmpfs /a tmpfs defaults 0 0\ntmpfs /b tmpfs defaults 0 0", mount=["true"])
    assert not rec.ok and "not one fstab line" in rec.error and tab.read_bytes() == ORIGINAL


# -- the guide's apply goes through the safe core ------------------------------------------------------------
def test_guide_apply_of_an_invalid_line_leaves_the_fstab_byte_identical(tab, tmp_path):
    from zdoctor.walk.apply import core_action, run_remedy

    rem = fs.fstab_remedy(UUID, str(tmp_path / "n"), "ext4", fstab_path=str(tab), stamp="G1")
    assert "findmnt --verify" in core_action(rem)
    lines: list[str] = []
    out = run_remedy(rem, dict(os.environ), on_output=lines.append)
    assert not out.ok and out.exit_code == 1
    assert tab.read_bytes() == ORIGINAL and not Path(f"{tab}.bak.G1").exists()
    assert any("findmnt --verify rejects the new line" in x for x in lines)
    assert not (tmp_path / "n").exists() and not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert out.changed == []


def test_guide_apply_backs_up_to_the_name_the_undo_gives_and_mounts(tab, tmp_path):
    from zdoctor.core.model import Remedy
    from zdoctor.walk.apply import run_remedy
    mp = tmp_path / "mnt"
    line = f"tmpfs {mp} tmpfs size=1m,nofail 0 0"
    backup = f"{tab}.bak.G2"
    rem = Remedy(title="t", commands=["false"], requires_root=True, undo=[f"cp -p -- {backup} {tab}"],
                 action={"kind": "fstab-add", "fstab": str(tab), "line": line, "backup": backup,
                         "mountpoint": str(mp), "mount": True})
    lines: list[str] = []
    try:
        out = run_remedy(rem, dict(os.environ), on_output=lines.append)
        assert out.ok, out.output
        assert is_mounted(mp)
        assert tab.read_bytes() == ORIGINAL + line.encode() + b"\n"
        assert Path(backup).read_bytes() == ORIGINAL
        assert f"modified {tab}" in out.changed and f"created {backup}" in out.changed
        # the core's record is read into the outcome, never passed on as output to show
        assert out.record is not None and out.record["ok"] and out.record["backup"] == backup
        assert lines and not [x for x in lines if "-record:" in x], lines
    finally:
        subprocess.run(["umount", str(mp)], capture_output=True)
    # a second apply finds the entry and refuses; the backup the undo names is still the original
    again = run_remedy(rem, dict(os.environ))
    assert not again.ok and Path(backup).read_bytes() == ORIGINAL


# A driver that stops for good right after step N (or inside the mount, N = -1), to be killed there.
KILL_DRIVER = """
import os, sys, time
from zdoctor.layers.offload import fstab as fs
tab, line, marker, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
seen = []
def on_step(text):
    seen.append(text)
    if len(seen) == n:
        open(marker, "w").write(text)
        time.sleep(600)
def mount():
    open(marker, "w").write("mounting")
    time.sleep(600)
fs.apply_fstab_line(tab, line, mount=mount if n == -1 else ["true"], backup=tab + ".bak.K", on_step=on_step)
open(marker, "w").write("done")
"""


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, -1])
def test_a_kill_between_any_two_steps_leaves_the_old_or_the_new_file(tab, tmp_path, n):
    import signal
    import sys

    from prockit import wait_for

    mp = tmp_path / "k"
    line = f"tmpfs {mp} tmpfs size=1m,nofail 0 0"
    new = ORIGINAL + line.encode() + b"\n"
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", KILL_DRIVER, str(tab), line, str(marker), str(n)])
    try:
        assert wait_for(marker.exists, 60)
        step = marker.read_text()
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    now = tab.read_bytes()
    assert now in (ORIGINAL, new), now
    expect_new = n == -1 or n >= 5  # killed after "replaced": the new file, complete
    assert now == (new if expect_new else ORIGINAL), step
    backup = Path(f"{tab}.bak.K")
    assert not backup.exists() or backup.read_bytes() == ORIGINAL  # never a half-written backup
    assert oct(tab.stat().st_mode & 0o777) == "0o644"


def test_the_backup_name_is_the_same_however_often_the_finding_is_made(tmp_path):
    import time as _time

    first = fs.fstab_remedy(UUID, "/mnt/nvme", "ext4", fstab_path=str(tmp_path / "fstab"))
    _time.sleep(1.1)
    again = fs.fstab_remedy(UUID, "/mnt/nvme", "ext4", fstab_path=str(tmp_path / "fstab"))
    assert first.action["backup"] == again.action["backup"] == f"{tmp_path / 'fstab'}.bak.zdoctor-0bfe0b2c"
    assert first.undo == again.undo and first.commands == again.commands


def test_apply_refuses_when_another_admin_edits_the_fstab_meanwhile(tab, tmp_path):
    line = f"tmpfs {tmp_path / 'mp'} tmpfs size=1m,nofail 0 0"
    edited = ORIGINAL + b"tmpfs /srv/other tmpfs size=1m 0 0\n"

    def on_step(text):
        if text.startswith("validated"):  # another admin saves the file while findmnt ran
            tab.write_bytes(edited)

    rec = fs.apply_fstab_line(str(tab), line, mount=["true"], stamp="C1", on_step=on_step)
    assert not rec.ok and "changed since it was shown" in rec.error
    assert tab.read_bytes() == edited  # the other edit kept, not overwritten
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_apply_edits_the_target_of_a_root_owned_fstab_link_and_says_so(tmp_path):
    real = tmp_path / "etc-real" / "fstab"
    real.parent.mkdir()
    real.write_bytes(ORIGINAL)
    link = tmp_path / "fstab"
    link.symlink_to(real)
    (tmp_path / "mp").mkdir()
    line = f"tmpfs {tmp_path / 'mp'} tmpfs size=1m,nofail 0 0"
    rec = fs.apply_fstab_line(str(link), line, mount=["true"], stamp="L1", make_mountpoint=False)
    assert rec.ok, rec.error
    assert link.is_symlink() and real.read_bytes() == ORIGINAL + line.encode() + b"\n"
    assert rec.steps[0] == f"{link} is a symbolic link to {real} (root's alone): editing {real}"
    assert rec.backup == f"{real}.bak.L1"


def test_apply_refuses_an_fstab_link_into_a_folder_another_user_may_write(tmp_path):
    real = tmp_path / "shared" / "fstab"
    real.parent.mkdir()
    real.parent.chmod(0o777)
    real.write_bytes(ORIGINAL)
    link = tmp_path / "fstab"
    link.symlink_to(real)
    rec = fs.apply_fstab_line(str(link), f"tmpfs {tmp_path / 'mp'} tmpfs size=1m 0 0", mount=["true"],
                              make_mountpoint=False)
    assert not rec.ok and "is not root's alone" in rec.error
    assert link.is_symlink() and real.read_bytes() == ORIGINAL


@pytest.mark.parametrize("planted", ["link to the fstab", "link elsewhere", "other bytes", "same bytes"])
def test_a_file_already_at_the_backup_name_counts_only_as_a_regular_copy_of_the_original(tab, tmp_path, planted):
    """A link planted at the backup name (to the fstab itself, whose new text it would then name, or to
    another file) or a file with other bytes is left alone: the backup goes under the next free name and
    holds the original bytes, and the rollback restores them from there."""
    backup = Path(f"{tab}.bak.P1")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(ORIGINAL)
    if planted == "link to the fstab":
        backup.symlink_to(tab)
    elif planted == "link elsewhere":
        backup.symlink_to(elsewhere)
    else:
        backup.write_bytes(ORIGINAL if planted == "same bytes" else b"something else\n")
    (tmp_path / "mp").mkdir()
    line = f"tmpfs {tmp_path / 'mp'} tmpfs size=1m,nofail 0 0"
    rec = fs.apply_fstab_line(str(tab), line, mount=["false"], backup=str(backup), make_mountpoint=False)
    assert not rec.ok and rec.rolled_back, rec.error  # the mount failed: the old file came back
    assert tab.read_bytes() == ORIGINAL and not tab.is_symlink()
    if planted == "same bytes":
        assert rec.backup == str(backup)
    else:
        assert rec.backup == f"{backup}-2", rec.backup
        assert backup.is_symlink() == planted.startswith("link")  # left as it was
    kept = Path(rec.backup)
    assert not kept.is_symlink() and kept.read_bytes() == ORIGINAL
    assert elsewhere.read_bytes() == ORIGINAL
    # the same plant, and an apply that succeeds: the backup still holds the old bytes, never the new ones
    ok = fs.apply_fstab_line(str(tab), line, mount=["true"], backup=str(backup), make_mountpoint=False)
    assert ok.ok, ok.error
    assert Path(ok.backup).read_bytes() == ORIGINAL and not Path(ok.backup).is_symlink()
