"""Live confirmation: real commands under LD_DEBUG and strace, with a real g++ extension that needs
GLIBCXX_3.4.30 (std::condition_variable::wait) and a libstdc++ stand-in whose version nodes stop at
GLIBCXX_3.4.28."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from envkit import build_extension

from zdoctor.core.errors import UsageError
from zdoctor.layers.libraries.live import (
    default_probe_argv,
    parse_probe_output,
    parse_stderr_version_errors,
    trace_command,
)
from zdoctor.readers.elf import read_elf
from zdoctor.scripts import script_path

LD = Path(__file__).resolve().parent / "fixtures" / "lddebug"

class Built:
    ext: str
    old_dir: str


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Built:
    d = tmp_path_factory.mktemp("live")
    b = Built()
    b.ext = str(build_extension(d, "cvwait", filename=f"cvwait{sysconfig.get_config_var('EXT_SUFFIX')}"))
    nodes = ["GLIBCXX_3.4"] + [f"GLIBCXX_3.4.{i}" for i in range(1, 29)] + ["CXXABI_1.3"]
    (d / "stub.c").write_text("".join(f"int zd_dummy_{i}(void) {{ return {i}; }}\n" for i in range(len(nodes))))
    (d / "stub.map").write_text("".join(
        f"{n} {{ global: zd_dummy_{i}; {'local: *; ' if i == 0 else ''}}};\n" for i, n in enumerate(nodes)))
    old = d / "old"
    old.mkdir()
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libstdc++.so.6", f"-Wl,--version-script={d}/stub.map",
                    str(d / "stub.c"), "-o", str(old / "libstdc++.so.6")], check=True, capture_output=True)
    b.old_dir = str(old)
    info = read_elf(b.ext)
    assert ("GLIBCXX_3.4.30", False) in info.verneed["libstdc++.so.6"]
    stand_in = read_elf(str(old / "libstdc++.so.6"))
    assert stand_in.soname == "libstdc++.so.6" and not stand_in.provides("GLIBCXX_3.4.30")
    return b


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def failing(built):
    env = base_env(LD_LIBRARY_PATH=built.old_dir)
    before = dict(env)
    lt = trace_command(default_probe_argv(sys.executable, [], [built.ext]), env, timeout=90)
    assert env == before  # the caller's mapping is untouched
    return lt


def test_old_copy_on_ld_library_path_is_caught_live(built, failing):
    lt = failing
    assert lt.exit_code == 1 and not lt.timed_out
    stand_in = os.path.join(built.old_dir, "libstdc++.so.6")
    assert [row[1:] for row in lt.libstdcxx] == [(stand_in, "[LD_LIBRARY_PATH]", built.ext)]
    assert [(e.provider, e.version, e.required_by) for e in lt.version_errors] == [
        (stand_in, "GLIBCXX_3.4.30", built.ext)]
    assert [(e.provider, e.version, e.required_by) for e in lt.stderr_version_errors] == [
        (stand_in, "GLIBCXX_3.4.30", built.ext)]
    assert "ImportError" in lt.evidence.stderr and "GLIBCXX_3.4.30" in lt.evidence.stderr
    assert "LD_DEBUG" not in os.environ and "LD_DEBUG_OUTPUT" not in os.environ
    steps = parse_probe_output(lt.evidence.stdout)
    load = next(st for st in steps if st["step"] == "load cvwait")
    assert load["ok"] is False
    assert "GLIBCXX_3.4.30" in load["error"] and load["path"] == built.ext


def test_strace_saw_the_loader_open_the_stand_in(built, failing):
    assert failing.strace_available and failing.strace_used and failing.notes == []
    (pid,) = failing.traces  # strace itself ran without LD_DEBUG: only the python process is traced
    opened = [e.path for e in failing.last_files[pid]]
    assert os.path.join(built.old_dir, "libstdc++.so.6") in opened
    json.dumps(failing.to_dict())


def test_without_the_dir_the_import_works_with_the_cached_copy(built):
    lt = trace_command(default_probe_argv(sys.executable, [], [built.ext]), base_env(), timeout=90)
    assert lt.exit_code == 0, lt.evidence.stderr
    ((_, path, label, needed_by),) = lt.libstdcxx
    assert label == "[ld.so.cache]" and needed_by == built.ext
    assert read_elf(path).provides("GLIBCXX_3.4.30")
    assert lt.version_errors == [] and lt.stderr_version_errors == []
    assert parse_probe_output(lt.evidence.stdout)[-1] == {
        "step": "load cvwait", "ok": True, "error": None, "path": built.ext, "module": "cvwait"}


def test_preloaded_copy_is_named_as_the_preload(built):
    stand_in = os.path.join(built.old_dir, "libstdc++.so.6")
    lt = trace_command(default_probe_argv(sys.executable, [], [built.ext]), base_env(LD_PRELOAD=stand_in), timeout=90)
    assert lt.exit_code == 1
    assert lt.libstdcxx[0][1:3] == (stand_in, "[LD_PRELOAD]")
    assert lt.version_errors[0].provider == stand_in


def test_hang_is_killed_and_strace_shows_what_it_touched(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    marker, fifo = tmp_path / "marker.txt", tmp_path / "fifo"
    os.mkfifo(fifo)
    code = "import sys; open(sys.argv[1], 'w').close(); open(sys.argv[2])"  # nobody writes to the FIFO
    lt = trace_command([sys.executable, "-c", code, str(marker), str(fifo)], base_env(), timeout=5)
    assert lt.timed_out and lt.exit_code is None
    assert any("timed out" in n for n in lt.notes)
    touched = [e.path for evs in lt.last_files.values() for e in evs]
    assert str(marker) in touched
    assert [(e.path, e.syscall) for e in lt.pending_calls] == [(str(fifo), "openat")]
    assert lt.traces  # the loader trace up to the hang is kept
    assert list(scratch.iterdir()) == []  # the private trace directory is gone
    # strace's own line of the call it waits in, as strace wrote it
    (wait,) = lt.strace_lines
    assert wait.startswith(f"{lt.pending_calls[0].pid} ") and f'openat(AT_FDCWD, "{fifo}", O_RDONLY' in wait
    assert " = " not in wait


def test_strace_line_of_the_copy_really_opened(built):
    """The trace keeps strace's own line of the open of the old copy found through LD_LIBRARY_PATH."""
    argv = ["/bin/sh", "-c", shlex.join(default_probe_argv(sys.executable, [], [built.ext]))]
    lt = trace_command(argv, base_env(LD_LIBRARY_PATH=built.old_dir), timeout=90)
    assert lt.exit_code == 1 and lt.strace_used
    stand_in = os.path.join(built.old_dir, "libstdc++.so.6")
    opened = [line for line in lt.strace_lines if f'"{stand_in}"' in line]
    assert opened and all("openat(AT_FDCWD, " in line and "O_RDONLY|O_CLOEXEC) = " in line for line in opened)
    assert not any("ENOENT" in line for line in lt.strace_lines)  # the misses of the search are not kept


