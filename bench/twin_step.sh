#!/bin/sh
# What a second busy core costs this machine: one bench_step (one thread,
# pinned to core 0) alone, against two copies at once (cores 0 and 1),
# alternating for several rounds, the order flipping every round. Run by
# hand; not a test.
#
# Why: two ranks of a pipeline (or of data parallelism) with one thread each
# run at once on the two cores. Where each runs c times slower beside the
# other than alone, no schedule gets two stages past 2 (1 - bubble) / c of
# one rank's speed, whatever the runtime does. The script prints c (the
# twins' median step over the lone run's, both twins) and, from it, each
# pp = 2 schedule's ceiling next to issue 13's goal, 0.9 x 2 / (1 + b) with
# b the schedule's formula bubble at equal F, B and W:
#   ideal   = 2 (1 - b)      a perfect runtime on two cores that never
#                            slow each other down (b = idle / makespan)
#   ceiling = 2 (1 - b) / c  the same on this machine's cores
#   goal    = 0.9 x 2 / (1 + b)
#
#   bench/twin_step.sh [--rounds R] [--configs "small gpt2"] [--steps S] [--save]
#
# BENCH_STEP=path overrides the binary (default build/bench/bench_step);
# PARTRAIN=path the CLI used for the formula bubbles (default
# build/src/cli/partrain). --save also writes bench/results/twin_<date>.txt.
set -eu
ROUNDS=5 CONFIGS="small gpt2" STEPS=6 SAVE=0
while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --configs) CONFIGS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --save) SAVE=1; shift ;;
    -h | --help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "twin_step.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
BS=${BENCH_STEP:-build/bench/bench_step} P=${PARTRAIN:-build/src/cli/partrain}
for f in "$BS" "$P"; do
    [ -x "$f" ] || { echo "twin_step.sh: $f: not an executable (build first)" >&2; exit 1; }
done
[ "$(nproc)" -ge 2 ] || { echo "twin_step.sh: needs 2 cores, this machine has $(nproc)" >&2; exit 1; }
export OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d /tmp/pt-twin-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# one CORE CONFIG OUT: the median ms/step of one pinned run into OUT
one() {
    taskset -c "$1" "$BS" --config "$2" --threads 1 --warmup 2 --steps "$STEPS" --json |
        sed -n 's/.*"step_ms_median": *\([0-9.]*\).*/\1/p' > "$3"
}
median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

report() {
    echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $ROUNDS rounds of $STEPS steps, load $(cut -d' ' -f1 /proc/loadavg)"
    printf '%-6s %10s %10s %10s %7s  %s\n' config alone_ms twin0_ms twin1_ms c "rounds (alone / twin0 / twin1 ms)"
    for cfg in $CONFIGS; do
        alone="" t0="" t1="" rounds="" r=1
        while [ "$r" -le "$ROUNDS" ]; do
            if [ $((r % 2)) -eq 1 ]; then
                one 0 "$cfg" "$tmp/a"
                one 0 "$cfg" "$tmp/b" & one 1 "$cfg" "$tmp/c"; wait
            else
                one 0 "$cfg" "$tmp/b" & one 1 "$cfg" "$tmp/c"; wait
                one 0 "$cfg" "$tmp/a"
            fi
            a=$(cat "$tmp/a") b=$(cat "$tmp/b") c=$(cat "$tmp/c")
            alone="$alone $a" t0="$t0 $b" t1="$t1 $c" rounds="$rounds $a/$b/$c"
            r=$((r + 1))
        done
        ma=$(echo "$alone" | median) m0=$(echo "$t0" | median) m1=$(echo "$t1" | median)
        cc=$(echo "$m0 $m1 $ma" | awk '{printf "%.3f", ($1 + $2) / 2 / $3}')
        printf '%-6s %10s %10s %10s %7s %s\n' "$cfg" "$ma" "$m0" "$m1" "$cc" "$rounds"
        echo "$cc" > "$tmp/c_$cfg"
    done
    echo
    echo "pp = 2, equal F, B, W: the goal against what two stages can reach"
    printf '%-12s %2s %7s %7s %7s' schedule m bubble ideal goal
    for cfg in $CONFIGS; do printf ' %14s' "ceiling_$cfg"; done
    echo
    for m in 2 4 8; do
        for s in gpipe 1f1b interleaved zb1 zbv; do
            v=1
            [ "$s" = interleaved ] || [ "$s" = zbv ] && v=2
            b=$("$P" bench schedule --schedule "$s" --pp 2 --microbatches "$m" --virtual-stages "$v" \
                --tf 1 --tb 1 --tw 1 --json 2>/dev/null | sed -n 's/.*"bubble": *\([0-9.e+-]*\).*/\1/p')
            [ -n "$b" ] || { echo "twin_step.sh: no bubble for $s m $m" >&2; exit 1; }
            printf '%-12s %2s %7.3f %7.3f %7.3f' "$s" "$m" "$b" \
                "$(echo "$b" | awk '{print 2 * (1 - $1)}')" "$(echo "$b" | awk '{print 1.8 / (1 + $1)}')"
            for cfg in $CONFIGS; do
                printf ' %14.3f' "$(echo "$b $(cat "$tmp/c_$cfg")" | awk '{print 2 * (1 - $1) / $2}')"
            done
            echo
        done
    done
}

if [ "$SAVE" = 1 ]; then
    out=bench/results/twin_$(date -u +%Y-%m-%d_%H%M).txt
    report | tee "$out"
    echo "saved $out" >&2
else
    report
fi
