#!/bin/sh
# Sharded data parallel (ZeRO), two parts:
#
# 1. Table: partrain at dp = 1, 2, 4 and parallel.zero = 0..3 (the peer's
#    tiny model: L 4, C 256, NH 8, V 256, T 256; global batch 16; 1 thread
#    per rank), per-rank peak bytes by category from the metrics' `mem`
#    (the largest over ranks), bytes sent per rank per step (`comm_bytes`)
#    and the median step time, next to the ZeRO paper's formulas (Psi
#    parameters, fp32 + AdamW: params 4 Psi, grads 4 Psi, optimizer 8 Psi;
#    stage 1 divides the optimizer by N, 2 also the grads, 3 also the params)
#    and the communication theory per rank (all-reduce 2(N-1)/N x 4 Psi;
#    stage 1 + an all-gather = 1.5x; stage 2 reduce-scatter + all-gather =
#    1x; stage 3 two all-gathers + reduce-scatter = 1.5x).
# 2. Side by side: partrain zero=1 dp=2 and PyTorch DDP +
#    ZeroRedundancyOptimizer(AdamW) (gloo, 2 processes, 1 thread each;
#    ../shared/peers/pytorch_gpt_bench.py --mode zero1), the same work (per
#    rank batch 8, global 16, one AdamW step per step), runs alternating for
#    several rounds (order flipping), medians of per-run medians.
#
#   bench/run_zero_bench.sh [--rounds R] [--warmup W] [--steps S] [--layers L] [--no-table] [--no-peer]
#
# --layers L: the table's model depth (default 4, the peer's tiny; deeper
# models show the stage 2 / 3 savings beyond the fixed unit buffers).
#
# PARTRAIN=path overrides the binary (default: build-zero/src/cli/partrain, built if missing).
set -eu
ROUNDS=5 WARMUP=3 STEPS=10 TABLE=1 PEER_RUN=1 LAYERS=4
while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --layers) LAYERS=$2; shift 2 ;;
    --no-table) TABLE=0; shift ;;
    --no-peer) PEER_RUN=0; shift ;;
    -h | --help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "run_zero_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
SHARED="$ROOT/../shared"
PEER="$SHARED/peers/pytorch_gpt_bench.py"
BIN=${PARTRAIN:-$ROOT/build-zero/src/cli/partrain}
if [ -z "${PARTRAIN:-}" ]; then
    cmake -S "$ROOT" -B "$ROOT/build-zero" >/dev/null
    cmake --build "$ROOT/build-zero" --target partrain -j2 >/dev/null
