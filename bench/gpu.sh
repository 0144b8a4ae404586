#!/usr/bin/env bash
# The one script run on the H200, from the repository root, in a single device call:
#
#   bash bench/gpu.sh                          # ceilings, tests, demo, bench
#   bash bench/gpu.sh bench -- --workloads 'jagged-*' --providers 'jagflash-*,varlen-fa2'
#   bash bench/gpu.sh tests demo               # no bench
#   bash bench/gpu.sh bench -- --workloads 'bs-*' --providers 'jagflash-tlx,flex,fa4' --rep-ms 40 --warmup-ms 10
#                                              # block-sparse set (issue 22; + its two dense baselines
#                                              # for jagflash-tlx): FA4 needs the step-3 carry below
#   GRAPH_WORKLOADS='short-*,jagged-tiny-d128' GRAPH_PROVIDERS='jagflash-tlx,varlen-fa2,fa4,flex' \
#     bash bench/gpu.sh bench graph-bench -- --workloads 'short-*,jagged-tiny-d128' --providers 'jagflash-tlx,varlen-fa2,fa4,flex'
#                                              # short and skewed set (issue 20), eager then CUDA-graphed
#   TESTS_SHARD=1/2 bash bench/gpu.sh tests    # half the GPU suite (the whole one needs ~520 s alone)
#
# Carrying (the device tool moves at most 64 MiB a call; .gpu/ is git-ignored, name files in
# `carry`): the TLX bundle is 53 MB and FA4 comes in two parts of 35 + 30 MB, so a full run is
# three calls, each within 30 s of the last (the machine stays warm and keeps /tmp):
#   1. carry [".gpu/fa4.part00"]:            mkdir -p /tmp/stage && cp .gpu/fa4.part00 /tmp/stage/
#   2. carry [".gpu/triton38-utlx.tar.xz"]:  bash bench/gpu.sh ceilings tests demo
#   3. carry [".gpu/fa4.part01"]:            bash bench/gpu.sh bench   (reuses /tmp/tlx)
# (add ".gpu/commit" to each carry so the results name the commit: see JAGFLASH_GIT_COMMIT).
# Budget: a full bench of every workload and peer takes ~8 minutes of a 10-minute call; the
# 2026-11-30 run had ~4.5 and skipped 44 of its 184 rows (bench/results/2026-11-30-3d49d95).
# Make the bundles first with ../shared/tools/gpu-bundle and ../shared/tools/fa4-bundle, then
# tools/slim-gpu-bundle.sh: the full TLX bundle and the tracked tree no longer fit one call's 64 MiB.
#
# Steps (default: ceilings tests demo bench, in this order): ceilings (versions + bf16 matmul and
# copy ceilings), tlx-tests (the TLX kernels' sm90 tests alone, first), tests (pytest -m "gpu or sm90" on core and variants), demo
# (jagflash.variants.jagged.demo), sanitize (compute-sanitizer's memcheck, racecheck, synccheck and
# initcheck, each over bench/probes/sanitize_case.py after one warm-up run that fills Triton's cache:
# logs $OUT/sanitize-<tool>.log, then bench/probes/sanitize_summary.py classifies every report
# against its documented false positives into $OUT/sanitize.log; SANITIZE_TOOLS (the four),
# SANITIZE_TIMEOUT_S (150 each), SANITIZE_WARM_PARTS (8 warm-up processes), SANITIZE_PARALLEL (1:
# the tools side by side)),
# recsys (docs/examples/recsys/train_gpu.py into $OUT/recsys; RECSYS_TIMEOUT_S, 300), schedule-ab (bench/probes/schedule_ab.py:
# plan build time, then the portable kernels under schedules none / static / dynamic / grouped), probe (python $PROBE, a script of
# bench/probes/), ncu (Nsight Compute, --clock-control none, on
# one launch of bench/probes/probe_ncu.py's kernel: NCU_ARGS its arguments, NCU_KERNEL the kernel-name regex
# (default: _fwd_kernel with NCU_ARGS="--kernel fwd", else _dkdv_kernel), NCU_TIMEOUT_S (240), NCU_CACHE (1: the run's
# Triton cache kept, cubins only, under $OUT/triton-cache, for bench/probes/ncu_lines.py); writes
# ncu-report.ncu-rep, ncu-details.txt, ncu-sass.csv and prints the stall summary), graph-bench (the
# bench on GRAPH_WORKLOADS (bq-*) and GRAPH_PROVIDERS (jagflash-tlx, FA4 and FA2 expand-Q) with
# --cuda-graphs --graph-below-ms GRAPH_BELOW_MS (5.0: an eager estimate of a host-bound call is its host time): rows under that replayed in a CUDA graph,
# into $OUT/bench-graph; GRAPH_BENCH_TIMEOUT_S (150)), bench (python -m jagflash.bench; arguments after `--`).
# A failing step does not stop the next. Everything a step prints is tee'd to $OUT/<step>.log; the bench writes
# $OUT/bench/{results.csv,results.md,tflops_*.png,meta.json,rows.jsonl}. The short bench table is
# printed last; at the end everything under $OUT is packed into $OUT/gpu-out.tgz (the device tool
# brings back at most 8 files).
#
# Time: the whole script ends within GPU_SH_LIMIT_S seconds (default 560, for a 600 s call). Each
# step has a timeout; the bench gets what is left (minus a margin) as --budget-s and trims its
# repetitions and items to fit.
#
# Toolchain, offline: .gpu/triton38-utlx.tar.xz (Triton 3.8 + uTLX) is unpacked to /tmp/tlx and put
# first on PYTHONPATH (its sitecustomize registers uTLX); /tmp/stage/fa4.part00 + .gpu/fa4.part01
# (FlashAttention-4) are joined and unpacked to /tmp/fa4. The repo's packages are not installed
# (no hatchling offline): their src dirs go on PYTHONPATH (jagflash is a PEP 420 namespace), so
# entry points do not exist and pytest gets `-p jagflash.testing.plugin`. FlexAttention and FA4
# run in a bench worker whose PYTHONPATH drops /tmp/tlx (the host's Triton 3.6 for torch.compile).
#
# Environment knobs: OUT (default /tmp/gpu-out), PYTHON (python3), GPU_SH_LIMIT_S (560),
# TESTS_TIMEOUT_S (300: every GPU test, 4 xdist workers, ran ~240 s in session 8), TESTS_PATHS (core variants), TESTS_K (a pytest -k), TESTS_MAXFAIL (20; a
# small one lets pytest print its failures before the timeout), TLX_TESTS_K (a pytest -k for tlx-tests),
# TESTS_SHARD / TLX_TESTS_SHARD (I/N: the I-th of N round-robin shares, the testing plugin's
# --shard: the whole GPU suite ran ~13 minutes serially, more than one call), TESTS_WORKERS (4:
# pytest-xdist processes for both test steps; 0: serial),
# TLX_TESTS_TIMEOUT_S (220)
# PROBE, PROBE_ARGS (its arguments, split on spaces), PROBE_TIMEOUT_S (180), DEMO_TIMEOUT_S (60), JAGFLASH_GIT_COMMIT
# (the commit to record).

