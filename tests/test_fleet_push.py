"""`zdoctor fleet --push` against a real sshd on loopback: a node without zdoctor and a node with an older
zdoctor get the one-file bundle (copied with scp, run from a private temporary directory, removed
afterwards) and are diagnosed; a node with this version of zdoctor uses its own. Nothing is left behind:
each node's temporary directory is empty afterwards and no bundle cache appears in the home directory."""

from __future__ import annotations

import glob
import json
import os
import sys
from pathlib import Path

import pytest
from bundlekit import build_bundle, interpreter
from sshkit import node_bin, require, start_sshd

HAVE, LACK, OLD, OLD_PYTHON = "127.0.0.2", "127.0.0.5", "127.0.0.7", "127.0.0.8"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    require("/usr/sbin/sshd", "ssh", "scp", "pdsh")
    bundle = build_bundle()
    root = tmp_path_factory.mktemp("push")
    # A pushed bundle runs with no wrapper, so no session window for the kernel log: the node that has
    # its own zdoctor reads the same whole log, and the two nodes' cells can be compared.
    good = node_bin(root / "bin", window=False)
    old = node_bin(root / "old", body='if [ "$1" = --version ]; then echo "zdoctor 0.0.1"; exit 0; fi\n'
                                      f'echo "the old zdoctor ran" >&2; touch {root / "old-ran"}; exit 3\n')
    # The node without zdoctor has only Python 3.8 as python3: the bundle's floor.
    py38 = root / "py38"
    py38.mkdir()
    (py38 / "python3").symlink_to(interpreter("3.8"))
    # A node whose python3 is older than the bundle's floor (Python 3.6 where this machine has one).
    old_pythons = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.6.*/bin/python3")))
    py36 = root / "py36"
    py36.mkdir()
    if old_pythons:
        (py36 / "python3").symlink_to(old_pythons[-1])
    path = "/usr/local/bin:/usr/bin:/bin"
    tmps = {h: root / f"tmp-{h}" for h in (HAVE, LACK, OLD, OLD_PYTHON)}
    for d in tmps.values():
        d.mkdir()
    sshd = start_sshd(root / "sshd", {
        HAVE: {"PATH": f"{good}:{path}", "TMPDIR": str(tmps[HAVE])},
        # PYENV_VERSION too: a login shell that puts pyenv's shims first (root's .bashrc here) picks by it.
        LACK: {"PATH": f"{py38}:{path}", "TMPDIR": str(tmps[LACK]), "PYENV_VERSION": version_of(py38)},
        OLD: {"PATH": f"{old}:{path}", "TMPDIR": str(tmps[OLD])},
        OLD_PYTHON: {"PATH": f"{py36}:{path}", "TMPDIR": str(tmps[OLD_PYTHON]), "PYENV_VERSION": version_of(py36)},
    })
    yield {"sshd": sshd, "root": root, "bundle": bundle, "tmps": tmps, "old_python": bool(old_pythons)}
    sshd.stop()


def version_of(bindir: Path) -> str:
    """The full version of ``bindir/python3`` ("3.8.18"), or "system" when there is none."""
    exe = bindir / "python3"
    if not exe.exists():
        return "system"
    import subprocess

    return subprocess.run([str(exe), "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True).stdout.strip()


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
    # The node without zdoctor was diagnosed by the bundle under its Python 3.8 (the python3 its shell finds,
    # which the snapshot shows as the training interpreter): its findings are real checks.
    assert nodes[LACK]["facts"]["python"].startswith("3.8."), nodes[LACK]["facts"]["python"]
    lack = {f["id"]: f["status"] for f in nodes[LACK]["findings"]}
    assert lack and "fleet.launch" not in " ".join(lack)
    # Both nodes are this machine, read a few seconds apart: the same cells, except what the kernel log's OOM
    # records decide, which other tests running beside this one add to with real kills in their cgroups.
    moving = ("kernel.oom", "offload.host-ram")
    assert ({k: v for k, v in nodes[LACK]["cells"].items() if k not in moving}
            == {k: v for k, v in nodes[HAVE]["cells"].items() if k not in moving})
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


STAND_IN_SRUN = r'''#!/bin/sh
# A stand-in for srun (no Slurm here): records its argv, then does what srun does with the options
# --push uses: --bcast=DEST copies the step's program to DEST and runs it from there, --export sets variables.
printf "%s\n" "$*" >> "$SRUN_LOG"
bcast=""; exports=""
while [ "$1" != "--" ]; do
  case "$1" in --bcast=*) bcast="${1#--bcast=}";; --export=*) exports="${1#--export=}";; esac
  shift
done
shift
if [ -n "$bcast" ]; then cp "$1" "$bcast" && chmod 0700 "$bcast" || exit 1; shift; set -- "$bcast" "$@"; fi
if [ -n "$exports" ]; then
  IFS=,; for kv in $exports; do case "$kv" in ALL) ;; *) export "$kv";; esac; done; unset IFS
fi
exec "$@"
'''


def test_push_through_srun_broadcasts_the_bundle_and_removes_it(cli, tmp_path):
    import os

    bundle = build_bundle()
    fake = tmp_path / "slurm"
    fake.mkdir()
    (fake / "srun").write_text(STAND_IN_SRUN)
    (fake / "srun").chmod(0o755)
    node_tmp = tmp_path / "node-tmp"
    node_tmp.mkdir()
    log = tmp_path / "srun.log"
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", SLURM_JOB_NODELIST="node01", SRUN_LOG=str(log),
               TMPDIR=str(node_tmp))
    r = cli(["fleet", "--zdoctor", "zdoctor-node", "--push", "--bundle", str(bundle), "--json"], env=env,
            timeout=400)
    assert r.returncode in (0, 1), r.stderr
    (node,) = json.loads(r.stdout)["nodes"]
    assert node["launch"]["status"] == "ok" and node["launch"]["pushed"] == "bundle", json.dumps(node["launch"])
    assert node["cells"]
    ask, step, clean = log.read_text().splitlines()
    assert ask.startswith("--nodes=1 --ntasks=1 --nodelist=node01 --overlap") and "mktemp -d" in ask
    d = step.split("--bcast=", 1)[1].split("/zdoctor.pyz", 1)[0]
    assert d.startswith(f"{node_tmp}/zdoctor-push.")
    assert f"--export=ALL,XDG_CACHE_HOME={d}/cache,XDG_STATE_HOME={d}/state -- {bundle} snapshot -o - --armor" in step
    assert clean.endswith(f"-- rm -rf -- {d}")
    assert list(node_tmp.iterdir()) == []


def test_a_node_whose_python_is_too_old_is_told_and_left_clean(fleet, cli, tmp_path):
    if not fleet["old_python"]:
        pytest.skip("no Python 3.6 on this machine to play the old node's python3")
    hf = tmp_path / "hostfile"
    hf.write_text(f"{OLD_PYTHON}\n")
    r = cli(["fleet", "--hostfile", str(hf), "--launcher", "ssh", "--ssh-config", str(fleet["sshd"].ssh_config),
             "--zdoctor", "zdoctor-node", "--push", "--bundle", str(fleet["bundle"]), "--json"], timeout=300)
    assert r.returncode == 1, r.stderr
    (node,) = json.loads(r.stdout)["nodes"]
    assert node["launch"]["status"] == "error" and node["launch"]["pushed"] == "bundle"
    assert "zdoctor.pyz needs Python 3.8.1 or newer" in node["launch"]["error"]
    assert list(fleet["tmps"][OLD_PYTHON].iterdir()) == []
