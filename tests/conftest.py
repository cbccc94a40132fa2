"""Shared fixtures: every test gets its own session directory; CLI runs as a real subprocess."""

from __future__ import annotations

import compileall
import contextlib
import hashlib
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from prockit import spawn  # noqa: F401 - the detached-process fixture, for every test module

REPO = Path(__file__).resolve().parent.parent
# The kernel log is the machine's: the kernel-log tests read private kmsg-format files (kmsgkit.py), and
# write into the real one only where the machine opted in (ZDOCTOR_TEST_WRITE_KMSG=1, as CI). A run of
# zdoctor in any other test judges only the kernel records logged after this session started.
os.environ.setdefault("ZDOCTOR_KERNEL_LOG_SINCE", str(time.time()))
FIXTURES = Path(__file__).resolve().parent / "fixtures"

#: The home of the account running the tests, from the password database ($HOME may be anything).
REAL_HOME = Path(pwd.getpwuid(os.getuid()).pw_dir)
#: zdoctor's state directory in that home: no test may write there.
REAL_STATE = REAL_HOME / ".local" / "state" / "zdoctor"
# Every zdoctor this test process starts records its sessions in a private directory, set here, as pytest
# imports this file, so that no fixture of any scope (a module's ``zdoctor check``) runs before it; each test
# then gets its own (``state_home``).
RUN_STATE = tempfile.mkdtemp(prefix="zdoctor-tests-state-")
os.environ["XDG_STATE_HOME"] = RUN_STATE


#: The lanes each test file belongs to (``python3 -m pytest -m "not slow"`` is the inner loop; the README's
#: test command runs them all). A file is marked whole: its tests share the same costly set-up.
LANES: dict[str, tuple[str, ...]] = {
    "test_bundle.py": ("slow", "e2e"),
    "test_fleet_push.py": ("slow", "e2e", "needs_sshd"),
    "test_fleet_loopback.py": ("slow", "e2e", "needs_sshd"),
    "test_hung_ranks.py": ("slow", "e2e", "needs_sshd"),
    "test_tui_tmux.py": ("slow", "e2e"),
    "test_tui_wheel.py": ("slow", "e2e"),
    "test_wheel.py": ("slow", "e2e"),
    "test_deepspeed_e2e.py": ("slow", "e2e"),
    "test_launch_e2e.py": ("slow", "e2e"),
    "test_forensics_e2e.py": ("slow", "e2e"),
    "test_claims_libs.py": ("slow", "e2e"),
    "test_jit_exit_paths.py": ("slow", "e2e", "needs_root"),
    "test_nccl_verbs.py": ("needs_root",),
    "test_jitguard.py": ("slow", "e2e"),
    "test_locktrial.py": ("slow", "e2e"),
    "test_containment.py": ("slow", "needs_root"),
    "test_root_races.py": ("slow", "needs_root"),
    "test_privilege.py": ("slow", "needs_root"),
    "test_mutations.py": ("slow",),
    "test_hardening.py": ("slow",),
    "test_symptoms.py": ("slow", "e2e"),
    "test_origins.py": ("slow", "e2e"),
    "test_answer_first.py": ("slow", "e2e"),
    "test_progress_line.py": ("slow", "e2e"),
    "test_libaio_calls.py": ("slow",),
    "test_hostram_kills.py": ("needs_root",),
    "test_container_limits.py": ("needs_root",),
    "test_slurm_memory.py": ("needs_root",),
    "test_fd_passing.py": ("slow", "needs_root"),
    "test_full_disk.py": ("needs_root",),
    "test_shm_as_user.py": ("needs_root",),
    "test_stale_lock_unscanned.py": ("needs_root",),
    "test_secrets.py": ("needs_root",),
    "test_storage_check.py": ("needs_root",),
    "test_nccl_network.py": ("needs_root",),
    "test_nccl_network_fleet.py": ("slow", "e2e", "needs_sshd", "needs_root"),
    "test_sysfile.py": ("needs_root",),
    "test_driver_parts.py": ("needs_root",),
    # unit-level files whose real processes, terminals or interpreters take tens of seconds each
    "test_tui.py": ("slow",),
    "test_tui_fleet.py": ("slow",),
    "test_tui_snapshots.py": ("slow",),
    "test_html_width.py": ("slow",),
    "test_symbols.py": ("slow", "e2e"),
    "test_cli.py": ("slow",),
    "test_live.py": ("slow",),
    "test_children.py": ("slow",),
    "test_walllog.py": ("slow",),
    "test_planner.py": ("slow",),
    "test_training_user.py": ("slow", "needs_root"),
    "test_offload_lint.py": ("slow",),
    "test_swap_buffers.py": ("slow",),
    "test_pyenv.py": ("slow",),
    "test_dsconfig.py": ("slow",),
    "test_toolchain.py": ("slow",),
    "test_fstab.py": ("slow", "needs_root"),
    "test_runner.py": ("slow",),
    "test_jitprereq.py": ("slow",),
    "test_hangs_check.py": ("slow",),
    "test_gpu_probes.py": ("slow",),
    "test_nonblocking_reads.py": ("slow",),
    # whole checks on nodes made hostile or slow on purpose (FIFOs the loader blocks on, endless lines, compiles
    # and runs held at their time limits) and guided walks through the real screens: 15-22 s a file
    "test_special_files.py": ("slow",),
    "test_catalogue_bounds.py": ("slow",),
    "test_scratch.py": ("slow",),
    "test_guide_junior.py": ("slow",),
    "test_late_probes.py": ("slow",),
    # the DeepSpeed environment's real launchers (each imports torch) against real namespaces and sshd
    "test_dsbugs.py": ("slow", "e2e"),
    "test_launch_peers.py": ("slow", "e2e"),
    "test_launch_rendezvous.py": ("slow", "e2e"),
    "test_launch_ssh.py": ("slow", "e2e"),
}


