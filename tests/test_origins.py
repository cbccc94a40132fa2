"""Where a message comes from, on real installed code: DeepSpeed's own assertions and ValueErrors that no
catalogue entry knows, raised for real by DeepSpeed 0.19.8 in the real torch + DeepSpeed environment and
located by ``zdoctor check`` at the file, line and guard that raise them, with the config keys and
environment variables they read; a real shared library built here whose printf format is the message; the
index of the whole environment built once within a memory cap and read back from the cache."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import run_cli
from dsenv import ensure

from zdoctor.symptoms.catalogue import SIGNATURES
from zdoctor.symptoms.extract import from_text
from zdoctor.symptoms.origin import OriginIndex, located
from zdoctor.symptoms.origin_index import index_env

#: DeepSpeed's own check of a config, run as the training job runs it.
READ_CONFIG = "import json, sys; from deepspeed.runtime.config import DeepSpeedConfig; " \
              "DeepSpeedConfig(json.load(open(sys.argv[1])))"
#: DeepSpeed's check of the launch's arguments, as ``deepspeed.initialize`` runs it.
ARGS_CHECK = "import argparse; from deepspeed.runtime.engine import DeepSpeedEngine; " \
             "DeepSpeedEngine._do_args_sanity_check(object.__new__(DeepSpeedEngine), argparse.Namespace())"


@pytest.fixture(scope="module")
def ds_python() -> Path:
    return ensure()


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import importlib.util, os; print(os.path.dirname(os.path.dirname("
                          "importlib.util.find_spec('deepspeed').origin)))"], capture_output=True, text=True,
                         timeout=300, check=True)
    return Path(out.stdout.strip())


def line_of(path: Path, needle: str, starts: str) -> int:
    """The line of the statement (starting with ``starts``) whose message holds ``needle``."""
    lines = path.read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if needle in ln)
    while not lines[at].lstrip().startswith(starts):
        at -= 1
    return at + 1


def job_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LD_", "TORCH_EXTENSIONS_DIR", "LOCAL_RANK", "OMPI_", "RANK", "WORLD_SIZE"))}
    env.update(extra)
    return env


def check(args: list[str], env: dict[str, str] | None = None) -> dict:
    proc = run_cli(["check", "--json", "--no-log", "--timeout", "120", *args], env=env or job_env(), timeout=900)
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout)


def unexplained(doc: dict, sid: str) -> dict:
    return next(f for f in doc["findings"] if f["id"] == f"symptom.unexplained.{sid}")


def symptom(doc: dict, text: str) -> dict:
    return next(s for s in doc["symptoms"] if text in s["text"])


def not_in_catalogue(line: str) -> None:
    assert not any(sig.search(line) for sig in SIGNATURES), f"the catalogue knows {line!r}"


def run_real(python: Path, code: str, *args: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([str(python), "-c", code, *args], capture_output=True, text=True, timeout=600,
                          env=env or job_env())
    assert proc.returncode != 0, proc.stdout
    return proc.stderr


def test_deepspeed_assertion_located_at_its_line_and_guard(ds_python, tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_batch_size": 1, "fp16": {"enabled": True}, "bf16": {"enabled": True}}))
    message = "AssertionError: bfloat16 and fp16 modes cannot be simultaneously enabled"
    assert message in run_real(ds_python, READ_CONFIG, str(cfg))  # DeepSpeed itself refuses it
    not_in_catalogue(message)
    real = line_of(site_packages(ds_python) / "deepspeed/runtime/config.py", "bfloat16 and fp16 modes", "assert")

    cmd = shlex.join([str(ds_python), "-c", READ_CONFIG, str(cfg)])
    doc = check(["--python", str(ds_python), "--command", cmd])
    s = symptom(doc, message)
    assert s["explained_by"] == []
    assert s["origin"].startswith(f"asserted at deepspeed/runtime/config.py:{real} (deepspeed 0.19.8)")
    assert "`not (self.float16_config.enabled and self.bfloat16_config.enabled)`" in s["origin"]
    f = unexplained(doc, s["id"])
    assert f"(located in the source only: deepspeed/runtime/config.py:{real})" in f["title"]
    assert "From the source only, not confirmed by a check on this node: asserted at " \
           f"deepspeed/runtime/config.py:{real}" in f["detail"]


def test_pydantic_wrapped_valueerror_names_the_config_keys_and_their_values(ds_python, tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_batch_size": 1, "zero_optimization": {"stage": 3, "compute_grad_norm": False}}))
    out = run_real(ds_python, READ_CONFIG, str(cfg))
    line = next(ln.strip() for ln in out.splitlines() if "compute_grad_norm=false" in ln)  # as the user saw it
    not_in_catalogue(line)
    real = line_of(site_packages(ds_python) / "deepspeed/runtime/zero/config.py", "compute_grad_norm=false", "raise")

    doc = check(["--python", str(ds_python), "--symptom", line, "--ds-config", str(cfg)])
    s = symptom(doc, "compute_grad_norm=false")
    assert s["origin"].startswith(f"raised (ValueError) at deepspeed/runtime/zero/config.py:{real}")
    assert "when `not self.compute_grad_norm and self.stage not in" in s["origin"]
    detail = unexplained(doc, s["id"])["detail"]
    assert "It reads the config keys compute_grad_norm, stage; this job's ds_config: " in detail
    assert re.search(r"zero_optimization\.stage = 3 \(set\)", detail), detail

    # run for real: the exception line is pydantic's; the message DeepSpeed raised is on the line after it
    cmd = shlex.join([str(ds_python), "-c", READ_CONFIG, str(cfg)])
    doc = check(["--python", str(ds_python), "--command", cmd, "--ds-config", str(cfg)])
    s = symptom(doc, "ValidationError: 1 validation error for DeepSpeedZeroConfig")
    assert s["origin"].startswith(f"raised (ValueError) at deepspeed/runtime/zero/config.py:{real}")
    assert s["origin"].endswith(f", for the line that follows it: {line}")
    assert "It reads the config keys compute_grad_norm, stage" in unexplained(doc, s["id"])["detail"]


def test_environment_variable_read_by_the_message_is_shown_with_its_value(ds_python):
    message = "DeepSpeed requires the LOCAL_RANK environment variable"
    out = run_real(ds_python, ARGS_CHECK)
    assert message in out  # the real assertion, LOCAL_RANK unset
    line = next(ln for ln in out.splitlines() if message in ln)
    not_in_catalogue(line)

    doc = check(["--python", str(ds_python), "--command", shlex.join([str(ds_python), "-c", ARGS_CHECK])])
    s = symptom(doc, message)
    assert s["origin"].startswith("asserted at deepspeed/runtime/engine.py:")
    detail = unexplained(doc, s["id"])["detail"]
    assert "It reads the environment: LOCAL_RANK unset, OMPI_COMM_WORLD_LOCAL_RANK unset" in detail


LIBRARY = r"""
#include <stdio.h>
void zdnet_open(const char *dev, int ring, unsigned long bytes) {
    fprintf(stderr, "zdnet error: cannot map %lu bytes for ring %d on device %s (errno %d)\n", bytes, ring, dev, 12);
}
"""
PROGRAM = r"""
void zdnet_open(const char *dev, int ring, unsigned long bytes);
int main(void) { zdnet_open("mlx5_0", 3, 4096UL); return 2; }
"""


def test_printf_format_in_a_real_shared_library(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    lib_dir = site / "zdnet" / "lib"
    lib_dir.mkdir(parents=True)
    (site / "zdnet" / "__init__.py").write_text("")
    (tmp_path / "lib.c").write_text(LIBRARY)
    (tmp_path / "main.c").write_text(PROGRAM)
    lib = lib_dir / "libzdnet.so.2.19.3"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wl,-soname,libzdnet.so.2", "-o", str(lib),
                    str(tmp_path / "lib.c")], check=True, timeout=120)
    (lib_dir / "libzdnet.so.2").symlink_to(lib.name)  # the soname link, as an installed library has
    prog = tmp_path / "train"
    subprocess.run(["gcc", "-o", str(prog), str(tmp_path / "main.c"), str(lib), f"-Wl,-rpath,{lib_dir}"],
                   check=True, timeout=120)
    seen = subprocess.run([str(prog)], capture_output=True, text=True, timeout=60).stderr.strip()
    assert seen == "zdnet error: cannot map 4096 bytes for ring 3 on device mlx5_0 (errno 12)"

    doc = check(["--python", str(python), "--command", str(prog)])
    s = symptom(doc, "cannot map 4096 bytes")
    assert s["origin"].startswith("format string in zdnet/lib/libzdnet.so.2.19.3 (2.19.3) at .rodata offset ")
    shown = run_cli(["check", "--no-log", "--timeout", "120", "--python", str(python), "--command", str(prog)],
                    env=job_env(), timeout=900).stdout
    assert "from the source only: format string in zdnet/lib/libzdnet.so.2.19.3 (2.19.3)" in shown


def test_broken_files_in_site_packages_are_skipped_not_hung(tmp_path):
    site = tmp_path / "site-packages"
    pkg = site / "brokenpkg"
    pkg.mkdir(parents=True)
    os.mkfifo(pkg / "waits.py")
    os.mkfifo(pkg / "libwaits.so")
    (pkg / "bad.py").write_text("def (:\n")
    (pkg / "good.py").write_text(textwrap.dedent("""
        import os
        def start(cfg):
            if cfg.get("ring_count", 0) > 64:
                raise RuntimeError(f"ring_count of {cfg['ring_count']} is above what ZDNET_MAX_RINGS allows")
    """))
    idx = OriginIndex(index_env([str(site)], budget=60))
    hits = idx.find("RuntimeError: ring_count of 99 is above what ZDNET_MAX_RINGS allows")
    assert [located(o) for o in hits] == \
        ['raised (RuntimeError) at brokenpkg/good.py:5 when `cfg.get("ring_count", 0) > 64`']
    assert hits[0]["reads"]["config"] == ["ring_count"]
    assert idx.find("a line no template holds at all") == []


def test_cache_never_goes_into_another_users_folder(tmp_path):
    foreign = tmp_path / "theirs"
    foreign.mkdir()
    os.chown(foreign, 65534, 65534)  # nobody's, as a training user's home is to root
    site = tmp_path / "site-packages"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "m.py").write_text('raise SystemExit("the ring buffer could not be mapped")\n')
    env = dict(os.environ, ZDOCTOR_CACHE_DIR=str(foreign / "cache"))
    code = "import sys; from zdoctor.symptoms.origin_index import index_env; " \
           "e = index_env([sys.argv[1]], 30); print(e.summary()['cache'] == '', e.summary()['sites'])"
    out = subprocess.run([sys.executable, "-c", code, str(site)], capture_output=True, text=True, env=env,
                         timeout=120, check=True).stdout.split()
    assert out == ["True", "1"]  # indexed in memory, cached nowhere
    assert list(foreign.iterdir()) == []


def test_whole_environment_index_is_bounded_and_cached(ds_python, tmp_path):
    site = site_packages(ds_python)
    measure = textwrap.dedent("""
        import json, sys
        from zdoctor.symptoms.origin_index import index_env
        env = index_env([sys.argv[1]], budget=float(sys.argv[2]))
        # the process's own peak: ru_maxrss would keep the forking test worker's size across the exec
        peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
        print(json.dumps({**env.summary(), "max_rss_kib": peak}))
    """)
    env = dict(os.environ, ZDOCTOR_CACHE_DIR=str(tmp_path / "cache"))

    def run() -> dict:
        out = subprocess.run([sys.executable, "-c", measure, str(site), "600"], capture_output=True, text=True,
                             env=env, timeout=900, check=True)
        return json.loads(out.stdout)

    first = run()
    sys.stderr.write(f"whole-environment index, first run: {first}\n")
    assert first["built"] == first["packages"] > 20 and first["not_indexed"] == []
    assert first["sites"] > 10000 and first["library_strings"] > 1000  # torch's libraries' formats too
    assert first["max_rss_kib"] < 1024 * 1024  # the cap: under 1 GiB for torch + DeepSpeed
    second = run()
    sys.stderr.write(f"whole-environment index, second run: {second}\n")
    assert second["from_cache"] == second["packages"] == first["packages"] and second["built"] == 0
    assert second["sites"] == first["sites"]


def test_a_line_the_extractor_finds_is_the_line_located():
    found = from_text("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                      "AssertionError: bfloat16 and fp16 modes cannot be simultaneously enabled\n", "log", "x")
    assert [s.text for s in found] == ["AssertionError: bfloat16 and fp16 modes cannot be simultaneously enabled"]