def test_without_strace_on_path_the_trace_still_works(built, tmp_path):
    env = base_env(PATH=str(tmp_path))
    lt = trace_command(default_probe_argv(sys.executable, [], [built.ext]), env, timeout=90)
    assert lt.exit_code == 0
    assert not lt.strace_available and not lt.strace_used and lt.last_files == {}
    assert lt.notes == ["strace not installed: hang analysis limited to LD_DEBUG"]
    assert lt.libstdcxx[0][2] == "[ld.so.cache]"


def test_strace_that_cannot_trace_falls_back(built, tmp_path):
    fake = tmp_path / "strace"
    fake.write_text("#!/bin/sh\necho 'strace: ptrace(PTRACE_TRACEME, ...): Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    lt = trace_command(default_probe_argv(sys.executable, [], [built.ext]),
                       base_env(PATH=f"{tmp_path}:{os.environ.get('PATH', '')}"), timeout=90)
    assert lt.exit_code == 0 and lt.strace_available and not lt.strace_used
    (note,) = lt.notes
    assert "strace cannot trace here" in note and "Operation not permitted" in note
    assert lt.traces and lt.libstdcxx


def test_use_strace_false_and_missing_program(tmp_path):
    lt = trace_command([sys.executable, "-c", "pass"], base_env(), use_strace=False, timeout=60)
    assert lt.exit_code == 0 and not lt.strace_used and lt.notes == []
    assert lt.traces
    gone = trace_command([str(tmp_path / "no such program")], base_env(), timeout=30)
    assert gone.exit_code is None and "executable not found" in (gone.evidence.error or "")
    assert any("ran without strace" in n for n in gone.notes)


