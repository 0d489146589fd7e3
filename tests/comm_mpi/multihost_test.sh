#!/bin/sh
# The mpi backend across three simulated hosts (issue 3, item 6): network
# namespaces pt-h1..pt-h3 joined by a bridge (../shared/multihost/hosts.sh),
# Open MPI over TCP between them.
#
#   multihost_test.sh MPIRUN TEST_MPI_BACKEND [TEST_COMM_CONFORMANCE]
#
# 1. Every collective, checked against a double-precision reference, with
#    one rank per host: test_mpi_backend, and the shared conformance test
#    with --backend mpi when its binary is given.
# 2. A long all-reduce loop; once it runs, host 2's link is cut
#    (ip -n pt-h2 link set pt-h2-e down). Asserts that mpirun exits non-zero
#    within the comm timeout plus a margin, with a clear error (the
#    heartbeat verdict "rank 2 stopped responding", a rank's "allreduce ...
#    timed out" or Open MPI's "lost communication with a remote daemon"),
#    and that no process is left in any namespace.
#
# Open MPI notices a dead host only through TCP keepalive on its control
# connections; multihost_lib.sh sets it to about 3 s (see docs/mpi.md).
#
# Needs root and iproute2; exits 77 (CTest SKIP_RETURN_CODE) when network
# namespaces cannot be made. The namespaces are always removed (trap).
# The hosts and mpirun's flags: multihost_lib.sh.
set -u
mpirun=$1 bin=$2 conf=${3:-}
. "$(dirname "$0")/multihost_lib.sh"
mh_setup multihost_test 3

timeout_s=5
margin=20
tag="pt-multihost-$$"
out=$mh_dir/out

mpi() {
  mh_mpirun -x PT_LOG \
    -np 3 --host 10.213.0.1:1,10.213.0.2:1,10.213.0.3:1 "$@"
}

# A start-up failure (mh_startup_failed) is retried: 3 attempts in all.
mpi_retry() {
  attempt=1
  while :; do
    mpi "$@" >"$out" 2>&1
    r=$?
    [ $r -ne 0 ] && mh_startup_failed "$out" && [ $attempt -lt 3 ] || break
    echo "(Open MPI failed to start on the simulated hosts, attempt $attempt; retrying)"
    attempt=$((attempt + 1))
    sleep 1
  done
  grep -v "^ok " "$out"
  return $r
}

fail=0
echo "== 1. collectives across 3 hosts: test_mpi_backend"
if ! mpi_retry "$bin" --max-count 262147 --timeout $timeout_s --tag "$tag"; then
  echo "FAIL: test_mpi_backend across 3 hosts"; fail=1
fi
if [ -n "$conf" ]; then
  echo "== 1b. collectives across 3 hosts: test_comm_conformance --backend mpi"
  if ! mpi_retry "$conf" --backend mpi --nproc 3 --timeout $timeout_s; then
    echo "FAIL: test_comm_conformance across 3 hosts"; fail=1
  fi
fi

echo "== 2. cut host 2's link in the middle of a long all-reduce loop"
# Cut once the loop runs (rank 0 reports its first 200 all-reduces), so the
# cut lands mid-collective rather than during start-up.
start_cutter() {
  rm -f "$out.cut"
  (
    i=0
    while [ $i -lt 300 ] && ! grep -q "200 all-reduces" "$out" 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
    ip -n pt-h2 link set pt-h2-e down
    date +%s >"$out.cut"
    echo "link of pt-h2 cut"
  ) &
  cutter=$!
}
# The outer timeout turns a hang into a failure instead of outliving the test.
limit=$((30 + timeout_s + margin)) # start-up (the cut comes within 30 s) + timeout + margin
mh_wrap="timeout $((limit + 30))"
attempt=1
while :; do
  : >"$out"
  start_cutter
  t0=$(date +%s)
  mpi "$bin" --loop 60 --timeout $timeout_s --tag "$tag" >"$out" 2>&1
  rc=$?
  t1=$(date +%s)
  if [ $rc -ne 0 ] && mh_startup_failed "$out" && ! grep -q "all-reduces" "$out" && [ $attempt -lt 3 ]; then
    kill $cutter 2>/dev/null
    wait $cutter 2>/dev/null
    ip -n pt-h2 link set pt-h2-e up
    echo "(Open MPI failed to start on the simulated hosts, attempt $attempt; retrying)"
    attempt=$((attempt + 1))
    sleep 1
    continue
  fi
  break
done
mh_wrap=""
wait $cutter 2>/dev/null
grep -v "all-reduces" "$out"
elapsed=$((t1 - t0))
echo "mpirun exit $rc after ${elapsed}s (comm timeout ${timeout_s}s)"
if [ "$rc" -eq 0 ]; then echo "FAIL: the job exited 0 after losing a host"; fail=1; fi
if [ "$rc" -eq 124 ]; then echo "FAIL: the job hung (stopped after $((limit + 30))s)"; fail=1; fi
if [ -s "$out.cut" ]; then
  after=$((t1 - $(cat "$out.cut")))
  echo "the job ended ${after}s after the cut (limit: timeout ${timeout_s}s + margin ${margin}s)"
  if [ "$after" -gt $((timeout_s + margin)) ]; then
    echo "FAIL: the job took ${after}s to end after the cut: it hung"; fail=1
  fi
else
  echo "FAIL: the loop never reached 200 all-reduces: the link was not cut mid-run"; fail=1
fi
if ! grep -q -E "allreduce of .* timed out after|rank 2 stopped responding|lost communication with a remote daemon" "$out"; then
  echo "FAIL: no clear error (timeout naming the operation, or the lost host)"; fail=1
fi
sleep 1
left=""
for ns in pt-h1 pt-h2 pt-h3; do left="$left$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"; done
left="$left$(pgrep -f -- "$tag" | tr '\n' ' ')"
if [ -n "$(echo "$left" | tr -d ' ')" ]; then
  echo "FAIL: processes left behind after the job ended: $left"; fail=1
fi
[ $fail -eq 0 ] && echo "PASS multihost_test"
exit $fail
