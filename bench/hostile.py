"""The hostile battery: every input zdoctor must survive, run as real zdoctor processes.

Each row runs ``python -m zdoctor ...`` from this checkout with one hostile input (built here: a real
FIFO, /dev/zero, a crafted ELF, a real symlink, a loop device when run as root), and reports its peak
RSS (``wait4``, the process and the children it waited for) and its wall time against the budgets:
under 512 MB, and within the time the probe itself allows (its ``--timeout``, else the default).

    python bench/hostile.py [--json FILE] [--only SUBSTRING]

Exit code 1 when any row is over a budget or did not behave (the expected refusal or finding).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))

from compilerkit import (  # noqa: E402
    DEFAULT_TMP,
    check_killed_mid_compile,
    defunct_children,
    killed_with_fallback_folders,
    slow_compiler,
    without_tmpdir,
)
from envkit import system_libstdcxx  # noqa: E402
from hostilekit import RSS_BUDGET_MB, Measured, craft_looping_verneed, run_measured  # noqa: E402
from kmsgkit import USER, add_records, kmsg_file, private_kmsg_argv  # noqa: E402
from racekit import build_racer, can_race, intact, loop_device, racing, unprivileged_user  # noqa: E402
from userkit import SYSTEM_PYTHON, WITNESS_PTH, witnessed  # noqa: E402

#: Wall-time budget of a row whose probe has no --timeout of its own: the default probe budget.
DEFAULT_TIME_BUDGET = 60.0


@dataclass
class Row:
    name: str
    args: list[str]
    time_budget: float
    expect: Callable[[Measured], bool]
    env: dict[str, str] | None = None
    setup: Callable[[], None] | None = None
    cleanup: Callable[[], None] | None = None
    #: The interpreter command zdoctor itself starts under (default: this one).
    python: list[str] | None = None


def _in_json(text: str) -> Callable[[Measured], bool]:
    return lambda m: text in m.stdout


def _in_stderr(text: str) -> Callable[[Measured], bool]:
    return lambda m: text in m.stderr


def _no_crash(m: Measured) -> bool:
    try:
        doc = json.loads(m.stdout)
    except ValueError:
        return False
    return not [f for f in doc["findings"] if f["status"] == "crash"]


def battery(work: Path) -> list[Row]:
    fifo = work / "fifo"
    os.mkfifo(fifo)
    crafted = craft_looping_verneed(system_libstdcxx(), work / "libhostile.so")
    libdir = work / "lib"
    libdir.mkdir()
    shutil.copy2(crafted, libdir / "libstdc++.so.6")
    big = work / "big.json"
    big.write_text(json.dumps({"train_batch_size": 8, "x": list(range(1_700_000))}))
    configs = {
        "100000-digit integer": '{"train_batch_size": ' + "9" * 100_000 + "}",
        "10000-deep nesting": '{"a": ' + "[" * 10_000 + "]" * 10_000 + "}",
        "latin-1 bytes": b'{"zero_optimization": {"offload_param": {"nvme_path": "/tmp/caf\xe9"}}}',
        "binary": bytes(range(256)) * 4,
    }
    rows: list[Row] = [
        Row("check --command yes --timeout 10", ["check", "--json", "--no-log", "--command", "yes", "--timeout", "10"],
            10 + 15, _in_json("bytes cut")),
        Row("check --ext crafted .gnu.version_r", ["check", "--json", "--no-log", "--ext", str(crafted)],
            DEFAULT_TIME_BUDGET, _in_json("corrupt ELF: .gnu.version_r claims 4294967295 entries")),
        Row("crafted libstdc++.so.6 on LD_LIBRARY_PATH", ["check", "--json", "--no-log"], DEFAULT_TIME_BUDGET,
            _in_json("damaged, corrupt ELF"), env={**os.environ, "LD_LIBRARY_PATH": str(libdir)}),
    ]
    for flag in ("--ds-config", "--model-config", "--log"):
        for target, kind in ((str(fifo), "a FIFO"), ("/dev/zero", "a character device")):
            label = "FIFO" if target == str(fifo) else target
            rows.append(Row(f"check {flag} {label}", ["check", "--json", "--no-log", flag, target],
                            DEFAULT_TIME_BUDGET, _in_json(f"is {kind}")))
    for target in (str(fifo), "/dev/zero"):
        rows.append(Row(f"check --ext {'FIFO' if target == str(fifo) else target}",
                        ["check", "--json", "--no-log", "--ext", target], DEFAULT_TIME_BUDGET,
                        _in_stderr("only regular files are loaded as an extension")))
    for args, label in ((["check", "--replay"], "check --replay"), (["fleet", "--hostfile"], "fleet --hostfile")):
        for target in (str(fifo), "/dev/zero"):
            rows.append(Row(f"{label} {'FIFO' if target == str(fifo) else target}", [*args, target],
                            DEFAULT_TIME_BUDGET, _in_stderr("only regular files are read")))
    log = work / "train.log"
    line = (b"[2026-01-01 00:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | fwd_microstep: 101.5 "
            b"| bwd_microstep: 200.1 | step_microstep: 300.2\n")
    with open(log, "wb") as fh:  # 400 MB, mostly a hole
        fh.write(line * 1000)
        fh.seek(400 * 1024 * 1024)
        fh.write(line * 1000)
    rows.append(Row("check --log 400 MB training log", ["check", "--json", "--no-log", "--log", str(log)],
                    DEFAULT_TIME_BUDGET, _no_crash))
    rows.append(Row("check --ds-config 14 MB JSON array", ["check", "--json", "--no-log", "--ds-config", str(big)],
                    DEFAULT_TIME_BUDGET, _no_crash))
    for name, data in configs.items():
        path = work / f"{name.replace(' ', '-')}.json"
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        for flag in ("--ds-config", "--model-config"):
            rows.append(Row(f"check {flag} {name}", ["check", "--json", "--no-log", flag, str(path)],
                            DEFAULT_TIME_BUDGET, _no_crash))
    # -- writing through links
    link_fifo = work / "to-fifo.md"
    link_fifo.symlink_to(fifo)
    rows.append(Row("export -o symlink to a FIFO", ["export", "--last", "--format", "md", "-o", str(link_fifo)],
                    DEFAULT_TIME_BUDGET, _in_stderr("refusing to write through it")))
    rows.append(Row("export -o FIFO without reader", ["export", "--last", "--format", "md", "-o", str(fifo)],
                    DEFAULT_TIME_BUDGET, _in_stderr("no process read this FIFO within 10s")))
    loop: dict[str, str] = {}
    if os.geteuid() == 0 and shutil.which("losetup"):
        backing = work / "disk.img"
        backing.write_bytes(b"\0" * (1 << 20))
        link_dev = work / "to-device.json"

        def attach() -> None:
            loop["dev"] = subprocess.run(["losetup", "-f", "--show", str(backing)], capture_output=True,
                                         text=True, check=True).stdout.strip()
            link_dev.symlink_to(loop["dev"])

        def detach() -> None:
            if loop.get("dev"):
                subprocess.run(["losetup", "-d", loop["dev"]], check=False)

        rows.append(Row("snapshot -o symlink to a loop device", ["snapshot", "-o", str(link_dev)],
                        DEFAULT_TIME_BUDGET, _in_stderr("a symbolic link to a block device"), setup=attach,
                        cleanup=detach))
    home = Path(f"/nonexistent-zdoctor-hostile-{os.getpid()}")
    rows.append(Row("HOME=/nonexistent (no XDG_STATE_HOME)", ["check", "--json", "--playbook", "gpu-stack"],
                    DEFAULT_TIME_BUDGET, lambda m: "not creating session log directory" in m.stderr
                    and not home.exists() and _no_crash(m),
                    env={**{k: v for k, v in os.environ.items() if k != "XDG_STATE_HOME"}, "HOME": str(home)}))
    if can_race() is None and shutil.which("losetup"):
        rows.append(_racing_offload_row(work))
    state = work / "state-link"
    (state / "zdoctor").mkdir(parents=True)
    victim = work / "victim"
    victim.mkdir(mode=0o755)
    (state / "zdoctor" / "sessions").symlink_to(victim)
    rows.append(Row("state directory is a symlink", ["check", "--json", "--playbook", "gpu-stack"],
                    DEFAULT_TIME_BUDGET, _in_stderr("it is a symbolic link"),
                    env={**os.environ, "XDG_STATE_HOME": str(state)}))
    rows += recorded_rows(work) + reader_rows(work, fifo) + bounded_rows(work) + leftover_rows(work)
    if os.geteuid() == 0 and os.path.exists(SYSTEM_PYTHON):
        rows += code_owner_rows(work)
    if os.geteuid() == 0 and shutil.which("mount"):
        rows.append(full_disk_row(work))
        rows += kernel_log_rows(work)
    return rows


def _racing_offload_row(work: Path) -> Row:
    """The offload directory's owner (a user made for the row) renames a link to a loop device over each
    test file zdoctor creates there, while ``check --offload-path`` runs the O_DIRECT tests."""
    held = contextlib.ExitStack()
    state: dict[str, object] = {}
    root_dir, offload = work / "race-root", work / "race-offload"
    root_dir.mkdir(mode=0o755)
    os.chmod(work, 0o755)

    def setup() -> None:
        user = held.enter_context(unprivileged_user())
        offload.mkdir()
        os.chown(offload, user.uid, user.gid)
        state["dev"], _ = held.enter_context(loop_device(root_dir))
        racer = build_racer("swap_in_link", root_dir)
        held.enter_context(racing(user, [str(racer), str(offload), ".zdoctor-", str(state["dev"]), "both"]))

    def cleanup() -> None:
        state["intact"] = intact(str(state["dev"]), 16 << 20)
        held.close()

    return Row("check --offload-path: the owner swaps a link to a loop device in",
               ["check", "--json", "--no-log", "--offload-path", str(offload), "--io-size", "16M"],
               DEFAULT_TIME_BUDGET, lambda m: _no_crash(m) and state.get("intact") is True, setup=setup,
               cleanup=cleanup)


def code_owner_rows(work: Path) -> list[Row]:
    """zdoctor as root on code a user made for the row can change: their venv in the default layout
    (``bin/python`` a link to the system one), and the system Python given their HOME (a ``sudo -E``
    shell); a recording ``.pth`` counts who started the interpreter. Any start as uid 0 fails the row.
    zdoctor itself starts with ``-s``: what is counted is what it starts."""
    version = subprocess.run([SYSTEM_PYTHON, "-I", "-S", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True).stdout.strip()
    rows = []
    for kind in ("venv", "home"):
        held = contextlib.ExitStack()
        top = work / f"code-owner-{kind}"
        seen = top / "witness"
        env_dir, home = top / "env", top / "home"
        python = str(env_dir / "bin" / "python") if kind == "venv" else SYSTEM_PYTHON

        def setup(kind: str = kind, held: contextlib.ExitStack = held, top: Path = top, seen: Path = seen,
                  env_dir: Path = env_dir, home: Path = home) -> None:
            user = held.enter_context(unprivileged_user())
            top.mkdir(mode=0o755)
            os.chmod(work, 0o755)
            seen.mkdir(mode=0o777)
            os.chmod(seen, 0o777)
            if kind == "venv":
                subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(env_dir)], check=True)
                (site,) = env_dir.glob("lib/python3*/site-packages")
                owned = env_dir
            else:
                site = home / ".local" / "lib" / f"python{version}" / "site-packages"
                site.mkdir(parents=True)
                owned = home
                subprocess.run(["usermod", "-d", str(home), user.name], check=True, capture_output=True)
            (site / "x.pth").write_text(WITNESS_PTH.format(dir=str(seen)))
            for directory, dirs, files in os.walk(owned):
                for n in [*dirs, *files]:
                    os.chown(os.path.join(directory, n), user.uid, user.gid, follow_symlinks=False)
            os.chown(owned, user.uid, user.gid)

        def never_root(m: Measured, seen: Path = seen) -> bool:
            runs = witnessed(seen)
            return _no_crash(m) and bool(runs) and all(r[0] != 0 and r[1] != 0 for r in runs)

        env = {k: v for k, v in os.environ.items() if k != "SUDO_USER"}
        if kind == "home":
            env["HOME"] = str(home)
        rows.append(Row(f"check --python --command as root: the user's {'venv' if kind == 'venv' else 'HOME'} "
                        "(.pth never runs as uid 0)",
                        ["check", "--json", "--no-log", "--python", python, "--command", f"{python} -c pass",
                         "--timeout", "30"], DEFAULT_TIME_BUDGET, never_root, env=env, setup=setup,
                        cleanup=held.close, python=[sys.executable, "-s"]))
    return rows


def recorded_rows(work: Path) -> list[Row]:
    """Recordings of the wrong shape: a mutated snapshot, a session event of the wrong type, a 200 MB log,
    deeply nested playbook TOML, an export into a FIFO another user planted."""
    rows = []
    doc = json.loads((REPO / "tests" / "fixtures" / "snapshots" / "healthy.json").read_text())
    doc["probes"]["pyenv"]["facts"]["target"] = "x"
    doc["probes"]["toolchain"]["facts"]["compilers"] = [1]
    snap = work / "mutated-snapshot.json"
    snap.write_text(json.dumps(doc))
    rows.append(Row("check --replay snapshot with wrong-typed fields", ["check", "--json", "--replay", str(snap)],
                    DEFAULT_TIME_BUDGET, lambda m: _no_crash(m) and "malformed" in m.stdout))
    odd = work / "state-odd" / "zdoctor" / "sessions"
    odd.mkdir(parents=True, mode=0o700)
    src = sorted((REPO / "tests" / "fixtures" / "sessions").glob("*.jsonl"))[-1]
    events = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    for e in events:
        if e.get("type") == "finding":
            e["finding"]["remedies"] = 7
            break
    (odd / src.name).write_text("".join(json.dumps(e) + "\n" for e in events))
    rows.append(Row("export of a session with a wrong-typed finding", ["export", "--last", "--format", "md"],
                    DEFAULT_TIME_BUDGET, _in_stderr("event of the wrong shape"),
                    env={**os.environ, "XDG_STATE_HOME": str(work / "state-odd")}))
    big = work / "state-big" / "zdoctor" / "sessions"
    big.mkdir(parents=True, mode=0o700)
    sid = "20261201T120000-b8aa"
    with open(big / f"{sid}.jsonl", "w") as fh:
        fh.write(json.dumps({"seq": 1, "ts": 1.0, "type": "session_start", "session_id": sid, "mode": "check",
                             "argv": ["check"], "host": {}, "started": 1.0}) + "\n")
        seq = 2
        while fh.tell() < 200 << 20:
            fh.write(json.dumps({"seq": seq, "ts": 1.0, "type": "finding", "finding": {
                "id": f"f{seq}", "status": "warn", "title": "t", "detail": "x" * 60000}}) + "\n")
            seq += 1
    rows.append(Row("export of a 200 MB session log", ["export", "--session", sid, "--format", "md", "-o",
                                                       str(work / "big.md")],
                    DEFAULT_TIME_BUDGET, _in_stderr("only the first 32 MiB were read"),
                    env={**os.environ, "XDG_STATE_HOME": str(work / "state-big")}))
    deep = work / "deep.toml"
    deep.write_text("id = 'x'\nnodes = " + "[" * 5000 + "]" * 5000 + "\n")
    rows.append(Row("playbooks lint 5000-deep TOML", ["playbooks", "lint", str(deep)], DEFAULT_TIME_BUDGET,
                    lambda m: "nested too deeply" in m.stdout + m.stderr))
    if os.geteuid() == 0:
        shared = work / "shared"
        shared.mkdir(mode=0o1777)
        planted = shared / "report.md"
        os.mkfifo(planted)
        os.chown(planted, 65534, 65534)
        rows.append(Row("export -o FIFO another user planted", ["export", "--last", "--format", "md", "-o",
                                                                str(planted)],
                        DEFAULT_TIME_BUDGET, _in_stderr("that belongs to another user")))
    return rows


def reader_rows(work: Path, fifo: Path) -> list[Row]:
    """FIFOs where zdoctor reads on its own: a libstdc++.so.6 on LD_LIBRARY_PATH, an op's build.ninja."""
    lib = work / "fifo-lib"
    lib.mkdir()
    os.mkfifo(lib / "libstdc++.so.6")
    ops = work / "fifo-ops"
    (ops / "cpu_adam").mkdir(parents=True)
    os.mkfifo(ops / "cpu_adam" / "build.ninja")
    return [Row("FIFO libstdc++.so.6 on LD_LIBRARY_PATH", ["check", "--json", "--no-log"], DEFAULT_TIME_BUDGET,
                lambda m: _no_crash(m) and "libstdc++.so.6: a FIFO (named pipe)" in m.stdout,
                env={**os.environ, "LD_LIBRARY_PATH": str(lib)}),
            Row("FIFO build.ninja in the op cache", ["check", "--json", "--no-log", "--playbook", "zero3-launch"],
                DEFAULT_TIME_BUDGET, _no_crash, env={**os.environ, "TORCH_EXTENSIONS_DIR": str(ops)})]


