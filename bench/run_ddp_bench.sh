#!/bin/sh
# Data-parallel training throughput, side by side: partrain at dp=2 (shm
# launcher, 1 thread per rank) and PyTorch DDP (gloo, 2 processes, 1 thread
# each; ../shared/peers/pytorch_gpt_bench.py --mode ddp), the same model
# (tiny / small of the peer: L, C, NH, V 256, T 256) and the same work: per
# rank batch 8, global batch 16, one optimizer step (AdamW) per step.
# partrain trains on the real default dataset (data/fortunes/train.txt,
# byte-level, vocab 256); the peer on random tokens: the step's work does not
# depend on the token values. Runs ALTERNATE for several rounds (the machine
# is shared and noisy), the order flipping every round. Per run: the median
# step time over the timed steps (after warm-up); per system: the median over
# rounds. Prints a table and one JSON line per config.
#
#   bench/run_ddp_bench.sh [--rounds R] [--warmup W] [--steps S] [--configs "tiny small"]
#
# PARTRAIN=path overrides the binary (default: build-dp/src/cli/partrain, built if missing).
set -eu
ROUNDS=3 WARMUP=3 STEPS=10 CONFIGS="tiny small"
while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --configs) CONFIGS=$2; shift 2 ;;
    -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "run_ddp_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
SHARED="$ROOT/../shared"
PEER="$SHARED/peers/pytorch_gpt_bench.py"
[ -f "$PEER" ] || { echo "run_ddp_bench.sh: peer not found at $PEER" >&2; exit 1; }
BIN=${PARTRAIN:-$ROOT/build-dp/src/cli/partrain}
if [ -z "${PARTRAIN:-}" ]; then
    cmake -S "$ROOT" -B "$ROOT/build-dp" >/dev/null
    cmake --build "$ROOT/build-dp" --target partrain -j2 >/dev/null
fi
DATA="$ROOT/data/fortunes/train.txt"
[ -f "$DATA" ] || { echo "run_ddp_bench.sh: $DATA missing (scripts/prepare-data.sh)" >&2; exit 1; }
TMP=$(mktemp -d /tmp/pt-ddp-bench-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, partrain $(git -C "$ROOT" rev-parse --short HEAD), rounds $ROUNDS, warm-up $WARMUP, timed $STEPS; load at start $(cut -d' ' -f1-3 /proc/loadavg)"

shape() { # config -> "L C NH"
    case "$1" in tiny) echo "4 256 8" ;; small) echo "6 384 6" ;; *) echo "unknown config $1" >&2; exit 2 ;; esac
}
run_partrain() { # config round
    set -- "$1" "$2" $(shape "$1")
    "$BIN" train --set model.n_layer=$3 --set model.n_embd=$4 --set model.n_head=$5 \
        --set model.vocab_size=256 --set model.seq_len=256 --set train.batch_size=16 \
        --set train.steps=$((WARMUP + STEPS)) --set train.warmup_steps=0 --set train.lr=3e-4 \
        --set train.threads=1 --set parallel.dp=2 --nproc 2 --set data.train="$DATA" \
        --set log.metrics="$TMP/p_$1_$2.jsonl" >/dev/null 2>&1
    python3 - "$TMP/p_$1_$2.jsonl" "$WARMUP" <<'PY' >>"$TMP/partrain_$1"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows = [r for r in rows if "step_ms" in r][int(sys.argv[2]):]
print(statistics.median(r["step_ms"] for r in rows))
PY
}
# The peer's torch.set_num_threads(1) does not limit OpenBLAS's own pthreads,
# which default to every core: without OPENBLAS_NUM_THREADS=1 each rank's
# sgemm would run on 2 threads (4 on 2 cores in all), not "1 thread each".
# Same fix as bench/run_step_bench.sh.
run_peer() { # config round
    OPENBLAS_NUM_THREADS=1 BENCH_BLAS_LABEL="openblas OPENBLAS_NUM_THREADS=1" /usr/bin/python3 "$PEER" --config "$1" --mode ddp --world 2 --threads 1 --warmup "$WARMUP" \
        --steps "$STEPS" --port $((29600 + $2)) 2>/dev/null | sed -n 's/^RESULT //p' |
        python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print(r["step_ms_median"])' \
        >>"$TMP/peer_$1"
}
printf "%-6s %14s %14s %12s %12s %7s\n" config partrain_ms pytorch_ms partrain_tok/s pytorch_tok/s ratio
for cfg in $CONFIGS; do
    r=1
    while [ $r -le "$ROUNDS" ]; do
        if [ $((r % 2)) = 1 ]; then run_partrain "$cfg" "$r"; run_peer "$cfg" "$r"; else run_peer "$cfg" "$r"; run_partrain "$cfg" "$r"; fi
        r=$((r + 1))
    done
    python3 - "$cfg" "$TMP/partrain_$cfg" "$TMP/peer_$cfg" <<'PY'
import json, statistics, sys
cfg, a, b = sys.argv[1], [float(x) for x in open(sys.argv[2])], [float(x) for x in open(sys.argv[3])]
pa, pb = statistics.median(a), statistics.median(b)
tok = 16 * 256
print("%-6s %14.1f %14.1f %12.0f %12.0f %6.2fx" % (cfg, pa, pb, tok / pa * 1e3, tok / pb * 1e3, pb / pa))
print(json.dumps({"bench": "ddp", "config": cfg, "world": 2, "threads_per_rank": 1, "global_batch": 16,
                  "partrain_step_ms": pa, "pytorch_step_ms": pb, "partrain_runs": a, "pytorch_runs": b,
                  "partrain_tokens_per_s": tok / pa * 1e3, "pytorch_tokens_per_s": tok / pb * 1e3,
                  "ratio": pb / pa}))
PY
done
