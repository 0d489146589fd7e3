#!/bin/sh
# Failure tests of the mpi backend, 3 ranks under mpirun, comm timeout 3 s:
#   fault_test.sh kill      MPIRUN BIN   rank 1 SIGKILLs itself mid all-reduce
#   fault_test.sh stall     MPIRUN BIN   rank 2 never joins the all-reduce (alive)
#   fault_test.sh stop      MPIRUN BIN   rank 2 SIGSTOPs itself mid all-reduce
#   fault_test.sh wedge-stop MPIRUN BIN  rank 1 SIGSTOPs while every rank waits in a
#                                        collective, soon enough that at the deadline
#                                        its silence is still short
#   fault_test.sh stop-save MPIRUN BIN   a slow save (3 timeouts, alive) passes, then
#                                        rank 0 SIGSTOPs in the next save
# Asserts: mpirun exits non-zero within the timeout + 5 s of the fault (the
# stop-save case: + the slow save); the job shows exactly one "partrain: "
# line and it names the rank at fault (mpirun's own report names a killed
# rank) and no survivor shows an error of its own; afterwards no process
# of the run is left (a stopped one included).
set -u
mode=$1 mpirun=$2 bin=$3
timeout_s=3
tag="pt-fault-$mode-$$"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
limit=$((timeout_s + 5))
case $mode in
kill) args="--kill 1 --after 30" culprit=1 ;;
stall) args="--stall 2" culprit=2 ;;
stop) args="--stop 2 --after 30" culprit=2 ;;
wedge-stop) args="--wedge-stop 1" culprit=1 ;;
stop-save) args="--stop-save" culprit=0 limit=$((4 * timeout_s + 5)) ;;
*) echo "fault_test.sh: unknown mode $mode" >&2; exit 2 ;;
esac
t0=$(date +%s)
# The outer timeout only keeps a hang from outliving the test; it must not fire.
timeout $((limit + 30)) \
  "$mpirun" --oversubscribe --bind-to none -np 3 "$bin" $args --timeout $timeout_s --tag "$tag" \
  >"$out" 2>&1
rc=$?
t1=$(date +%s)
elapsed=$((t1 - t0))
cat "$out"
fail=0
echo "fault_test $mode: mpirun exit $rc after ${elapsed}s"
if [ "$rc" -eq 0 ]; then echo "FAIL: the job exited 0"; fail=1; fi
if [ "$rc" -eq 124 ]; then echo "FAIL: mpirun hung (stopped by the outer timeout)"; fail=1; fi
# The job's start (MPI_Init, the loop's first iterations) is in elapsed too:
# allow 2 s for it.
if [ "$elapsed" -gt $((limit + 2)) ]; then
  echo "FAIL: took ${elapsed}s, limit $((limit + 2))s"; fail=1
fi
lines=$(grep -c '^partrain: ' "$out")
if [ "$mode" = kill ]; then
  # mpirun tears the job down at once and says which rank died; a survivor
  # may get in one line of its own first, never more.
  if [ "$lines" -gt 1 ]; then echo "FAIL: $lines 'partrain: ' lines, at most 1 expected"; fail=1; fi
  if ! grep -q "rank $culprit" "$out"; then echo "FAIL: nothing names rank $culprit"; fail=1; fi
else
  if [ "$lines" -ne 1 ]; then echo "FAIL: $lines 'partrain: ' lines, exactly 1 expected"; fail=1; fi
  if ! grep '^partrain: ' "$out" | grep -q "^partrain: rank $culprit "; then
    echo "FAIL: the line does not name rank $culprit as the rank at fault"; fail=1
  fi
  # The others adopt the verdict (the backend's fault_reported) and say
  # nothing of their own: a survivor's error line means the verdict did
  # not reach it in time.
  if grep -q '^rank [0-9]*: error: ' "$out"; then
    echo "FAIL: a survivor reported an error of its own beside the verdict"; fail=1
  fi
  # wedge-stop: if rank 1's beat that says it waits in a collective did not
  # leave before it stopped (a loaded machine), rank 0 rightly sees a rank
  # that has not joined, heard from 1.2 s before: "did not take part".
  if [ "$mode" != stall ] && [ "$mode" != wedge-stop ] &&
    ! grep '^partrain: ' "$out" | grep -q "stopped responding"; then
    echo "FAIL: a stopped rank is not reported as stopped responding"; fail=1
  fi
  if [ "$mode" = stop-save ] && [ "$(grep -c 'slow save passed' "$out")" -ne 3 ]; then
    echo "FAIL: the slow (alive) save did not pass on every rank"; fail=1
  fi
fi
sleep 1
left=$(pgrep -f -- "$tag" || true)
if [ -n "$left" ]; then
  echo "FAIL: processes left behind: $left"
  ps -o pid,stat,args -p $(echo $left | tr ' ' ,) || true
  for p in $left; do kill -9 "$p" 2>/dev/null; done
  fail=1
fi
[ $fail -eq 0 ] && echo "PASS fault_test $mode"
exit $fail