set -u
START=$(date +%s)
LIMIT=${GPU_SH_LIMIT_S:-560}
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/gpu-out}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
mkdir -p "$OUT"

steps=()
bench_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --) shift; bench_args=("$@"); break ;;
        ceilings|tlx-tests|tests|demo|sanitize|recsys|schedule-ab|probe|ncu|graph-bench|bench) steps+=("$1"); shift ;;
        *) echo "gpu.sh: unknown step '$1' (steps: ceilings tlx-tests tests demo sanitize recsys schedule-ab probe ncu graph-bench bench; bench args after --)" >&2; exit 2 ;;
    esac
done
[ ${#steps[@]} -eq 0 ] && steps=(ceilings tests demo bench)

elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( LIMIT - $(date +%s) + START )); }
log() { echo "[gpu.sh $(elapsed)s] $*"; }

# ------------------------------------------------------------------------- toolchain
TLX_DIR=""
if [ -f .gpu/triton38-utlx.tar.xz ]; then
    mkdir -p /tmp/tlx
    log "unpacking .gpu/triton38-utlx.tar.xz -> /tmp/tlx"
    tar -xf .gpu/triton38-utlx.tar.xz -C /tmp/tlx || log "WARNING: unpacking the TLX bundle failed"
    # The bundle's root is the directory that holds triton/ (the tarball may nest it).
    found=$(find /tmp/tlx -maxdepth 4 -path '*/triton/__init__.py' -print -quit 2>/dev/null)
    [ -n "$found" ] && TLX_DIR=$(dirname "$(dirname "$found")")
    log "TLX bundle root: ${TLX_DIR:-not found}"
