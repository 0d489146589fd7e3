#!/bin/sh
# The flight recorder's acceptance (issue 39): 4 ranks in named groups
# (test_comm_flight.c: dp {0,1} {2,3}, tp {0,2} {1,3}, the world), one of
# them broken on purpose by the PT_FAULT knob at dp group 1's collective #21:
#   flight_test.sh shm|mpi MODE TEST_COMM_FLIGHT PARTRAIN [MPIRUN]
#   MODE stop   rank 2 SIGSTOPs itself before it
#        skip   rank 2 never issues it (and waits in the world's barrier)
#        swap   rank 2 issues it after its next operation (the barrier)
#        kill   rank 2 SIGKILLs itself before it
#        order  comm.check_order on; rank 2 defers dp #22 after dp #23 (two
#               collectives of one group in the other order)
# Asserts: the job exits non-zero within comm.timeout + 5 s of the fault
# (the knob's line says when it fired); exactly one "partrain: " line, naming the laggard rank,
# the group, the op and its sequence number (order: both ranks and both
# operations); a flight dump from every survivor (stop and kill: 0, 1, 3;
# else all four); `partrain flight` on them prints the first mismatch; no
# process of the job left, nothing new in /dev/shm.
# MPIRUN may carry the multihost wrapper's flags (multihost_flight_test.sh).
set -u
backend=$1 mode=$2 bin=$3 P=$4
mpirun=${5:-mpirun}
timeout_s=${PT_FLIGHT_TIMEOUT:-3}
limit=$((timeout_s + 5))
T=$(mktemp -d /tmp/pt-flight-XXXXXX)
tag="pt-flight-$backend-$mode-$$"
out=$T/$tag # the dumps' folder: its name marks the job's processes (pgrep -f)
cleanup() {
    for p in $(pgrep -f -- "$tag" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    rm -rf "$T"
}
trap cleanup EXIT
# the fault's collective: dp #21 (iteration 11) by default; across hosts
# later (PT_FLIGHT_SEQ, odd), once the heartbeats carry every rank's tables
seq=${PT_FLIGHT_SEQ:-21}
extra="--iters $((seq / 2 + 20))"
case $mode in
stop) fault="stop:rank=2:group=dp:seq=$seq" survivors="0 1 3" ;;
skip) fault="skip:rank=2:group=dp:seq=$seq" survivors="0 1 2 3" ;;
swap) fault="swap:rank=2:group=dp:seq=$seq" survivors="0 1 2 3" ;;
kill) fault="kill:rank=2:group=dp:seq=$seq" survivors="0 1 3" ;;
order) fault="swap:rank=2:group=dp:seq=$((seq + 1))" survivors="0 1 2 3" extra="$extra --check-order" ;;
*) echo "flight_test.sh: unknown mode $mode" >&2; exit 2 ;;
esac
ls /dev/shm >"$T/shm.before" 2>/dev/null
t0=$(date +%s.%N)
if [ "$backend" = shm ]; then
    PT_FAULT=$fault timeout $((limit + 30)) "$bin" --backend shm --nproc 4 \
        --timeout "$timeout_s" --flight "$out/" $extra >"$T/log" 2>&1
else
    # shellcheck disable=SC2086
    timeout $((limit + 30)) $mpirun -x PT_FAULT="$fault" -np 4 \
        "$bin" --backend mpi --timeout "$timeout_s" --flight "$out/" $extra >"$T/log" 2>&1