def test_relative_program_resolves_from_cwd_and_empty_command_is_refused(tmp_path):
    script = tmp_path / "run me.sh"
    script.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c 'print(42)'\n")
    script.chmod(0o755)
    lt = trace_command(["./run me.sh"], base_env(), cwd=str(tmp_path), timeout=60)
    assert lt.exit_code == 0 and lt.evidence.stdout == "42\n"
    assert lt.strace_used and lt.notes == []
    (t,) = lt.traces.values()  # exec keeps the pid: both programs' loads land in one trace
    assert {"/bin/sh", sys.executable} <= {lk.needed_by for lk in t.lookups}
    with pytest.raises(UsageError):
        trace_command([], base_env())


def test_hostile_arguments_and_paths_stay_inert(built, tmp_path):
    odd = tmp_path / "a b $(touch pwned) `touch pwned2`; touch pwned3"
    odd.mkdir()
    ext = odd / os.path.basename(built.ext)
    shutil.copy(built.ext, ext)
    lt = trace_command(default_probe_argv(sys.executable, [], [str(ext)]), base_env(), cwd=str(tmp_path), timeout=90)
    assert lt.exit_code == 0, lt.evidence.stderr
    assert parse_probe_output(lt.evidence.stdout)[-1]["path"] == str(ext)
    echo = trace_command([sys.executable, "-c", "import sys; print(sys.argv[1])", "$(touch pwned4) ; rm -rf x"],
                         base_env(), cwd=str(tmp_path), timeout=60)
    assert echo.evidence.stdout == "$(touch pwned4) ; rm -rf x\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [odd.name]


def test_probe_program_layout_and_output_parsing():
    argv = default_probe_argv("/opt/py/bin/python", ["/x/ext.so", "-rf"], ["/y/op.so"])
    assert argv == ["/opt/py/bin/python", "-B", str(script_path("probe_script.py")), "--trace", "ext:/x/ext.so",
                    "ext:-rf", "op:/y/op.so"]
    out = "\n".join([
        "[INFO] something printed by an import",
        json.dumps({"step": "import torch", "begin": True}),
        json.dumps({"step": "import torch", "ok": True, "error": None}),
        "{not json",
        json.dumps({"unrelated": 1}),
        json.dumps({"step": "load op", "begin": True, "path": "/x/op.so", "module": "op"}),
    ])
    steps = parse_probe_output(out)
    assert steps[0] == {"step": "import torch", "ok": True, "error": None}
    assert steps[1]["step"] == "load op" and steps[1]["ok"] is False and steps[1]["finished"] is False
    assert steps[1]["path"] == "/x/op.so"
    assert parse_probe_output("") == []


def test_probe_order_and_ops_built_for_another_python(tmp_path):
    """Extensions load before torch, JIT ops after; an op cached under another Python's tag is skipped."""
    good = tmp_path / "a.so"
    good.write_text("not an ELF file")
    other = tmp_path / "py27_cpu" / "cpu_adam" / "cpu_adam.so"
    other.parent.mkdir(parents=True)
    other.write_text("never loaded")
    proc = subprocess.run(default_probe_argv(sys.executable, [str(good)], [str(other)]), capture_output=True,
                          text=True, timeout=60)
    steps = parse_probe_output(proc.stdout)
    assert [s["step"] for s in steps] == ["load a", "import torch", "import deepspeed", "load cpu_adam"]
    assert steps[-1]["ok"] is None and "py27" in steps[-1]["skipped"]
    assert proc.returncode == 1  # a.so is not a library