elif [ -f /tmp/tlx/triton/__init__.py ]; then
    TLX_DIR=/tmp/tlx  # unpacked by an earlier call on this (still warm) machine
    log "TLX bundle already unpacked at /tmp/tlx"
else
    log "no .gpu/triton38-utlx.tar.xz: the host's Triton only (no TLX providers)"
fi

FA4_DIR=""
if [ -f /tmp/stage/fa4.part00 ] && [ -f .gpu/fa4.part01 ]; then
    mkdir -p /tmp/fa4
    log "joining /tmp/stage/fa4.part00 + .gpu/fa4.part01 -> /tmp/fa4"
    cat /tmp/stage/fa4.part00 .gpu/fa4.part01 > /tmp/fa4.archive
    "$PY" - <<'EOF' || log "WARNING: unpacking FA4 failed"
import tarfile, zipfile
path = "/tmp/fa4.archive"
if tarfile.is_tarfile(path):
    with tarfile.open(path, "r:*") as t:
        t.extractall("/tmp/fa4")
elif zipfile.is_zipfile(path):
    with zipfile.ZipFile(path) as z:
        z.extractall("/tmp/fa4")
else:
    raise SystemExit("fa4 archive is neither tar nor zip")
EOF
    rm -f /tmp/fa4.archive
fi
if [ -d /tmp/fa4 ]; then  # unpacked just now, or by an earlier call on this (still warm) machine
    found=$(find /tmp/fa4 -maxdepth 5 -path '*/flash_attn/cute/interface.py' -print -quit 2>/dev/null)
    [ -n "$found" ] && FA4_DIR=$(dirname "$(dirname "$(dirname "$found")")")
    log "FA4 root: ${FA4_DIR:-not found}"
fi

