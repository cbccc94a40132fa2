"""The issue's own failure, for real: DeepSpeed's JIT-built cpu_adam needs GLIBCXX_3.4.30 and an older
libstdc++ on LD_LIBRARY_PATH wins. zdoctor must name it and prove the fix."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from conftest import run_cli
from dsenv import LOAD_CPU_ADAM, cpu_adam_op, ensure
from envkit import make_old_libstdcxx


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> dict[str, Path]:
    python = ensure()
    so = cpu_adam_op(python)
    old = make_old_libstdcxx(tmp_path_factory.mktemp("old") / "lib").parent
    return {"python": python, "so": so, "cache": so.parent.parent, "old": old}


def ds_env(ds: dict[str, Path], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
    env.update(TORCH_EXTENSIONS_DIR=str(ds["cache"]), PATH=f"{ds['python'].parent}{os.pathsep}{env['PATH']}")
    env.update(extra)
    return env


def test_cpu_adam_against_an_old_libstdcxx(ds):
    env = ds_env(ds, LD_LIBRARY_PATH=str(ds["old"]))
    cmd = shlex.join([str(ds["python"]), "-c", LOAD_CPU_ADAM])
    real = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=300)
    assert real.returncode == 1
    assert (f"{ds['old']}/libstdc++.so.6: version `GLIBCXX_3.4.30' not found (required by {ds['so']})"
            in real.stderr)

    proc = run_cli(["check", "--json", "--no-log", "--python", str(ds["python"]), "--playbook", "zero3-launch"],
                   env=env, timeout=600)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1
    fails = [f for f in doc["findings"] if f["id"] == "libs.glibcxx" and f["status"] == "fail"]
    (f,) = [f for f in fails if "cpu_adam.so" in f["title"]]
    assert "GLIBCXX_3.4.30" in f["title"] and str(ds["old"]) in f["title"]
    assert f"LD_LIBRARY_PATH entry {ds['old']}" in f["detail"]
    assert "Seen by the real loader" in f["detail"]
    fix = next(r for r in f["remedies"] if r["verified"])
    assert f["remedies"][0]["verified"]
    fixed = subprocess.run(["bash", "-c", "\n".join([*fix["commands"], cmd])], env=env, capture_output=True,
                           text=True, timeout=300)
    assert fixed.returncode == 0, fixed.stderr
    path = next(p["path"] for p in doc["playbooks"] if p["id"] == "zero3-launch")
    assert path[-1] == "diag-ld-library-path"
    # The static audit saw torch and the op: needs vs provides is a table on the finding.
    tables = [e for e in f["evidence"] if e["kind"] == "table"]
    assert any("cpu_adam" in " ".join(" ".join(r) for r in e["table"]["rows"]) for e in tables)


def test_the_same_environment_is_healthy_without_the_old_copy(ds):
    proc = run_cli(["check", "--json", "--no-log", "--python", str(ds["python"]), "--playbook", "zero3-launch"],
                   env=ds_env(ds), timeout=600)
    doc = json.loads(proc.stdout)
    bad = [f for f in doc["findings"] if f["status"] in ("fail", "crash")]
    assert bad == [] and proc.returncode == 0
    ok = next(f for f in doc["findings"] if f["id"] == "libs.glibcxx")
    assert "provides all" in ok["title"]
    # The ok says what it covered: torch and the one JIT-built cpu_adam, and no prebuilt DeepSpeed op
    # (none is installed), never "DeepSpeed's ops and every JIT-built op" whatever was there.
    assert "torch librar" in ok["detail"] and "no prebuilt DeepSpeed op, 1 JIT-built op" in ok["detail"]
    assert "every JIT-built op" not in ok["detail"]
