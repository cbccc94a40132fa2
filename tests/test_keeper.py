"""The keeper is a real file, run by path in an isolated interpreter (``python -I -S keeper.py ...``): it says
whether the command started, exits as the command did and leaves nothing the command started behind."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import zdoctor.scripts
from zdoctor.core import resources
from zdoctor.front.bundle.build import _data_tree
from zdoctor.proc import shim

ROOT = Path(__file__).resolve().parent.parent


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2:].split()[0] != b"Z"


def _wait_for(cond, limit: float = 30.0) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def _keep(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, bytes]:
    """Start ``argv`` under the keeper as zdoctor does (its lifeline held open here): the keeper and the
    status line it wrote."""
    life_r, life_w = os.pipe()
    env_r, env_w = os.pipe()
    st_r, st_w = os.pipe()
    proc = subprocess.Popen([*shim.keeper_command(sys.executable), str(life_r), str(env_r), str(st_w), "", "", "",
                             "--", *argv], env={}, pass_fds=(life_r, env_r, st_w), start_new_session=True)
    for fd in (life_r, env_r, st_w):
        os.close(fd)
    os.write(env_w, b"\0".join(f"{k}={v}".encode() for k, v in env.items()))
    os.close(env_w)
    with os.fdopen(st_r, "rb") as fh:
        status = fh.readline()
    proc.life = life_w  # type: ignore[attr-defined]
    return proc, status


def test_the_keeper_is_a_file_run_by_path():
    path = shim.keeper_path()
    assert path == ROOT / "zdoctor" / "scripts" / "keeper.py" and path.is_file()
    cmd = shim.keeper_command("/usr/bin/python3")
    assert cmd == ["/usr/bin/python3", "-I", "-S", str(path)] and shim.is_keeper_command([*cmd, "3", "4"])
    assert not shim.is_keeper_command(["/usr/bin/python3", "-I", "-S", "-c", "print(1)"])


def test_zdoctor_never_imports_the_keeper():
    """It runs in another interpreter; importing it would run nothing, but a module importing it would tie
    zdoctor to code that must stay stdlib-only."""
    offenders = []
    for path in sorted((ROOT / "zdoctor").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
            module = getattr(node, "module", None) or ""
            if "keeper" in names or module.endswith("scripts.keeper") or "zdoctor.scripts.keeper" in names:
                offenders.append(str(path))
    assert offenders == []
    tree = ast.parse(shim.keeper_path().read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "contextlib", "ctypes", "os", "resource", "select", "signal", "sys", "time",
                        "typing"}, imported


def test_a_command_that_cannot_start_is_reported_with_its_errno():
    proc, status = _keep(["/nonexistent/zdoctor-no-such-program"], {"PATH": "/usr/bin:/bin"})
    try:
        assert status == b"E2\n"
        assert proc.wait(timeout=60) == 127
    finally:
        os.close(proc.life)  # type: ignore[attr-defined]


def test_the_keeper_exits_as_the_command_did_and_ends_what_it_left(tmp_path: Path):
    pidfile = tmp_path / "daemon.pid"
    script = f"sleep 300 & echo $! > {pidfile}; exit 3"
    proc, status = _keep(["/bin/sh", "-c", script], {"PATH": "/usr/bin:/bin"})
    try:
        assert status == b"ok\n"
        assert proc.wait(timeout=60) == 3
        daemon = int(pidfile.read_text())
        assert _wait_for(lambda: not _alive(daemon)), "the command's background child outlived it"
    finally:
        os.close(proc.life)  # type: ignore[attr-defined]


def test_the_keeper_ends_the_tree_when_its_lifeline_closes(tmp_path: Path):
    pidfile = tmp_path / "worker.pid"
    proc, status = _keep(["/bin/sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"], {"PATH": "/usr/bin:/bin"})
    assert status == b"ok\n"
    assert _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "")
    worker = int(pidfile.read_text())
    assert _alive(worker)
    os.close(proc.life)  # type: ignore[attr-defined]  # zdoctor is gone
    assert proc.wait(timeout=60) == -9
    assert _wait_for(lambda: not _alive(worker)), "the worker outlived its keeper"


def test_the_bundle_ships_the_keeper_as_a_file_and_finds_it_there(tmp_path: Path, monkeypatch):
    """Inside the one-file bundle zdoctor's modules are in a zip, where no interpreter can run a file by path:
    the bundle extracts the scripts, and the keeper is found among them."""
    tree = _data_tree()
    assert tree["_zdoctor_data/scripts/keeper.py"] == ROOT / "zdoctor" / "scripts" / "keeper.py"
    assert tree["_zdoctor_data/scripts/probe_script.py"] == ROOT / "zdoctor" / "scripts" / "probe_script.py"
    extracted = tmp_path / "data" / "scripts"
    extracted.mkdir(parents=True)
    (extracted / "keeper.py").write_bytes(shim.keeper_path().read_bytes())
    monkeypatch.setattr(zdoctor.scripts, "__file__", str(tmp_path / "zdoctor.pyz" / "zdoctor" / "scripts" / "x.py"))
    monkeypatch.setattr(resources, "DATA_ROOT", tmp_path / "data")
    assert shim.keeper_path() == extracted / "keeper.py"
    proc, status = _keep(["/bin/sh", "-c", "exit 5"], {"PATH": "/usr/bin:/bin"})
    try:
        assert status == b"ok\n" and proc.wait(timeout=60) == 5
    finally:
        os.close(proc.life)  # type: ignore[attr-defined]