SRC="$ROOT/core/src:$ROOT/testing/src"
for d in "$ROOT"/variants/*/src; do [ -d "$d" ] && SRC="$SRC:$d"; done
SRC="$SRC:$ROOT/compat/src:$ROOT/bench/src"
PP="$SRC"
[ -n "$FA4_DIR" ] && PP="$FA4_DIR:$PP"
# The CUTLASS DSL (module `cutlass`, which flash_attn.cute imports) sits one level down.
[ -n "$FA4_DIR" ] && [ -d "$FA4_DIR/nvidia_cutlass_dsl/dsl_packages" ] && PP="$FA4_DIR/nvidia_cutlass_dsl/dsl_packages:$PP"
[ -n "$TLX_DIR" ] && PP="$TLX_DIR:$PP"
export PYTHONPATH="$PP${PYTHONPATH:+:$PYTHONPATH}"
export JAGFLASH_TLX_PATHS=/tmp/tlx
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
# The device copy's .git may lag the working tree it was sent with: a commit written to
# .gpu/commit here (`git describe --always --dirty --abbrev=12 > .gpu/commit`, carried along)
# wins over what git says there.
if [ -z "${JAGFLASH_GIT_COMMIT:-}" ] && [ -s .gpu/commit ]; then
    JAGFLASH_GIT_COMMIT=$(head -c 64 .gpu/commit | tr -d '\n')
fi
if [ -z "${JAGFLASH_GIT_COMMIT:-}" ]; then
    JAGFLASH_GIT_COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
fi
export JAGFLASH_GIT_COMMIT
log "PYTHONPATH=$PYTHONPATH"
log "commit $JAGFLASH_GIT_COMMIT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
    --format=csv 2>&1 | tee "$OUT/nvidia-smi.log"

# ----------------------------------------------------------------------------- steps
declare -A RC
declare -A SECS

run_step() {  # name timeout_s command...
    local name=$1 t=$2; shift 2
    local t0; t0=$(date +%s)
    log "== $name (timeout ${t}s): $*"
    # SIGINT first: pytest then stops like at Ctrl-C and still prints its summary and the
    # --durations table (a test step cut by its timeout used to return only dots).
    timeout -s INT -k 15 "$t" "$@" 2>&1 | tee "$OUT/$name.log"
    RC[$name]=${PIPESTATUS[0]}
    SECS[$name]=$(( $(date +%s) - t0 ))
    log "== $name: exit ${RC[$name]} after ${SECS[$name]}s"
}

has_step() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

cap() {  # min(wanted, time left - reserve), at least 10
    local want=$1 reserve=$2 l; l=$(left)
    local t=$(( l - reserve ))
    [ "$t" -gt "$want" ] && t=$want
    [ "$t" -lt 10 ] && t=10
    echo "$t"
}

bench_reserve=0
has_step bench && bench_reserve=150   # what the later steps leave the bench at least

if has_step ceilings; then
    run_step ceilings "$(cap 60 "$bench_reserve")" "$PY" -m jagflash.bench --ceilings
fi
# Without installed distributions there is no pytest11 entry point: load the plugin by name
# (but not twice where the testing distribution is installed, pytest refuses that).
plugin=(-p jagflash.testing.plugin)
if "$PY" -c "import importlib.metadata as m, sys; sys.exit(not any(e.value.startswith('jagflash.testing') for e in m.entry_points(group='pytest11')))" 2>/dev/null; then
    plugin=()
fi
# The GPU image has pytest-xdist: the suites run in TESTS_WORKERS processes (default 4, 0: one),
# most of their time being Triton compiles, which run in parallel on the host's cores (the
# kernels themselves are small; Triton's on-disk cache is shared between the workers).
xdist=()
if [ "${TESTS_WORKERS:-4}" != 0 ] && "$PY" -c "import xdist" 2>/dev/null; then
    xdist=(-n "${TESTS_WORKERS:-4}")
fi
TLX_TESTS=variants/jagged/tests/test_tlx_sm90.py
if has_step tlx-tests; then  # the TLX kernels' own tests first: they decide the next step
    run_step tlx-tests "$(cap "${TLX_TESTS_TIMEOUT_S:-220}" "$bench_reserve")" \
        "$PY" -m pytest ${plugin[@]+"${plugin[@]}"} ${xdist[@]+"${xdist[@]}"} -m sm90 --maxfail=40 -q -p no:cacheprovider -rf --durations=15 ${TLX_TESTS_K:+-k "$TLX_TESTS_K"} ${TLX_TESTS_SHARD:+--shard "$TLX_TESTS_SHARD"} "$TLX_TESTS"
fi
if has_step tests; then
    ignore=()
    has_step tlx-tests && ignore=(--ignore "$TLX_TESTS")
    run_step tests "$(cap "${TESTS_TIMEOUT_S:-300}" "$bench_reserve")" \
        "$PY" -m pytest ${plugin[@]+"${plugin[@]}"} ${xdist[@]+"${xdist[@]}"} -m "gpu or sm90" --maxfail="${TESTS_MAXFAIL:-20}" -q -p no:cacheprovider -rf --durations=15 ${TESTS_K:+-k "$TESTS_K"} ${TESTS_SHARD:+--shard "$TESTS_SHARD"} ${ignore[@]+"${ignore[@]}"} ${TESTS_PATHS:-core variants}
fi
if has_step recsys; then
    run_step recsys "$(cap "${RECSYS_TIMEOUT_S:-300}" "$bench_reserve")" "$PY" docs/examples/recsys/train_gpu.py --out "$OUT/recsys"
fi
if has_step demo; then
    run_step demo "$(cap "${DEMO_TIMEOUT_S:-60}" "$bench_reserve")" "$PY" -m jagflash.variants.jagged.demo
fi
if has_step sanitize; then  # compute-sanitizer over every TLX path the backends pick (#19)
    CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    # The warm-up fills Triton's cache in SANITIZE_WARM_PARTS processes (every N-th case each:
    # one process compiles its ~40 kernels one after another), then the tools run side by side
    # (each its own process and CUDA context; SANITIZE_PARALLEL=0: one after another).
    parts=${SANITIZE_WARM_PARTS:-8}
    run_step sanitize-warm "$(cap 240 "$bench_reserve")" bash -c \
        "fail=0; for i in \$(seq 0 $((parts - 1))); do '$PY' bench/probes/sanitize_case.py --part \$i/$parts & done; for p in \$(jobs -p); do wait \$p || fail=1; done; exit \$fail"
    logs=()
    tools=${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}
    if [ "${SANITIZE_PARALLEL:-1}" = 1 ]; then
        t=$(cap "${SANITIZE_TIMEOUT_S:-150}" "$bench_reserve")
        t0=$(date +%s)
        log "== sanitize tools side by side (timeout ${t}s each): $tools"
        for tool in $tools; do
            ( timeout -s INT -k 15 "$t" "$CS" --tool "$tool" --print-limit 2000 "$PY" bench/probes/sanitize_case.py \
                > "$OUT/sanitize-$tool.log" 2>&1; echo $? > "$OUT/sanitize-$tool.rc" ) &
            logs+=("$OUT/sanitize-$tool.log")
        done
        wait
        for tool in $tools; do
            RC[sanitize-$tool]=$(cat "$OUT/sanitize-$tool.rc" 2>/dev/null || echo 1)
            SECS[sanitize-$tool]=$(( $(date +%s) - t0 ))
            rm -f "$OUT/sanitize-$tool.rc"
            log "== sanitize-$tool: exit ${RC[sanitize-$tool]}"
        done
    else
        for tool in $tools; do
            run_step "sanitize-$tool" "$(cap "${SANITIZE_TIMEOUT_S:-150}" "$bench_reserve")" \
                "$CS" --tool "$tool" --print-limit 2000 "$PY" bench/probes/sanitize_case.py
            logs+=("$OUT/sanitize-$tool.log")
        done
    fi
    run_step sanitize 30 "$PY" bench/probes/sanitize_summary.py "${logs[@]}"
fi
if has_step schedule-ab; then  # plan build time, portable kernels with each schedule (bench/probes/schedule_ab.py)
    run_step schedule-ab "$(cap 200 "$bench_reserve")" bash -c \
        "'$PY' bench/probes/schedule_ab.py plan-time && '$PY' bench/probes/schedule_ab.py kernels --reps 50"
fi
if has_step probe; then  # a measurement script of bench/probes/: PROBE=bench/probes/<name>.py
    if [ -n "${PROBE:-}" ]; then
        run_step probe "$(cap "${PROBE_TIMEOUT_S:-180}" "$bench_reserve")" "$PY" "$PROBE" ${PROBE_ARGS:-}
    else
        log "== probe: no PROBE given (PROBE=bench/probes/<name>.py; see ls bench/probes)"
        RC[probe]=2; SECS[probe]=0
    fi
fi
if has_step ncu; then  # Nsight Compute on one launch of bench/probes/probe_ncu.py's kernel (NCU_ARGS)
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    NCU_REPS=$(echo "${NCU_ARGS:-}" | sed -n 's/.*--reps \([0-9]*\).*/\1/p'); NCU_REPS=${NCU_REPS:-3}
    case " ${NCU_ARGS:-} " in *" --kernel fwd "*) NCU_KERNEL=${NCU_KERNEL:-_fwd_kernel} ;; esac
    NCU_ENV=""; [ "${NCU_CACHE:-0}" = 1 ] && NCU_ENV="TRITON_CACHE_DIR='$OUT/triton-cache'"
    run_step ncu "$(cap "${NCU_TIMEOUT_S:-240}" "$bench_reserve")" bash -c "
        $NCU_ENV '$NCU' --clock-control none --kernel-name regex:'${NCU_KERNEL:-_dkdv_kernel}' \
            --launch-skip $((NCU_REPS - 1)) --launch-count 1 --import-source no \
            --section SpeedOfLight --section WarpStateStats --section SourceCounters \
            --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
            -f -o '$OUT/ncu-report' '$PY' bench/probes/probe_ncu.py ${NCU_ARGS:-} &&
        '$NCU' --import '$OUT/ncu-report.ncu-rep' --page details > '$OUT/ncu-details.txt' 2>&1;
        '$NCU' --import '$OUT/ncu-report.ncu-rep' --page source --csv --print-source sass > '$OUT/ncu-sass.csv' 2>&1;
        head -c 20000 '$OUT/ncu-details.txt';
        '$PY' bench/probes/probe_ncu.py --summarize '$OUT/ncu-sass.csv';
        rm -f '$OUT/ncu-report.ncu-rep';
        if [ -d '$OUT/triton-cache' ]; then find '$OUT/triton-cache' -type f ! -name '*.cubin' -delete; fi"  # (its exports stay; the report itself may outgrow what comes back)
