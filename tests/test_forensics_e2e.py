"""End to end on real broken environments: the real ld.so fails as users see it, `zdoctor check` names the
needed version, the library that needs it, the copy that lacks it and where that copy came from, and the
first verified remedy really fixes the failing command."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli
from envkit import build_extension, make_conda_like_python, make_old_libstdcxx, system_libstdcxx

from zdoctor.layers.libraries.audit import static_audit, training_targets

PY = os.path.realpath(sys.executable)


@pytest.fixture(scope="module")
def kit(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kit")
    k: dict[str, Path] = {"root": root}
    k["old"] = make_old_libstdcxx(root / "old").parent
    k["exts"] = root / "exts"
    k["needsnew"] = build_extension(k["exts"], "needsnew")
    k["plain"] = build_extension(k["exts"], "plain", needs_new=False)
    k["needsnew_rp"] = build_extension(k["exts"], "needsnew_rp", runpath="$ORIGIN")
    conda = root / "conda"
    k["conda_py"] = make_conda_like_python(conda)
    shutil.copy2(k["old"] / "libstdc++.so.6.0.28", conda / "lib" / "libstdc++.so.6.0.28")
    (conda / "lib" / "libstdc++.so.6").symlink_to("libstdc++.so.6.0.28")
    (conda / "conda-meta").mkdir()
    k["conda"] = conda
    return k


def env_with(**changes: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "TORCH_EXTENSIONS_DIR"))}
    for k, v in changes.items():
        if v is not None:
            env[k] = v
    return env


def import_cmd(python: str | Path, exts_dir: Path, *modules: str) -> str:
    code = f"import sys; sys.path.insert(0, {str(exts_dir)!r}); " + "; ".join(f"import {m}" for m in modules)
    return shlex.join([str(python), "-c", code])


def bash(script: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120,
                          cwd=str(cwd) if cwd else None)


def check(args: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[int, dict]:
    proc = run_cli(["check", "--json", "--no-log", "--timeout", "60", *args], env=env,
                   cwd=str(cwd) if cwd else None, timeout=300)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def findings(doc: dict, prefix: str, status: str | None = None) -> list[dict]:
    return [f for f in doc["findings"] if f["id"].startswith(prefix) and (status is None or f["status"] == status)]


def first_verified(finding: dict) -> dict:
    verified = [r for r in finding["remedies"] if r["verified"]]
    assert verified, finding["remedies"]
    assert finding["remedies"][0] is verified[0] or finding["remedies"][0]["verified"]
    return verified[0]


def walk_end(doc: dict, playbook: str = "zero3-launch") -> list[str]:
    return next(p["path"] for p in doc["playbooks"] if p["id"] == playbook)


def test_old_copy_on_ld_library_path(kit, tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    env = env_with(LD_LIBRARY_PATH=f"{kit['old']}:{keep}")
    cmd = import_cmd(PY, kit["exts"], "needsnew")
    real = bash(cmd, env)
    assert real.returncode == 1
    assert f"{kit['old']}/libstdc++.so.6: version `GLIBCXX_3.4.30' not found" in real.stderr

    rc, doc = check(["--python", PY, "--command", cmd, "--playbook", "zero3-launch"], env)
    assert rc == 1
    (f,) = findings(doc, "libs.glibcxx", "fail")
    assert "GLIBCXX_3.4.30" in f["title"] and "needsnew" in f["title"] and str(kit["old"]) in f["title"]
    assert f"the LD_LIBRARY_PATH entry {kit['old']}" in f["detail"]
    assert "GLIBCXX_3.4.28" in f["detail"]  # what the old copy has, compared numerically
    fix = first_verified(f)
    assert fix["commands"] == [f"export LD_LIBRARY_PATH={keep}"]  # exactly the offending entry removed
    assert bash("\n".join([*fix["commands"], cmd]), env).returncode == 0
    assert walk_end(doc)[-1] == "diag-ld-library-path"
    assert not findings(doc, "libs.prediction")


def test_old_copy_forced_by_ld_preload(kit):
    env = env_with(LD_PRELOAD=str(kit["old"] / "libstdc++.so.6"))
    cmd = import_cmd(PY, kit["exts"], "needsnew")
    assert bash(cmd, env).returncode == 1
    rc, doc = check(["--python", PY, "--command", cmd, "--playbook", "zero3-launch"], env)
    assert rc == 1
    (f,) = findings(doc, "libs.glibcxx", "fail")
    assert "forced by LD_PRELOAD" in f["detail"]
    fix = first_verified(f)
    assert fix["commands"] == ["unset LD_PRELOAD"]
    assert bash("\n".join([*fix["commands"], cmd]), env).returncode == 0
    assert walk_end(doc)[-1] == "diag-preload"


def test_conda_interpreter_rpath_and_an_earlier_import(kit):
    """conda's python (DT_RPATH $ORIGIN/../lib) imports an RPATH-less C++ extension before the one that
    needs GLIBCXX_3.4.30: the old env copy is loaded first and wins, whatever the later RUNPATH says."""
    env = env_with()
    py = kit["conda_py"]
    alone = bash(import_cmd(py, kit["exts"], "needsnew_rp"), env)
    assert alone.returncode == 0, alone.stderr  # with its RUNPATH, on its own it gets a good copy
    cmd = import_cmd(py, kit["exts"], "plain", "needsnew_rp")
    real = bash(cmd, env)
    assert real.returncode == 1 and "version `GLIBCXX_3.4.30' not found" in real.stderr

    rc, doc = check(["--python", str(py), "--command", cmd, "--playbook", "zero3-launch"], env)
    assert rc == 1
    (f,) = findings(doc, "libs.glibcxx", "fail")
    assert "needsnew_rp" in f["title"] and "GLIBCXX_3.4.30" in f["title"]
    assert "conda/bin/../lib/libstdc++.so.6" in f["title"]
    assert "plain" in f["detail"] and "interpreter's DT_RPATH" in f["detail"]
    fix = first_verified(f)
    assert fix["commands"] == [f"export LD_PRELOAD={shlex.quote(str(system_libstdcxx()))}"] or \
        fix["commands"][0].startswith("export LD_PRELOAD=") and "libstdc++.so.6" in fix["commands"][0]
    assert bash("\n".join([*fix["commands"], cmd]), env).returncode == 0
    conda = [r for r in f["remedies"] if "conda install" in " ".join(r["commands"])]
    assert conda and not conda[0]["verified"] and "libstdcxx-ng>=12" in conda[0]["commands"][0]
    assert str(kit["conda"]) in conda[0]["commands"][0]
    if not shutil.which("conda", path=env.get("PATH")):  # this machine has no conda: the remedy says so
        assert conda[0]["missing"][0].startswith("conda was not found on this node (looked: the training PATH (")
    (warn,) = findings(doc, "libs.interpreter-rpath", "warn")
    assert "$ORIGIN/../lib" in warn["detail"]
    assert walk_end(doc)[-1] in ("diag-rpath", "diag-earlier-import")


def test_the_same_diagnosis_without_a_command(kit):
    """With only --ext (imported before torch), the import probe and the emulation find it too."""
    rc, doc = check(["--python", str(kit["conda_py"]), "--ext", str(kit["plain"]),
                     "--ext", str(kit["needsnew_rp"]), "--playbook", "zero3-launch"], env_with())
    assert rc == 1
    (f,) = findings(doc, "libs.glibcxx", "fail")
    assert "needsnew_rp" in f["title"] and "already loaded" in f["detail"]
    assert not findings(doc, "libs.prediction")  # the emulation agrees with the real loader


def test_runpath_is_not_inherited(kit, tmp_path):
    """a.so (RUNPATH=$ORIGIN/deps) -> deps/libb.so, which needs GLIBCXX_3.4.30. deps/ also holds a good
    libstdc++, but libb.so's lookup does not use a.so's RUNPATH: it falls to conda's interpreter RPATH."""
    deps = tmp_path / "mods" / "deps"
    deps.mkdir(parents=True)
    shutil.copy2(system_libstdcxx(), deps / "libstdc++.so.6")
    (tmp_path / "b.cpp").write_text(
        "#include <condition_variable>\n#include <mutex>\n"
        "static std::mutex m; static std::condition_variable cv; static volatile int never = 0;\n"
        "extern \"C\" int b_touch(void) { std::unique_lock<std::mutex> lk(m); if (never) cv.wait(lk); return 7; }\n")
    subprocess.run(["g++", "-shared", "-fPIC", str(tmp_path / "b.cpp"), "-o", str(deps / "libb.so")], check=True)
    import sysconfig

    (tmp_path / "a.c").write_text(
        "#include <Python.h>\nint b_touch(void);\n"
        "static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, \"a\", NULL, -1, NULL};\n"
        "PyMODINIT_FUNC PyInit_a(void) { b_touch(); return PyModule_Create(&m); }\n")
    a = tmp_path / "mods" / "a.so"
    subprocess.run(["gcc", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", str(tmp_path / "a.c"),
                    "-o", str(a), f"-L{deps}", "-lb", "-Wl,--enable-new-dtags,-rpath,$ORIGIN/deps"], check=True)
    py = kit["conda_py"]
    cmd = import_cmd(py, a.parent, "a")
    real = bash(cmd, env_with())
    assert real.returncode == 1 and "required by " + str(deps / "libb.so") in real.stderr

    audit = static_audit(str(py), env_with(), training_targets(ext=[str(a)]))
    (failure,) = audit["failures"]
    assert failure["required_by"].endswith("deps/libb.so") and failure["version"] == "GLIBCXX_3.4.30"
    assert os.path.realpath(failure["provider"]) == os.path.realpath(kit["conda"] / "lib" / "libstdc++.so.6")

    rc, doc = check(["--python", str(py), "--ext", str(a), "--playbook", "zero3-launch"], env_with())
    assert rc == 1
    (f,) = findings(doc, "libs.glibcxx", "fail")
    assert "libb.so" in f["title"] and "interpreter's DT_RPATH" in f["detail"]
    assert not findings(doc, "libs.prediction")
    fix = first_verified(f)
    assert bash("\n".join([*fix["commands"], cmd]), env_with()).returncode == 0