def bounded_rows(work: Path) -> list[Row]:
    """Inputs bounded by construction: endless lines for the message catalogue, an out-of-range kernel
    record's kind of damage in a snapshot, a multi-megabyte line in a log, special files in the op cache and
    among the shell start-up files."""
    state = {**os.environ, "XDG_STATE_HOME": str(work / "state")}
    log = work / "one-long-line.log"
    log.write_text("step 1\n" + "/" * (1 << 20) + " ImportError: /opt/env/ext.so: undefined symbol: ncclCommRegister\n")
    doc = json.loads((REPO / "tests" / "fixtures" / "snapshots" / "healthy.json").read_text())
    doc["probes"]["dsrelease"] = {"probe": "dsrelease", "status": "ok", "error": None, "started": 0.0,
                                  "duration_s": 0.1, "evidence": [],
                                  "facts": {"installed": True, "version": "0.19.8",
                                            "rules": {"libaio-detection": "old"}, "jit_origins": ["x"]}}
    snap = work / "release-rule-of-another-type.json"
    snap.write_text(json.dumps(doc))
    home, ops = work / "special-home", work / "special-ops" / "cpu_adam"
    home.mkdir()
    ops.mkdir(parents=True)
    os.mkfifo(home / ".bashrc")
    os.mkfifo(ops / "cpu_adam.so")
    return [
        Row("check --symptom of 120,000 characters", ["check", "--json", "--no-log", "--playbook", "toolchain",
                                                      "--symptom", "RuntimeError: " + "CUDA " * 24_000],
            DEFAULT_TIME_BUDGET, lambda m: _no_crash(m) and '"symptoms": [' in m.stdout),
        Row("check --log ending in a 1 MiB line", ["check", "--json", "--no-log", "--log", str(log)],
            DEFAULT_TIME_BUDGET, _in_json("loader.undefined-nccl-symbol")),
        Row("check --command printing one endless line", ["check", "--json", "--no-log", "--playbook", "toolchain",
                                                          "--command", f"{sys.executable} -c \"import sys\n"
                                                          "while True: sys.stdout.write('CUDA /' * 4096)\"",
                                                          "--timeout", "10"],
            10 + DEFAULT_TIME_BUDGET, _no_crash),
        Row("check --replay with a release rule of another type", ["check", "--json", "--replay", str(snap)],
            DEFAULT_TIME_BUDGET, lambda m: _no_crash(m) and "cannot be read" in m.stdout),
        Row("FIFO .bashrc and FIFO op .so", ["check", "--json", "--no-log"], DEFAULT_TIME_BUDGET,
            lambda m: _no_crash(m) and ".bashrc: a FIFO (named pipe)" in m.stdout
            and "cpu_adam.so: a FIFO (named pipe)" in m.stdout,
            env={**state, "HOME": str(home), "TORCH_EXTENSIONS_DIR": str(ops.parent)}),
    ]


