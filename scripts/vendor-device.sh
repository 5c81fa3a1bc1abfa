#!/usr/bin/env bash
# Run every laid-out vLLM-Ascend revision of a folder through the harness on a CUDA device
# (docs/vendor-revisions.md, the H200 column).
#
#   scripts/vendor-device.sh DIR [SUITE] [SIZE]        (defaults: all all)
#
# DIR holds one checkout per revision, DIR/<owner>__<sha12>/vllm_ascend/ops/triton/... (folders
# without the indexer file are skipped). Each revision runs
#   python -m parity run --kernel vllm-ascend:DIR/REV --suite SUITE --size SIZE
# with no semantics flag (the adapter's declared ones):
#   * compiled on --device cuda when its files use no triton-ascend language extension (stock
#     Triton compiles every kernel of the revision);
#   * else under the Triton interpreter (--device cpu, on this host's CPU): extract_slice and
#     get_element exist only as interpreter emulations (parity/implementations/vendor_ascend_ext.py).
# The log's header line for each revision says which, and why.
#
# Writes only two files under $OUT (default ./vendor-device-out): vendor-device.log (every run's
# header, stdout and stderr, one section per revision) and vendor-device-summary.tsv (revision,
# mode, device, exit status, seconds, the run's last line). Reports go to a temporary folder.
# Knobs: PYTHON (interpreter), DEVICE (default cuda), TIMEOUT_PER_REV (seconds, 0 = none),
# PARALLEL (revisions run side by side, default 1; the log keeps revision order),
# ONLY (space-separated checkout names to run, default every one), SHARDS (an interpreter
# revision runs as that many shard processes side by side, --shard i/N, combined with
# python -m parity merge; default 1),
# PARITY_EXTRA (more flags for every run, e.g. "--case decode-tail").
set -u -o pipefail

dir=${1:?usage: scripts/vendor-device.sh DIR [SUITE] [SIZE]}
suite=${2:-all}
size=${3:-all}
out=${OUT:-./vendor-device-out}
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
limit=${TIMEOUT_PER_REV:-0}
parallel=${PARALLEL:-1}
only=${ONLY:-}
shards=${SHARDS:-1}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
log="$out/vendor-device.log"
summary="$out/vendor-device-summary.tsv"
reports=$(mktemp -d)
: > "$log"
printf 'revision\tmode\tdevice\trc\tseconds\tlast line\n' > "$summary"

sections=$(mktemp -d)

run_rev() {   # one revision: its log section in $sections/NAME.log, its summary line in NAME.tsv
    local rev=$1 name shape ext mode run_device why start rc secs last section
    name=$(basename "$rev")
    section="$sections/$name.log"
    : > "$section"
    # the revision's shape and extensions, from its real signatures and imports
    shape=$(cd "$here" && TRITON_INTERPRET=1 "$py" -c "
import sys
from parity.implementations.vllm_ascend import describe, load_operators
r = describe(load_operators(sys.argv[1]))
print(('+'.join(r.extensions) or '-') + '|' + r.text())" "$rev" 2>>"$section") || shape="?|the adapter could not load it"
    ext=${shape%%|*}
    if [ "$ext" = "-" ]; then
        mode=compiled; run_device=$device; why="stock Triton compiles every kernel of the revision"
    else
        mode=interpreter; run_device=cpu
        why="its files use triton-ascend's $ext, which stock Triton cannot compile: the Triton interpreter on this host's CPU"
    fi
    {
        echo "=================================================================================="
        echo "=== $name: $mode on --device $run_device ($why)"
        echo "=== shape: ${shape#*|}"
        echo "=== command: python -m parity run --kernel vllm-ascend:$rev --device $run_device --suite $suite --size $size"
        echo "=== started $(date -u +%FT%TZ) on $(hostname)"
    } >> "$section"
    start=$(date +%s)
    # shellcheck disable=SC2206  # PARITY_EXTRA is a list of flags
    cmd=("$py" -m parity run --kernel "vllm-ascend:$rev" --device "$run_device" --suite "$suite" --size "$size"
         ${PARITY_EXTRA:-})
    if [ "$limit" != 0 ]; then cmd=(timeout "$limit" "${cmd[@]}"); fi
    if [ "$mode" = interpreter ] && [ "$shards" -gt 1 ]; then
        # the interpreter is single-threaded: every shard its own process, then one merged report
        local i
        for ((i = 0; i < shards; i++)); do
            (cd "$here" && "${cmd[@]}" --shard "$i/$shards" \
                --report "$reports/$name-shard$i") > "$sections/$name.shard$i" 2>&1 &
        done
        wait
        for ((i = 0; i < shards; i++)); do
            echo "--- shard $i/$shards" >> "$section"; cat "$sections/$name.shard$i" >> "$section"
        done
        echo "--- python -m parity merge" >> "$section"
        (cd "$here" && "$py" -m parity merge --out "$reports/$name" "$reports/$name"-shard*) >> "$section" 2>&1
        local merged=$?
        # the merged verdict line (the shards' own lines are partial)
        grep -E '^(PASS|FAIL)' "$reports/$name/summary.md" 2>/dev/null | head -1 | sed 's/^/merged: /' >> "$section"
        (exit $merged)
    else
        (cd "$here" && "${cmd[@]}" --report "$reports/$name") >> "$section" 2>&1
    fi
    rc=$?
    secs=$(( $(date +%s) - start ))
    last=$(grep -E '^(merged: )?(PASS|FAIL)' "$section" | tail -1 | tr '\t' ' ')
    echo "=== $name: exit $rc after ${secs}s" >> "$section"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$mode" "$run_device" "$rc" "$secs" "$last" > "$sections/$name.tsv"
}

names=()
for rev in "$dir"/*/; do
    rev=$(cd "$rev" && pwd)          # absolute: the runs start in the repository root
    [ -f "$rev/vllm_ascend/ops/triton/glm5_next_lightning_indexer.py" ] || continue
    if [ -n "$only" ] && [[ " $only " != *" $(basename "$rev") "* ]]; then continue; fi
    while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n; done
    run_rev "$rev" &
    names+=("$(basename "$rev")")
done
wait
for name in "${names[@]}"; do
    cat "$sections/$name.log" >> "$log"
    cat "$sections/$name.tsv" >> "$summary" 2>/dev/null || printf '%s\t?\t?\t?\t?\tno result\n' "$name" >> "$summary"
done
rm -rf "$sections"
rm -rf "$reports"
cat "$summary"
