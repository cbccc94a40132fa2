"""A real torch + DeepSpeed environment for end-to-end tests, built once per machine and reused.

``python tests/dsenv.py`` builds it ahead of the test run (CI does); the tests call :func:`ensure` and
:func:`cpu_adam_op`. The location is ``$ZDOCTOR_TEST_DS_ENV`` or ``~/.cache/zdoctor-tests/ds-env``.
torch comes as the CPU build; cpu_adam is JIT-built for real by DeepSpeed with the system g++.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TORCH = "torch==2.13.0"
DEEPSPEED = "deepspeed==0.19.8"
LOAD_CPU_ADAM = "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()"


def location() -> Path:
    return Path(os.environ.get("ZDOCTOR_TEST_DS_ENV") or Path.home() / ".cache" / "zdoctor-tests" / "ds-env")


def _works(python: Path) -> bool:
    if not python.exists():
        return False
    probe = subprocess.run([str(python), "-c", "import deepspeed, torch"], capture_output=True, timeout=300)
    return probe.returncode == 0


def ensure() -> Path:
    """The environment's python, installing torch (CPU) and DeepSpeed first when needed."""
    venv = location()
    python = venv / "bin" / "python"
    if _works(python):
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, TORCH, "numpy"], check=True)
    subprocess.run([*pip, "--no-build-isolation", DEEPSPEED], check=True)
    if not _works(python):
        raise RuntimeError(f"{venv}: torch and deepspeed do not import after installing them")
    return python


def cpu_adam_op(python: Path) -> Path:
    """DeepSpeed's cpu_adam op, JIT-built (once) into the environment's own extension cache."""
    cache = python.parent.parent / "zdoctor-torch-extensions"
    so = cache / "cpu_adam" / "cpu_adam.so"
    if so.exists():
        return so
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(cache), PATH=f"{python.parent}{os.pathsep}{os.environ['PATH']}")
    env.pop("LD_LIBRARY_PATH", None)
    env.pop("LD_PRELOAD", None)
    subprocess.run([str(python), "-c", LOAD_CPU_ADAM], check=True, env=env, timeout=1200,
                   stdout=subprocess.DEVNULL)
    if not so.exists():
        raise RuntimeError(f"building cpu_adam did not produce {so}")
    return so


if __name__ == "__main__":
    py = ensure()
    print(py)
    print(cpu_adam_op(py))
