#!/bin/sh
# Failure tests of the mpi backend (issue 3):
#   fault_test.sh kill  MPIRUN BIN   rank 1 of 3 SIGKILLs itself mid all-reduce
#   fault_test.sh stall MPIRUN BIN   rank 2 of 3 never joins the all-reduce
# Asserts: mpirun exits non-zero within the comm timeout plus a margin; in
# the stall case the survivors' error names the operation and says "timed
# out"; afterwards no process of the run is left.
set -u
mode=$1 mpirun=$2 bin=$3
timeout_s=4
margin=20
tag="pt-fault-$mode-$$"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
case $mode in
kill) args="--kill 1 --after 30" ;;
stall) args="--stall 2" ;;
*) echo "fault_test.sh: unknown mode $mode" >&2; exit 2 ;;
esac
t0=$(date +%s)
# The outer timeout only keeps a hang from outliving the test; it must not fire.
PT_COMM_TIMEOUT=$timeout_s timeout $((timeout_s + margin + 30)) \
  "$mpirun" --oversubscribe --bind-to none -np 3 "$bin" $args --tag "$tag" >"$out" 2>&1
rc=$?
t1=$(date +%s)
elapsed=$((t1 - t0))
cat "$out"
fail=0
echo "fault_test $mode: mpirun exit $rc after ${elapsed}s"
if [ "$rc" -eq 0 ]; then echo "FAIL: the job exited 0"; fail=1; fi
if [ "$rc" -eq 124 ]; then echo "FAIL: mpirun hung (stopped by the outer timeout)"; fail=1; fi
if [ "$elapsed" -gt $((timeout_s + margin)) ]; then
  echo "FAIL: took ${elapsed}s, limit $((timeout_s + margin))s"; fail=1
fi
if [ "$mode" = stall ]; then
  if ! grep -q "allreduce of .* timed out after" "$out"; then
    echo "FAIL: no 'allreduce ... timed out' error from a surviving rank"; fail=1
  fi
fi
sleep 1
left=$(pgrep -f -- "$tag" || true)
if [ -n "$left" ]; then
  echo "FAIL: processes left behind: $left"
  ps -o pid,args -p $(echo $left | tr ' ' ,) || true
  for p in $left; do kill -9 "$p" 2>/dev/null; done
  fail=1
fi
[ $fail -eq 0 ] && echo "PASS fault_test $mode"
exit $fail
