"""The pieces between the loader emulation and the findings: sources, remedy plans, inventory, tables."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from envkit import make_old_libstdcxx, system_libstdcxx

from zdoctor.layers.libraries.fixes import best_copy, offending_entries, offending_preloads, propose
from zdoctor.layers.libraries.inventory import conda_prefix_of, conda_roots, take_inventory
from zdoctor.layers.libraries.sources import how_found, live_source, static_source
from zdoctor.trials.remedies import Plan, export_line, fix_ld_library_path, preload, verify, without_entries


@pytest.fixture(scope="module")
def old_dir(tmp_path_factory) -> Path:
    return make_old_libstdcxx(tmp_path_factory.mktemp("old") / "lib").parent


def test_sources_name_the_route():
    s = how_found("LD_LIBRARY_PATH", dir="/opt/conda/lib", via_object=None, path="/opt/conda/lib/libstdc++.so.6",
                  interpreter="/usr/bin/python3")
    assert s["kind"] == "ld_library_path" and s["entry"] == "/opt/conda/lib"
    s = how_found("[rpath of /opt/conda/bin/python3.11]", dir=None, via_object=None,
                  path="/opt/conda/bin/../lib/libstdc++.so.6", interpreter="/opt/conda/bin/python3.11",
                  interpreter_rpath="$ORIGIN/../lib")
    assert s["kind"] == "interpreter_rpath" and "$ORIGIN/../lib" in s["text"]
    assert how_found("[runpath of /x/a.so]", dir=None, via_object=None, path="/x/d/libstdc++.so.6",
                     interpreter=None)["kind"] == "runpath"
    assert how_found("ld.so.cache", dir=None, via_object=None, path="/lib/libstdc++.so.6",
                     interpreter=None)["kind"] == "system"


def test_earlier_import_only_when_the_route_is_not_process_wide():
    served = {"via": "rpath", "via_object": "/env/bin/python3", "path": "/env/lib/libstdc++.so.6",
              "first_target": "/x/plain.so"}
    s = static_source(served, "/x/needs.so", "/env/bin/python3", "$ORIGIN/../lib")
    assert s["kind"] == "earlier_import" and s["import"] == "/x/plain.so" and s["how"]["kind"] == "interpreter_rpath"
    # LD_LIBRARY_PATH decides for every library whoever asked first: the entry is the cause.
    served = {"via": "LD_LIBRARY_PATH", "dir": "/old", "path": "/old/libstdc++.so.6", "first_target": "/x/a.so"}
    assert static_source(served, "/x/b.so", None)["kind"] == "ld_library_path"
    live = live_source("[LD_PRELOAD]", "/old/libstdc++.so.6", None, "/x/b.so", None)
    assert live["kind"] == "ld_preload"
    live = live_source("[ld.so.cache]", "/lib/libstdc++.so.6", "/x/a.so", "/x/b.so", None)
    assert live["kind"] == "earlier_import" and live["how"]["kind"] == "system"


def test_export_lines_quote_everything():
    assert export_line("LD_LIBRARY_PATH", "/a b/$(touch x)") == "export LD_LIBRARY_PATH='/a b/$(touch x)'"
    assert export_line("LD_LIBRARY_PATH", "") == "unset LD_LIBRARY_PATH"
    assert without_entries("/old:/keep;/old/:/x", ["/old"]) == "/keep:/x"
    plan = fix_ld_library_path({"LD_LIBRARY_PATH": "/old:/keep"}, ["/old"], [])
    assert plan.commands == ["export LD_LIBRARY_PATH=/keep"] and plan.undo == ["export LD_LIBRARY_PATH=/old:/keep"]
    assert plan.apply_to({"LD_LIBRARY_PATH": "/old:/keep", "A": "1"}) == {"LD_LIBRARY_PATH": "/keep", "A": "1"}
    p = preload({"LD_PRELOAD": "/a/libjemalloc.so /old/libstdc++.so.6"}, "/lib/libstdc++.so.6",
                ["/old/libstdc++.so.6"], [])
    assert p.env_changes["LD_PRELOAD"] == "/lib/libstdc++.so.6 /a/libjemalloc.so"
    assert shlex.split(p.commands[0].split("=", 1)[1]) == ["/lib/libstdc++.so.6 /a/libjemalloc.so"]
    assert Plan.from_dict(p.to_dict()) == p


def test_offending_entries_are_read_from_the_files(old_dir, tmp_path):
    env = {"LD_LIBRARY_PATH": f"{tmp_path}:{old_dir}:/nonexistent"}
    assert offending_entries(env, ["GLIBCXX_3.4.30"]) == [str(old_dir)]
    assert offending_entries(env, ["GLIBCXX_3.4.19"]) == []  # the old copy has that one
    bad = tmp_path / "junk"
    bad.mkdir()
    (bad / "libstdc++.so.6").write_text("not a library")  # fatal for ld.so: offending too
    assert offending_entries({"LD_LIBRARY_PATH": str(bad)}, ["GLIBCXX_3.4"]) == [str(bad)]
    pre = {"LD_PRELOAD": f"{old_dir}/libstdc++.so.6 {system_libstdcxx()}"}
    assert offending_preloads(pre, ["GLIBCXX_3.4.30"]) == [f"{old_dir}/libstdc++.so.6"]


def test_plans_follow_the_evidence(old_dir):
    sysc = str(system_libstdcxx())
    libs = {"needs": ["GLIBCXX_3.4.30"], "failures": [], "etc_preload": [],
            "inventory": take_and_mark([sysc, str(old_dir / "libstdc++.so.6")], ["GLIBCXX_3.4.30"])}
    live = {"version_errors": [{"provider": f"{old_dir}/libstdc++.so.6", "version": "GLIBCXX_3.4.30",
                                "required_by": "/x/cpu_adam.so", "message": "m"}]}
    plans = propose(libs, live, {"LD_LIBRARY_PATH": f"{old_dir}:/keep"})
    assert [p.key for p in plans] == ["ld-library-path", "ld-preload"]
    assert plans[1].env_changes["LD_PRELOAD"] == best_copy(libs, ["GLIBCXX_3.4.30"])
    assert os.path.realpath(plans[1].env_changes["LD_PRELOAD"]) == os.path.realpath(sysc)
    assert propose(libs, {}, {}) == []  # nothing fails: nothing to fix


def take_and_mark(paths: list[str], needs: list[str]) -> list[dict]:
    copies = [c.to_dict() for c in take_inventory({}, extra=[(p, "given") for p in paths], toolsets=False)]
    for c in copies:
        c["has_every_need"] = set(needs) <= set(c["versions"])
    return copies


def test_conda_envs_are_inventoried(old_dir, tmp_path):
    base = tmp_path / "miniconda3"
    for prefix in (base, base / "envs" / "train"):
        (prefix / "conda-meta").mkdir(parents=True)
        (prefix / "lib").mkdir()
        os.symlink(old_dir / "libstdc++.so.6.0.28", prefix / "lib" / "libstdc++.so.6")
    (base / "bin").mkdir()
    env = {"CONDA_EXE": str(base / "bin" / "conda"), "CONDA_PREFIX": str(base / "envs" / "train")}
    assert conda_roots(env)[:2] == [str(base / "envs" / "train"), str(base)]
    copies = take_inventory(env, toolsets=False)
    # Both envs link the same real file: one copy, found twice.
    (copy,) = [c for c in copies if "conda environment" in c.found_as]
    assert copy.glibcxx_max == "GLIBCXX_3.4.28" and copy.gcc_release == "9.3"
    assert conda_prefix_of(str(base / "envs" / "train" / "lib" / "libstdc++.so.6")) == str(base / "envs" / "train")


def test_verification_runs_the_command_with_the_change(tmp_path):
    plan = Plan(key="k", title="t", env_changes={"MARK": "yes"})
    ev = verify(plan, ["sh", "-c", 'test "$MARK" = yes'], {"PATH": os.defpath}, timeout=10)
    assert plan.verified and ev.exit_code == 0
    plan = Plan(key="k", title="t", env_changes={"MARK": None})
    verify(plan, ["sh", "-c", 'test "$MARK" = yes'], {"PATH": os.defpath, "MARK": "yes"}, timeout=10)
    assert not plan.verified and "still fails" in plan.verification
    plan = Plan(key="k", title="t")
    verify(plan, ["sleep", "5"], {"PATH": os.defpath}, timeout=0.5)
    assert not plan.verified and "timed out" in plan.verification


def test_a_missing_dependency_lists_every_path_considered(tmp_path):
    import sys

    from zdoctor.layers.libraries.audit import static_audit, training_targets

    (tmp_path / "dep.c").write_text("int f(void) { return 1; }\n")
    (tmp_path / "main.c").write_text("int f(void);\nint g(void) { return f(); }\n")
    (tmp_path / "hidden").mkdir()
    subprocess.run(["gcc", "-shared", "-fPIC", str(tmp_path / "dep.c"), "-o", str(tmp_path / "hidden" / "libdep.so")],
                   check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", str(tmp_path / "main.c"), "-o", str(tmp_path / "main.so"),
                    f"-L{tmp_path / 'hidden'}", "-ldep"], check=True)
    env = {"PATH": os.defpath, "LD_LIBRARY_PATH": str(tmp_path / "elsewhere")}
    audit = static_audit(os.path.realpath(sys.executable), env, training_targets(ext=[str(tmp_path / "main.so")]))
    (t,) = audit["targets"]
    assert t["kind_error"] == "not-found" and "libdep.so: cannot open shared object file" in t["error"]
    assert t["tried"][0].startswith(str(tmp_path / "elsewhere" / "libdep.so"))
    assert any(p.startswith("/usr/lib") for p in t["tried"])