#: The files that write a record into the machine's kernel log where it opted in. They run last (in their
#: worker): the window they move forward (ZDOCTOR_KERNEL_LOG_SINCE) is a wall-clock time, and a record's
#: wall-clock time is the boot time plus the kernel's clock, which a step of the machine's clock moves after
#: the fact. Each of their tests runs alone on the machine (see pytest_runtest_protocol).
KERNEL_LOG_WRITERS = ("test_kernel_log.py",)
#: Files whose tests run alone on the machine: the kernel log's writers; the cgroups a killed zdoctor
#: leaves behind, which the next zdoctor started anywhere on the machine ends; and the tests that compare
#: two live looks at the machine (a check and a later snapshot, two fleet nodes), which another worker's
#: processes, zombies and recycled pids would tell apart; the count of python processes on the node, and a
#: JIT build timed against its limit, which another worker's real op builds would crowd.
RUNS_ALONE = (*KERNEL_LOG_WRITERS, "test_containment.py", "test_bundle.py", "test_fleet_push.py",
              "test_fleet_loopback.py", "test_cli.py", "test_hangs_check.py", "test_jitguard.py")
#: Files that change what every test on the machine shares (users and groups, network namespaces, sshd on
#: loopback addresses, loop devices and mounts, cgroups, the kernel log, the bundle's wheel cache): under
#: pytest-xdist they run one after another on one worker (``xdist_group``), the rest on any worker.
MACHINE_GROUP = frozenset({
    "test_bundle.py", "test_kernel_log.py", "test_hostram_kills.py",
    *(name for name, lanes in LANES.items() if "needs_root" in lanes or "needs_sshd" in lanes),
})


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with the lanes of its file (see :data:`LANES`) and its xdist group; the kernel log's
    writers go last."""
    for item in items:
        for lane in LANES.get(item.path.name, ()):
            item.add_marker(getattr(pytest.mark, lane))
        if item.path.name in MACHINE_GROUP:
            item.add_marker(pytest.mark.xdist_group("machine"))
    items.sort(key=lambda item: item.path.name in KERNEL_LOG_WRITERS)  # stable: the rest keep their order


#: The run's private directory (0700, made by the controlling process, inherited by the xdist workers
#: through the environment): the lock and the published kernel log window live there, not at names in /tmp
#: that another user could have placed a link at.
SHARED_ENV = "ZDOCTOR_TESTS_SHARED_DIR"


def home_listing(home: Path = REAL_HOME, state: Path = REAL_STATE) -> dict[str, tuple[int, int]]:
    """What a test must not change in the user's own files: the names at the top of the home, and every
    file under zdoctor's state directory there with its size and modification time (links not followed)."""
    seen: dict[str, tuple[int, int]] = {}
    with contextlib.suppress(OSError):
        seen.update({f"~/{entry.name}": (0, 0) for entry in os.scandir(home)})
    for folder, dirs, files in os.walk(state):
        for path in [folder] * (folder == str(state)) + [os.path.join(folder, name) for name in dirs + files]:
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                seen[path] = (st.st_size, st.st_mtime_ns)
    return seen


