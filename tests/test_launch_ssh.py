"""The DeepSpeed launcher's own tools and its ssh logins, for real: the test environment's `deepspeed`
launching across two hosts with a PATH that lacks pdsh, and against the real sshd of sshkit on loopback
addresses with a key the server does not accept, a host key that changed and a port where nothing listens.
ssh's client configuration is a private /etc/ssh bound in a private mount namespace: no user's home and no
file of the machine changes. zdoctor tells the failures apart, explains the real messages and offers the
commands that fix each; the PATH remedy is tried by launching again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from dsenv import ensure
from launchkit import PROBE, probe_argument
from sshkit import SSHD, free_port, require, start_sshd
from test_gpu_facts import facts_of

from zdoctor.layers.launch import check_launchtools as ct
from zdoctor.layers.launch.probe_launchtools import collect_launcher_tools

ROOT = Path(__file__).resolve().parent.parent
WRONG_KEY, CHANGED, CLOSED = "127.0.0.2", "127.0.0.3", "127.0.0.4"



def _private_ssh(work: Path, cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    """``cmd`` in a private mount namespace whose /etc/ssh is the test's folder."""
    script = f"{shutil.which('mount')} --bind {work / 'etcssh'} /etc/ssh && exec \"$@\""
    return subprocess.run([str(shutil.which("unshare")), "-m", "/bin/sh", "-c", script, "sh", *cmd],
                          capture_output=True, text=True,
                          timeout=kw.pop("timeout", 300), **kw)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    require("ssh", SSHD, "unshare")
    python = ensure()
    work = tmp_path_factory.mktemp("ssh")
    sshd = start_sshd(work / "sshd", {WRONG_KEY: {}, CHANGED: {}})
    try:
        for key in ("wrongkey", "otherhost"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / key)], check=True)
        hostkey = (work / "sshd" / "hostkey.pub").read_text().split()[:2]
        other = (work / "otherhost.pub").read_text().split()[:2]
        (work / "etcssh").mkdir()
        (work / "etcssh" / "known_hosts").write_text(f"[{WRONG_KEY}]:{sshd.port} {' '.join(hostkey)}\n"
                                                     f"[{CHANGED}]:{sshd.port} {' '.join(other)}\n")
        (work / "etcssh" / "ssh_config").write_text(textwrap.dedent(f"""\
            Host {WRONG_KEY}
              Port {sshd.port}
              IdentityFile {work / 'wrongkey'}
            Host {CHANGED}
              Port {sshd.port}
              IdentityFile {work / 'sshd' / 'userkey'}
            Host {CLOSED}
              Port {free_port()}
            Host *
              IdentitiesOnly yes
              GlobalKnownHostsFile {work / 'etcssh' / 'known_hosts'}
              UserKnownHostsFile /dev/null
              StrictHostKeyChecking yes
              LogLevel ERROR
            """))
        (work / "t.py").write_text("print('ran')\n")
        (work / "hostfile").write_text(f"{WRONG_KEY} slots=1\n{CHANGED} slots=1\n{CLOSED} slots=1\n")
        # a PATH with the training environment and ssh, without pdsh
        (work / "bin").mkdir()
        (work / "bin" / "ssh").symlink_to(str(shutil.which("ssh")))
        env = {"PATH": f"{python.parent}:{work / 'bin'}", "HOME": os.environ.get("HOME", "/root")}
        deepspeed = str(python.parent / "deepspeed")
        runs = {
            "check": _private_ssh(work, [deepspeed, "-H", "hostfile", "t.py"], cwd=work, env=env),
            "pdsh": _private_ssh(work, [deepspeed, "-H", "hostfile", "--no_ssh_check", "--master_addr", "127.0.0.1",
                                        "t.py"], cwd=work, env=env),
            **{h: _private_ssh(work, [str(shutil.which("ssh")), "-o", "BatchMode=yes", h, "true"], env={**os.environ})
               for h in (WRONG_KEY, CHANGED)},
        }
        log = "\n".join(r.stdout + r.stderr for r in runs.values())
        command = f"deepspeed -H {work / 'hostfile'} t.py"
        arg = probe_argument(env, command, log, ["launch", "hostfile", "launcher_tools"],
                             ["launcher.hostfile", "launcher.tools"])
        r = _private_ssh(work, [sys.executable, "-c", PROBE, arg], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert r.returncode == 0, r.stderr
        yield {"work": work, "runs": runs, "doc": json.loads(r.stdout), "env": env, "deepspeed": deepspeed}
    finally:
        sshd.stop()


def test_the_real_launcher_and_ssh_fail_as_users_see_them(lab):
    runs = lab["runs"]
    assert f"host={WRONG_KEY} was not reachable via ssh" in runs["check"].stdout + runs["check"].stderr
    assert "RuntimeError: launcher 'pdsh' not installed." in runs["pdsh"].stderr
    assert f"root@{WRONG_KEY}: Permission denied (publickey)." in runs[WRONG_KEY].stderr
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in runs[CHANGED].stderr
    assert "Host key verification failed." in runs[CHANGED].stderr


def test_each_ssh_failure_is_told_apart_and_explained(lab):
    doc = lab["doc"]
    (f,) = doc["findings"]["launcher.hostfile"]
    assert f["status"] == "fail"
    assert f"{WRONG_KEY} (publickey)" in f["title"] and f"{CHANGED} (host key changed)" in f["title"]
    assert f"{CLOSED} (refused)" in f["title"]
    kinds: dict[str, list[str]] = {}
    for s in doc["symptoms"]:
        kinds.setdefault(s["kind"], []).append(s["id"])
    named = set(f["explains"])
    assert set(kinds["host-unreachable"]) <= named  # DeepSpeed's "was not reachable via ssh" for the first host
    assert [s["id"] for s in doc["symptoms"] if s["kind"] == "ssh-auth" and s["fields"].get("host") == WRONG_KEY] \
        and set(kinds["ssh-auth"]) <= named
    commands = {r["title"].split(":")[0]: r["commands"] for r in f["remedies"]}
    key = next(c for t, c in commands.items() if t.startswith("The server accepts keys only"))
    assert key[-1] == f"ssh-copy-id -i ~/.ssh/id_ed25519.pub {WRONG_KEY}"
    changed = next(c for t, c in commands.items() if t.startswith("The host's key differs"))
    assert changed[0].startswith(f"ssh-keygen -R '[{CHANGED}]:") and changed[0].endswith("known_hosts")


def test_the_host_key_remedy_fixes_the_login_for_real(lab):
    """The changed-key remedy of the finding, run in the private namespace (the new key accepted into the test's
    known_hosts file, restored after): ssh logs in."""
    work = lab["work"]
    known = work / "etcssh" / "known_hosts"
    saved = known.read_text()
    try:
        (f,) = lab["doc"]["findings"]["launcher.hostfile"]
        steps = next(r["commands"] for r in f["remedies"] if r["title"].startswith("The host's key differs"))
        script = " && ".join([steps[0], steps[1].replace("StrictHostKeyChecking=accept-new",
                                                         f"StrictHostKeyChecking=accept-new -o UserKnownHostsFile="
                                                         f"{known}"), f"ssh {CHANGED} echo logged-in"])
        r = _private_ssh(work, ["sh", "-c", script], env={**os.environ})
        assert r.returncode == 0 and "logged-in" in r.stdout, r.stderr
    finally:
        known.write_text(saved)


def test_pdsh_missing_from_the_path_is_explained_and_the_path_remedy_works(lab):
    doc = lab["doc"]
    tools = doc["facts"]["launcher_tools"]
    assert tools["needed"] and tools["backend"] == "pdsh" and tools["tool"]["on_path"] is None
    (f,) = doc["findings"]["launcher.tools"]
    (sym,) = [s for s in doc["symptoms"] if s["kind"] == "launcher-missing"]
    assert f["status"] == "fail" and f["explains"] == [sym["id"]]
    first = f["remedies"][0]
    folder = os.path.dirname(tools["tool"]["elsewhere"])
    assert first["commands"] == [f'export PATH={folder}:"$PATH"']
    assert first["verification"]["state"] != "not_tried"  # pdsh was started
    # tried for real: the same launch with that folder on the PATH gets past the launcher's check
    env = {**lab["env"], "PATH": f"{folder}:{lab['env']['PATH']}"}
    r = _private_ssh(lab["work"], [lab["deepspeed"], "-H", "hostfile", "--no_ssh_check", "--master_addr",
                                   "127.0.0.1", "t.py"], cwd=lab["work"], env=env)
    assert "not installed" not in r.stderr and "pdsh" in r.stdout + r.stderr


def test_one_host_needs_no_backend_and_openmpi_is_offered_when_present(tmp_path):
    facts, _ = collect_launcher_tools({"launcher": "deepspeed", "options": {}}, ["a"], "/nonexistent")
    assert facts["needed"] is False
    (f,) = ct.check_launcher_tools(facts_of(launcher_tools=facts))
    assert f.status == "ok"
    (tmp_path / "ompi_info").write_text("#!/bin/sh\necho 'Open MPI: 4.1.6'\n")
    (tmp_path / "ompi_info").chmod(0o755)
    launch = {"launcher": "deepspeed", "options": {"include": "a@b"}, "command": "deepspeed -H hf t.py"}
    facts, _ = collect_launcher_tools(launch, ["a", "b", "c"], str(tmp_path))
    assert facts["needed"] and facts["others"] == {"openmpi": str(tmp_path / "ompi_info")}
    (f,) = ct.check_launcher_tools(facts_of(launcher_tools=facts, launch={"launch": launch},
                                            toolchain={"distro": {"id": "ubuntu"}}))
    cmds = [r.commands for r in f.remedies]
    assert ["apt-get update", "apt-get install -y pdsh"] in cmds
    assert ["deepspeed --launcher openmpi -H hf t.py"] in cmds
    launch_mpi = {**launch, "options": {"multinode_launcher": "openmpi"}}
    facts, _ = collect_launcher_tools(launch_mpi, ["a", "b"], "/nonexistent")
    assert facts["tool"]["tool"] == "ompi_info"
