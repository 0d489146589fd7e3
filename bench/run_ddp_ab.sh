#!/bin/sh
# Before/after data-parallel step: two partrain binaries (say, main's and a
# branch's) train the same model at dp=2 (shm launcher, 1 thread per rank,
# the default dataset) ALTERNATELY for several rounds, the order flipping
# every round, so that the shared machine's drift falls on both alike. The
# models are run_ddp_bench.sh's (tiny: L 4, C 256; small: L 6, C 384; V 256,
# T 256, global batch 16). Per run: the median step time over the timed
# steps; per binary: the median over rounds; the ratio after/before. Run by
# hand; not a test. --layout replaces parallel.dp=2 with another 2-rank
# layout (e.g. "parallel.tp=2", "parallel.tp=2 parallel.sequence_parallel=true").
#
#   bench/run_ddp_ab.sh BEFORE AFTER [--rounds R] [--warmup W] [--steps S] [--configs "tiny small"]
#                       [--layout "KEY=VALUE ..."]
set -eu
[ $# -ge 2 ] || { sed -n '2,10p' "$0"; exit 2; }
A=$1 B=$2
shift 2
ROUNDS=5 WARMUP=3 STEPS=10 CONFIGS="tiny small" LAYOUT="parallel.dp=2"
while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --configs) CONFIGS=$2; shift 2 ;;
    --layout) LAYOUT=$2; shift 2 ;;
    *) echo "run_ddp_ab.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
for f in "$A" "$B"; do
    [ -x "$f" ] || { echo "run_ddp_ab.sh: $f: not an executable" >&2; exit 1; }
done
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
DATA="$ROOT/data/fortunes/train.txt"
[ -f "$DATA" ] || { echo "run_ddp_ab.sh: $DATA missing (scripts/prepare-data.sh)" >&2; exit 1; }
TMP=$(mktemp -d /tmp/pt-ddp-ab-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
shape() { # config -> "L C NH"
    case "$1" in tiny) echo "4 256 8" ;; small) echo "6 384 6" ;; *) echo "unknown config $1" >&2; exit 2 ;; esac
}
one() { # binary config -> median ms/step of one run
    bin=$1
    set -- "$2" $(shape "$2")
    OPENBLAS_NUM_THREADS=1 "$bin" train --set model.n_layer=$2 --set model.n_embd=$3 \
        --set model.n_head=$4 --set model.vocab_size=256 --set model.seq_len=256 \
        --set train.batch_size=16 --set train.steps=$((WARMUP + STEPS)) \
        --set train.warmup_steps=0 --set train.lr=3e-4 --set train.threads=1 \
        $(for kv in $LAYOUT; do printf -- '--set %s ' "$kv"; done) --nproc 2 --set data.train="$DATA" \
        --set log.metrics="$TMP/m.jsonl" >/dev/null 2>&1
    python3 - "$TMP/m.jsonl" "$WARMUP" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows = [r for r in rows if "step_ms" in r][int(sys.argv[2]):]
print(statistics.median(r["step_ms"] for r in rows))
PY
}
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(lscpu | sed -n 's/^Model name: *//p'), $LAYOUT, 2 ranks x 1 thread, $ROUNDS rounds; load at start $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-8s %12s %12s %8s\n' config before_ms after_ms ratio
for c in $CONFIGS; do
    a="" b="" r=1
    while [ "$r" -le "$ROUNDS" ]; do
        if [ $((r % 2)) -eq 1 ]; then
            a="$a $(one "$A" "$c")"; b="$b $(one "$B" "$c")"
        else
            b="$b $(one "$B" "$c")"; a="$a $(one "$A" "$c")"
        fi
        r=$((r + 1))
    done
    python3 - "$c" "$a" "$b" "$LAYOUT" <<'PY'
import json, statistics, sys
c, a, b = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
ma, mb = statistics.median(a), statistics.median(b)
print("%-8s %12.2f %12.2f %8.3f" % (c, ma, mb, mb / ma))
print(json.dumps({"bench": "ddp_ab", "config": c, "layout": sys.argv[4], "before_ms": ma, "after_ms": mb, "ratio": mb / ma,
                  "before_runs": a, "after_runs": b}))
PY
done
