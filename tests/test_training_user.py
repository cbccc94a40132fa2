"""The offload directory belongs to the training user, and zdoctor says which rule chose that user."""

from __future__ import annotations

import json
import os
import pwd
import sys
from pathlib import Path

import pytest
from conftest import run_cli

import zdoctor.layers.offload.check_storage  # noqa: F401 - registers the storage checks
import zdoctor.layers.offload.probe_storage  # noqa: F401 - and the storage probes
from zdoctor.core.registry import Facts
from zdoctor.host import LiveHost
from zdoctor.layers import evaluate_check

NOBODY = pwd.getpwnam("nobody")
NOGROUP = __import__("grp").getgrgid(NOBODY.pw_gid).gr_name
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown of a test environment to another user needs root")


def _env_of(owner: int, root: Path) -> Path:
    """A venv-shaped training environment owned by ``owner``: <root>/env/bin/python -> this interpreter."""
    (root / "env" / "bin").mkdir(parents=True)
    python = root / "env" / "bin" / "python"
    python.symlink_to(sys.executable)
    os.chown(root / "env", owner, -1)
    return python


def _dir_remedy(host: LiveHost):
    facts = Facts({"storage": host.result("storage"), "nvme_inventory": host.result("nvme_inventory")})
    (f,) = [f for f in evaluate_check("storage.mount", facts) if f.id == "storage.mount"]
    assert f.status == "warn" and "does not exist yet" in f.title
    (rem,) = f.remedies
    return rem


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SUDO_USER"}
    env.update(extra)
    return env


def test_the_owner_of_the_python_environment_owns_the_offload_directory(tmp_path):
    python = _env_of(NOBODY.pw_uid, tmp_path)
    off = tmp_path / "off"
    host = LiveHost(python=str(python), env=_env(), options={"offload_path": str(off)})
    rem = _dir_remedy(host)
    assert f"chown -- nobody:{NOGROUP} {off}" in rem.commands
    assert f"chosen by: owner of the training environment {tmp_path / 'env'} (--python)" in rem.explanation
    assert "root:root" not in " ".join(rem.commands)


def test_sudo_user_when_the_environment_is_roots(tmp_path):
    python = _env_of(0, tmp_path)
    off = tmp_path / "off"
    host = LiveHost(python=str(python), env=_env(SUDO_USER="nobody"), options={"offload_path": str(off)})
    rem = _dir_remedy(host)
    assert f"chown -- nobody:{NOGROUP} {off}" in rem.commands and "chosen by: SUDO_USER" in rem.explanation


def test_root_without_any_other_user_gets_no_chown_and_no_training_user_claim(tmp_path):
    off = tmp_path / "off"
    host = LiveHost(env=_env(), options={"offload_path": str(off)})
    rem = _dir_remedy(host)
    assert not any(c.startswith("chown") for c in rem.commands)
    assert "the training user writes" not in rem.explanation
    assert "only root can write there" in rem.explanation and "--user" in rem.explanation


def test_user_option_wins_and_an_unknown_user_is_a_usage_error(tmp_path):
    python = _env_of(0, tmp_path)
    off = tmp_path / "off"
    proc = run_cli(["check", "--json", "--no-log", "--python", str(python), "--offload-path", str(off),
                    "--user", "nobody"], env=_env(SUDO_USER="root"), timeout=300)
    doc = json.loads(proc.stdout)
    (f,) = [f for f in doc["findings"] if f["id"] == "storage.mount"]
    (rem,) = f["remedies"]
    assert f"chown -- nobody:{NOGROUP} {off}" in rem["commands"] and "chosen by: --user" in rem["explanation"]
    bad = run_cli(["check", "--no-log", "--offload-path", str(off), "--user", "no-such-user-zd"], timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.strip() == "zdoctor: --user no-such-user-zd: no such user on this machine"


def test_a_directory_the_training_user_cannot_write_names_the_user_and_the_rule(tmp_path):
    off = tmp_path / "off"
    off.mkdir(mode=0o755)  # root's, as zdoctor (root) would find a directory someone made with sudo
    host = LiveHost(env=_env(), options={"offload_path": str(off), "user": "nobody"})
    facts = Facts({"storage": host.result("storage"), "nvme_inventory": host.result("nvme_inventory")})
    (f,) = [f for f in evaluate_check("storage.mount", facts) if f.id == "storage.mount"]
    assert f.status == "fail" and "not writable" in f.title
    assert "running as nobody (the training user, chosen by: --user)" in f.detail
    (rem,) = f.remedies
    assert f"chown -- nobody:{NOGROUP} {off}" in rem.commands
