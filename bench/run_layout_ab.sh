#!/bin/sh
# Before/after training-step benchmark over layouts: two partrain binaries
# (say, an old commit's and this tree's) train the same config ALTERNATELY
# for several rounds, the order flipping every round, so that the shared
# machine's drift falls on both alike. Per layout: the median over rounds of
# each run's median step_ms (the metrics lines after the first two steps),
# and the ratio after/before. Run by hand; not a test.
#
#   bench/run_layout_ab.sh BEFORE AFTER [--rounds R] [--steps S] [--config FILE]
#
# The layouts are issue 38's: one worker at 1 thread; dp 2; tp 2; pp 2 1f1b
# at m 8; dp 2 x tp 2 with ZeRO-3 (one thread a rank). Needs the default
# dataset (scripts/prepare-data.sh).
set -eu
[ $# -ge 2 ] || { sed -n '2,13p' "$0"; exit 2; }
A=$1 B=$2
shift 2
ROUNDS=5 STEPS=12 CONFIG=configs/small.json
while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    *) echo "run_layout_ab.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
for f in "$A" "$B"; do
    [ -x "$f" ] || { echo "run_layout_ab.sh: $f: not an executable" >&2; exit 1; }
done
T=$(mktemp -d /tmp/pt-layout-ab-XXXXXX)
trap 'rm -rf "$T"' EXIT
# name|nproc|--set arguments
LAYOUTS='one|1|
dp2|2|parallel.dp=2
tp2|2|parallel.tp=2
pp2-1f1b-m8|2|parallel.pp=2 parallel.schedule=1f1b parallel.microbatches=8
dp2-tp2-zero3|4|parallel.dp=2 parallel.tp=2 parallel.zero=3'
one() { # binary nproc sets -> median step_ms of steps 3..
    m="$T/m.jsonl"
    rm -f "$m"
    args=""
    for kv in $3; do args="$args --set $kv"; done
    # shellcheck disable=SC2086
    PT_LOG=warn "$1" train --config "$CONFIG" --nproc "$2" --set train.steps="$STEPS" \
        --set train.threads=1 --set train.val_every=0 --set checkpoint.dir= \
        --set log.metrics="$m" --set log.every=1000 $args >/dev/null 2>"$T/err" ||
        { cat "$T/err" >&2; exit 1; }
    python3 -c "
import json, statistics, sys
ms = [json.loads(l)['step_ms'] for l in open(sys.argv[1]) if '\"step_ms\"' in l][2:]
print(statistics.median(ms))" "$m"
}
med() { python3 -c "import statistics, sys; print(statistics.median(map(float, sys.argv[1:])))" "$@"; }
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(lscpu | sed -n 's/^Model name: *//p'), $CONFIG, $STEPS steps, $ROUNDS rounds, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-auto}"
printf '%-16s %12s %12s %8s\n' layout before_ms after_ms ratio
echo "$LAYOUTS" | while IFS='|' read -r name np sets; do
    a="" b="" r=1
    while [ "$r" -le "$ROUNDS" ]; do
        if [ $((r % 2)) -eq 1 ]; then
            a="$a $(one "$A" "$np" "$sets")"; b="$b $(one "$B" "$np" "$sets")"
        else
            b="$b $(one "$B" "$np" "$sets")"; a="$a $(one "$A" "$np" "$sets")"
        fi
        r=$((r + 1))
    done
    # shellcheck disable=SC2086
    ma=$(med $a) mb=$(med $b)
    printf '%-16s %12.1f %12.1f %8.3f\n' "$name" "$ma" "$mb" "$(python3 -c "print($mb / $ma)")"
done