fi
rc=$?
t1=$(date +%s.%N)
elapsed=$(echo "$t1 - $t0" | bc)
cat "$T/log"
tf=$(grep -o 'PT_FAULT: .* at [0-9.]*' "$T/log" | head -1 | sed 's/.* at //')
since=$(echo "$t1 - ${tf:-$t0}" | bc)
echo "flight_test $backend $mode: exit $rc after ${elapsed}s, ${since}s after the fault"
fail=0
bad() { echo "FAIL: $*"; fail=1; }
[ "$rc" -ne 0 ] || bad "the job exited 0"
[ "$rc" -ne 124 ] || bad "the job hung (stopped by the outer timeout)"
[ -n "$tf" ] || bad "the fault did not fire (no PT_FAULT line)"
[ "$(echo "$since > $limit" | bc)" -eq 0 ] || bad "ended ${since}s after the fault, limit ${limit}s"
lines=$(grep -c '^partrain: ' "$T/log")
line=$(grep '^partrain: ' "$T/log" | head -1)
if [ "$mode" = kill ] && [ "${PT_FLIGHT_HOSTS:-0}" = 1 ]; then
    # Across hosts Open MPI's sends to the killed rank's broken connection can
    # hold up the heartbeat until mpirun ends the job: then no survivor knows
    # who is gone, mpirun's own line names the rank, and the dumps tell the rest.
    [ "$lines" -le 1 ] || bad "$lines 'partrain: ' lines, at most 1 expected"
    grep -q "rank 2" "$T/log" || bad "nothing names rank 2"
    [ "$lines" -eq 1 ] || { echo "note: no survivor's line; partrain flight must name it"; mode=kill-noline; }
else
    [ "$lines" -eq 1 ] || bad "$lines 'partrain: ' lines, exactly 1 expected"
fi
has() { case $line in *"$1"*) ;; *) bad "the line does not say '$1'" ;; esac; }
case $mode in
stop)
    has "rank 2 stopped responding"
    has "dp group 1 allreduce #$seq"
    has "rank 2 never arrived" ;;
skip | swap)
    has "dp group 1 allreduce #$seq"
    has "where rank 2 never arrived" ;;
kill)
    case $line in "partrain: rank 2 "*) ;; *) bad "the line does not start with rank 2" ;; esac
    has "dp group 1"
    has "allreduce #$seq"
    has "rank 2 never arrived" ;;
order)
    has "rank 2 issued dp group 1 allreduce #$((seq + 2)) (64 KiB) where rank 3 issued allreduce #$((seq + 1)) (4 KiB)"
    has "out of order" ;;
esac
for r in $survivors; do
    [ -s "$out/flight-rank$r.json" ] || bad "no flight dump from rank $r"
done
if "$P" flight "$out" >"$T/flight.txt" 2>&1; then
    cat "$T/flight.txt"
    grep -q "^first mismatch: " "$T/flight.txt" || bad "partrain flight found no mismatch"
    case $mode in
    stop | kill) grep -q "rank 2 left no dump" "$T/flight.txt" || bad "partrain flight: rank 2" ;;
    kill-noline) grep "^first mismatch: " "$T/flight.txt" | grep -qE "dp group 1:? allreduce #$seq .*rank 2 left no dump" ||
        bad "partrain flight: dp group 1 allreduce #$seq and rank 2" ;;
    skip) grep -q "where rank 2 never arrived" "$T/flight.txt" || bad "partrain flight: rank 2" ;;
    swap) grep -q "rank 2 issued it and never ran it" "$T/flight.txt" ||
        bad "partrain flight: rank 2's deferred collective" ;;
    order) grep -q "rank 2 ran allreduce #$((seq + 2)) (64 KiB) while its allreduce #$((seq + 1)) (4 KiB) waited" \
        "$T/flight.txt" || bad "partrain flight: rank 2's two collectives" ;;
    esac
else
    cat "$T/flight.txt"
    bad "partrain flight failed"
fi
sleep 1
left=$(pgrep -f -- "$tag" || true)
[ -z "$left" ] || bad "processes left behind: $left"
ls /dev/shm >"$T/shm.after" 2>/dev/null
new=$(comm -13 "$T/shm.before" "$T/shm.after" | grep "^partrain-" || true)
[ -z "$new" ] || echo "note: new in /dev/shm (another job's?): $new"
[ $fail -eq 0 ] && echo "PASS flight_test $backend $mode"
exit $fail