def leftover_rows(work: Path) -> list[Row]:
    """What zdoctor leaves of its own: the next check after one SIGKILLed mid-compile (its run folder, with
    the compile test's sources and the compiler's cc*.s, removed; a link named like a run folder left, its
    target untouched), and, as root (the command's cgroup), a compile whose keeper is killed outright, the
    compiler in a session of its own (no <defunct> child of zdoctor lasting past a poll or two)."""
    from zdoctor.proc.scratch import PREFIX, pid_namespace

    ns = pid_namespace()
    marks, target = work / "killed-cc", work / "not-a-run-folder"
    for folder in (marks, target):
        folder.mkdir()
    (target / "keep").write_text("x")
    link = DEFAULT_TMP / f"{PREFIX}{ns}-1-1-link{os.getpid()}"
    killed: dict[str, int] = {}

    def kill_one() -> None:
        killed["pid"] = check_killed_mid_compile(marks, REPO)
        link.symlink_to(target)

    def swept(m: Measured) -> bool:
        return (_no_crash(m) and bool(killed) and not list(DEFAULT_TMP.glob(f"{PREFIX}{ns}-{killed['pid']}-*"))
                and killed.get("link kept") == 1)

    def unlink() -> None:  # runs before the row is judged: what the link was is noted first
        killed["link kept"] = int(link.is_symlink() and (target / "keep").exists())
        if link.is_symlink():
            link.unlink()

    state = {**without_tmpdir(dict(os.environ)), "XDG_STATE_HOME": str(work / "state")}
    rows = [Row("check after a check SIGKILLed mid-compile", ["check", "--json", "--no-log", "--playbook",
                                                               "gpu-stack"],
                DEFAULT_TIME_BUDGET, swept, env=state, setup=kill_one, cleanup=unlink),
            _fallbacks_row(work, state)]
    if os.geteuid() == 0:
        rows.append(_defunct_row(work, state))
    return rows


