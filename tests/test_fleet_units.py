"""Fleet building blocks: hostfiles and Slurm node lists, host-name validation, launcher argv, the armored
snapshot, demultiplexing pdsh's real output, and how a node's outcome is classified."""

from __future__ import annotations

import base64
import gzip
import json
import os
import shlex

import pytest
from fleetkit import h200_node

from zdoctor.core.errors import InputError, UsageError
from zdoctor.fleet import armor
from zdoctor.fleet.collect import classify, split_pdsh
from zdoctor.fleet.launch import FleetOptions, pdsh_argv, pdsh_env, remote_argv, srun_argv, ssh_argv
from zdoctor.layers.launch.hosts import expand_nodelist, host_problem, parse_hostfile, read_hostfile

# -- hostfiles ----------------------------------------------------------------------------------------


def test_deepspeed_hostfile_with_comments_blank_lines_and_a_plain_entry():
    text = "# nodes of the job\n\nworker-1 slots=8\n  worker-2   slots=4  # the small one\nworker-3\n10.0.0.7 slots=8\n"
    nodes = parse_hostfile(text, "hf")
    assert [(n.name, n.slots, n.line) for n in nodes] == [
        ("worker-1", 8, 3), ("worker-2", 4, 4), ("worker-3", None, 5), ("10.0.0.7", 8, 6)]


@pytest.mark.parametrize("text,message", [
    ("worker-1 slots=8\nworker-1 slots=8\n", "hf:2: host 'worker-1' is listed twice (first on line 1)"),
    ("worker-1 slots=eight\n", "hf:1: expected 'slots=N' after the host, got 'slots=eight'"),
    ("worker-1 slots=8 gpus=2\n", "hf:1: expected 'HOST' or 'HOST slots=N'"),
    ("# only a comment\n\n", "hf: no hosts"),
    ("-oProxyCommand=touch${IFS}/tmp/x slots=1\n", "starts with '-'"),
    ("a;reboot\n", "contains ';'"),
    ("root@worker-1\n", "contains '@'"),
    ("node[1-4]\n", "contains '[' ']'"),
    ("a,b\n", "contains ','"),
    ("300.1.1.1\n", "not a valid IPv4 address"),
    ("wörker\n", "contains 'ö'"),
    ("a..b\n", "empty or malformed label"),
])
def test_bad_hostfiles_are_one_line_errors_with_the_line(text, message):
    with pytest.raises(InputError) as exc:
        parse_hostfile(text, "hf")
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_host_names_accepted():
    for name in ("gpu-01", "gpu_01.cluster.local", "127.0.0.2", "::1", "fe80::1", "a" * 63):
        assert host_problem(name) is None, name
    assert host_problem("a" * 64) is not None
    assert host_problem("x" * 254) == "host name longer than 253 characters"


def test_unreadable_hostfiles(tmp_path):
    with pytest.raises(InputError, match="missing: no such hostfile"):
        read_hostfile(str(tmp_path / "missing"))
    with pytest.raises(InputError, match="is a directory"):
        read_hostfile(str(tmp_path))
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InputError, match="not a text file"):
        read_hostfile(str(tmp_path / "bin"))
    os.mkfifo(tmp_path / "fifo")  # a pipe nobody writes to must not hang the read
    with pytest.raises(InputError, match="not a regular file"):
        read_hostfile(str(tmp_path / "fifo"))


def test_slurm_node_lists():
    names = [n.name for n in expand_nodelist("gpu[01-03,07],login1,rack[1-2]-n[8-9]")]
    assert names == ["gpu01", "gpu02", "gpu03", "gpu07", "login1", "rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"]
    assert [n.name for n in expand_nodelist("a,a,b")] == ["a", "b"]
    for bad, why in (("gpu[1-", "unbalanced"), ("gpu[3-1]", "runs backwards"), ("gpu[a-b]", "bad range"),
                     ("gpu[1-99999]", "more than 4096"), ("-x[1-2]", "starts with '-'")):
        with pytest.raises(InputError, match=why):
            expand_nodelist(bad)


# -- launcher argv -----------------------------------------------------------------------------------

HOSTILE = "/opt/my envs/$(touch pwned);'py'"


