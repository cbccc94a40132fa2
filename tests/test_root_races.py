"""Root against the training user: a real unprivileged user (created here, removed after) races zdoctor
with a compiled racer, and zdoctor must never write, copy or delete through what the user swapped in."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import racekit
from hostilekit import run_measured
from racekit import build_racer, can_race, intact, loop_device, racing, unprivileged_user, user_dir

from zdoctor.core.model import Remedy
from zdoctor.layers.offload import iotest
from zdoctor.layers.offload.check_offload import nvme_patch_remedy
from zdoctor.layers.offload.dsconfig import load_config
from zdoctor.layers.toolchain.check_hangs import lock_remedy
from zdoctor.walk import apply

pytestmark = pytest.mark.skipif(can_race() is not None, reason=can_race() or "")

#: How long each race runs (the old code lost within a few tries).
RACE_SECONDS = 10.0


@pytest.fixture
def racer_user():
    with unprivileged_user() as user:
        yield user


@pytest.fixture
def root_dir():
    """A root-owned folder (0755) the racing user can read, for the racer and root's own files."""
    d = Path(tempfile.mkdtemp(prefix="zdrace-root-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("which", ["odirect", "iotest"])
def test_odirect_tests_never_write_through_a_link_swapped_in_for_their_file(racer_user, root_dir, which):
    racer = build_racer("swap_in_link", root_dir)
    with user_dir(racer_user) as offload, loop_device(root_dir) as (dev, _backing):
        size = 16 << 20
        with racing(racer_user, [str(racer), str(offload), f".zdoctor-{which}-", dev, "both"]) as proc:
            deadline = time.monotonic() + RACE_SECONDS
            runs = 0
            while time.monotonic() < deadline:
                res = iotest.odirect_check(str(offload)) if which == "odirect" else \
                    iotest.measure(str(offload), 256 << 10, block=4096, queue_depth=1, time_limit=2)
                runs += 1
                assert intact(dev, size), f"run {runs} wrote into {dev} through the swapped-in link: {res}"
            os.kill(proc.pid, 9)
            proc.wait()
            swaps = proc.stdout.read().decode().count("swapped") if proc.stdout else 0
        assert swaps > 0, "the racer never got to swap a link in: the race did not run"
        assert intact(dev, size)
        assert not [p for p in offload.iterdir() if p.name.startswith(f".zdoctor-{which}-") and not p.is_symlink()]


# -- the ds_config fix ----------------------------------------------------------------------------------

OFFLOAD_CFG = (Path(__file__).parent / "fixtures" / "offload" / "zero3-cpu-offload.json").read_text()


def _as_user(user, argv: list[str]) -> None:
    """Run ``argv`` as the racing user (the training user acting between the preview and the apply)."""
    subprocess.run(argv, preexec_fn=racekit._drop_to(user), check=True, capture_output=True, timeout=30)


def _user_config(user, folder: Path, text: str = OFFLOAD_CFG, mode: int = 0o640) -> Path:
    cfg = folder / "ds_config.json"
    cfg.write_text(text)
    os.chown(cfg, user.uid, user.gid)
    os.chmod(cfg, mode)
    return cfg


def _reset_config(cfg: Path, user, text: str = OFFLOAD_CFG) -> None:
    """Put the owner's config back after a run, never through what is at its name now: a run as the owner may
    have renamed the racer's link over it, and root writing through that link would be the very write the
    test forbids."""
    cfg.unlink(missing_ok=True)
    fd = os.open(cfg, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chown(cfg, user.uid, user.gid)


def _nvme_remedy(cfg: Path):
    remedy = nvme_patch_remedy(str(cfg), "/mnt/nvme")
    assert remedy is not None
    return remedy


def _root_victim(root_dir: Path, text: str = "root's own file\n") -> Path:
    victim = root_dir / "authorized_keys"
    victim.write_text(text)
    os.chmod(victim, 0o600)
    return victim


def test_ds_config_fix_never_copies_through_a_planted_backup_link(racer_user, root_dir):
    victim = _root_victim(root_dir)
    with user_dir(racer_user) as folder:
        cfg = _user_config(racer_user, folder)
        remedy = _nvme_remedy(cfg)
        for name in (cfg.name + ".bak", os.path.basename(remedy.action["backup"])):
            _as_user(racer_user, ["ln", "-s", str(victim), str(folder / name)])
        out = apply.run_remedy(remedy, dict(os.environ))
        assert out.ok, out.output
        assert victim.read_text() == "root's own file\n" and victim.stat().st_uid == 0
        assert stat.S_IMODE(victim.stat().st_mode) == 0o600
        backup = Path(remedy.action["backup"] + "-2")
        assert not backup.is_symlink() and backup.read_text() == OFFLOAD_CFG
        st = cfg.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (racer_user.uid, racer_user.gid, 0o640)
        assert load_config(str(cfg)).get(("zero_optimization", "offload_optimizer", "device")) == "nvme"


def test_ds_config_fix_refuses_a_config_swapped_for_a_link_after_the_preview(racer_user, root_dir):
    victim = _root_victim(root_dir, "ssh-ed25519 AAAA admin\n")
    with user_dir(racer_user) as folder:
        cfg = _user_config(racer_user, folder)
        remedy = _nvme_remedy(cfg)
        _as_user(racer_user, ["ln", "-sfn", str(victim), str(cfg)])
        out = apply.run_remedy(remedy, dict(os.environ))
        assert not out.ok and "symbolic link" in out.output
        assert victim.read_text() == "ssh-ed25519 AAAA admin\n" and victim.stat().st_uid == 0
        assert cfg.is_symlink() and not [p for p in folder.iterdir() if ".bak" in p.name]


def test_ds_config_fix_refuses_a_config_edited_after_the_preview(racer_user):
    with user_dir(racer_user) as folder:
        cfg = _user_config(racer_user, folder)
        remedy = _nvme_remedy(cfg)
        edited = OFFLOAD_CFG.replace('"stage": 3', '"stage": 3, "note": "edited"')
        _as_user(racer_user, ["python3", "-c", f"open({str(cfg)!r}, 'w').write({edited!r})"])
        out = apply.run_remedy(remedy, dict(os.environ))
        assert not out.ok and "changed since it was shown" in out.output
        assert cfg.read_text() == edited


def test_ds_config_fix_of_a_large_config_written_as_its_owner(racer_user):
    big = OFFLOAD_CFG.rstrip().rstrip("}") + ', "comment": "' + "x" * (300 * 1024) + '"}\n'
    with user_dir(racer_user, mode=0o700) as folder:
        cfg = _user_config(racer_user, folder, big, mode=0o600)
        remedy = _nvme_remedy(cfg)
        out = apply.run_remedy(remedy, dict(os.environ))
        assert out.ok, out.output[-2000:]
        assert f"writing as {racer_user.name}" in out.output
        st = cfg.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (racer_user.uid, 0o600)
        assert Path(remedy.action["backup"]).stat().st_uid == racer_user.uid
        assert load_config(str(cfg)).get(("comment",)) == "x" * (300 * 1024)


def test_ds_config_fix_killed_at_any_point_leaves_the_old_or_the_new_config(racer_user):
    with user_dir(racer_user) as folder:
        cfg = _user_config(racer_user, folder)
        remedy = _nvme_remedy(cfg)
        new = remedy.action["text"]
        from zdoctor.edit import core_apply

        rng = random.Random(7)
        for _ in range(60):
            with core_apply.action_argv(remedy.action) as argv:
                proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(rng.uniform(0.0, 0.15))
                proc.send_signal(signal.SIGTERM)
                proc.wait()
            assert cfg.read_text() in (OFFLOAD_CFG, new)
            if cfg.read_text() == new:  # start over from the old config
                cfg.write_text(OFFLOAD_CFG)
            assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def _block(remedy: Remedy, user=None) -> subprocess.CompletedProcess[str]:
    """The remedy's copyable lines pasted into bash under ``set -e``, as root or (``user``) as that user."""
    return subprocess.run(["bash", "-c", apply.script(remedy, trace=False)], capture_output=True, text=True,
                          preexec_fn=racekit._drop_to(user) if user is not None else None, timeout=60)


def test_ds_config_copyable_lines_stop_at_the_first_failing_check(racer_user):
    with user_dir(racer_user) as folder:
        cfg = _user_config(racer_user, folder)
        remedy = _nvme_remedy(cfg)
        cfg.write_text(OFFLOAD_CFG + "\n")  # edited after the preview
        done = _block(remedy, racer_user)
        assert done.returncode != 0 and cfg.read_text() == OFFLOAD_CFG + "\n"
        assert [p.name for p in folder.iterdir()] == [cfg.name]
        cfg.write_text(OFFLOAD_CFG)
        done = _block(remedy, racer_user)
        assert done.returncode == 0, done.stderr
        assert cfg.read_text() == remedy.action["text"] and cfg.stat().st_uid == racer_user.uid
        assert Path(remedy.action["backup"]).read_text() == OFFLOAD_CFG


def _victim_untouched(victim: Path, text: str = "root's own file\n") -> bool:
    st = victim.stat()
    return victim.read_text() == text and (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o600)


def test_ds_config_copyable_lines_refuse_root_in_the_owners_folder_and_as_the_owner_never_reach_roots_files(
        racer_user, root_dir):
    """The owner renames a link to a root-owned file over the block's temporary file as soon as it appears:
    pasted by root the lines stop at their first (they run only as the folder's owner); run as the owner,
    the link gets them nothing root's file would not give that owner."""
    victim = _root_victim(root_dir)
    racer = build_racer("swap_in_link", root_dir)
    with user_dir(racer_user) as folder:
        cfg = _user_config(racer_user, folder)
        remedy = _nvme_remedy(cfg)
        with racing(racer_user, [str(racer), str(folder), ".ds_config.json.zdoctor-", str(victim), "both"]) as proc:
            done = _block(remedy)
            assert done.returncode != 0 and "run these lines as the owner of the folder" in done.stderr
            made = [p.name for p in folder.iterdir() if not p.name.startswith(".swap-in-link")]
            assert made == [cfg.name]  # nothing written, not even the temp file
            assert cfg.read_text() == OFFLOAD_CFG and _victim_untouched(victim)
            runs, deadline = 0, time.monotonic() + RACE_SECONDS
            while time.monotonic() < deadline and runs < 20:
                _block(remedy, racer_user)
                runs += 1
                assert _victim_untouched(victim), f"run {runs} wrote or chowned root's file through the link"
                _reset_config(cfg, racer_user)
            os.kill(proc.pid, 9)
            proc.wait()
            swaps = proc.stdout.read().decode().count("swapped") if proc.stdout else 0
        assert swaps > 0, "the racer never got to swap a link in: the race did not run"
        assert _victim_untouched(victim)


def test_fstab_copyable_lines_run_only_as_the_owner_of_the_fstabs_folder(racer_user, root_dir):
    """The fstab block stages and backs up beside the file: in a folder a user owns, root's paste stops at
    the first line while that user renames a link to root's file over every file made there."""
    from zdoctor.layers.offload import fstab as fs

    victim = _root_victim(root_dir)
    racer = build_racer("swap_in_link", root_dir)
    with user_dir(racer_user) as folder:
        tab = folder / "fstab"
        tab.write_text("proc /proc proc defaults 0 0\n")
        os.chown(tab, racer_user.uid, racer_user.gid)
        remedy = fs.fstab_remedy("0bfe0b2c-4b45-4a3c-9d5e-6b1e5e0d9d11", str(root_dir / "mp"), "ext4",
                                 fstab_path=str(tab), stamp="R", mount_now=False)
        with racing(racer_user, [str(racer), str(folder), "fstab.", str(victim), "both"]):
            done = _block(remedy)
        assert done.returncode != 0 and "run these lines as the owner of the folder" in done.stderr
        made = [p.name for p in folder.iterdir() if not p.name.startswith(".swap-in-link")]
        assert made == ["fstab"] and _victim_untouched(victim)
    # In root's own folder (as /etc is) root goes past that line.
    tab = root_dir / "fstab"
    tab.write_text("proc /proc proc defaults 0 0\n")
    remedy = fs.fstab_remedy("0bfe0b2c-4b45-4a3c-9d5e-6b1e5e0d9d11", str(root_dir / "mp"), "ext4",
                             fstab_path=str(tab), stamp="R", mount_now=False)
    done = subprocess.run(["bash", "-c", remedy.commands[0]], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# -- the stale-lock fix -----------------------------------------------------------------------------------

def test_stale_lock_fix_never_deletes_through_an_op_dir_swapped_for_a_link(racer_user, root_dir):
    theirs = root_dir / "root-op"
    theirs.mkdir()
    (theirs / "lock").write_text("")
    with user_dir(racer_user) as ext:
        _as_user(racer_user, ["mkdir", str(ext / "cpu_adam")])
        _as_user(racer_user, ["touch", str(ext / "cpu_adam" / "lock")])
        remedy = lock_remedy({"path": str(ext / "cpu_adam" / "lock"), "op": "cpu_adam"}, {"lock_kind": "file"}, [])
        _as_user(racer_user, ["mv", str(ext / "cpu_adam"), str(ext / "old")])
        _as_user(racer_user, ["ln", "-s", str(theirs), str(ext / "cpu_adam")])
        out = apply.run_remedy(remedy, dict(os.environ))
        assert not out.ok and "symbolic link" in out.output
        assert (theirs / "lock").exists()
        done = subprocess.run(["bash", "-c", apply.script(remedy)], capture_output=True, text=True)
        assert done.returncode != 0 and (theirs / "lock").exists()  # the copyable line refuses it too
        _as_user(racer_user, ["rm", str(ext / "cpu_adam")])
        _as_user(racer_user, ["mv", str(ext / "old"), str(ext / "cpu_adam")])
        out = apply.run_remedy(remedy, dict(os.environ))
        assert out.ok, out.output
        assert f"removing as {racer_user.name}" in out.output and not (ext / "cpu_adam" / "lock").exists()


# -- zdoctor's own state: the fix files and the state directory ---------------------------------------------

def test_fix_files_are_never_written_through_the_users_link(racer_user, root_dir):
    profile_d = root_dir / "profile.d"  # a stand-in for /etc/profile.d
    profile_d.mkdir()
    with user_dir(racer_user) as state:
        _as_user(racer_user, ["mkdir", "-p", str(state / "zdoctor")])
        _as_user(racer_user, ["ln", "-s", str(profile_d), str(state / "zdoctor" / "fixes")])
        r = Remedy("preload", ["export LD_PRELOAD=/tmp/evil.so"])
        out = apply.run_remedy(r, dict(os.environ), env_file=(state / "zdoctor" / "fixes", "fix-1.sh"))
        assert out.exit_code == 0 and out.env_file is None
        assert "could not write the environment file" in (out.error or "")
        assert not list(profile_d.iterdir())
        _as_user(racer_user, ["rm", str(state / "zdoctor" / "fixes")])
        _as_user(racer_user, ["mkdir", str(state / "zdoctor" / "fixes")])  # a real folder, but the user's
        out = apply.run_remedy(r, dict(os.environ), env_file=(state / "zdoctor" / "fixes", "fix-2.sh"))
        assert out.env_file is None and f"owned by uid {racer_user.uid}" in (out.error or "")
        assert not list((state / "zdoctor" / "fixes").iterdir())


def test_a_missing_home_makes_no_directories_and_the_check_still_reports(tmp_path):
    home = Path(f"/nonexistent-zdrace-{os.getpid()}")
    env = {k: v for k, v in os.environ.items() if k != "XDG_STATE_HOME"}
    env["HOME"] = str(home)
    m = run_measured(["check", "--json", "--playbook", "gpu-stack"], env=env, wall_limit=90)
    try:
        assert m.returncode in (0, 1, 3), m.stderr
        (line,) = [x for x in m.stderr.splitlines() if "session not recorded" in x]
        assert f"not creating session log directory {home}/.local/state/zdoctor/sessions: {home} does not exist" in line
        assert not home.exists() and "Traceback" not in m.stderr
        assert json.loads(m.stdout)["findings"]
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_ds_config_fix_refuses_a_config_whose_owner_changed_since_the_preview(racer_user):
    with user_dir(racer_user) as folder:
        cfg = folder / "ds_config.json"
        cfg.write_text(OFFLOAD_CFG)  # root's config in the user's folder
        os.chmod(cfg, 0o644)
        remedy = _nvme_remedy(cfg)
        assert remedy.action["uid"] == 0
        _as_user(racer_user, ["sh", "-c", f"cp {cfg} {folder}/x && mv -f {folder}/x {cfg}"])  # same bytes, theirs
        out = apply.run_remedy(remedy, dict(os.environ))
        assert not out.ok and f"now belongs to uid {racer_user.uid}, not uid 0" in out.output
        assert cfg.read_text() == OFFLOAD_CFG and cfg.stat().st_uid == racer_user.uid
        done = subprocess.run(["bash", "-c", apply.script(remedy, trace=False)], capture_output=True, text=True)
        assert done.returncode != 0 and cfg.read_text() == OFFLOAD_CFG  # the copyable lines check it too
