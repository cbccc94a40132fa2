"""zdoctor ended while the traced launch JIT-builds an op for the first time: whatever the way out (q in the
guide, the terminal closed, SIGHUP, SIGTERM, SIGINT, the command's time limit), no compiler, ninja or
python of the build outlives zdoctor, and the lock torch made is removed, with zdoctor saying so.

The build is real (torch's ``load``, ninja, ``c++``, ``cc1plus``, each ninja job in a process group of its
own); the op's source includes a header that is a FIFO nobody writes, so the compiler is mid-build at a
known point for as long as it takes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from prockit import dead, wait_for

from zdoctor.trials.jitguard import run_guarded

ZDOCTOR = [sys.executable, "-c", "import sys; from zdoctor.front.cli import main; sys.exit(main())"]
NOTE = "removed the JIT build lock the killed run left (it was not there before)"


def _under(root: Path) -> list[tuple[int, str]]:
    """Live processes working for the build under ``root``: (pid, name), by command line or working dir."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
            cwd = os.readlink(f"/proc/{name}/cwd")
            with open(f"/proc/{name}/comm") as fh:
                comm = fh.read().strip()
        except OSError:
            continue
        if comm.startswith("tmux"):  # the test's terminal, not the build
            continue
        if (str(root) in cmdline or cwd.startswith(str(root))) and not dead(int(name)):
            found.append((int(name), comm))
    return found


def _compiling(root: Path) -> bool:
    """Whether the compiler runs for the build of ``zd_exit_op`` under ``root`` (in its build directory,
    where ninja runs its jobs; another probe may build a copy of the op elsewhere at the same time)."""
    build = str(root / "ext" / "zd_exit_op")
    for pid, comm in _under(root):
        with contextlib.suppress(OSError):
            if comm == "cc1plus" and os.readlink(f"/proc/{pid}/cwd") == build:
                return True
    return False


def _kill_all(root: Path) -> None:
    for pid, _ in _under(root):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def build(tmp_path):
    """A first-time build of op ``zd_exit_op``: (python, argv, environment, extension dir, lock path)."""
    from dsenv import ensure

    python = ensure()
    os.mkfifo(tmp_path / "stall.h")
    (tmp_path / "zd_exit_op.cpp").write_text(
        '#include "stall.h"\n#include <torch/extension.h>\nint answer() { return 42; }\n'
        'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("answer", &answer); }\n')
    (tmp_path / "build.py").write_text(textwrap.dedent(f"""
        from torch.utils.cpp_extension import load
        load(name="zd_exit_op", sources=[{str(tmp_path / 'zd_exit_op.cpp')!r}],
             extra_include_paths=[{str(tmp_path)!r}])
    """))
    ext = tmp_path / "ext"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "TORCH_EXTENSIONS_DIR", "MAX_JOBS"))}
    env.update(TORCH_EXTENSIONS_DIR=str(ext), PATH=f"{python.parent}{os.pathsep}{env.get('PATH', os.defpath)}",
               XDG_STATE_HOME=str(tmp_path / "state"))
    yield python, [str(python), str(tmp_path / "build.py")], env, ext, ext / "zd_exit_op" / "lock"
    _kill_all(tmp_path)