def test_remote_command_keeps_hostile_paths_as_one_argument():
    opts = FleetOptions(python=HOSTILE, timeout=90, snapshot_args=["--ext", "/x y/ext.so"])
    argv = remote_argv(opts)
    assert argv == ["zdoctor", "snapshot", "-o", "-", "--armor", "--timeout", "30", "--python", HOSTILE,
                    "--ext", "/x y/ext.so"]
    line = ssh_argv("gpu-1", opts)[-1]
    assert shlex.split(line) == ["timeout", "-k", "5", "90", *argv]  # what the node's shell will run
    assert pdsh_argv(["gpu-1"], opts)[-1] == line
    with pytest.raises(UsageError, match="--zdoctor"):
        remote_argv(FleetOptions(zdoctor="'unterminated"))
    assert remote_argv(FleetOptions(zdoctor="/opt/venv/bin/python -m zdoctor"))[:4] == [
        "/opt/venv/bin/python", "-m", "zdoctor", "snapshot"]


def test_ssh_pdsh_and_srun_argv():
    opts = FleetOptions(timeout=8, parallel=4, ssh_config="/etc/zd/ssh_config")
    assert ssh_argv("gpu-1", opts)[:-1] == ["ssh", "-n", "-o", "BatchMode=yes", "-o", "ConnectTimeout=4",
                                            "-F", "/etc/zd/ssh_config", "--", "gpu-1"]
    assert pdsh_argv(["gpu-1", "gpu-2"], opts)[:-1] == ["pdsh", "-R", "ssh", "-f", "4", "-t", "4", "-u", "8",
                                                         "-w", "gpu-1,gpu-2"]
    assert srun_argv("gpu-1", opts) == ["srun", "--nodes=1", "--ntasks=1", "--nodelist=gpu-1", "--overlap",
                                        "--quiet", "--immediate=4", "--job-name=zdoctor-fleet", "--",
                                        "zdoctor", "snapshot", "-o", "-", "--armor", "--timeout", "2"]
    env = pdsh_env(opts, {"PDSH_SSH_ARGS_APPEND": "-p 2222"})
    assert env["PDSH_SSH_ARGS_APPEND"] == "-p 2222 -o BatchMode=yes -F /etc/zd/ssh_config"
    with pytest.raises(UsageError, match="white space"):
        pdsh_env(FleetOptions(ssh_config="/my dir/cfg"), {})


# -- the armored snapshot -----------------------------------------------------------------------------


def test_armor_survives_pdsh_prefixes_banners_and_split_lines():
    doc = h200_node("gpu-1").snapshot
    text = armor.encode(doc)
    assert all(len(line) <= 76 for line in text.splitlines()[1:-1])
    lines = ["Welcome to gpu-1", *text.splitlines(), "logout"]
    assert armor.decode(lines) == doc
    assert armor.decode(["old", *armor.encode({"a": 1}).splitlines(), *lines]) == doc  # the last block wins


@pytest.mark.parametrize("lines,why", [
    (["hello"], "no snapshot in the output"),
    ([armor.BEGIN, "H4sI"], "cut off before its end marker"),
    ([armor.END], "end marker without a begin marker"),
    ([armor.BEGIN, "!!!!", armor.END], "corrupt"),
    ([armor.BEGIN, base64.b64encode(b"not gzip").decode(), armor.END], "corrupt"),
    ([armor.BEGIN, base64.b64encode(gzip.compress(b"{nope")).decode(), armor.END], "not valid JSON"),
    ([armor.BEGIN, base64.b64encode(gzip.compress(b"[1]")).decode(), armor.END], "not a JSON object"),
])
def test_armor_errors(lines, why):
    with pytest.raises(armor.ArmorError, match=why):
        armor.decode(lines)


def test_armor_refuses_a_decompression_bomb(monkeypatch):
    monkeypatch.setattr(armor, "MAX_JSON", 1000)
    bomb = base64.b64encode(gzip.compress(json.dumps({"x": "a" * 5000}).encode())).decode()
    with pytest.raises(armor.ArmorError, match="larger than"):
        armor.decode([armor.BEGIN, bomb, armor.END])


# -- pdsh's output, as the real pdsh 2.34 printed it -----------------------------------------------------

