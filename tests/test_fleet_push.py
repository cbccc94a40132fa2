"""`zdoctor fleet --push` against a real sshd on loopback: a node without zdoctor and a node with an older
zdoctor get the one-file bundle (copied with scp, run from a private temporary directory, removed
afterwards) and are diagnosed; a node with this version of zdoctor uses its own. Nothing is left behind:
each node's temporary directory is empty afterwards and no bundle cache appears in the home directory."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from bundlekit import build_bundle, interpreter
from sshkit import node_bin, require, start_sshd

HAVE, LACK, OLD = "127.0.0.2", "127.0.0.5", "127.0.0.7"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    require("/usr/sbin/sshd", "ssh", "scp", "pdsh")
    bundle = build_bundle()
    root = tmp_path_factory.mktemp("push")
    good = node_bin(root / "bin")
    old = node_bin(root / "old", body='if [ "$1" = --version ]; then echo "zdoctor 0.0.1"; exit 0; fi\n'
                                      f'echo "the old zdoctor ran" >&2; touch {root / "old-ran"}; exit 3\n')
    # The node without zdoctor has only Python 3.8 as python3: the bundle's floor.
    py38 = root / "py38"
    py38.mkdir()
    (py38 / "python3").symlink_to(interpreter("3.8"))
    path = "/usr/local/bin:/usr/bin:/bin"
    tmps = {h: root / f"tmp-{h}" for h in (HAVE, LACK, OLD)}
    for d in tmps.values():
        d.mkdir()
    sshd = start_sshd(root / "sshd", {
        HAVE: {"PATH": f"{good}:{path}", "TMPDIR": str(tmps[HAVE])},
        LACK: {"PATH": f"{py38}:{path}", "TMPDIR": str(tmps[LACK])},
        OLD: {"PATH": f"{old}:{path}", "TMPDIR": str(tmps[OLD])},
    })
    yield {"sshd": sshd, "root": root, "bundle": bundle, "tmps": tmps}
    sshd.stop()


def bundle_caches(bundle: Path) -> list[Path]:
    """This bundle's cache directories in the (shared) home directory of the loopback nodes."""
    with __import__("zipfile").ZipFile(bundle) as zf:
        man = json.loads(zf.read("_zdoctor_bundle/manifest.json"))
    base = Path(os.path.expanduser("~/.cache/zdoctor/bundle"))
    return [p for p in base.glob(f"{man['version']}-{man['content_sha256'][:16]}*")]


@pytest.mark.parametrize("launcher", ["ssh", "pdsh"])
def test_push_diagnoses_nodes_without_zdoctor_and_leaves_nothing(fleet, cli, tmp_path, launcher):
    before = bundle_caches(fleet["bundle"])
    hf = tmp_path / "hostfile"
    hf.write_text(f"{HAVE}\n{LACK}\n{OLD}\n")
    r = cli(["fleet", "--hostfile", str(hf), "--launcher", launcher, "--ssh-config", str(fleet["sshd"].ssh_config),
             "--zdoctor", "zdoctor-node", "--push", "--bundle", str(fleet["bundle"]), "--timeout", "150", "--json"],
            timeout=400)
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    nodes = {n["host"]: n for n in doc["nodes"]}
    for host in (HAVE, LACK, OLD):
        assert nodes[host]["launch"]["status"] == "ok", (host, nodes[host]["launch"])
        assert nodes[host]["cells"], host
    assert nodes[HAVE]["launch"]["pushed"] == "own"
    assert nodes[LACK]["launch"]["pushed"] == "bundle"
    assert nodes[OLD]["launch"]["pushed"] == "bundle"
    assert not (fleet["root"] / "old-ran").exists()
    # The node without zdoctor was diagnosed by the bundle under its Python 3.8: its findings are real checks.
    lack = {f["id"]: f["status"] for f in nodes[LACK]["findings"]}
    assert lack and "fleet.launch" not in " ".join(lack)
    assert nodes[LACK]["cells"] == nodes[HAVE]["cells"]
    # Nothing is left behind: the private directories are gone and no cache was made in the home directory.
    for host, tmp in fleet["tmps"].items():
        assert list(tmp.iterdir()) == [], (host, list(tmp.iterdir()))
    assert bundle_caches(fleet["bundle"]) == before


def test_push_without_a_bundle_is_a_usage_error(cli, tmp_path):
    hf = tmp_path / "hostfile"
    hf.write_text("node1\n")
    r = cli(["fleet", "--hostfile", str(hf), "--launcher", "ssh", "--push"])
    assert r.returncode == 2
    assert r.stderr.strip() == ("zdoctor fleet: --push needs the one-file bundle: --bundle zdoctor.pyz (made by "
                                "`zdoctor build-bundle`), or run the fleet from zdoctor.pyz itself")
    r = cli(["fleet", "--hostfile", str(hf), "--launcher", "ssh", "--push", "--bundle", str(tmp_path / "nope.pyz")])
    assert r.returncode == 2 and "no such file" in r.stderr and r.stderr.count("\n") == 1


def test_the_node_lines_are_quoted_and_the_named_directory_is_checked():
    from zdoctor.fleet.launch import FleetOptions
    from zdoctor.fleet.push import MARK, ask_line, pushed_dir, run_line

    opts = FleetOptions(launcher="ssh", zdoctor="zdoctor-node", python="/opt/my env/bin/python", timeout=60)
    line = ask_line(opts)
    assert line.startswith("sh -c ") and "mktemp -d" in line and "zdoctor-node" in line
    run = run_line(opts, "/tmp/zdoctor-push.AbCdEf1234")
    assert "'/opt/my env/bin/python'" in run and 'rm -rf -- "$d"' in run
    assert pushed_dir(f"{MARK} /tmp/zdoctor-push.AbCdEf1234\n") == "/tmp/zdoctor-push.AbCdEf1234"
    for bad in ("/tmp/zdoctor-push.AbCdEf1234; rm -rf ~", "relative/zdoctor-push.AbCdEf1234",
                "/tmp/x y/zdoctor-push.AbCdEf1234", "/tmp/zdoctor-push.short"):
        assert pushed_dir(f"{MARK} {bad}\n") is None, bad
    assert sys.version_info >= (3, 8)


def test_a_fleet_run_from_the_bundle_pushes_that_bundle(fleet, tmp_path):
    """``python3 zdoctor.pyz fleet --push`` (no --bundle) copies the very file it runs from."""
    from bundlekit import run_bundle

    hf = tmp_path / "hostfile"
    hf.write_text(f"{LACK}\n")
    proc = run_bundle(interpreter("3.11"), fleet["bundle"],
                      ["fleet", "--hostfile", str(hf), "--launcher", "ssh", "--ssh-config",
                       str(fleet["sshd"].ssh_config), "--zdoctor", "zdoctor-node", "--push", "--timeout", "150",
                       "--json"],
                      tmp_path / "home", tmp_path, timeout=400, network=True)
    assert proc.returncode in (0, 1), proc.stderr
    (node,) = json.loads(proc.stdout)["nodes"]
    assert node["launch"]["status"] == "ok" and node["launch"]["pushed"] == "bundle", json.dumps(node["launch"])
    assert list(fleet["tmps"][LACK].iterdir()) == []
