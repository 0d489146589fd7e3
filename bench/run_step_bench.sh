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
#                           [--out FILE]
#
# Builds bench_step in build-bench/ if needed (BENCH_STEP=path overrides).
# Every raw result line goes to FILE (default build-bench/step_bench.jsonl).
set -eu

ROUNDS=3 WARMUP=3 STEPS=10 CONFIGS="tiny small gpt2" THREADS="1 2" OUT=""
while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --configs) CONFIGS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "run_step_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done

ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
SHARED="$ROOT/../shared"
PEER="$SHARED/peers/pytorch_gpt_bench.py"
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
echo "# rounds $ROUNDS, warm-up $WARMUP, timed steps $STEPS per run; load average at start: $(cut -d" " -f1-3 /proc/loadavg)"

run_partrain() { # config threads round
    "$BENCH" --config "$1" --threads "$2" --warmup "$WARMUP" --steps "$STEPS" --json |
        sed "s/^{/{\"round\": $3, /" >>"$OUT"
}
run_pytorch() { # config threads round
    "$PY" "$PEER" --config "$1" --mode single --threads "$2" --warmup "$WARMUP" --steps "$STEPS" |
        sed -n "s/^RESULT {/{\"system\": \"pytorch\", \"round\": $3, \"threads\": $2, /p" >>"$OUT"
}

r=1
while [ "$r" -le "$ROUNDS" ]; do
    for c in $CONFIGS; do
        for t in $THREADS; do
            echo "# round $r: $c, $t thread(s)" >&2
            if [ $((r % 2)) -eq 1 ]; then
                run_partrain "$c" "$t" "$r"
                run_pytorch "$c" "$t" "$r"
            else
                run_pytorch "$c" "$t" "$r"
                run_partrain "$c" "$t" "$r"
            fi
        done
    done
    r=$((r + 1))
done
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

"$PY" - "$OUT" <<'EOF'
import json, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in rows:
    if r.get("status", "ok") != "ok":
        sys.exit("pytorch run failed: %s" % r.get("error"))


def flops(L, C, V, T, B, n_params):
    # Same count as bench_step.c: 6 x non-embedding params x tokens, LM head,
    # attention over the FULL T x T (what PyTorch computes).
    N = B * T
    return 6.0 * (n_params - V * C - T * C) * N + 6.0 * N * C * V + 12.0 * L * B * T * T * C


keys = []
for r in rows:
    k = (r["config"], r["threads"])
    if k not in keys:
        keys.append(k)
print("%-6s %3s %11s %11s %8s %12s %9s %9s %12s" % (
    "config", "thr", "partrain_ms", "pytorch_ms", "speedup", "round_ratios", "pt_GFLOPs",
    "torch_GFLOPs", "%sgemm_peak"))
out = []
for cfg, thr in keys:
    pa = [r for r in rows if r["system"] == "partrain" and (r["config"], r["threads"]) == (cfg, thr)]
    py = [r for r in rows if r["system"] == "pytorch" and (r["config"], r["threads"]) == (cfg, thr)]
    if not pa or not py:
        continue
    p0, q0 = pa[0], py[0]
    # Same work: the same parameter count and the same FLOPs per step.
    fq = flops(q0["n_layer"], q0["n_embd"], q0["vocab"], q0["T"], q0["B_per_rank"], q0["n_params"])
    same = p0["n_params"] == q0["n_params"] and abs(fq - p0["flops_per_step"]) <= 1e-6 * fq
    if not same:
        print("# MISMATCH %s: params partrain %d pytorch %d, FLOPs %.6e vs %.6e" % (
            cfg, p0["n_params"], q0["n_params"], p0["flops_per_step"], fq))
    pms = statistics.median(r["step_ms_median"] for r in pa)
    qms = statistics.median(r["step_ms_median"] for r in py)
    ratios = sorted(q["step_ms_median"] / p["step_ms_median"]
                    for p in pa for q in py if p["round"] == q["round"])
    peak = statistics.median(r["sgemm_peak_gflops"] for r in pa)
    gf = p0["flops_per_step"] / (pms / 1e3) / 1e9
    qgf = fq / (qms / 1e3) / 1e9
    row = {"config": cfg, "threads": thr, "n_params_partrain": p0["n_params"],
           "n_params_pytorch": q0["n_params"], "flops_per_step": p0["flops_per_step"],
           "same_work": same, "rounds": len(ratios), "partrain_ms": round(pms, 1),
           "pytorch_ms": round(qms, 1), "speedup": round(qms / pms, 3),
           "round_ratios": [round(x, 2) for x in ratios],
           "partrain_tokens_per_s": round(p0["B"] * p0["T"] / (pms / 1e3), 1),
           "pytorch_tokens_per_s": round(q0["B_per_rank"] * q0["T"] / (qms / 1e3), 1),
           "partrain_gflops": round(gf, 1), "pytorch_gflops": round(qgf, 1),
           "sgemm_peak_gflops": round(peak, 1), "partrain_peak_fraction": round(gf / peak, 3),
           "pytorch_peak_fraction": round(qgf / peak, 3)}
    out.append(row)
    rr = "%.2f-%.2f" % (ratios[0], ratios[-1]) if ratios else "-"
    print("%-6s %3d %11.1f %11.1f %7.2fx %12s %9.1f %9.1f %8.1f%% of %.0f" % (
        cfg, thr, pms, qms, qms / pms, rr, gf, qgf, 100 * gf / peak, peak))
print("# params (partrain = pytorch): " + ", ".join(
    "%s %d%s" % (r["config"], r["n_params_partrain"],
                 "" if r["n_params_partrain"] == r["n_params_pytorch"] else
                 " != %d" % r["n_params_pytorch"])
    for r in out if r["threads"] == out[0]["threads"]))
print("# FLOPs/step (same count for both): " + ", ".join(
    "%s %.2f G" % (r["config"], r["flops_per_step"] / 1e9)
    for r in out if r["threads"] == out[0]["threads"]))
for r in out:
    print("RESULT " + json.dumps(r))
EOF
