#!/bin/bash
# Restart on failure under mpirun: what `partrain train --nproc N
# --max-restarts K [--elastic]` does on one machine (docs/comm.md), for jobs
# that mpirun starts (docs/mpi.md, "Restart on failure").
#
#   scripts/mpirun-restart.sh [--max-restarts K] [--elastic --cluster FILE]
#       [--mpirun CMD] -np N [MPIRUN_OPTIONS...] -- PARTRAIN train TRAIN_ARGS...
#
# Runs `CMD -np N MPIRUN_OPTIONS... PARTRAIN train TRAIN_ARGS... --backend mpi`.
# When it fails because a rank died, stalled or did not take part (mpirun's
# exit status 3, partrain's for such a fault, or 128 + a signal: a rank
# killed), it runs it again with --resume=auto (from checkpoint.dir's newest
# checkpoint, or from the start if none was saved yet), at most K times
# (default 1), one line each on stderr. Another failure (1: an error a rank
# reported, which a restart would meet again; 2: a bad command line) ends
# it with that status.
#
# --elastic: each restart has one rank fewer (the lost host's, say) and the
# layout the planner picks for them: `PARTRAIN plan --world N-1 --cluster
# FILE --write DIR/plan-N.json` with the run's --config and --set (less
# parallel.dp, tp and pp, which the number of ranks decides), then `train
# --plan` with the same --set; the checkpoint loads under the new layout.
# The plan files go to a temporary folder, removed at the end.
#
# The debugging knob PT_FAULT (and an `-x PT_FAULT...` of MPIRUN_OPTIONS)
# acts in the first run only, as with --max-restarts. The exit status is the
# last run's.
set -u
max=1 elastic=0 cluster="" mpirun=mpirun np=""
usage() {
    sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//; /^set -u/d' >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case $1 in
    --max-restarts) max=$2; shift 2 ;;
    --elastic) elastic=1; shift ;;
    --cluster) cluster=$2; shift 2 ;;
    --mpirun) mpirun=$2; shift 2 ;;
    -np | -n) np=$2; shift 2 ;;
    --) shift; break ;;
    -h | --help) usage ;;
    *) break ;;
    esac
done
mpi_opts=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
    case $1 in
    -np | -n) np=$2; shift 2 ;;
    *) mpi_opts+=("$1"); shift ;;
    esac
done
[ $# -gt 0 ] && shift # the --
[ $# -ge 2 ] && [ "$2" = train ] && [ -n "$np" ] || usage
case $max in '' | *[!0-9]*) echo "mpirun-restart.sh: --max-restarts must be a number" >&2; exit 2 ;; esac
if [ $elastic = 1 ] && [ -z "$cluster" ]; then
    echo "mpirun-restart.sh: --elastic plans for the ranks that are left: give --cluster FILE" >&2
    exit 2
fi
partrain=$1
shift 2
train_args=("$@")
orig_args=("$@") # what each elastic plan starts from
tmp=$(mktemp -d /tmp/pt-restart-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The run's --config and --set, as `plan` takes them (less the world's keys),
# and the train arguments with --plan in place of --config. `plan` holds a
# config file's layout keys fixed, so each split of the ranks (dp x tp x pp =
# world) is planned in turn and the fastest that fits is kept: the planner
# picks the rest (ZeRO, micro-batches, schedule, ...) for each.
plan_for() {
    local world=$1 file=$tmp/plan-$1.json cfg=() sets=() rest=() a best="" best_ms=""
    set -- "${orig_args[@]}"
    while [ $# -gt 0 ]; do
        a=$1
        case $a in
        --config) cfg=(--config "$2"); shift 2; continue ;;
        --config=*) cfg=(--config "${a#--config=}"); shift; continue ;;
        --set) a="--set=$2"; shift ;;
        esac
        case $a in
        --set=parallel.dp=* | --set=parallel.tp=* | --set=parallel.pp=*) ;;
        --set=*) sets+=(--set "${a#--set=}"); rest+=(--set "${a#--set=}") ;;
        --plan | --plan=* | --resume | --resume=* | --layout | --layout=*) ;;
        *) rest+=("$a") ;;
        esac
        shift
    done
    local d t p ms
    for ((d = 1; d <= world; d++)); do
        for ((t = 1; d * t <= world; t++)); do
            [ $((world % (d * t))) -eq 0 ] || continue
            p=$((world / (d * t)))
            ms=$("$partrain" plan "${cfg[@]}" "${sets[@]}" --set parallel.dp=$d \
                --set parallel.tp=$t --set parallel.pp=$p --cluster "$cluster" \
                --world "$world" --json --top 1 2>/dev/null | head -1 |
                grep '"fits":true' | sed 's/.*"step_ms":\([0-9.e+-]*\).*/\1/')
            [ -n "$ms" ] || continue
            if [ -z "$best" ] || [ "$(echo "$ms < $best_ms" | sed 's/e/*10^/g' | bc -l)" = 1 ]; then
                best="$d $t $p" best_ms=$ms
            fi
        done
    done
    [ -n "$best" ] || return 1
    set -- $best
    echo "partrain: restart: dp $1 x tp $2 x pp $3 is the fastest layout of $world ranks" \
        "($best_ms ms a step planned on $cluster)" >&2
    "$partrain" plan "${cfg[@]}" "${sets[@]}" --set parallel.dp=$1 --set parallel.tp=$2 \
        --set parallel.pp=$3 --cluster "$cluster" --world "$world" --write "$file" --top 1 \
        >/dev/null || return 1
    train_args=(--plan "$file" "${rest[@]}")
}

attempt=0 n=$np
while :; do
    if [ $attempt -eq 0 ]; then
        "$mpirun" "${mpi_opts[@]}" -np "$n" "$partrain" train "${train_args[@]}" --backend mpi
    else
        "$mpirun" "${mpi_opts[@]}" -np "$n" "$partrain" train "${train_args[@]}" --backend mpi \
            --resume=auto
    fi
    rc=$?
    [ $rc -eq 0 ] && exit 0
    if [ $rc -ne 3 ] && [ $rc -lt 128 ]; then exit $rc; fi
    if [ $attempt -ge "$max" ]; then exit $rc; fi
    attempt=$((attempt + 1))
    unset PT_FAULT # the first run's only
    kept=()
    for ((i = 0; i < ${#mpi_opts[@]}; i++)); do
        o=${mpi_opts[$i]}
        if [ "$o" = -x ] && [[ ${mpi_opts[$((i + 1))]:-} == PT_FAULT* ]]; then i=$((i + 1)); continue; fi
        kept+=("$o")
    done
    mpi_opts=("${kept[@]}")
    # no --resume given twice: the restart says --resume=auto itself
    args=()
    for a in "${train_args[@]}"; do case $a in --resume | --resume=*) ;; *) args+=("$a") ;; esac; done
    train_args=("${args[@]}")
    if [ $elastic = 1 ]; then
        n=$((n - 1))
        if [ $n -lt 1 ]; then echo "partrain: restart: no rank is left" >&2; exit $rc; fi
        plan_for $n || { echo "partrain: restart: no plan for $n ranks" >&2; exit $rc; }
    fi
    echo "partrain: restart $attempt of $max after mpirun's exit status $rc: resuming from the" \
        "newest checkpoint (if any) on $n ranks" >&2
done