fi
if has_step graph-bench; then  # the small rows again, replayed in CUDA graphs (what a serving loop sees)
    gb=$(cap "${GRAPH_BENCH_TIMEOUT_S:-150}" "$bench_reserve")
    run_step graph-bench "$gb" "$PY" -m jagflash.bench --out "$OUT/bench-graph" --budget-s $(( gb - 20 )) \
        --cuda-graphs --graph-below-ms "${GRAPH_BELOW_MS:-5.0}" --workloads "${GRAPH_WORKLOADS:-bq-*}" \
        --providers "${GRAPH_PROVIDERS:-jagflash-tlx,fa4-expand-q,expand-q-varlen}"
fi
if has_step bench; then
    budget=$(( $(left) - 45 ))
    [ "$budget" -lt 60 ] && budget=60
    run_step bench $(( budget + 30 )) "$PY" -m jagflash.bench --out "$OUT/bench" --budget-s "$budget" \
        ${bench_args[@]+"${bench_args[@]}"}
    if [ ! -s "$OUT/bench/summary.txt" ] || [ "$OUT/bench/summary.txt" -ot "$OUT/bench/rows.jsonl" ]; then
        log "bench ended before its report: rebuilding it from rows.jsonl"
        timeout 60 "$PY" -m jagflash.bench --report-only "$OUT/bench" > "$OUT/bench-report.log" 2>&1
    fi