def _fallbacks_row(work: Path, state: dict[str, str]) -> Row:
    """The next check after a run killed while its compile test's folder was in /var/tmp and its /dev/shm
    write test's in /dev/shm: both removed."""
    left: list[Path] = []

    def kill_one() -> None:
        left.extend(killed_with_fallback_folders(work, REPO)[1])

    def swept(m: Measured) -> bool:
        return _no_crash(m) and len(left) == 2 and not any(p.exists() for p in left)

    def cleanup() -> None:
        for p in left:
            shutil.rmtree(p, ignore_errors=True)

    return Row("check after a run killed with folders in /var/tmp and /dev/shm",
               ["check", "--json", "--no-log", "--playbook", "gpu-stack"], DEFAULT_TIME_BUDGET, swept, env=state,
               setup=kill_one, cleanup=cleanup)


def kernel_log_rows(work: Path) -> list[Row]:
    """The kernel log as a forger or an empty ring leaves it, bind-mounted over /dev/kmsg in a private mount
    namespace (root): an Xid written from user space (LOG_USER, as the kernel forces), a kernel record that
    echoes an Xid's text mid-message (a mount's error naming its device), and a log that gave no record.
    None may make kernel.xid fail; the empty log is not examined."""
    xid = "NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    boot = "Linux version 6.8.0-49-generic (buildd@lcy02-amd64-103) #49-Ubuntu SMP PREEMPT_DYNAMIC"
    forged = kmsg_file(work / "kmsg-forged", boot)
    add_records(forged, xid, facility=USER)
    echoed = kmsg_file(work / "kmsg-echoed", boot, f"EXT4-fs (loop0): unable to read superblock of {xid}")
    empty = work / "kmsg-empty"
    empty.write_text("")
    env = {**os.environ, "ZDOCTOR_KERNEL_LOG_SINCE": "", "XDG_STATE_HOME": str(work / "state")}
    args = ["check", "--json", "--no-log", "--playbook", "gpu-health"]

    def finding(m: Measured, fid: str) -> dict:
        try:
            return next((f for f in json.loads(m.stdout)["findings"] if f["id"] == fid), {})
        except ValueError:
            return {}

    def layer(m: Measured) -> str:
        try:
            return next(x["status"] for x in json.loads(m.stdout)["layers"] if x["id"] == "kernel-log")
        except (ValueError, StopIteration):
            return ""

    return [
        Row("/dev/kmsg: an Xid 79 written from user space (LOG_USER)", args, DEFAULT_TIME_BUDGET,
            lambda m: finding(m, "kernel.xid").get("status") == "ok" and "written from user space" in m.stdout,
            env=env, python=private_kmsg_argv(forged, [sys.executable])),
        Row("/dev/kmsg: a kernel record with an Xid's text mid-message", args, DEFAULT_TIME_BUDGET,
            lambda m: finding(m, "kernel.xid").get("status") == "ok" and "not at the start" in m.stdout,
            env=env, python=private_kmsg_argv(echoed, [sys.executable])),
        Row("/dev/kmsg: 0 records read", args, DEFAULT_TIME_BUDGET,
            lambda m: layer(m) == "not examined" and finding(m, "kernel.xid.not-checked").get("status") == "skip",
            env=env, python=private_kmsg_argv(empty, [sys.executable])),
    ]


