"""/dev/shm tested as the training user, not as root: a real unprivileged user (created here, removed
after) and a real tmpfs mounted over /dev/shm in a private mount namespace (``unshare -m``), with modes
root can write through and the user cannot. Root's own groups must not leak into the test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_gpu_facts import h200

import zdoctor
from zdoctor.layers.gpu.check_shmaccess import check_shm_access
from zdoctor.layers.gpu.probe_shmaccess import shm_access

USER, GROUP = "zdh3shm", "zdh3shmgrp"

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("useradd"),
                                reason="needs root, unshare and useradd")

PROBE = textwrap.dedent("""
    import json, sys
    from zdoctor.layers.gpu.check_shmaccess import check_shm_access
    from zdoctor.host import LiveHost
    from zdoctor.core.registry import load_vocabulary
    load_vocabulary()
    opts = {"user": sys.argv[1]} if len(sys.argv) > 1 else {}
    facts = LiveHost(options=opts).results(["shm_access"])
    (x,) = check_shm_access(facts)
    print(json.dumps({"facts": facts.of("shm_access"), "status": x.status, "title": x.title, "detail": x.detail}))
""")


@pytest.fixture(scope="module")
def user():
    subprocess.run(["userdel", "-r", USER], capture_output=True)
    subprocess.run(["groupdel", GROUP], capture_output=True)
    subprocess.run(["groupadd", GROUP], check=True)
    subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", "-G", GROUP, USER], check=True)
    try:
        yield USER
    finally:
        subprocess.run(["userdel", USER], capture_output=True)
        subprocess.run(["groupdel", GROUP], capture_output=True)


def in_namespace(mode: str, group: str = "root", *args: str, runner: list[str] | None = None) -> dict:
    """Run the shm_access probe and check in a private mount namespace whose /dev/shm is a fresh tmpfs
    with ``mode`` and group ``group``."""
    setup = (f"mount -t tmpfs -o mode={mode},size=1m zdh3shm /dev/shm && chgrp {group} /dev/shm && "
             f"chmod {mode} /dev/shm && exec \"$@\"")
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", setup, "sh", *(runner or []),
            sys.executable, "-c", PROBE, *args]
    env = {**os.environ, "PYTHONPATH": str(Path(zdoctor.__file__).resolve().parent.parent)}  # the code under test
    res = subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/", timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_root_writable_shm_the_training_user_cannot_write_fails_as_that_user(user):
    # 0775 root:root: root writes (its own uid, and its group 0 too), the training user cannot.
    out = in_namespace("0775", "root", user)
    f = out["facts"]
    assert f["tested_as"] == user and f["euid"] == 0 and f["write_test"] is False, f
    assert out["status"] == "fail" and f"{user} (uid {f['user_uid']}) cannot create files in /dev/shm" in out["title"]
    assert "Permission denied" in out["title"]
    # the same mount with the group of the training user: its own groups count, root's do not
    out = in_namespace("0770", GROUP, user)
    assert out["status"] == "ok" and f"writable by {user}" in out["title"], out
    out = in_namespace("1777", "root", user)
    assert out["status"] == "ok" and out["facts"]["tested_as"] == user


def test_without_root_another_training_user_is_a_skip_never_ok(user):
    # zdoctor running as the unprivileged user, told the training runs as root: it cannot switch, so it
    # says so (a forked child that really dropped to the user runs the probe's function).
    import pwd

    pw = pwd.getpwnam(user)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            os.write(w, json.dumps(shm_access("/dev/shm", user={"name": "root", "rule": "--user"})).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    f = json.loads(data)
    assert f["euid"] == pw.pw_uid and f["write_test"] is None and "not root" in f["skipped"], f
    (x,) = check_shm_access(h200(shm_access=f))
    assert x.status == "skip" and "not tested as root" in x.detail and "not checked" in x.title