PDSH_STDERR = """\
127.0.0.9: ssh: connect to host 127.0.0.9 port 2222: Connection refused
pdsh@vm: 127.0.0.9: ssh exited with exit code 255
127.0.0.5: bash: line 1: zdoctor: command not found
pdsh@vm: 127.0.0.5: ssh exited with exit code 127
pdsh@vm: 127.0.0.6: command timeout
sending SIGTERM to ssh 127.0.0.6
sending signal 15 to 127.0.0.6 [ssh] pid 31802
pdsh@vm: 127.0.0.6: ssh exited with exit code 255
"""


def test_split_pdsh_output_per_host():
    hosts = ["127.0.0.2", "127.0.0.5", "127.0.0.6", "127.0.0.9"]
    stdout = "127.0.0.2: " + "\n127.0.0.2: ".join(armor.encode({"a": 1}).splitlines()) + "\n127.0.0.2: \n"
    out, err, codes, timed_out, stray = split_pdsh(hosts, stdout, PDSH_STDERR)
    assert armor.decode(out["127.0.0.2"]) == {"a": 1} and out["127.0.0.2"][-1] == ""
    assert codes == {"127.0.0.9": 255, "127.0.0.5": 127, "127.0.0.6": 255}
    assert timed_out == {"127.0.0.6"} and stray == []
    assert err["127.0.0.9"] == ["ssh: connect to host 127.0.0.9 port 2222: Connection refused"]
    assert err["127.0.0.5"] == ["bash: line 1: zdoctor: command not found"]
    assert err["127.0.0.6"] == ["pdsh: command timeout"]


def test_classify_each_outcome():
    good = armor.encode(h200_node("gpu-1").snapshot).splitlines()
    assert classify("h", "ssh", 0, good, [], False, 60).status == "ok"
    refused = classify("h", "ssh", 255, [], ["ssh: connect to host h port 22: Connection refused"], False, 60)
    assert (refused.status, refused.error) == ("unreachable", "ssh: connect to host h port 22: Connection refused")
    missing = classify("h", "pdsh", 127, [], ["bash: line 1: zdoctor: command not found"], False, 60)
    assert missing.status == "no-zdoctor" and "command not found" in missing.error
    hung = classify("h", "ssh", None, [], [], True, 60)
    assert (hung.status, hung.error) == ("timeout", "no snapshot within 60 s")
    assert classify("h", "pdsh", 124, [], [], False, 60).status == "timeout"  # the node's own limit
    gone = classify("h", "ssh", 127, [], ["timeout: failed to run command 'zd': No such file or directory"],
                    False, 60, "zd")
    assert gone.status == "no-zdoctor" and "failed to run command 'zd'" in gone.error
    failed = classify("h", "ssh", 2, [], ["zdoctor: --python /nope: no such file"], False, 60)
    assert failed.status == "error" and failed.error == "zdoctor exited with 2: zdoctor: --python /nope: no such file"
    junk = classify("h", "ssh", 0, ["hello"], [], False, 60)
    assert junk.status == "bad-output" and "no snapshot in the output" in junk.error
    not_snap = classify("h", "ssh", 0, armor.encode({"format": "other"}).splitlines(), [], False, 60)
    assert not_snap.status == "bad-output" and "not a zdoctor snapshot" in not_snap.error
    srun = classify("n1", "srun", 1, [], ["srun: error: Invalid node name specified"], False, 60)
    assert srun.status == "unreachable"


def test_snapshot_to_standard_output_plain_and_armored(cli):
    import sys

    plain = cli(["snapshot", "-o", "-", "--python", sys.executable])
    assert plain.returncode == 0, plain.stderr
    doc = json.loads(plain.stdout)
    assert doc["format"] == "zdoctor-snapshot" and "written to standard output" in plain.stderr
    armored = cli(["snapshot", "-o", "-", "--armor", "--python", sys.executable])
    assert armored.returncode == 0, armored.stderr
    lines = armored.stdout.splitlines()
    assert lines[0] == armor.BEGIN and lines[-1] == armor.END
    again = armor.decode(lines)
    assert again["format"] == "zdoctor-snapshot" and set(again["probes"]) == set(doc["probes"])
