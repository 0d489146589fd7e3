#!/bin/sh
# pp 2 across two simulated hosts (issue 13, acceptance): the pipeline
# parity harness (test_pp --mpi, the layouts of world size 2: every
# schedule, m 2, 4, 8, recompute) under Open MPI over TCP between network
# namespaces pt-h1 and pt-h2 (../shared/multihost/hosts.sh), set up by
# multihost_lib.sh.
#
#   multihost_pp_test.sh MPIRUN TEST_PP
#
# One slot a host: stage 0 (world rank 0) on host 1, stage 1 on host 2, so
# every activation, every gradient and the tied wte cross between them.
# Every rank prints the address of the host it runs on before it starts,
# and the test asserts that placement from those lines.
#
# Needs root and iproute2; exits 77 (CTest SKIP_RETURN_CODE) when network
# namespaces cannot be made. The namespaces are always removed (trap).
# The hosts and mpirun's flags: multihost_lib.sh.
set -u
mpirun=$1 bin=$2
export PT_LOG=${PT_LOG:-warn} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
. "$(dirname "$0")/multihost_lib.sh"
mh_setup multihost_pp_test 2
out=$mh_dir/out

# The outer timeout turns a hang into a failure instead of outliving CTest.
mh_wrap="timeout 240"
mpi() {
  mh_mpirun -x PT_LOG -x OPENBLAS_NUM_THREADS --map-by slot --bind-to none \
    -np 2 --host 10.213.0.1:1,10.213.0.2:1 "$@"
}

# Each rank: "placement: rank R on 10.213.0.H", then test_pp --mpi.
mh_run_placed "$bin" "$out"

fail=0
[ $rc -eq 0 ] || { echo "FAIL: test_pp --mpi across 2 hosts exited $rc"; fail=1; }
# one stage a host
for want in "0 on 10.213.0.1" "1 on 10.213.0.2"; do
  grep -qx "placement: rank $want" "$out" || { echo "FAIL: expected rank $want"; fail=1; }
done
# the pipeline layouts really ran (not skipped for a world size mismatch),
# under both optimizer variants, and nothing failed
for layout in "model.n_layer=3 parallel.pp=2 parallel.schedule=1f1b parallel.microbatches=4" \
  "model.n_layer=3 parallel.pp=2 parallel.schedule=zbv parallel.microbatches=8"; do
  for v in adamw sgd; do
    grep -qF "  $layout [$v] " "$out" || { echo "FAIL: no result for '$layout [$v]'"; fail=1; }
  done
done
# every rank prints its summary; only rank 0's sets the exit status
grep -q "^[1-9][0-9]* passed, 0 failed$" "$out" || { echo "FAIL: no passing summary"; fail=1; }
if grep -q -E "^[0-9]+ passed, [1-9][0-9]* failed$|^FAIL |CHECK[A-Z_]* failed" "$out"; then
  echo "FAIL: a rank reported failed checks"; fail=1
fi
[ $fail -eq 0 ] && echo "PASS multihost_pp_test"
exit $fail