def _defunct_row(work: Path, state: dict[str, str]) -> Row:
    """``check --playbook toolchain`` with a compiler that kills its keeper mid-compile; a thread watches
    the zdoctor process (found by a variable in its environment) for children that stay ``<defunct>``."""
    marks = work / "defunct-cc"
    marks.mkdir()
    cxx = slow_compiler(marks, own_session=True, kill_keeper=True)
    tag = f"ZDOCTOR_HOSTILE_ROW=defunct-{os.getpid()}"
    seen: dict[str, float] = {}
    lasting: list[str] = []
    done = threading.Event()

    def zdoctor_pid() -> int | None:
        for name in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                if tag.encode() in Path(f"/proc/{name}/environ").read_bytes().split(b"\0") and \
                        b"zdoctor" in Path(f"/proc/{name}/cmdline").read_bytes():
                    return int(name)
        return None

    def watch() -> None:
        pid = None
        while not done.is_set():
            pid = pid or zdoctor_pid()
            now = time.monotonic()
            for zombie in defunct_children(pid) if pid else ():
                if now - seen.setdefault(zombie, now) > 2.0 and zombie not in lasting:
                    lasting.append(zombie)
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)

    def stop() -> None:
        done.set()
        watcher.join()

    key, _, value = tag.partition("=")
    return Row("check with a compiler that kills its keeper mid-compile", ["check", "--json", "--no-log",
                                                                           "--playbook", "toolchain"],
               DEFAULT_TIME_BUDGET, lambda m: _no_crash(m) and not lasting,
               env={**state, "CXX": str(cxx), key: value}, setup=watcher.start,
               cleanup=stop)


