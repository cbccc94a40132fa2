"""Every input is bounded: the message catalogue reads long and hostile lines in work linear in what it reads
(a regular expression holds the GIL, so no probe budget can stop a runaway match), and zdoctor answers a
120,000-character --symptom, a --log ending in a 1 MiB line and a command printing one endless line.

The bound is on CPU time (RLIMIT_CPU in the process doing the work), never on wall time: a loaded machine
makes these slower, not failing; a pattern that backtracks over the whole line would need hours.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import REPO

from zdoctor.symptoms.catalogue import MATCH_LIMIT, SIGNATURES

PY = sys.executable
#: CPU seconds for the whole catalogue against every hostile line (it needs about one here).
CPU_BOUND = 60


def hostile_lines(pattern: str, length: int) -> list[str]:
    """Lines built to make a pattern backtrack: floods of one character its runs accept, and its own literal
    pieces repeated without the rest of the message."""
    lits = re.findall(r"[A-Za-z_][A-Za-z0-9_ .:'=/+-]{2,}", pattern.replace("\\", ""))[:6] or ["x"]
    out = [c * length for c in ("a", "/", " ", "(", ".", ":", "'")]
    for t in lits:
        out.append((t + " ") * (length // (len(t) + 1)))
        out.append(t + "a" * length)
        out.append(("/" + t) * (length // (len(t) + 1)))
    return out


def run_bounded(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    prelude = f"import resource; resource.setrlimit(resource.RLIMIT_CPU, ({CPU_BOUND}, {CPU_BOUND}))\n"
    return subprocess.run([PY, "-c", prelude + textwrap.dedent(code), *args], capture_output=True, text=True,
                          cwd=str(REPO), timeout=3600)


def test_every_catalogue_pattern_reads_hostile_lines_within_a_cpu_bound():
    code = """
        import sys
        sys.path.insert(0, "tests")
        from test_catalogue_bounds import hostile_lines
        from zdoctor.symptoms.catalogue import SIGNATURES
        from zdoctor.symptoms.extract import from_text, recognise
        n = 0
        for sig in SIGNATURES:
            for line in hostile_lines(sig.pattern, 200_000):
                recognise(line)
                n += 1
        # the same lines as one log: every line matched, at most a dozen symptoms kept
        text = "\\n".join(hostile_lines(SIGNATURES[0].pattern, 200_000))
        assert len(from_text(text, "log")) <= 12
        print(n)
    """
    proc = run_bounded(code)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert int(proc.stdout) >= len(SIGNATURES) * 7


def test_a_message_at_the_end_of_a_long_line_is_still_recognised():
    """Only the head and the tail of a long line are matched; a loader message at either end is found."""
    from zdoctor.symptoms.extract import recognise

    msg = "ImportError: /x/ext.so: undefined symbol: _ZN3c104cuda20CUDACachingAllocator9allocatorE"
    for line in (msg + " " + "z" * 100_000, "z" * 100_000 + " " + msg):
        hit = recognise(line)
        assert hit is not None and hit[0].id == "loader.undefined-symbol"
        assert hit[1]["symbol"].startswith("_ZN3c104cuda")
    assert recognise("z" * 50_000 + msg + "z" * 50_000) is None  # the middle of a huge line is not read
    assert 2 * len(msg) <= MATCH_LIMIT


def check_bounded(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["prlimit", f"--cpu={CPU_BOUND * 4}", PY, "-m", "zdoctor", "check", "--json", "--no-log",
                           "--python", PY, "--playbook", "toolchain", *args], capture_output=True, text=True,
                          cwd=str(REPO), timeout=3600, stdin=subprocess.DEVNULL)


def test_a_120000_character_symptom_gets_a_report():
    line = "RuntimeError: " + "CUDA " * 24_000 + "x"
    assert len(line) > 120_000
    proc = check_bounded("--symptom", line)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    (s,) = doc["symptoms"]
    assert len(s["text"]) < 1000 and s["text"].startswith("RuntimeError: CUDA CUDA")


def test_a_log_ending_in_a_one_mebibyte_line_gets_a_report(tmp_path: Path):
    log = tmp_path / "train.log"
    msg = "ImportError: /opt/env/ext.so: undefined symbol: ncclCommRegister"
    log.write_text("step 1\n" + "/" * (1 << 20) + " " + msg + "\n")
    proc = check_bounded("--log", str(log))
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert [s["signature"] for s in doc["symptoms"]] == ["loader.undefined-nccl-symbol"]


def test_a_command_printing_one_endless_line_gets_a_report():
    endless = f"{PY} -c \"import sys\nwhile True: sys.stdout.write('CUDA /' * 4096)\""
    proc = check_bounded("--command", endless, "--timeout", "5")
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert any(s["kind"] in ("hang", "still-compiling", "still-working") for s in doc["symptoms"]), doc["symptoms"]
