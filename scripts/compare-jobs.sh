#!/usr/bin/env bash
# One-worker vs N-worker parity run on this host, for docs/validation.md ("Multi-worker run").
#
# Usage: scripts/compare-jobs.sh [DEVICE=auto] [SIZE=small] [JOBS=2] [OUT=reports/jobs-compare]
#   e.g. on a two-GPU host:  scripts/compare-jobs.sh cuda all 2
#
# Runs `python -m parity run --jobs 1` and `--jobs N` (same cases, same seed) with --report,
# prints each one's wall time, the device each worker was pinned to (python -m parity.running.parallel),
# checks that the two merged results tables are identical row for row once the worker columns
# are dropped, and writes OUT/compare.md (a markdown snippet). Exit 1 if they differ or a run
# fails. Interpreter: $PYTHON, else scripts/bootstrap.sh main.
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE="${1:-auto}"; SIZE="${2:-small}"; JOBS="${3:-2}"; OUT="${4:-reports/jobs-compare}"
PY="${PYTHON:-$(bash scripts/bootstrap.sh main)}"
mkdir -p "$OUT"

probe="$("$PY" -m parity.running.parallel --device "$DEVICE" --jobs "$JOBS")"
echo "$probe"

declare -A WALL RC
for j in 1 "$JOBS"; do
    t0=$(date +%s.%N)
    rc=0
    "$PY" -m parity run --device "$DEVICE" --suite seed --size "$SIZE" --jobs "$j" --failures-only \
        --report "$OUT/jobs$j" >"$OUT/jobs$j.log" 2>&1 || rc=$?
    WALL[$j]=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { print a - b }')
    RC[$j]=$rc
    echo "jobs=$j: exit $rc, wall ${WALL[$j]} s ($(grep -E '^(PASS|FAIL):' "$OUT/jobs$j.log" || true))"
done

"$PY" - "$OUT" "$JOBS" "${WALL[1]}" "${WALL[$JOBS]}" "${RC[1]}" "${RC[$JOBS]}" "$DEVICE" "$SIZE" "$probe" <<'EOF'
import json, platform, sys
import pandas as pd
out, jobs, w1, wn, rc1, rcn, device, size, probe = sys.argv[1:]
one = pd.read_csv(f"{out}/jobs1/results.csv")
many = pd.read_csv(f"{out}/jobs{jobs}/results.csv")
keep = [c for c in one.columns if c not in ("worker", "worker_device")]
same = one[keep].equals(many[keep])
per_worker = (many.drop_duplicates(["case", "size"]).groupby(["worker", "worker_device"])
              .size().rename("cases").reset_index())
lines = probe.strip().splitlines()
head = json.loads(lines[0])
seen = [json.loads(l) for l in lines[1:]]
md = [f"- host: {platform.node()}, device `{head['device']}`, visible devices {head['visible']}, size `{size}`",
      f"- `--jobs 1`: {float(w1):.1f} s wall (exit {rc1}); `--jobs {jobs}`: {float(wn):.1f} s wall (exit {rcn}); "
      f"speed-up {float(w1) / float(wn):.2f}x",
      f"- merged report identical to the one-worker report (worker columns dropped): {same} "
      f"({len(many)} rows, {many[['case', 'size']].drop_duplicates().shape[0]} cases)",
      "- workers (spawned with their pin; device_count/name as each worker saw it):"]
for s in seen:
    md.append(f"  - worker {s['worker']}: CUDA_VISIBLE_DEVICES={s.get('CUDA_VISIBLE_DEVICES')} "
              f"ASCEND_RT_VISIBLE_DEVICES={s.get('ASCEND_RT_VISIBLE_DEVICES')} "
              f"device_count={s.get('device_count')} {s.get('device_name', '')}".rstrip())
md.append("- cases per worker:")
md += [f"  - worker {r.worker} ({r.worker_device}): {r.cases}" for r in per_worker.itertuples()]
text = "\n".join(md)
open(f"{out}/compare.md", "w").write(text + "\n")
print(text)
sys.exit(0 if same and rc1 == "0" and rcn == "0" else 1)
EOF