def listing_changes(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    """The entries added, removed or changed between two :func:`home_listing` results."""
    return sorted([f"added {k}" for k in after.keys() - before.keys()]
                  + [f"removed {k}" for k in before.keys() - after.keys()]
                  + [f"changed {k}" for k in before.keys() & after.keys() if before[k] != after[k]])


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        # zdoctor's cache (the index of where messages come from) is the test runs', shared by a run's workers
        # (they inherit the variable), never the contributor's own zdoctor cache. Made before the home is
        # listed: on a machine with no ~/.cache yet, the folder the tests keep is not a change to the home.
        cache, kept = kept_cache_dir()
        os.environ["ZDOCTOR_CACHE_DIR"] = str(cache)
        if not kept:
            config._zdoctor_run_cache = cache  # type: ignore[attr-defined]
    config._zdoctor_home_before = home_listing()  # type: ignore[attr-defined]
    if not hasattr(config, "workerinput") and not os.environ.get(SHARED_ENV):
        os.environ[SHARED_ENV] = tempfile.mkdtemp(prefix="zdoctor-tests-")
        config._zdoctor_shared_dir = os.environ[SHARED_ENV]  # type: ignore[attr-defined]
    if not hasattr(config, "workerinput"):
        # Every zdoctor a test starts imports most of the package: compiled once here, not in each process
        # (where PYTHONDONTWRITEBYTECODE is set, or in a fresh clone, each would compile it again).
        compileall.compile_dir(str(REPO / "zdoctor"), quiet=1)


def kept_cache_dir() -> tuple[Path, bool]:
    """zdoctor's cache for the test runs, kept between runs beside the DeepSpeed environment
    (``~/.cache/zdoctor-tests``, or ``$ZDOCTOR_TEST_CACHE``), as the environment's index is the same from one
    run to the next: one folder per version of the code that builds it (every module of
    ``zdoctor/symptoms`` and ``zdoctor/readers``), the folders of other versions removed. Where that folder
    cannot be made, a temporary one serves this run alone (``False``: removed as the run ends)."""
    base = Path(os.environ.get("ZDOCTOR_TEST_CACHE") or Path.home() / ".cache" / "zdoctor-tests")
    digest = hashlib.sha256()
    for source in sorted([*(REPO / "zdoctor" / "symptoms").glob("*.py"), *(REPO / "zdoctor" / "readers").glob("*.py")]):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    folder = base / f"zdoctor-cache-{digest.hexdigest()[:16]}"
    for old in base.glob("zdoctor-cache-*"):
        if old != folder:
            shutil.rmtree(old, ignore_errors=True)
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        return Path(tempfile.mkdtemp(prefix="zdoctor-test-cache-")), False
    return folder, True


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The run fails when the user's home or zdoctor state there changed while it ran."""
    if hasattr(session.config, "workerinput"):
        return
    changes = listing_changes(session.config._zdoctor_home_before, home_listing())  # type: ignore[attr-defined]
    if changes:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = (f"the tests changed the user's own files ({REAL_HOME}, {REAL_STATE}): "
                + "; ".join(changes[:20]))
        if reporter is not None:
            reporter.write_line(text, red=True)
        else:
            sys.stderr.write(text + "\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(RUN_STATE, ignore_errors=True)
    run_cache = getattr(config, "_zdoctor_run_cache", None)
    if run_cache is not None:
        shutil.rmtree(run_cache, ignore_errors=True)
    made = getattr(config, "_zdoctor_shared_dir", None)
    if made:
        shutil.rmtree(made, ignore_errors=True)
        os.environ.pop(SHARED_ENV, None)


def _shared_path(name: str) -> Path:
    """A file every worker of this run sees, in the run's private directory."""
    return Path(os.environ[SHARED_ENV]) / name


def publish_kernel_log_since(value: float) -> None:
    """Move the kernel log's window past records a test wrote, here and for every later test of the run
    (the other workers read it as each of their tests starts)."""
    os.environ["ZDOCTOR_KERNEL_LOG_SINCE"] = str(value)
    path = _shared_path("kernel-log-since")
    tmp = path.with_name(f"{path.name}.{os.getpid()}")
    tmp.write_text(str(value))
    os.replace(tmp, path)


def _follow_kernel_log_since() -> None:
    try:
        shared = float(_shared_path("kernel-log-since").read_text())
    except (OSError, ValueError):
        return
    if shared > float(os.environ.get("ZDOCTOR_KERNEL_LOG_SINCE") or 0):
        os.environ["ZDOCTOR_KERNEL_LOG_SINCE"] = str(shared)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Each test holds the run's lock shared, a test of :data:`RUNS_ALONE` holds it alone (its module's
    fixtures included): no other worker's zdoctor reads the kernel log while records are written and the
    window is not yet moved past them, or ends the cgroups a test left to be found. Every test starts with
    the newest window."""
    import fcntl

    fd = os.open(str(_shared_path("lock")), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if item.path.name in RUNS_ALONE else fcntl.LOCK_SH)
        _follow_kernel_log_since()
        yield
    finally:
        os.close(fd)


@pytest.fixture(autouse=True)
def not_a_subreaper():
    """A test that runs zdoctor's signal set-up in this process makes it a child subreaper (as zdoctor is):
    orphans of later tests (the detached processes of ``spawn``) would then be this process's unreaped
    zombies instead of init's. Each test starts without it."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(36, 0, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER off
    yield


@pytest.fixture(autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the session log at a private directory for each test."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return state


def run_cli(args: Sequence[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``python -m zdoctor ARGS`` for real and capture its output."""
    full_env = dict(os.environ if env is None else env)
    full_env.setdefault("NO_COLOR", "1")
    return subprocess.run([sys.executable, "-m", "zdoctor", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd or str(REPO), timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture
def cli():
    return run_cli


def dependency_dirs() -> list[str]:
    """Where this interpreter finds zdoctor's dependencies (a venv's own and, with system site packages,
    the base interpreter's), never the checkout itself."""
    dirs = [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    return list(dict.fromkeys(dirs))
