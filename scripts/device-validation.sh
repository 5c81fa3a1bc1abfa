#!/usr/bin/env bash
# Compiled-mode validation on a GPU/NPU host: environment, the default `make parity` (every suite,
# both sizes, device profile; report + JUnit), the tests on the device (both tiers) and `make
# bench`. Output goes to ${OUT:-validation-out}/.
# Usage: DEVICE=cuda bash scripts/device-validation.sh
set -uo pipefail
OUT=${OUT:-validation-out}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
export KPOOL_DEVICE=$DEVICE PYTHONUNBUFFERED=1
PY=$(bash scripts/bootstrap.sh main 2>"$OUT/bootstrap.log" | tail -n 1)
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  "$PY" - <<'PY'
import platform, torch
print("python:", platform.python_version())
print("torch:", torch.__version__)
try:
    import triton; print("triton:", triton.__version__)
except ImportError:
    print("triton: missing")
if torch.cuda.is_available():
    print("gpu:", torch.cuda.get_device_name(), "x", torch.cuda.device_count())
PY
} | tee "$OUT/env.txt"
start=$(date +%s)
"$PY" -m parity run --device "$DEVICE" --report "$OUT/report" --junit "$OUT/junit.xml" >"$OUT/parity.log" 2>&1
echo "parity rc=$? wall=$(( $(date +%s) - start ))s" | tee -a "$OUT/env.txt"
tail -n 3 "$OUT/parity.log"
start=$(date +%s)
"$PY" -m pytest -q -p no:cacheprovider --device "$DEVICE" ${PYTEST_ARGS:--n 4} tests >"$OUT/pytest.log" 2>&1
echo "pytest rc=$? wall=$(( $(date +%s) - start ))s" | tee -a "$OUT/env.txt"
tail -n 15 "$OUT/pytest.log"
"$PY" -m parity.bench --device "$DEVICE" --json "$OUT/bench.json" >"$OUT/bench.log" 2>&1
echo "bench rc=$?" | tee -a "$OUT/env.txt"
tail -n 12 "$OUT/bench.log"
