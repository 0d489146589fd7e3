#!/bin/sh
# Side-by-side training-step benchmark: partrain's bench_step and the PyTorch
# peer (../shared/peers/pytorch_gpt_bench.py, --mode single) on the same
# configs and thread counts, run ALTERNATELY for several rounds (the machine is
# shared and noisy: interleaving spreads the noise over both systems; the
# order within a pair flips every round). Per system and row: the median over
# rounds of each run's median step. Prints a table and one JSON line per row.
#
#   bench/run_step_bench.sh [--rounds R] [--warmup W] [--steps S]
#                           [--configs "tiny small gpt2"] [--threads "1 2"]
#                           [--precisions "fp32 bf16"] [--out FILE]
#   bench/step_bench_report.py FILE      (the table again from a run's FILE)
#   bench/bf16_step_report.py FILE       (bf16 against fp32, both systems)
#
# --precisions: each run in each precision (bench_step --precision, the
# peer's --precision: torch.autocast for bf16), the four runs of a row in
# one round one after another. OPENBLAS_CORETYPE, when set, reaches both.
#
# Builds bench_step in build-bench/ if needed (BENCH_STEP=path overrides).
# Every raw result line goes to FILE (default build-bench/step_bench.jsonl).
set -eu

ROUNDS=3 WARMUP=3 STEPS=10 CONFIGS="tiny small gpt2" THREADS="1 2" PRECISIONS=fp32 OUT=""
while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --configs) CONFIGS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --precisions) PRECISIONS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "run_step_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done

ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
SHARED="$ROOT/../shared"
PEER=${BENCH_PEER:-$SHARED/peers/pytorch_gpt_bench.py} # BENCH_PEER: another checkout's shared/
PY=/usr/bin/python3
[ -f "$PEER" ] || { echo "run_step_bench.sh: peer not found at $PEER" >&2; exit 1; }
BENCH=${BENCH_STEP:-$ROOT/build-bench/bench/bench_step}
if [ -z "${BENCH_STEP:-}" ]; then
    cmake -S "$ROOT" -B "$ROOT/build-bench" >/dev/null
    cmake --build "$ROOT/build-bench" --target bench_step -j2 >/dev/null
fi
OUT=${OUT:-$ROOT/build-bench/step_bench.jsonl}
: >"$OUT"

# Both sides must use OpenBLAS (the peer's torch takes whatever libblas.so.3 is selected).
BLAS=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo unknown)
case "$BLAS" in
*openblas*) ;;
*) echo "run_step_bench.sh: WARNING: libblas.so.3 is $BLAS, not OpenBLAS: PyTorch will be slow" >&2 ;;
esac
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs"
echo "# partrain $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- src include || echo '+dirty'), libblas.so.3 -> $BLAS"
echo "# rounds $ROUNDS, warm-up $WARMUP, timed steps $STEPS per run, precisions $PRECISIONS, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-auto}; load average at start: $(cut -d" " -f1-3 /proc/loadavg)"

# Each raw line gets the round and the 1-minute load average before the run.
load1() { cut -d' ' -f1 /proc/loadavg; }
run_partrain() { # config threads round precision
    l=$(load1)
    "$BENCH" --config "$1" --threads "$2" --warmup "$WARMUP" --steps "$STEPS" --precision "$4" --json |
        sed "s/^{/{\"round\": $3, \"load1\": $l, /" >>"$OUT"
}
# The peer's torch.set_num_threads(N) sets torch's own (OpenMP) threads but not
# OpenBLAS's pthreads, which default to every core: at --threads 1 its matrix
# products would run on 2 cores (measured: user+sys 12 s in 9 s wall, small
# 1.15 s/step; with OPENBLAS_NUM_THREADS=1, 1.77 s/step). Both sides get N cores.
run_pytorch() { # config threads round precision
    l=$(load1)
    OPENBLAS_NUM_THREADS=$2 BENCH_BLAS_LABEL="openblas OPENBLAS_NUM_THREADS=$2" \
        "$PY" "$PEER" --config "$1" --mode single --threads "$2" --warmup "$WARMUP" \
        --steps "$STEPS" --precision "$4" |
        sed -n "s/^RESULT {/{\"system\": \"pytorch\", \"round\": $3, \"load1\": $l, \"threads\": $2, /p" \
            >>"$OUT"
}

r=1
while [ "$r" -le "$ROUNDS" ]; do
    for c in $CONFIGS; do
        for t in $THREADS; do
            for p in $PRECISIONS; do
                echo "# round $r: $c, $t thread(s), $p" >&2
                if [ $((r % 2)) -eq 1 ]; then
                    run_partrain "$c" "$t" "$r" "$p"
                    run_pytorch "$c" "$t" "$r" "$p"
                else
                    run_pytorch "$c" "$t" "$r" "$p"
                    run_partrain "$c" "$t" "$r" "$p"
                fi
            done
        done
    done
    r=$((r + 1))
done
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

"$PY" "$ROOT/bench/step_bench_report.py" "$OUT"
case "$PRECISIONS" in *bf16*) "$PY" "$ROOT/bench/bf16_step_report.py" "$OUT" ;; esac
