#!/usr/bin/env bash
# Issue 12's done-when on a device (python -m parity ab / golden / bisect), one script, one log.
#   DEVICE=cuda PYTHON=python3 CLONE=DIR bash scripts/kernel-vs-kernel-device.sh OUT
# CLONE: a throwaway clone with a planted kernel commit (python -m parity.verbs.planted_history DIR: the
# planted commit is HEAD~4, the base HEAD~9); built here when unset (needs git and this
# checkout's .git). BISECT=1 also bisects the clone. Each step prints its exit status next to
# the expected one; the script exits 1 when any differs. Writes only under OUT (and CLONE).
set -u -o pipefail
OUT=${1:?usage: kernel-vs-kernel-device.sh OUT}
PY=${PYTHON:-python3}
DEV=${DEVICE:-cuda}
SEL=(--suite seed --size "${SIZE:-all}")
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
CLONE=${CLONE:-}
if [ -z "$CLONE" ]; then
  CLONE="$OUT/clone"
  "$PY" -m parity.verbs.planted_history "$CLONE" | tee "$OUT/clone.txt" || { echo "cannot build the clone"; exit 2; }
fi
export KPOOL_GIT_REPO="$CLONE"
bad=0
step() {   # step NAME EXPECTED_RC CMD...
  local name=$1 want=$2; shift 2
  echo "=== $name: $*" | tee -a "$OUT/summary.txt"
  "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  tail -n 25 "$OUT/$name.log"
  echo "=== $name: exit $rc (expected $want)" | tee -a "$OUT/summary.txt"
  [ "$rc" = "$want" ] || bad=1
}
step ab-identical 0 "$PY" -m parity ab --baseline git:HEAD~9 --candidate git:HEAD~5 --device "$DEV" "${SEL[@]}" --report "$OUT/ab-identical"
step ab-worktree-vs-base 0 "$PY" -m parity ab --baseline kpool --candidate git:HEAD~9 --device "$DEV" "${SEL[@]}"
step ab-changed 1 "$PY" -m parity ab --baseline git:HEAD~5 --candidate git:HEAD~4 --device "$DEV" "${SEL[@]}" --report "$OUT/ab-changed"
step golden-record 0 "$PY" -m parity golden record "$OUT/golden" --device "$DEV" "${SEL[@]}"
step golden-check 0 "$PY" -m parity golden check "$OUT/golden" --device "$DEV"
step golden-check-planted 1 "$PY" -m parity golden check "$OUT/golden" --device "$DEV" --kernel mutant:tail-wrong-column
step golden-check-other-kind 2 "$PY" -m parity golden check "$OUT/golden" --device cpu
if [ "${BISECT:-0}" = 1 ]; then
  (cd "$CLONE" && git status --porcelain && git rev-parse HEAD) > "$OUT/clone-before.txt" 2>&1
  step bisect 0 "$PY" -m parity bisect HEAD~9 HEAD --case prefill-tail --suite seed --size small --device "$DEV"
  (cd "$CLONE" && git status --porcelain && git rev-parse HEAD) > "$OUT/clone-after.txt" 2>&1
  cmp -s "$OUT/clone-before.txt" "$OUT/clone-after.txt" && echo "clone unchanged" || { echo "CLONE CHANGED"; bad=1; }
fi
cat "$OUT/summary.txt"
exit $bad
