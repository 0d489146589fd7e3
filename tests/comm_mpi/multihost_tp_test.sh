#!/bin/sh
# dp 2 x tp 2 across two simulated hosts (issue 12, acceptance): the tensor-
# parallel parity harness (test_tp --mpi, the layouts of world size 4) under
# Open MPI over TCP between network namespaces pt-h1 and pt-h2
# (../shared/multihost/hosts.sh), set up by multihost_lib.sh.
#
#   multihost_tp_test.sh MPIRUN TEST_TP
#
# Two slots a host, filled in order (--map-by slot): world ranks 0, 1 on
# host 1 and 2, 3 on host 2. The mesh puts tp fastest (rank = dp_i * tp +
# tp_i), so each tp group lives on one host and only the dp all-reduces
# cross between them: the Megatron placement. Every rank prints the address
# of the host it runs on before it starts, and the test asserts that
# placement from those lines rather than trusting the mapper.
#
# The np-4 layouts of test_tp also include tp = 4 (one group over both
# hosts); they run too.
#
# Needs root and iproute2; exits 77 (CTest SKIP_RETURN_CODE) when network
# namespaces cannot be made. The namespaces are always removed (trap).
# The hosts and mpirun's flags: multihost_lib.sh.
set -u
mpirun=$1 bin=$2
export PT_LOG=${PT_LOG:-warn} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
. "$(dirname "$0")/multihost_lib.sh"
mh_setup multihost_tp_test 2
out=$mh_dir/out

# The outer timeout turns a hang into a failure instead of outliving CTest.
mh_wrap="timeout 240"
mpi() {
  mh_mpirun -x PT_LOG -x OPENBLAS_NUM_THREADS --map-by slot --bind-to none \
    -np 4 --host 10.213.0.1:2,10.213.0.2:2 "$@"
}

# Each rank: "placement: rank R on 10.213.0.H", then test_tp --mpi.
mh_run_placed "$bin" "$out"

fail=0
[ $rc -eq 0 ] || { echo "FAIL: test_tp --mpi across 2 hosts exited $rc"; fail=1; }
# one tp group a host: ranks 0, 1 (dp 0) on host 1; 2, 3 (dp 1) on host 2
for want in "0 on 10.213.0.1" "1 on 10.213.0.1" "2 on 10.213.0.2" "3 on 10.213.0.2"; do
  grep -qx "placement: rank $want" "$out" || { echo "FAIL: expected rank $want"; fail=1; }
done
# the dp x tp layouts really ran (not skipped for a world size mismatch),
# under both optimizer variants, and nothing failed
for layout in "parallel.dp=2 parallel.tp=2" "parallel.dp=2 parallel.tp=2 parallel.zero=3"; do
  for v in adamw sgd; do
    grep -qF "  $layout [$v] " "$out" || { echo "FAIL: no result for '$layout [$v]'"; fail=1; }
  done
done
# every rank prints its summary; only rank 0's sets the exit status
grep -q "^[1-9][0-9]* passed, 0 failed$" "$out" || { echo "FAIL: no passing summary"; fail=1; }
if grep -q -E "^[0-9]+ passed, [1-9][0-9]* failed$|^FAIL |CHECK[A-Z_]* failed" "$out"; then
  echo "FAIL: a rank reported failed checks"; fail=1
fi
[ $fail -eq 0 ] && echo "PASS multihost_tp_test"
exit $fail