def full_disk_row(work: Path) -> Row:
    """The session log on a real 256 KiB tmpfs, full."""
    point = work / "full"
    point.mkdir()

    def setup() -> None:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "zdoctor-full", str(point)],
                       check=True)
        (point / "zdoctor" / "sessions").mkdir(parents=True, mode=0o700)
        fd = os.open(point / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\1" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        os.truncate(point / "filler", max(0, (point / "filler").stat().st_size - 8192))

    def cleanup() -> None:
        subprocess.run(["umount", "-l", str(point)], check=False)

    return Row("full disk under the session log", ["check", "--json", "--playbook", "gpu-stack"],
               DEFAULT_TIME_BUDGET, lambda m: m.returncode in (0, 1, 3) and "could not be recorded" in m.stderr,
               env={**os.environ, "XDG_STATE_HOME": str(point)}, setup=setup, cleanup=cleanup)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--only", metavar="TEXT", help="run only the rows whose name contains TEXT")
    opts = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="zdoctor-hostile-") as tmp:
        work = Path(tmp)
        state = work / "state"
        state.mkdir()
        base_env = {**os.environ, "XDG_STATE_HOME": str(state)}
        # one recorded session for the export rows
        run_measured(["check", "--json", "--playbook", "gpu-stack"], env=base_env, cwd=str(REPO))
        rows = [r for r in battery(work) if not opts.only or opts.only in r.name]
        print("| input | peak RSS (MB) | wall (s) | budget | result |\n|---|---|---|---|---|")
        for row in rows:
            if row.setup:
                row.setup()
            try:
                env = row.env or base_env
                m = run_measured(row.args, env=env, cwd=str(REPO), wall_limit=row.time_budget + 30,
                                 python=row.python)
            finally:
                if row.cleanup:
                    row.cleanup()
            ok_rss = m.peak_rss_mb < RSS_BUDGET_MB
            ok_time = not m.killed and m.wall_s <= row.time_budget
            behaved = row.expect(m) and "Traceback" not in m.stderr
            verdict = "ok" if ok_rss and ok_time and behaved else \
                "OVER BUDGET" if not (ok_rss and ok_time) else "unexpected output"
            print(f"| {row.name} | {m.peak_rss_mb:.0f} | {m.wall_s:.1f} | {RSS_BUDGET_MB} MB, "
                  f"{row.time_budget:g} s | {verdict} |", flush=True)
            results.append({"input": row.name, "peak_rss_mb": round(m.peak_rss_mb, 1), "wall_s": round(m.wall_s, 2),
                            "rss_budget_mb": RSS_BUDGET_MB, "time_budget_s": row.time_budget, "verdict": verdict,
                            "exit_code": m.returncode})
    if opts.json:
        Path(opts.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(r["verdict"] == "ok" for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
