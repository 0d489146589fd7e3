#!/bin/sh
# Before/after training-step benchmark: two bench_step binaries (say, main's
# and a branch's) run ALTERNATELY on the same configs for several rounds, the
# order flipping every round, so that the shared machine's drift falls on both
# alike. Per config: the median over rounds of each run's median ms/step, and
# the ratio after/before. Run by hand; not a test.
#
#   bench/run_step_ab.sh BEFORE AFTER [--rounds R] [--configs "tiny small"]
#                        [--threads N] [--steps S]
set -eu
[ $# -ge 2 ] || { sed -n '2,9p' "$0"; exit 2; }
A=$1 B=$2
shift 2
ROUNDS=5 CONFIGS="tiny small" THREADS=1 STEPS=10
while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --configs) CONFIGS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    *) echo "run_step_ab.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
for f in "$A" "$B"; do
    [ -x "$f" ] || { echo "run_step_ab.sh: $f: not an executable" >&2; exit 1; }
done
one() { # binary config -> median ms/step
    "$1" --config "$2" --threads "$THREADS" --warmup 3 --steps "$STEPS" --json |
        sed -n 's/.*"step_ms_median": *\([0-9.]*\).*/\1/p'
}
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(lscpu | sed -n 's/^Model name: *//p'), $THREADS thread(s), $ROUNDS rounds"
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
    med() { echo "$@" | tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
    ma=$(med $a) mb=$(med $b)
    printf '%-8s %12s %12s %8.3f\n' "$c" "$ma" "$mb" "$(echo "$mb $ma" | awk '{print $1/$2}')"
    echo "{\"config\": \"$c\", \"threads\": $THREADS, \"before_ms\": [${a# }], \"after_ms\": [${b# }], \"before_median\": $ma, \"after_median\": $mb}" | sed 's/\([0-9]\) \([0-9]\)/\1, \2/g'
done