fi

# --------------------------------------------------------------------------- summary
echo
echo "================================ gpu.sh summary ($(elapsed)s) ================================"
for s in "${steps[@]}"; do
    echo "  $s: exit ${RC[$s]:-?} in ${SECS[$s]:-?}s  (log: $OUT/$s.log)"
done
if has_step ceilings; then
    grep -h "ceilings:" "$OUT/ceilings.log" 2>/dev/null | tail -1
fi
if has_step tlx-tests; then
    echo "-- tlx-tests (tail):"
    grep -E "^(FAILED|ERROR)" "$OUT/tlx-tests.log" 2>/dev/null | tail -20
    tail -n 1 "$OUT/tlx-tests.log" 2>/dev/null
fi
if has_step sanitize; then
    echo "-- sanitize:"
    cat "$OUT/sanitize.log" 2>/dev/null | head -40
fi
if has_step tests; then
    echo "-- tests (tail):"
    grep -E "^(FAILED|ERROR)" "$OUT/tests.log" 2>/dev/null | tail -10
    tail -n 1 "$OUT/tests.log" 2>/dev/null
fi
if has_step demo; then
    echo "-- demo (tail):"
    tail -n 8 "$OUT/demo.log" 2>/dev/null
fi
if has_step graph-bench; then
    echo "-- graph-bench: $OUT/bench-graph/results.md"
    cat "$OUT/bench-graph/summary.txt" 2>/dev/null || echo "(no graph-bench summary)"
fi
if has_step bench; then
    echo "-- bench: $OUT/bench/results.md, results.csv, tflops_*.png"
    cat "$OUT/bench/summary.txt" 2>/dev/null || echo "(no bench summary)"
fi

# The device tool brings back at most 8 files: pack everything into one archive.
( cd "$OUT" && tar -czf /tmp/gpu-out.tgz --exclude=gpu-out.tgz . && find . -mindepth 1 -delete && mv /tmp/gpu-out.tgz . ) \
    && echo "[gpu.sh] everything written is in $OUT/gpu-out.tgz"
