#!/usr/bin/env bash
# A/B of two source trees on the H200: the bench's rows of PROVIDERS (default jagflash-tlx) on
# WORKLOADS, the current tree and OLD (a `git archive` of the other commit's core/src testing/src
# variants bench/src, carried as .gpu/old), interleaved ROUNDS times, each run a separate process
# with its own Triton cache. Run after bench/gpu.sh has unpacked the TLX bundle (/tmp/tlx):
#
#   OLD=.gpu/old ROUNDS=2 WORKLOADS='dense-b4h16n4096d128*,jagged-lognormal-d128' bash bench/probes/ab_trees.sh
#
# Writes $OUT/ab-{new,old}-<round>.log and prints each run's summary table.
# HASH=1 first runs bench/probes/hash_outputs.py (this tree's script) on each tree and compares
# the two: $OUT/hashes-{old,new}.json, $OUT/hashes-compare.log. ROUNDS=0: the hashes alone.
set -u
OUT=${OUT:-/tmp/gpu-out}
OLD=${OLD:-.gpu/old}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
tree_path() {
    local root=$1 p="$1/core/src:$1/testing/src:$1/bench/src" d
    for d in "$root"/variants/*/src; do p="$p:$d"; done
    echo "/tmp/tlx:$p"
}
if [ "${HASH:-0}" = 1 ]; then
    for side in old new; do
        root=$PWD; [ "$side" = old ] && root=$(cd "$OLD" && pwd)
        TRITON_CACHE_DIR=/tmp/tc-$side PYTHONPATH=$(tree_path "$root") timeout "${HASH_TIMEOUT_S:-150}" \
            "$PY" bench/probes/hash_outputs.py --out "$OUT/hashes-$side.json" > "$OUT/hashes-$side.log" 2>&1
        echo "== hashes $side (exit $?)"
    done
    "$PY" bench/probes/hash_outputs.py --compare "$OUT/hashes-old.json" "$OUT/hashes-new.json" 2>&1 | tee "$OUT/hashes-compare.log"
fi
for r in $(seq 1 "${ROUNDS:-2}"); do
    for side in new old; do
        root=$PWD; [ "$side" = old ] && root=$(cd "$OLD" && pwd)
        TRITON_CACHE_DIR=/tmp/tc-$side PYTHONPATH=$(tree_path "$root") timeout "${AB_TIMEOUT_S:-120}" \
            "$PY" -m jagflash.bench --providers "${PROVIDERS:-jagflash-tlx}" --workloads "${WORKLOADS:-dense-b4h16n4096d128*}" \
            --budget-s "${BUDGET_S:-40}" --no-ceilings --out "$OUT/ab-$side-$r" > "$OUT/ab-$side-$r.log" 2>&1
        echo "== $side round $r (exit $?)"
        cat "$OUT/ab-$side-$r/summary.txt" 2>/dev/null | head -30
    done
done