fi
DATA="$ROOT/data/fortunes/train.txt"
[ -f "$DATA" ] || { echo "run_zero_bench.sh: $DATA missing (scripts/prepare-data.sh)" >&2; exit 1; }
TMP=$(mktemp -d /tmp/pt-zero-bench-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, partrain $(git -C "$ROOT" rev-parse --short HEAD), rounds $ROUNDS, warm-up $WARMUP, timed $STEPS; load at start $(cut -d' ' -f1-3 /proc/loadavg)"

run_partrain() { # dp zero metrics-file [layers]
    nproc_arg=""
    [ "$1" -gt 1 ] && nproc_arg="--nproc $1"
    # shellcheck disable=SC2086
    OPENBLAS_NUM_THREADS=1 "$BIN" train --set model.n_layer="${4:-4}" --set model.n_embd=256 --set model.n_head=8 \
        --set model.vocab_size=256 --set model.seq_len=256 --set train.batch_size=16 \
        --set train.steps=$((WARMUP + STEPS)) --set train.warmup_steps=0 --set train.lr=3e-4 \
        --set train.threads=1 --set train.val_every=0 --set parallel.dp="$1" --set parallel.zero="$2" \
        $nproc_arg --set data.train="$DATA" --set log.metrics="$3" >/dev/null 2>&1
}

if [ "$TABLE" = 1 ]; then
    for dp in 1 2 4; do
        for z in 0 1 2 3; do
            [ "$dp" = 1 ] && [ "$z" != 0 ] && continue
            run_partrain "$dp" "$z" "$TMP/t_${dp}_$z.jsonl" "$LAYERS"
        done
    done
    python3 - "$TMP" "$WARMUP" "$LAYERS" <<'PY'
import json, os, statistics, sys
tmp, warm = sys.argv[1], int(sys.argv[2])
L, C, V, T = int(sys.argv[3]), 256, 256, 256
psi = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
print("L = %d, Psi = %d parameters (16 Psi = %.2f MiB)" % (L, psi, 16 * psi / 2**20))
print("%-4s %-5s %9s %9s %9s %9s %9s %9s %9s %9s %10s %10s %8s" % (
    "dp", "zero", "params", "(theory)", "grads", "(theory)", "optim", "(theory)", "p+g+o", "(theory)",
    "comm_MiB", "(theory)", "step_ms"))
MiB = 2**20
for dp in (1, 2, 4):
    for z in range(4):
        f = os.path.join(tmp, "t_%d_%d.jsonl" % (dp, z))
        if not os.path.exists(f):
            continue
        rows = [json.loads(l) for l in open(f)]
        rows = [r for r in rows if "step_ms" in r]
        last = rows[-1]
        mem = last["mem"]
        n = dp
        tp = 4 * psi / (n if z >= 3 else 1)
        tg = 4 * psi / (n if z >= 2 else 1)
        to = 8 * psi / (n if z >= 1 else 1)
        ar = 2 * (n - 1) / n * 4 * psi
        tc = {0: ar, 1: 1.5 * ar, 2: ar, 3: 1.5 * ar}[z] if n > 1 else 0
        step = statistics.median(r["step_ms"] for r in rows[warm:])
        pgo = mem["params"] + mem["grads"] + mem["optim"]
        print("%-4d %-5d %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %10.2f %10.2f %8.1f" % (
            dp, z, mem["params"] / MiB, tp / MiB, mem["grads"] / MiB, tg / MiB, mem["optim"] / MiB,
            to / MiB, pgo / MiB, (tp + tg + to) / MiB, last["comm_bytes"] / MiB, tc / MiB, step))
        print(json.dumps({"bench": "zero_table", "layers": L, "dp": dp, "zero": z, "psi": psi, "mem": mem,
                          "comm_bytes": last["comm_bytes"], "comm_theory": tc, "step_ms": step}),
              file=sys.stderr)
PY
fi

[ "$PEER_RUN" = 1 ] || exit 0
[ -f "$PEER" ] || { echo "run_zero_bench.sh: peer not found at $PEER" >&2; exit 1; }
run_p() { # round
    run_partrain 2 1 "$TMP/p_$1.jsonl"
    python3 - "$TMP/p_$1.jsonl" "$WARMUP" <<'PY' >>"$TMP/partrain"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows = [r for r in rows if "step_ms" in r][int(sys.argv[2]):]
print(statistics.median(r["step_ms"] for r in rows))
PY
}
# OPENBLAS_NUM_THREADS=1: torch.set_num_threads does not limit OpenBLAS's
# own threads (bench/run_ddp_bench.sh).
run_peer() { # round
    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 "$PEER" --config tiny --mode zero1 --world 2 --threads 1 \
        --warmup "$WARMUP" --steps "$STEPS" --port $((29700 + $1)) 2>/dev/null | sed -n 's/^RESULT //p' |
        python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print(r["step_ms_median"])' \
        >>"$TMP/peer"
}
r=1
while [ $r -le "$ROUNDS" ]; do
    if [ $((r % 2)) = 1 ]; then run_p "$r"; run_peer "$r"; else run_peer "$r"; run_p "$r"; fi
    r=$((r + 1))
done
python3 - "$TMP/partrain" "$TMP/peer" <<'PY'
import json, statistics, sys
a, b = [float(x) for x in open(sys.argv[1])], [float(x) for x in open(sys.argv[2])]
pa, pb = statistics.median(a), statistics.median(b)
tok = 16 * 256
print("%-22s %12s %12s %14s %14s %7s" % ("zero1 dp2 (tiny)", "partrain_ms", "pytorch_ms", "partrain_tok/s", "pytorch_tok/s", "ratio"))
print("%-22s %12.1f %12.1f %14.0f %14.0f %6.2fx" % ("", pa, pb, tok / pa * 1e3, tok / pb * 1e3, pb / pa))
print(json.dumps({"bench": "zero1", "config": "tiny", "world": 2, "threads_per_rank": 1, "global_batch": 16,
                  "partrain_step_ms": pa, "pytorch_step_ms": pb, "partrain_runs": a, "pytorch_runs": b,
                  "partrain_tokens_per_s": tok / pa * 1e3, "pytorch_tokens_per_s": tok / pb * 1e3,
                  "ratio": pb / pa}))
PY
