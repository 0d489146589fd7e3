#!/bin/sh
# Faults in a real training job (`partrain train`, 3 ranks, a tiny model,
# comm.timeout 3 s), on the shm launcher or under mpirun:
#   fault_train.sh shm|mpi stop-save PARTRAIN [MPIRUN]  rank 0 SIGSTOPped while the job
#                                                      saves a checkpoint every step
#   fault_train.sh shm|mpi stop-step PARTRAIN [MPIRUN]  rank 1 SIGSTOPped (no saves)
#   fault_train.sh shm|mpi kill      PARTRAIN [MPIRUN]  rank 1 SIGKILLed
#   fault_train.sh shm|mpi kill-save PARTRAIN [MPIRUN]  rank 0 SIGKILLed while saving
# The fault is sent from outside once the job has logged 3 steps. Asserts:
# the job exits non-zero within comm.timeout + 5 s of the fault; exactly one
# "partrain: " line on stderr, naming the rank at fault (under mpirun, a
# killed rank is named by mpirun's own report; a survivor prints at most
# one line); no process of the job is left (the stopped one included).
set -u
backend=$1 mode=$2 P=$3 mpirun=${4:-mpirun}
timeout_s=3
limit=$((timeout_s + 5))
T=$(mktemp -d /tmp/pt-fault-train-XXXXXX)
tag="pt-fault-train-$backend-$mode-$$"
cleanup() {
    for p in $(pgrep -f -- "$tag" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    rm -rf "$T"
}
trap cleanup EXIT
cd "$T" || exit 1
for i in $(seq 1 400); do echo "the quick brown fox $i jumps over the lazy dog"; done >train.txt
every=0 embd=32
case $mode in
stop-save) culprit=0 sig=STOP every=1 embd=128 ;; # 5 MB per save: saving dominates
stop-step) culprit=1 sig=STOP ;;
kill) culprit=1 sig=KILL ;;
kill-save) culprit=0 sig=KILL every=1 embd=128 ;;
*) echo "fault_train.sh: unknown mode $mode" >&2; exit 2 ;;
esac
cat >cfg.json <<EOF
{
  "model": {"n_layer": 2, "n_embd": $embd, "n_head": 2, "vocab_size": 256, "seq_len": 16},
  "data": {"train": "train.txt"},
  "train": {"steps": 1000000, "batch_size": 6, "warmup_steps": 1, "val_every": 0, "threads": 1},
  "parallel": {"dp": 3},
  "comm": {"timeout": $timeout_s},
  "checkpoint": {"dir": "ck", "every": $every},
  "log": {"metrics": "metrics.jsonl", "every": 1}
}
EOF
# PT_FAULT_TAG marks the job's processes (pgrep -f sees it in no argv: it is
# the config path's directory that carries the tag).
mkdir "$tag" && mv cfg.json "$tag/"
if [ "$backend" = shm ]; then
    PT_LOG=warn "$P" train --config "$tag/cfg.json" --nproc 3 >out.txt 2>err.txt &
else
    PT_LOG=warn "$mpirun" --oversubscribe --bind-to none -np 3 \
        "$P" train --config "$tag/cfg.json" --backend mpi >out.txt 2>err.txt &
fi
job=$!
# Wait for 3 logged steps (at most 60 s).
i=0
while [ "$({ wc -l <metrics.jsonl; } 2>/dev/null || echo 0)" -lt 3 ] && [ $i -lt 600 ]; do
    sleep 0.1
    i=$((i + 1))
done
# The rank's process: under mpirun by OMPI_COMM_WORLD_RANK, under the shm
# launcher the launcher's children in fork order (rank r is the r-th). Pids
# are handed out cyclically and wrap at pid_max (32768 on some machines, a
# few times in one CI run), and the three forks share a start time: fork
# order is pid order counted on from the launcher's own pid.
pid=""
if [ "$backend" = shm ]; then
    pid_max=$(cat /proc/sys/kernel/pid_max)
    pid=$(ps -o pid= --ppid "$job" |
        awk -v j="$job" -v m="$pid_max" '{ print ($1 - j + m) % m, $1 }' |
        sort -n | sed -n "$((culprit + 1))p" | awk '{ print $2 }')
