"""The one-file bundle, ``zdoctor.pyz``, built from this checkout and run under the real Python 3.8 and the
distribution's Python 3.11, from an empty directory, with an empty environment and no network: the
headless check, snapshot, replay and export, the guided session in tmux, what it extracts and where, and
the one-line refusals on an unsupported interpreter or machine."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from bundlekit import build_bundle, clean_env, interpreter, offline, run_bundle
from kmsgkit import kmsg_file

from zdoctor import __version__

PYTHONS = ["3.8", "3.11"]
#: The headless commands also under 3.9, the other Python that the core's floor brought in.
HEADLESS_PYTHONS = ["3.8", "3.9", "3.11"]
EM_X86_64, EM_AARCH64 = 62, 183


@pytest.fixture(scope="module")
def bundle() -> Path:
    return build_bundle()


def manifest(bundle: Path) -> dict:
    with zipfile.ZipFile(bundle) as zf:
        return json.loads(zf.read("_zdoctor_bundle/manifest.json"))


def cache_dir(home: Path, bundle: Path) -> Path:
    man = manifest(bundle)
    return home / ".cache" / "zdoctor" / "bundle" / f"{man['version']}-{man['content_sha256'][:16]}"


def test_bundle_is_one_small_file_with_psutil_for_both_architectures(bundle):
    assert bundle.stat().st_size < 15 * 2**20
    assert bundle.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    assert os.access(bundle, os.X_OK)
    man = manifest(bundle)
    assert man["version"] == __version__
    assert {"textual", "rich", "networkx", "pyelftools", "nvidia-ml-py", "psutil", "tomli"} <= set(man["deps"])
    assert man["deps"]["networkx"].startswith("3.1")  # the last networkx for Python 3.8
    machines = {}
    with zipfile.ZipFile(bundle) as zf:
        names = zf.namelist()
        for arch, files in man["native"].items():
            (so,) = files
            data = zf.read(so)
            assert hashlib.sha256(data).hexdigest() == files[so]
            assert data[:4] == b"\x7fELF"
            machines[arch] = int.from_bytes(data[18:20], "little")
    assert machines == {"x86_64": EM_X86_64, "aarch64": EM_AARCH64}
    # Only psutil's shared objects are native; no compiled bytecode travels (it is per interpreter).
    assert [n for n in names if n.endswith(".so")] == sorted(n for f in man["native"].values() for n in f)
    assert not [n for n in names if n.endswith(".pyc")]
    assert "zdoctor/screens/app.py" in names and "zdoctor/front/cli.py" in names


def test_a_second_build_is_the_same_file(bundle, tmp_path):
    again = tmp_path / "again.pyz"
    proc = subprocess.run([sys.executable, "-m", "zdoctor", "build-bundle", "-o", str(again)],
                          cwd=str(Path(__file__).resolve().parent.parent), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert again.read_bytes() == bundle.read_bytes()


@pytest.mark.parametrize("version", HEADLESS_PYTHONS)
def test_version_names_the_bundled_dependencies(bundle, tmp_path, version):
    python = interpreter(version)
    proc = run_bundle(python, bundle, ["--version"], tmp_path / "home", tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert "\n" not in line
    man = manifest(bundle)
    assert line.startswith(f"zdoctor {__version__} (one-file bundle")
    assert f"running on Python {version}." in line
    for dist, ver in man["deps"].items():
        assert f"{dist} {ver}" in line


@pytest.mark.parametrize("version", HEADLESS_PYTHONS)
def test_check_snapshot_replay_export_from_an_empty_directory_offline(bundle, tmp_path, version):
    python = interpreter(version)
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    # Something named zdoctor and textual on PYTHONPATH must not be picked up: the bundle runs isolated.
    poison = tmp_path / "poison"
    for pkg in ("zdoctor", "textual", "psutil"):
        (poison / pkg).mkdir(parents=True)
        (poison / pkg / "__init__.py").write_text(f"raise SystemExit('the {pkg} on PYTHONPATH was imported')\n")
    # Both runs read one kernel log: the machine's own gains OOM kills from the tests running beside this one.
    kmsg = kmsg_file(tmp_path / "kmsg", "Linux version 6.1.0 (build@host) #1 SMP",
                     "Out of memory: Killed process 4242 (python) total-vm:1048576kB, anon-rss:524288kB")
    check = run_bundle(python, bundle, ["check", "--json"], home, work, kmsg=kmsg, PYTHONPATH=str(poison),
                       PYTHONUSERBASE=str(poison))
    assert check.returncode in (0, 1, 3), check.stderr
    doc = json.loads(check.stdout)
    assert doc["version"] == __version__
    assert doc["summary"]["total"] > 20
    assert doc["summary"]["crash"] == 0, [f for f in doc["findings"] if f["status"] == "crash"]
    # psutil (the extracted native module) did its work: the process probe listed processes.
    assert any(f["id"].startswith("hangs.") or f["id"].startswith("processes") for f in doc["findings"])
    assert doc["host"]["arch"] == os.uname().machine

    snap = run_bundle(python, bundle, ["snapshot", "-o", "node.json"], home, work, kmsg=kmsg)
    assert snap.returncode == 0, snap.stderr
    replay = run_bundle(python, bundle, ["check", "--json", "--replay", "node.json"], home, work)
    assert replay.returncode in (0, 1, 3), replay.stderr
    again = json.loads(replay.stdout)
    hp = [(f["status"], f["title"], f["detail"][:600]) for d in (doc, again) for f in d["findings"]
          if f["id"] == "hangs.processes"]
    assert {f["id"]: f["status"] for f in again["findings"]} == {f["id"]: f["status"] for f in doc["findings"]}, hp

    export = run_bundle(python, bundle, ["export", "--session", doc["session"], "--format", "md", "-o", "t.md"],
                        home, work)
    assert export.returncode == 0, export.stderr
    md = (work / "t.md").read_text()
    assert f"zdoctor session `{doc['session']}`" in md
    html = run_bundle(python, bundle, ["export", "--last", "--format", "html"], home, work)
    assert html.returncode == 0 and "<html" in html.stdout.lower()
    assert sorted(p.name for p in work.iterdir()) == ["node.json", "t.md"]


@pytest.mark.parametrize("version", PYTHONS)
def test_extracts_only_the_native_module_and_data_into_a_private_verified_cache(bundle, tmp_path, version):
    python = interpreter(version)
    home = tmp_path / "home"
    prefix = Path(subprocess.run([python, "-c", "import sys; print(sys.prefix)"], capture_output=True,
                                 text=True).stdout.strip())
    marker = tmp_path / "marker"
    marker.write_text("")
    time.sleep(0.05)
    proc = run_bundle(python, bundle, ["playbooks", "list"], home, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "zero3-launch" in proc.stdout
    root = cache_dir(home, bundle)
    for d in (home / ".cache" / "zdoctor", root.parent, root, root / "native", root / "data"):
        st = d.lstat()
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid(), d
    man = manifest(bundle)
    arch = os.uname().machine
    (so_name, digest), = man["native"][arch].items()
    so = root / "native" / so_name.split("/", 2)[2]
    assert hashlib.sha256(so.read_bytes()).hexdigest() == digest
    extracted = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                       if p.is_file() and not p.relative_to(root).as_posix().startswith("pyc-"))
    assert extracted == sorted([f"native/{so_name.split('/', 2)[2]}"] +
                               [f"data/{n.split('/', 1)[1]}" for n in man["data"]])
    # Nothing was written into the interpreter's environment.
    changed = subprocess.run(["find", str(prefix), "-newer", str(marker), "-type", "f"], capture_output=True,
                             text=True).stdout.split()
    assert changed == []

    # A damaged extracted file is noticed by its hash and replaced.
    so.chmod(0o700)
    so.write_bytes(b"not an ELF file")
    proc = run_bundle(python, bundle, ["check", "--json"], home, tmp_path)
    assert proc.returncode in (0, 1, 3), proc.stderr
    assert hashlib.sha256(so.read_bytes()).hexdigest() == digest
    assert json.loads(proc.stdout)["summary"]["crash"] == 0


@pytest.mark.parametrize("version", PYTHONS)
def test_the_bundle_names_messages_from_every_layer_s_catalogue_file(bundle, tmp_path, version):
    """Each node layer's known messages (its package's symptoms.toml) travel as data the bundle extracts:
    messages kept in two layers' files are named from the bundle, in the catalogue's order."""
    python = interpreter(version)
    layers = Path(__file__).resolve().parent.parent / "zdoctor" / "layers"
    shipped = sorted(f"_zdoctor_data/layers/{p.relative_to(layers).as_posix()}" for p in layers.glob("*/symptoms.toml"))
    assert len(shipped) >= 10
    assert sorted(n for n in manifest(bundle)["data"] if n.startswith("_zdoctor_data/layers/")) == shipped
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(Path(__file__).resolve().parent / "fixtures" / "snapshots" / "healthy.json", work / "node.json")
    proc = run_bundle(python, bundle, ["check", "--json", "--no-log", "--replay", "node.json",
                                       "--symptom", "terminate called without an active exception",
                                       "--symptom", "/usr/bin/ld: cannot find -lcuda: No such file or directory"],
                      tmp_path / "home", work)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert [s["signature"] for s in doc["symptoms"]] == ["cxx.terminate-no-exception", "link.cannot-find-lcuda"]
    (f,) = [f for f in doc["findings"] if f["id"] == "symptom.unexplained.S1"]
    assert "The training environment (python-env): no check of zdoctor confirms this message" in f["detail"]


def test_a_cache_directory_that_is_not_private_is_refused(bundle, tmp_path):
    python = interpreter("3.11")
    home = tmp_path / "home"
    target = tmp_path / "elsewhere"
    target.mkdir()
    (home / ".cache").mkdir(parents=True)
    # A symlink planted where the cache should be: the bundle must not follow it.
    (home / ".cache" / "zdoctor").symlink_to(target)
    proc = run_bundle(python, bundle, ["playbooks", "list"], home, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert list(target.iterdir()) == []
    # It fell back to a private directory of its own under TMPDIR.
    fallback = home / "tmp" / f"zdoctor-{os.getuid()}"
    assert stat.S_IMODE(fallback.lstat().st_mode) == 0o700


def test_unsupported_interpreter_and_machine_say_so_in_one_line(bundle, tmp_path):
    old = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.[67].*/bin/python3")) +
                 glob.glob(os.path.expanduser("~/.pyenv/versions/2.7.*/bin/python")))
    for python in old:
        proc = run_bundle(python, bundle, ["check"], tmp_path / "home", tmp_path)
        assert proc.returncode == 2
        assert proc.stderr.count("\n") == 1 and "needs Python 3.8.1 or newer" in proc.stderr, proc.stderr
    if shutil.which("setarch") is None:
        pytest.skip("setarch is not installed: an unsupported machine cannot be shown")
    python = interpreter("3.11")
    proc = subprocess.run(["setarch", "i686", python, str(bundle), "check"], capture_output=True, text=True,
                          env=clean_env(tmp_path / "home"), cwd=str(tmp_path), timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == "zdoctor.pyz runs on Linux x86_64 and aarch64; this machine is linux i686\n"


class Tmux:
    """A private tmux server running the bundle at 80x24."""

    def __init__(self, tmp_path: Path) -> None:
        self.base = ["tmux", "-u", "-L", f"zdoctor-bundle-{os.getpid()}-{id(self) % 10000}"]

    def tmux(self, *args: str) -> str:
        return subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=30).stdout

    def start(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        command = "exec env -i " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()) + " " + \
            shlex.join(argv)
        self.tmux("new-session", "-d", "-s", "zd", "-x", "80", "-y", "24", "-c", str(cwd), command)
        self.tmux("set-option", "-t", "zd", "remain-on-exit", "on")

    def wait(self, *texts: str, timeout: float = 90.0) -> str:
        end = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < end:
            screen = self.tmux("capture-pane", "-p", "-t", "zd")
            flat = " ".join(screen.split())
            if all(t in flat for t in texts):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"never saw {texts!r}; the screen:\n{screen}")

    def send(self, *keys: str) -> None:
        for key in keys:
            self.tmux("send-keys", "-t", "zd", key)
            time.sleep(0.3)

    def dead(self, timeout: float = 20.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.tmux("display-message", "-p", "-t", "zd", "#{pane_dead}").strip() == "1":
                return True
            time.sleep(0.1)
        return False

    def close(self) -> None:
        self.tmux("kill-server")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
@pytest.mark.parametrize("version", PYTHONS)
def test_guided_session_in_a_terminal(bundle, tmp_path, version):
    python = interpreter(version)
    home = tmp_path / "home"
    env = clean_env(home, TERM="screen")
    del env["NO_COLOR"]
    term = Tmux(tmp_path)
    try:
        # The guide on this machine: the start screen with the first pass of every check, then a walk.
        term.start(offline([python, str(bundle)]), env, tmp_path)
        term.wait("First pass of every check", "Playbooks")
        term.wait("ok")
        term.send("q")
        assert term.dead(), term.tmux("capture-pane", "-p", "-t", "zd")
        # A recorded node, walked one step by keyboard, then exported.
        term.tmux("kill-session", "-t", "zd")
        term.start(offline([python, str(bundle), "--demo", "conda-ld-library-path"]), env, tmp_path)
        term.wait("1. The symptom", "Next → 2. Which libstdc++")  # the step is evaluated: n is accepted
        term.send("n")
        end = time.monotonic() + 60
        while time.monotonic() < end and not entered(home, "loaded"):
            time.sleep(0.2)
        assert entered(home, "loaded"), term.tmux("capture-pane", "-p", "-t", "zd")
        term.send("q")
        assert term.dead()
    finally:
        term.close()
    modes = sorted(json.loads(s.read_text().splitlines()[0])["mode"]
                   for s in (home / "state" / "zdoctor" / "sessions").glob("*.jsonl"))
    assert modes == ["demo", "tui"]


def entered(home: Path, node: str) -> bool:
    """Whether a guided session logged entering playbook node ``node``."""
    for log in (home / "state" / "zdoctor" / "sessions").glob("*.jsonl"):
        for line in log.read_text().splitlines():
            ev = json.loads(line) if line.strip() else {}
            if ev.get("type") == "node_enter" and ev.get("node") == node:
                return True
    return False