def _assert_left_clean(tmp_path: Path, lock: Path, said: str) -> None:
    assert wait_for(lambda: not _under(tmp_path), 20), f"outlived zdoctor: {_under(tmp_path)}"
    assert not lock.exists(), "the lock torch made during the ended build is still there"
    assert lock.parent.is_dir()  # the build directory itself is left as it was
    assert NOTE in said and str(lock) in said, said


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT], ids=["SIGHUP", "SIGTERM", "SIGINT"])
def test_a_signal_during_a_first_time_jit_build_leaves_no_compiler_and_no_lock(tmp_path, build, sig):
    python, argv, env, ext, lock = build
    proc = subprocess.Popen([*ZDOCTOR, "check", "--no-log", "--python", str(python), "--command",
                             " ".join(argv), "--timeout", "600"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert wait_for(lambda: _compiling(tmp_path), 240), "the build never reached the compiler"
        assert lock.exists()
        names = {comm for _, comm in _under(tmp_path)}
        assert {"ninja", "cc1plus"} <= names, names
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == (130 if sig == signal.SIGINT else -sig), err
        _assert_left_clean(tmp_path, lock, err)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_the_time_limit_during_a_first_time_jit_build_leaves_no_compiler_and_no_lock(tmp_path, build):
    python, argv, env, ext, lock = build
    seen: list[bool] = []
    # the build reaches the compiler in seconds (the other tests here wait for it the same way); the limit
    # leaves it several times that, and the compiler waits for its header past the limit
    watcher = threading.Thread(target=lambda: seen.append(wait_for(lambda: _compiling(tmp_path), 38)))
    watcher.start()
    ev = run_guarded(argv, env, timeout=40)
    watcher.join()
    assert seen == [True], "the build never reached the compiler within the time limit"
    assert ev.error and ev.error.startswith("timed out"), ev.error
    _assert_left_clean(tmp_path, lock, ev.error)


def _tmux(tmp_path: Path):
    from test_tui_tmux import Tmux

    return Tmux(tmp_path, tmp_path / "state")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
@pytest.mark.parametrize("how", ["q", "terminal closed"])
def test_leaving_the_guide_during_a_first_time_jit_build_leaves_no_compiler_and_no_lock(tmp_path, build, how):
    python, argv, env, ext, lock = build
    term = _tmux(tmp_path)
    term.env.update(TORCH_EXTENSIONS_DIR=str(ext), PATH=env["PATH"])
    term.start(["--python", str(python), "--command", " ".join(argv)], (120, 40), "xterm-256color")
    try:
        assert wait_for(lambda: _compiling(tmp_path), 240), "the build never reached the compiler\n" + term.screen()
        assert lock.exists()
        pane_pid = int(term.tmux("display-message", "-p", "-t", "zd", "#{pane_pid}").strip())
        if how == "q":
            term.send("q")
            assert wait_for(lambda: dead(pane_pid), 60), term.screen()
            said = term.tmux("capture-pane", "-p", "-S", "-", "-t", "zd")  # the whole pane, scrolled part too
        else:
            term.tmux("kill-server", check=False)  # the terminal goes: zdoctor gets SIGHUP
            assert wait_for(lambda: dead(pane_pid), 60)
        if how == "q":
            compact = "".join(said.split())
            _assert_left_clean(tmp_path, lock, compact.replace("".join(NOTE.split()), NOTE).replace(
                "".join(str(lock).split()), str(lock)))
        else:
            assert wait_for(lambda: not _under(tmp_path), 20), f"outlived zdoctor: {_under(tmp_path)}"
            assert not lock.exists(), "the lock torch made during the ended build is still there"
    finally:
        term.tmux("kill-server", check=False)


def test_leaving_the_step_that_runs_the_build_ends_it_and_removes_the_lock(tmp_path, build, monkeypatch):
    """Esc, then Leave, on the step whose probe traces the launch: the guide gives up on that probe
    (:func:`abandon_probe`, as `c` does); the build it runs ends with it, and the lock goes."""
    from zdoctor.core.registry import load_vocabulary
    from zdoctor.host import LiveHost
    from zdoctor.proc.target import Target
    from zdoctor.walk.guide import abandon_probe

    load_vocabulary()
    python, argv, env, ext, lock = build
    for key in [k for k in os.environ if k not in env]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    host = LiveHost(target=Target.from_args(str(python), " ".join(argv), [], 600, {}))
    probe = threading.Thread(target=host.result, args=("livetrace",), daemon=True)
    probe.start()
    assert wait_for(lambda: _compiling(tmp_path), 240), "the build never reached the compiler"
    assert lock.exists()
    shown = abandon_probe(host, "livetrace", 5.0)
    assert shown.status == "timeout" and "cancelled by the user" in (shown.error or "")
    probe.join(60)
    assert not probe.is_alive()
    later = host.result("livetrace")  # what the probe found once its command was ended
    said = " ".join(str(e.error or "") for e in later.evidence)
    _assert_left_clean(tmp_path, lock, said)
