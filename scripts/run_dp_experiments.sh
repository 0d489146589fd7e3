#!/usr/bin/env bash
# Data-parallel experiments of bench/results/history-parallel.md: on the default dataset
# (configs/default.json; scripts/prepare-data.sh), dp=2 with 1 thread per
# rank, the same steps (so the same tokens) for each synchronization mode,
# then exposed communication with overlap on and off. Metrics land in
# runs/dp/<name>.jsonl; scripts/plot_dp.py draws the SVG plots from them.
#
# Usage: scripts/run_dp_experiments.sh [STEPS] [PARTS]   (default 300, "modes overlap")
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
BIN=${PARTRAIN:-build-dp/src/cli/partrain}
if [ -z "${PARTRAIN:-}" ]; then
    cmake -S . -B build-dp -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build build-dp --target partrain -j2 >/dev/null
fi
# run() keeps only the val-loss lines of the output: a missing binary would
# otherwise leave nothing but stale metrics behind.
[ -x "$BIN" ] || { echo "run_dp_experiments.sh: $BIN not found (set PARTRAIN)" >&2; exit 1; }
STEPS=${1:-300}
PARTS=${2:-modes overlap}
OUT=runs/dp
mkdir -p "$OUT"
common=(--config configs/default.json --set parallel.dp=2 --nproc 2 --set train.threads=1
        --set train.steps="$STEPS" --set checkpoint.dir= --set log.every=50)
run() {
    local name=$1; shift
    echo "== $name" >&2
    "$BIN" train "${common[@]}" --set log.metrics="$OUT/$name.jsonl" "$@" 2>&1 | { grep -E "val loss|error" >&2 || true; }
}
case " $PARTS " in *" modes "*)
run sync --set parallel.sync=sync
run stale --set parallel.sync=stale --set parallel.staleness=1   # stale_mode=dga (default)
run stale_k2 --set parallel.sync=stale --set parallel.staleness=2
run stale_delayed --set parallel.sync=stale --set parallel.staleness=1 --set parallel.stale_mode=delayed
run stale_lr1e-3 --set parallel.sync=stale --set parallel.stale_mode=delayed --set train.lr=1e-3 --set train.min_lr=1e-4
run stale_beta1_0.8 --set parallel.sync=stale --set parallel.stale_mode=delayed --set train.beta1=0.8
run stale_warmup100 --set parallel.sync=stale --set parallel.stale_mode=delayed --set train.warmup_steps=100
run local_sgd_avg4 --set parallel.sync=local_sgd --set parallel.sync_every=4 --set parallel.outer=avg
run local_sgd_nesterov4 --set parallel.sync=local_sgd --set parallel.sync_every=4 --set parallel.outer=nesterov
;; esac
case " $PARTS " in *" overlap "*)
# overlap: short runs, 1 MiB buckets (the default 4 MiB makes 2 buckets of this 7 MiB model)
for ov in true false; do
    run "overlap_$ov" --set train.steps=40 --set train.val_every=0 --set data.val= \
        --set parallel.bucket_mb=1 --set parallel.overlap=$ov --set log.trace="$OUT/trace_overlap_$ov.json"
done
;; esac