def test_probe_reports_a_broken_extension_and_exits_1(tmp_path):
    bogus = tmp_path / "notanelf.cpython-311-x86_64-linux-gnu.so"
    bogus.write_text("not an ELF file")
    proc = subprocess.run(default_probe_argv(sys.executable, [], [str(bogus)]), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    (step,) = [s for s in parse_probe_output(proc.stdout) if s["step"].startswith("load")]
    assert step["module"] == "notanelf" and step["ok"] is False and "ImportError" in step["error"]


def test_stderr_version_messages_as_users_see_them():
    startup = (LD / "startup-missing-versions.stderr").read_text()
    (err,) = parse_stderr_version_errors(startup)
    assert (err.provider, err.version, err.required_by) == (
        "/tmp/zdemo/old/libstdc++.so.6", "GLIBCXX_3.4.30", "/tmp/zdemo/prog")
    text = textwrap.dedent("""\
        Traceback (most recent call last):
        ImportError: /opt/my env/lib/libstdc++.so.6: version `GLIBCXX_3.4.32' not found (required by /x/_C.so)
        """)
    (err,) = parse_stderr_version_errors(text)
    assert err.provider == "/opt/my env/lib/libstdc++.so.6" and err.version == "GLIBCXX_3.4.32"
    assert err.required_by == "/x/_C.so"
    assert parse_stderr_version_errors("") == []


def test_strace_joins_a_stalled_run_and_names_what_it_polls(tmp_path):
    """A run that stalls past ``strace_after`` gets strace attached: the polled lock file is named."""
    lock = tmp_path / "op dir" / "lock"
    lock.parent.mkdir()
    lock.write_text("")
    code = ("import os, sys, time\n"
            "while os.path.exists(sys.argv[1]):\n"
            "    time.sleep(0.05)\n")
    lt = trace_command([sys.executable, "-c", code, str(lock)], base_env(), timeout=4, strace_after=1)
    assert lt.timed_out and lt.strace_used
    assert any("strace attached" in n for n in lt.notes)
    touched = [e.path for evs in lt.last_files.values() for e in evs]
    assert str(lock) in touched


def test_a_quick_run_never_pays_for_strace(tmp_path):
    lt = trace_command([sys.executable, "-c", "pass"], base_env(), timeout=30, strace_after=10)
    assert lt.exit_code == 0 and not lt.strace_used and lt.last_files == {}
    assert lt.traces  # LD_DEBUG still saw the loader


def test_a_run_strace_may_join_later_starts_without_waiting_for_strace_s_self_test(tmp_path):
    """The self-test of a strace that joins only a stalled run goes on beside the run: a slow strace that
    cannot trace delays nothing, and the note still says why strace was not used."""
    fake = tmp_path / "strace"
    fake.write_text("#!/bin/sh\nsleep 2\n"
                    "echo 'strace: ptrace(PTRACE_SEIZE, ...): Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    t0 = time.time()
    lt = trace_command([sys.executable, "-c", "pass"], base_env(PATH=f"{tmp_path}:{os.environ.get('PATH', '')}"),
                       timeout=30, strace_after=10)
    assert lt.evidence.started - t0 < 1.5  # the self-test alone takes 2 s
    assert lt.exit_code == 0 and lt.strace_available and not lt.strace_used and lt.traces
    (note,) = lt.notes
    assert "strace cannot trace here" in note and "Operation not permitted" in note


def test_a_hang_names_the_call_it_waits_in_in_strace_words(tmp_path):
    """--command that hangs opening a FIFO: the finding shows strace's own line of the call it waits in."""
    from zdoctor.host.live import LiveHost
    from zdoctor.layers import run_checks

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    command = shlex.join([sys.executable, "-c", "import sys; open(sys.argv[1])", str(fifo)])
    host = LiveHost(python=sys.executable, env=base_env(), command=command, timeout=4)
    _facts, findings = run_checks(host, ["libs.live"])
    (live,) = [f for f in findings if f.id == "libs.live"]
    assert live.status == "fail" and "did not finish within the time limit" in live.title
    detail = live.detail.splitlines()
    at = detail.index("strace saw it wait in:")
    opened = rf'openat\(AT_FDCWD, "{re.escape(str(fifo))}", O_RDONLY'
    assert re.match(rf"\s+\d+\s+\d\d:\d\d:\d\d\.\d+ {opened}", detail[at + 1])