def test_hostile_directory_names_stay_inert(kit, tmp_path):
    """Shell syntax in LD_LIBRARY_PATH entries survives the remedy as plain text and runs nothing.

    ld.so splits LD_LIBRARY_PATH on ':' and ';', so the entry named `a b $(touch x);` is really two
    entries for the loader (the second, empty, means the current directory); the remedy keeps both.
    """
    semi = tmp_path / "a b $(touch x);"
    semi.mkdir()
    evil = tmp_path / "c d $(touch y) `touch z` \"'"
    shutil.copytree(kit["old"], evil, symlinks=True)
    keep = tmp_path / "it's"
    keep.mkdir()
    env = env_with(LD_LIBRARY_PATH=f"{semi}:{evil}:{keep}")
    cmd = import_cmd(PY, kit["exts"], "needsnew")
    assert bash(cmd, env, cwd=tmp_path).returncode == 1
    rc, doc = check(["--python", PY, "--command", cmd], env, cwd=tmp_path)
    assert rc == 1
    (f,) = findings(doc, "libs.glibcxx", "fail")
    assert str(evil) in f["title"]
    fix = first_verified(f)
    out = bash("\n".join([*fix["commands"], cmd, 'printf %s "$LD_LIBRARY_PATH"']), env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ":".join([str(semi)[:-1], "", str(keep)])
    for r in f["remedies"]:
        bash("\n".join(r["commands"] + r["undo"]), env, cwd=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([semi.name, evil.name, keep.name])


def test_a_healthy_environment_has_no_fail_finding(kit):
    rc, doc = check(["--ext", str(kit["needsnew"])], env_with())
    assert [f for f in doc["findings"] if f["status"] in ("fail", "crash")] == []
    assert rc == 0
    (ok,) = findings(doc, "libs.glibcxx")
    assert ok["status"] == "ok" and "provides all" in ok["title"]
    assert findings(doc, "libs.live")[0]["status"] == "ok"
    assert walk_end(doc)[-1] == "diag-healthy", [p["reason"] for p in doc["playbooks"] if p["id"] == "zero3-launch"]


def test_stale_lock_and_a_launch_waiting_on_it(kit, tmp_path):
    cache = tmp_path / "torch ext"
    op = cache / "cpu_adam"
    build_extension(op, "cpu_adam", needs_new=False)
    lock = op / "lock"
    lock.write_text("")
    env = env_with(TORCH_EXTENSIONS_DIR=str(cache))
    waiter = shlex.join([PY, "-c", "import os, sys, time\nwhile os.path.exists(sys.argv[1]): time.sleep(0.1)",
                         str(lock)])
    proc = run_cli(["check", "--json", "--no-log", "--python", PY, "--command", waiter, "--timeout", "4",
                    "--playbook", "zero3-launch"], env=env, timeout=300)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1
    (stale,) = [f for f in findings(doc, "hangs.stale-lock", "fail")]
    assert str(lock) in stale["title"] + stale["detail"]
    (live,) = findings(doc, "libs.live", "fail")
    assert "did not finish" in live["title"] and str(lock) in live["detail"]  # what it polled last
    assert walk_end(doc)[-1] == "diag-stale-lock"
    assert bash("\n".join(stale["remedies"][0]["commands"]), env).returncode == 0
    assert not lock.exists() and (op / "cpu_adam.so").exists()
    assert bash(waiter, env).returncode == 0  # the launch no longer waits


def test_corrupt_op_in_the_extension_cache(kit, tmp_path):
    cache = tmp_path / "cache"
    good = build_extension(cache / "fused_adam", "fused_adam", needs_new=False)
    bad = build_extension(cache / "cpu_adam", "cpu_adam", needs_new=False)
    bad.write_bytes(bad.read_bytes()[:3000])
    env = env_with(TORCH_EXTENSIONS_DIR=str(cache))
    rc, doc = check(["--python", PY, "--playbook", "zero3-launch"], env)
    assert rc == 1
    assert not [f for f in doc["findings"] if f["status"] == "crash"]
    (f,) = findings(doc, "jit.corrupt-ops", "fail")
    assert "cpu_adam" in f["title"] + f["detail"]
    assert walk_end(doc)[-1] == "diag-corrupt-op"
    assert bash("\n".join(f["remedies"][0]["commands"]), env).returncode == 0
    assert not bad.exists() and good.exists()


def test_bad_arguments_are_one_line_errors(tmp_path):
    for args in (["--ext", str(tmp_path / "nope.so")], ["--command", "  "], ["--timeout", "0"]):
        proc = run_cli(["check", *args])
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_the_live_run_wins_when_the_emulation_cannot_see_a_dlopen(kit):
    """Python code ctypes-loads the old copy before the import: only the live trace can know."""
    code = (f"import ctypes, sys; ctypes.CDLL({str(kit['old'] / 'libstdc++.so.6')!r}); "
            f"sys.path.insert(0, {str(kit['exts'])!r}); import needsnew")
    cmd = shlex.join([PY, "-c", code])
    rc, doc = check(["--python", PY, "--ext", str(kit["needsnew"]), "--command", cmd], env_with())
    assert rc == 1
    (warn,) = findings(doc, "libs.prediction", "warn")
    assert str(system_libstdcxx().parent) in warn["detail"] or "libstdc++.so.6" in warn["detail"]
    assert str(kit["old"]) in warn["detail"]
    (f,) = findings(doc, "libs.glibcxx", "fail")
    assert "Seen by the real loader" in f["detail"] and str(kit["old"]) in f["title"]


def test_fourth_toolchain_layer_reads_each_extension_compiler(kit):
    rc, doc = check(["--ext", str(kit["needsnew"]), "--playbook", "zero3-launch"], env_with())
    (f,) = findings(doc, "libs.ext-compilers")
    rows = f["evidence"][0]["table"]["rows"]
    ext_row = next(r for r in rows if r[0] == "extension needsnew.so")
    gcc = subprocess.run(["g++", "-dumpfullversion"], capture_output=True, text=True).stdout.strip()
    assert ext_row[2] == f"GCC {gcc}" and "GLIBCXX_3.4.30" in ext_row[3]
    assert any(r[0].startswith("JIT ops") for r in rows)  # the other layers sit in the same table


def test_the_startup_line_that_sets_the_offending_entry_is_named(kit, tmp_path):
    """The old copy comes through LD_LIBRARY_PATH, and the entry comes from a line of the user's ~/.bashrc:
    zdoctor names that file, line number and line (read, never run)."""
    home = tmp_path / "home"
    home.mkdir()
    line = f"export LD_LIBRARY_PATH={kit['old']}"
    (home / ".bashrc").write_text(f"# ~/.bashrc\nalias ll='ls -l'\n{line}\n", encoding="utf-8")
    (home / ".profile").write_text("# LD_LIBRARY_PATH=/nowhere is only a comment here\n", encoding="utf-8")
    sourced = bash('. "$HOME/.bashrc"; printf %s "$LD_LIBRARY_PATH"', env_with(HOME=str(home)))
    assert sourced.stdout == str(kit["old"])  # the line really sets the entry the loader follows
    env = env_with(HOME=str(home), LD_LIBRARY_PATH=sourced.stdout)
    cmd = import_cmd(PY, kit["exts"], "needsnew")
    rc, doc = check(["--python", PY, "--command", cmd, "--playbook", "zero3-launch"], env)
    assert rc == 1 and walk_end(doc)[-1] == "diag-ld-library-path"
    (src,) = findings(doc, "libs.env-source")
    assert src["status"] == "warn"
    assert f"{home}/.bashrc line 3: {line}" in src["detail"] and line in src["title"]
    assert ".profile" not in src["detail"]


def test_the_startup_line_is_commented_out_through_the_safe_core_and_undone(kit, tmp_path):
    """The fix of the ~/.bashrc line the walk finds: the line is commented out (backed up, replaced in one
    rename, through the safe core), a new shell no longer gets the entry, and the undo restores the file."""
    from zdoctor.core.model import Remedy
    from zdoctor.walk.apply import run_remedy

    home = tmp_path / "home"
    home.mkdir()
    line = f"export LD_LIBRARY_PATH={kit['old']}"
    original = f"# ~/.bashrc\nalias ll='ls -l'\n{line}\nexport EDITOR=vi\n"
    bashrc = home / ".bashrc"
    bashrc.write_text(original, encoding="utf-8")
    env = env_with(HOME=str(home), LD_LIBRARY_PATH=str(kit["old"]))
    rc, doc = check(["--python", PY, "--command", import_cmd(PY, kit["exts"], "needsnew"),
                     "--playbook", "zero3-launch"], env)
    (src,) = findings(doc, "libs.env-source")
    (fix,) = [Remedy.from_dict(r) for r in src["remedies"]]
    assert fix.title == f"Comment out line 3 of {bashrc}"
    assert fix.action and fix.action["kind"] == "file-replace" and fix.action["path"] == str(bashrc)
    outcome = run_remedy(fix, env_with(HOME=str(home)))
    assert outcome.ok, outcome
    now = bashrc.read_text(encoding="utf-8").splitlines()
    assert now[2].startswith(f"# {line}  # commented out by zdoctor")
    assert [now[i] for i in (0, 1, 3)] == ["# ~/.bashrc", "alias ll='ls -l'", "export EDITOR=vi"]
    backup = Path(fix.action["backup"])
    assert backup.read_text(encoding="utf-8") == original
    fresh = bash('. "$HOME/.bashrc"; printf %s "${LD_LIBRARY_PATH-unset}"', env_with(HOME=str(home)))
    assert fresh.stdout == "unset"  # a new shell no longer gets the old copy's directory
    undo = bash("set -e\n" + "\n".join(fix.undo), env_with(HOME=str(home)))
    assert undo.returncode == 0, undo.stderr
    assert bashrc.read_text(encoding="utf-8") == original and not backup.exists()


NINJA_SOURCE = r"""
#include <condition_variable>
#include <mutex>
#include <chrono>
static std::mutex m;
static std::condition_variable cv;
int main(int argc, char**) {
    std::unique_lock<std::mutex> lk(m);
    cv.wait_for(lk, std::chrono::milliseconds(1));
    if (argc > 99) cv.wait(lk);   /* GCC 12: std::condition_variable::wait is GLIBCXX_3.4.30 */
    return 0;
}
"""


def test_the_failure_tables_name_every_need_and_who_pulled_the_old_copy_in(kit, tmp_path):
    """A run like a JIT build: a C++ program named ninja fails on the old copy, then Python imports an
    extension that loads that copy first and one that needs GLIBCXX_3.4.30. The needed-vs-provided table
    has ninja's row, and the extension imported first is in what-each-library-gets."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tmp_path / "ninja.cpp").write_text(NINJA_SOURCE)
    subprocess.run(["g++", "-O0", str(tmp_path / "ninja.cpp"), "-o", str(tools / "ninja")], check=True)
    env = env_with(LD_LIBRARY_PATH=str(kit["old"]), PATH=f"{tools}:{os.environ['PATH']}")
    cmd = "ninja; " + import_cmd(PY, kit["exts"], "plain", "needsnew")
    rc, doc = check(["--python", PY, "--ext", str(kit["needsnew"]), "--command", cmd, "--playbook", "zero3-launch"],
                    env)
    titles = [f["title"] for f in findings(doc, "libs.glibcxx", "fail")]
    assert any(t.startswith("ninja needs GLIBCXX_3.4.30") for t in titles), titles
    (f, *_) = findings(doc, "libs.glibcxx", "fail")
    tables = {e["label"].split(" (")[0]: e["table"] for e in f["evidence"] if e.get("table")}
    needs = tables["needed vs provided by the loaded libstdc++"]
    row = next(r for r in needs["rows"] if r[0] == "GLIBCXX_3.4.30")
    assert "ninja" in row[1] and "needsnew.so" in row[1] and row[2] == "NO"
    gets = tables["what each library the training imports gets"]
    first = next(r for r in gets["rows"] if r[0] == "plain.so")
    assert first[1].startswith("asked for it first") and str(kit["old"]) in first[2]
