#!/usr/bin/env bash
# zdoctor on a real NVIDIA machine, offline, from a copy of this repository.
#
# Builds the zdoctor wheel from this checkout and installs it with its dependencies from wheels carried
# along (no network), into a private directory (the machine's own Python environment is not touched), then
# runs `zdoctor check --json` (plain, and sampling the GPUs for a few seconds) and `zdoctor snapshot`
# against the training interpreter, captures `nvidia-smi -q -x`, and runs the GPU tests there.
#
# Prepare the wheels on a machine with network access, in the repository root (.whl/ is git-ignored):
#   python3 -m pip download --dest .whl --only-binary=:all: --python-version 3.10 --implementation cp \
#     --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
#     'textual>=0.60' 'rich>=13' 'pyelftools>=0.30' 'psutil>=5.9' 'nvidia-ml-py>=12' 'networkx>=3.0' \
#     'tomli>=2' 'hatchling>=1.18'
#
# Environment: OUT (results, default ./device-out), WHEELS (default ./.whl), PYTHON (runs zdoctor, default
# python3), TARGET_PYTHON (the training interpreter zdoctor probes, default the python3 on PATH),
# SAMPLE_S (GPU sampling seconds, default 5). Results (at most 6 files): check.json, check-sampled.json,
# snapshot.json, nvidia-smi-q.xml, pytest-gpu.txt, device_check.log.

set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$REPO/device-out}
WHEELS=${WHEELS:-$REPO/.whl}
PY=${PYTHON:-python3}
TARGET_PY=${TARGET_PYTHON:-$(command -v python3 || echo python3)}
SAMPLE_S=${SAMPLE_S:-5}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/zdoctor-device.XXXXXX")
SITE=$WORK/site
mkdir -p "$OUT"
LOG=$OUT/device_check.log
: >"$LOG"
export PYTHONUNBUFFERED=1

say() { printf '\n=== %s\n' "$*" | tee -a "$LOG"; }
# Run a step, its output into the log (and the terminal); never stop the script.
step() { "$@" 2>&1 | tee -a "$LOG"; return "${PIPESTATUS[0]}"; }
# zdoctor from $SITE, appended to sys.path: the interpreter's own packages win, the carried ones fill gaps,
# and PYTHONPATH stays unset so the training interpreter zdoctor probes sees its usual environment.
cat >"$WORK/zd.py" <<ZDEOF
import sys
sys.path.append("$SITE")
from zdoctor.front.cli import main
raise SystemExit(main(sys.argv[1:]))
ZDEOF
ZD=("$PY" "$WORK/zd.py")

say "machine"
step uname -a
step "$PY" -c 'import sys; print(sys.executable, sys.version)'
step timeout 20 nvidia-smi -L
echo "training interpreter: $TARGET_PY" | tee -a "$LOG"
if [ ! -d "$WHEELS" ] || [ -z "$(ls "$WHEELS"/*.whl 2>/dev/null)" ]; then
    echo "no wheels in $WHEELS: see the pip download command at the top of this script" | tee -a "$LOG"
    exit 2
fi

say "build the zdoctor wheel (offline; hatchling from $WHEELS)"
if ! step timeout 180 "$PY" -m pip wheel --no-index --find-links "$WHEELS" --no-deps --no-cache-dir \
        -w "$WORK/dist" "$REPO"; then
    echo "building the wheel failed" | tee -a "$LOG"
    exit 3
fi
WHEEL=$(ls "$WORK"/dist/zdoctor-*.whl | head -n 1)

say "install $WHEEL and its dependencies into $SITE"
if ! step timeout 180 "$PY" -m pip install --no-index --find-links "$WHEELS" --no-cache-dir --no-compile \
        --target "$SITE" "$WHEEL"; then
    echo "installing failed" | tee -a "$LOG"
    exit 4
fi
step "${ZD[@]}" --version

say "zdoctor playbooks lint"
step timeout 60 "${ZD[@]}" playbooks lint

say "zdoctor check --json"
timeout 300 "${ZD[@]}" check --json --no-log --python "$TARGET_PY" >"$OUT/check.json" 2>>"$LOG"
echo "exit code $? (0: nothing failed, 1: a finding failed)" | tee -a "$LOG"

say "zdoctor check --json --gpu-sample $SAMPLE_S"
timeout 300 "${ZD[@]}" check --json --no-log --python "$TARGET_PY" --gpu-sample "$SAMPLE_S" \
    >"$OUT/check-sampled.json" 2>>"$LOG"
echo "exit code $?" | tee -a "$LOG"

say "zdoctor snapshot"
step timeout 300 "${ZD[@]}" snapshot -o "$OUT/snapshot.json" --python "$TARGET_PY"

say "nvidia-smi -q -x"
timeout 30 nvidia-smi -q -x >"$OUT/nvidia-smi-q.xml" 2>>"$LOG"
echo "exit code $?" | tee -a "$LOG"

say "GPU findings"
step "$PY" - "$OUT/check.json" <<'EOF'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    sys.exit(f"no readable check.json: {exc}")
for f in doc["findings"]:
    if f["id"].startswith("gpu"):
        print(f"{f['status']:5} {f['id']}: {f['title']}")
for p in doc.get("playbooks", []):
    print(f"playbook {p['id']}: {' -> '.join(p['path'])}")
print("summary:", doc["summary"])
EOF

say "GPU tests on this machine"
if "$PY" -c 'import pytest' 2>/dev/null; then
    (cd "$REPO" && PYTHONPATH="$SITE" timeout 240 "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu_facts.py \
        tests/test_gpu_nvml.py tests/test_gpu_checks.py tests/test_gpu_probes.py tests/test_gpu_playbook.py) \
        >"$OUT/pytest-gpu.txt" 2>&1
    echo "pytest exit code $?" | tee -a "$LOG"
    tail -n 15 "$OUT/pytest-gpu.txt" | tee -a "$LOG"
else
    echo "pytest is not installed for $PY: tests not run" | tee -a "$LOG"
fi

rm -rf "$WORK"
say "done: $(ls "$OUT" | tr '\n' ' ')"
