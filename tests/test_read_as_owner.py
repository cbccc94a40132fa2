"""A file a user names is read, by root, with the rights of whoever can change the way to it: a link a
training user planted in their own folder to a file only root may read is not read, not quoted in the
report, and the refusal is one line; the same user's real log in the same folder is read as before. Real
unprivileged user, real links, real root-only file."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import run_cli
from userkit import unprivileged_user

from zdoctor.core.errors import InputError
from zdoctor.proc.userfile import NOBODY, controller, read_user_file

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="reading as another user needs root")

SECRET = "ROOT-ONLY-SECRET-7f3a"


@pytest.fixture
def planted():
    # under /tmp itself: pytest's own temporary folders are root's alone, which no user may pass through
    tmp_path = Path(tempfile.mkdtemp(prefix="zdoctor-read-as-", dir="/tmp"))
    vault = tmp_path / "vault"
    vault.mkdir(mode=0o700)
    secret = vault / "secret.log"
    secret.write_text(f"RuntimeError: CUDA error: {SECRET}\n")
    secret.chmod(0o600)
    os.chmod(tmp_path, 0o755)
    with unprivileged_user("rd") as user:
        home = tmp_path / "home"
        home.mkdir()
        os.chown(home, user.uid, user.gid)
        link = home / "train.log"
        link.symlink_to(secret)
        os.lchown(link, user.uid, user.gid)
        real = home / "real.log"
        real.write_text("step 9\nRuntimeError: CUDA error: an illegal memory access was encountered\n")
        os.chown(real, user.uid, user.gid)
        try:
            yield {"user": user, "link": link, "real": real, "secret": secret, "tmp": tmp_path}
        finally:
            shutil.rmtree(tmp_path, ignore_errors=True)


def test_the_reader_takes_the_rights_of_whoever_can_change_the_way(planted):
    assert controller(str(planted["link"])) == planted["user"].uid
    assert controller(str(planted["secret"])) is None  # only root can change the way to it
    shared = planted["tmp"] / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # everyone may plant here, and no sticky bit
    assert controller(str(shared / "x.log")) == NOBODY
    with pytest.raises(InputError, match="permission denied") as exc:
        read_user_file(str(planted["link"]), "log")
    assert "\n" not in str(exc.value) and SECRET not in str(exc.value)
    assert b"illegal memory access" in read_user_file(str(planted["real"]), "log")


def test_check_never_quotes_a_root_only_file_through_a_planted_link(planted, tmp_path: Path):
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), NO_COLOR="1")
    proc = run_cli(["check", "--json", "--no-log", "--playbook", "gpu-stack", "--log", str(planted["link"])],
                   env=env, timeout=300)
    assert SECRET not in proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert not [s for s in doc["symptoms"] if s["source"] == "log"]
    proc = run_cli(["check", "--json", "--no-log", "--playbook", "gpu-stack", "--log", str(planted["real"])],
                   env=env, timeout=300)
    doc = json.loads(proc.stdout)
    assert [s["text"] for s in doc["symptoms"] if s["source"] == "log"] == [
        "RuntimeError: CUDA error: an illegal memory access was encountered"]
