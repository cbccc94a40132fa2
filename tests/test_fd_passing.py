"""DataLoader workers passing tensors by file descriptor: a real "received 0 items of ancdata" from a real
DataLoader in the real torch environment, explained by the training shell's low open-files limit; with a high
limit, the node's limit is said to be fine and the job's sharing strategy is what to change, with /dev/shm
(a tiny one, mounted in a private mount namespace) named as what file_system needs.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from dsenv import ensure

ROOT = Path(__file__).resolve().parent.parent
#: Many small tensors per item from four workers, all kept: each crosses as a file descriptor under
#: file_descriptor, the default strategy.
LOADER = """import sys
import torch
from torch.utils.data import DataLoader, Dataset

class Many(Dataset):
    def __len__(self):
        return 32
    def __getitem__(self, i):
        return [torch.full((4,), float(i)) for _ in range(100)]

n = 0
kept = []
for batch in DataLoader(Many(), batch_size=None, num_workers=4):
    n += len(batch)
    kept.append(batch)  # gathered for later: each tensor keeps its descriptor open under file_descriptor
print("received", n, "tensors")
"""
ANCDATA = "RuntimeError: received 0 items of ancdata"
#: The kept batches hold more descriptors than the limit, so every run should meet it (measured: 10 of 10
#: quiet, 5 of 5 beside three busy loops); without them only some runs did (3 of 10 quiet, 1 of 5 loaded).
TRIES = 20


def _under_limit(limit: int, argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", f"ulimit -Sn {limit} && exec {shlex.join(argv)}"], capture_output=True,
                          text=True, timeout=600, **kw)


@pytest.fixture(scope="module")
def ancdata(tmp_path_factory):
    """The real message from a real DataLoader under ulimit -n 512: (the log, the folder, the python)."""
    python = ensure()
    tmp = tmp_path_factory.mktemp("ancdata")
    (tmp / "loader.py").write_text(LOADER)
    for _ in range(TRIES):
        run = _under_limit(512, [str(python), str(tmp / "loader.py")], cwd=str(tmp))
        if ANCDATA in run.stderr:
            (tmp / "train.log").write_text(run.stdout + run.stderr)
            return tmp / "train.log", tmp, python
    pytest.fail(f"no run of {TRIES} showed '{ANCDATA}': {run.stderr[-1500:]}")


def _check(python: Path, log: Path, limit: int, tmp: Path, shm_mib: int | None = None) -> dict:
    argv = [sys.executable, "-m", "zdoctor", "check", "--json", "--playbook", "offload-bottleneck", "--python",
            str(python), "--log", str(log), "--no-log"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if shm_mib is None:
        proc = _under_limit(limit, argv, env=env, cwd=str(tmp))
    else:  # a private mount namespace whose /dev/shm is a tiny tmpfs: the machine's stays as it is
        inner = f"mount -t tmpfs -o size={shm_mib}m tmpfs /dev/shm && ulimit -Sn {limit} && exec {shlex.join(argv)}"
        proc = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", inner], capture_output=True,
                              text=True, timeout=600, env=env, cwd=str(tmp))
    assert proc.stdout.strip().startswith("{"), proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _finding(report: dict) -> dict:
    return {f["id"]: f for f in report["findings"]}["pyenv.fd-passing"]


def test_a_low_open_files_limit_explains_ancdata_and_file_system_fixes_it(ancdata):
    log, tmp, python = ancdata
    report = _check(python, log, 512, tmp)
    f = _finding(report)
    assert f["status"] == "fail"
    assert f["title"] == ("DataLoader workers pass every tensor as a file descriptor and the open-files limit is "
                          "only 512: the receiver ran out of descriptors")
    assert "torch passes tensors by file_descriptor" in f["detail"]  # read in the training environment
    (said,) = [s for s in report["symptoms"] if s["kind"] == "ancdata"]
    assert said["explained_by"] == ["pyenv.fd-passing"]
    titles = [r["title"] for r in f["remedies"]]
    assert titles[0].startswith("Raise the open-files limit in the launching shell: ulimit -n ")
    assert titles[1].startswith("Pass tensors by file name")
    # the first fix, made for real: the same loader under the limit it names
    (raise_limit,) = f["remedies"][0]["commands"]
    raised = int(raise_limit.split()[-1])
    assert raise_limit == f"ulimit -n {raised}" and raised > 512
    fixed = _under_limit(raised, [str(python), "loader.py"], cwd=str(tmp))
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert fixed.stdout.strip().splitlines()[-1] == "received 3200 tensors"
    # the job's change, made for real: the same loader under the same limit, with file_system first
    fixed = _under_limit(512, [str(python), "-c", "import runpy, torch.multiprocessing as mp; "
                               "mp.set_sharing_strategy('file_system'); runpy.run_path('loader.py', "
                               "run_name='__main__')"], cwd=str(tmp))
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert fixed.stdout.strip().splitlines()[-1] == "received 3200 tensors"


def test_a_high_limit_is_said_to_be_fine_and_a_tiny_dev_shm_is_named(ancdata):
    if os.geteuid() != 0:
        pytest.skip("needs root for a private mount namespace")
    log, tmp, python = ancdata
    f = _finding(_check(python, log, 8192, tmp, shm_mib=1))
    assert f["status"] == "fail"
    assert f["title"] == ("The open-files limit (8192) is fine: the job holds more tensors passed by file "
                          "descriptor than any limit allows; change the job's sharing strategy to file_system")
    (remedy,) = f["remedies"]
    assert remedy["commands"] == ["import torch.multiprocessing",
                                  "torch.multiprocessing.set_sharing_strategy('file_system')"]
    assert "/dev/shm here: 1 MiB free of 1 MiB - too small for a DataLoader's tensors" in remedy["explanation"]
