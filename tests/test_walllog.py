"""wall_clock_breakdown lines: a real DeepSpeed 0.19 ZeRO-3 CPU-offload run (recorded, and run again), the
pre-0.18 prefixed format with NVMe swap timers, and bad logs."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest
from conftest import FIXTURES
from dsenv import cpu_adam_op, ensure

from zdoctor.core.errors import InputError
from zdoctor.layers.offload import walllog

OFF = FIXTURES / "offload"


def test_recorded_real_run():
    r = walllog.parse_log(str(OFF / "ds-0.19-wallclock.log"))
    assert r["format"] == "plain (0.18 and later)" and r["ranks"] == [0] and r["timer_lines"] == 19
    t = r["timers"]
    assert t["fwd"]["count"] == t["fwd_microstep"]["count"] == t["optimizer_step"]["count"] == 6
    assert t["init_optimizer_state"]["count"] == 1
    assert t["step"]["max_ms"] == 21.57 and t["step"]["first_ms"] == 6.71
    assert [r["phases"][k]["timer"] for k in ("forward", "backward", "step")] == ["fwd", "bwd", "step"]
    # means leave the first (warm-up) sample out: step (6.71 left out) 42.84 ms over 5 steps
    assert r["phases"]["step"]["steady_mean_ms"] == pytest.approx(8.568)
    assert r["dominant"] == "step" and r["step_bound"] is True
    assert r["swap"] is None and r["disk_bound"] is False  # CPU offload: no NVMe swaps
    assert sum(r["shares"].values()) == pytest.approx(1.0, abs=1e-3)
    assert set(r["backward_parts"]) == {"bwd_inner", "bwd_allreduce"}


def test_recorded_real_run_of_deepspeed_0_17():
    """The same tiny training under DeepSpeed 0.17.6: timer lines carry the logger prefix."""
    r = walllog.parse_log(str(OFF / "ds-0.17-wallclock.log"))
    assert r["format"].startswith("prefixed") and r["ranks"] == [0] and r["timer_lines"] == 19
    t = r["timers"]
    assert t["fwd"]["count"] == t["step"]["count"] == t["optimizer_step"]["count"] == 6
    assert t["fwd"]["first_ms"] == 2.10 and t["step"]["first_ms"] == 11.50
    assert r["dominant"] == "step" and r["swap"] is None and r["disk_bound"] is False


def test_prefixed_format_with_nvme_swaps():
    r = walllog.parse_log(str(OFF / "ds-0.17-wallclock-nvme.log"))
    assert r["format"] == "prefixed (before 0.18)" and r["timer_lines"] == 16
    swap = r["swap"]
    assert swap["of"] == "optimizer_step" and set(swap["timers"]) == set(walllog.SWAP_TIMERS)
    assert swap["share_of_step"] == pytest.approx(0.7549, abs=1e-4)
    assert r["dominant"] == "step" and r["shares"]["step"] == pytest.approx(0.7969, abs=1e-4)
    assert r["disk_bound"] is True


def test_timer_names_in_any_order_and_other_shapes():
    lines = [
        "node-a: [Rank 0] time (ms) | step: 900.00 | fwd: 50.00 | bwd: 50.00",  # a pdsh prefix, any order
        "node-b: [Rank 8] time (ms) | fwd: 10.00 | bwd: 10.00 | step: 10.00",  # another rank: kept apart
        "[Rank 0] time (ms) | optimizer_step: 800.00 | optimizer_swap_out_state: 100.00 | "
        "optimizer_swap_in_state: 200.00",
        "[Rank 0] time (ms) | fwd: 1.00 (fwd_moe: 0.40, 1st_a2a: 0.10, 2nd_a2a: 0.10, top_k: 0.05)",  # MoE
        "comm op: all_reduce | time (ms): 1.20 | msg size: 4.0 MB | algbw (Gbps): 1.0 | busbw (Gbps): 1.0",
        "time (ms) | weird",
    ]
    r = walllog.parse_lines(lines)
    assert r["ranks"] == [0, 8] and r["rank"] == 0 and r["timer_lines"] == 4
    assert r["timers"]["fwd"]["count"] == 2 and r["timers"]["fwd_moe"]["count"] == 1
    assert "all_reduce" not in r["timers"] and "time" not in r["timers"]
    assert r["swap"]["share_of_step"] == pytest.approx(300 / 800)
    assert r["disk_bound"] is False  # the swaps take less than half of the optimizer step


def test_zero_offload_flag_in_a_log():
    r = walllog.parse_lines(["cmd: deepspeed --zero-offload train.py", "nothing else"])
    assert r["zero_offload_flag"] == [[1, "cmd: deepspeed --zero-offload train.py"]]
    assert r["timer_lines"] == 0 and r["dominant"] is None and r["step_bound"] is False


def test_bad_logs(tmp_path):
    binary = tmp_path / "core"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 100)
    with pytest.raises(InputError, match=r"not a text log \(NUL byte at offset 7\)"):
        walllog.parse_log(str(binary))
    with pytest.raises(InputError, match="no such training log"):
        walllog.parse_log(str(tmp_path / "missing.log"))
    with pytest.raises(InputError, match="is a directory"):
        walllog.parse_log(str(tmp_path))
    quiet = tmp_path / "quiet.log"
    quiet.write_text("epoch 1 loss 2.3\n\xff\xfe garbage that is not UTF-8\n", encoding="latin-1")
    r = walllog.parse_log(str(quiet))
    assert r["timer_lines"] == 0 and r["lines_read"] == 2 and r["dominant"] is None


def test_huge_log_is_read_from_its_end(tmp_path):
    log = tmp_path / "huge.log"
    with open(log, "wb") as fh:
        fh.write(b"[Rank 0] time (ms) | fwd: 999.00 | bwd: 1.00 | step: 1.00\n")  # cut off: too early
        fh.write(b"filler line of a long training\n" * 40000)  # about 1.2 MB
        fh.write(b"[Rank 0] time (ms) | fwd: 1.00 | bwd: 2.00 | step: 30.00\n" * 3)
    r = walllog.parse_log(str(log), cap=64 * 1024)
    assert r["head_skipped"] is True and r["read_bytes"] <= 64 * 1024
    assert r["timers"]["fwd"]["max_ms"] == 1.0 and r["timers"]["fwd"]["count"] == 3
    assert r["dominant"] == "step"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_fresh_real_training_run_parses(tmp_path):
    """Run the tiny ZeRO-3 CPU-offload training again with the installed DeepSpeed and read its log."""
    python = ensure()
    cache = cpu_adam_op(python).parent.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
    env.update(MASTER_PORT=str(_free_port()), TORCH_EXTENSIONS_DIR=str(cache), RANK="0", WORLD_SIZE="1",
               LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", PATH=f"{python.parent}{os.pathsep}{env['PATH']}")
    log = tmp_path / "train.log"
    with open(log, "wb") as fh:
        proc = subprocess.run([str(python), str(OFF / "wallclock_train.py"), "4"], stdout=fh,
                              stderr=subprocess.STDOUT, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, log.read_text(errors="replace")[-3000:]
    r = walllog.parse_log(str(log))
    assert r["format"] == "plain (0.18 and later)"
    assert {"fwd", "bwd", "step", "fwd_microstep", "step_microstep", "optimizer_step"} <= set(r["timers"])
    assert r["timers"]["step"]["count"] == 4 and r["timers"]["optimizer_step"]["count"] == 4
    assert r["dominant"] in ("forward", "backward", "step") and r["iteration_ms"] > 0