else
    for p in $(pgrep -f -- "$tag"); do
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$culprit"; then
            pid=$p
        fi
    done
fi
fail=0
if [ -z "$pid" ]; then
    echo "FAIL: no process for rank $culprit (job not started?)"; cat err.txt; exit 1
fi
t0=$(date +%s.%N)
[ "$mode" = kill-save ] && kill -STOP "$pid" # caught in a save first, killed below
[ "$mode" = kill-save ] || kill -"$sig" "$pid"
if [ "$mode" = stop-save ] || [ "$mode" = kill-save ]; then
    # Stopped while writing (its temporary step directory exists)? Else let
    # it go on (stopped for far less than the timeout) and try again.
    # Bounded by tries and by time: under ASan the step's compute grows ten
    # times and the save's share of it shrinks, so 50 tries were not always
    # enough (seen once in CI's sanitizer tree).
    tries=1 tstart=$(date +%s)
    while ! ls -A ck 2>/dev/null | grep -q tmp && [ $tries -lt 600 ] &&
        [ $(($(date +%s) - tstart)) -lt 40 ]; do
        kill -CONT "$pid"
        sleep 0.0$((tries % 7 + 1))
        t0=$(date +%s.%N)
        kill -STOP "$pid"
        tries=$((tries + 1))
    done
    if ls -A ck | grep -q tmp; then
        echo "rank 0 stopped while saving ($(ls -A ck | grep tmp), try $tries)"
    else
        echo "FAIL: rank 0 was not caught in a save in $tries tries"; fail=1
    fi
    if [ "$mode" = kill-save ]; then
        t0=$(date +%s.%N)
        kill -KILL "$pid"
    fi
fi
# The job must end by itself; after limit + 20 s it is killed (a failure).
i=0
while kill -0 "$job" 2>/dev/null && [ $i -lt $(((limit + 20) * 10)) ]; do
    sleep 0.1
    i=$((i + 1))
done
if kill -0 "$job" 2>/dev/null; then
    echo "FAIL: the job did not end within $((limit + 20)) s"; fail=1
    kill -9 "$job" 2>/dev/null
fi
wait "$job"
rc=$?
t1=$(date +%s.%N)
elapsed=$(echo "$t1 - $t0" | bc)
cat err.txt
echo "fault_train $backend $mode: exit $rc, ${elapsed}s after SIG$sig to rank $culprit (pid $pid)"
if [ "$rc" -eq 0 ]; then echo "FAIL: the job exited 0"; fail=1; fi
if [ "$(echo "$elapsed > $limit" | bc)" -eq 1 ]; then
    echo "FAIL: took ${elapsed}s, limit ${limit}s"; fail=1
fi
lines=$(grep -c '^partrain: ' err.txt)
if [ "$backend" = mpi ] && [ "$sig" = KILL ]; then
    if [ "$lines" -gt 1 ]; then echo "FAIL: $lines 'partrain: ' lines, at most 1"; fail=1; fi
    if ! grep -q "rank $culprit" err.txt; then echo "FAIL: nothing names rank $culprit"; fail=1; fi
else
    if [ "$lines" -ne 1 ]; then echo "FAIL: $lines 'partrain: ' lines, exactly 1 expected"; fail=1; fi
    if ! grep '^partrain: ' err.txt | grep -q "^partrain: rank $culprit "; then
        echo "FAIL: the line does not name rank $culprit as the rank at fault"; fail=1
    fi
    if [ "$sig" = STOP ] && ! grep '^partrain: ' err.txt | grep -q "stopped responding"; then
        echo "FAIL: a stopped rank is not reported as stopped responding"; fail=1
    fi
fi
sleep 1
left=$(pgrep -f -- "$tag" || true)
if [ -n "$left" ]; then
    echo "FAIL: processes left behind: $left"; fail=1
fi
[ $fail -eq 0 ] && echo "PASS fault_train $backend $mode"
exit $fail
