#!/bin/sh
# The flight recorder's faults across two simulated hosts (issue 39,
# acceptance): tests/comm/flight_test.sh's five cases (rank 2 stopped,
# skipping a collective, deferring one, killed; two collectives of a group
# in the other order under comm.check_order), 4 ranks, Open MPI over TCP
# between network namespaces pt-h1 and pt-h2 (../shared/multihost/hosts.sh,
# set up by multihost_lib.sh).
#
#   multihost_flight_test.sh MPIRUN TEST_COMM_FLIGHT PARTRAIN
#
# Two slots a host, filled in order: ranks 0, 1 on host 1 and 2, 3 on host
# 2, so that test_comm_flight's dp groups ({0,1}, {2,3}) stay on a host and
# its tp groups ({0,2}, {1,3}) and the world cross between them; the fault
# is on host 2, the noticer (rank 0) on host 1. Each case: the job's one
# line names the laggard, the group, the op and its number within
# comm.timeout + 5 s (+ 2 s of mpirun's start), every survivor's dump (the
# hosts share this file system), `partrain flight` on them, nothing left.
# A case whose mpirun failed to start on the simulated hosts (they share
# /tmp; multihost_lib.sh) is retried once.
#
# Needs root and iproute2; exits 77 (CTest SKIP_RETURN_CODE) when network
# namespaces cannot be made. The namespaces are always removed (trap).
set -u
mpirun=$1 bin=$2 P=$3
export PT_LOG=${PT_LOG:-warn} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/multihost_lib.sh"
mh_setup multihost_flight_test 2

# flight_test.sh calls "$MPIRUN -x PT_FAULT=... -np 4 BIN ...": a script that
# runs it from host 1 with the simulated hosts' flags
run=$mh_dir/mpirun-hosts.sh
cat >"$run" <<EOF
#!/bin/sh
exec ip netns exec pt-h1 "$mpirun" \\
  --mca plm_rsh_agent "$(sh "$mh_hosts" agent)" --mca orte_tmpdir_base "$mh_dir" \\
  --mca btl tcp,self --mca btl_tcp_if_include 10.213.0.0/24 \\
  --mca oob_tcp_if_include 10.213.0.0/24 --mca oob_tcp_keepalive_time 1 \\
  --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 3 \\
  -x PT_LOG -x OPENBLAS_NUM_THREADS --map-by slot --bind-to none \\
  --host 10.213.0.1:2,10.213.0.2:2 "\$@"
EOF
chmod +x "$run"

fail=0
for mode in stop skip swap kill order; do
  echo "== $mode across 2 hosts"
  attempt=1
  while :; do
    PT_FLIGHT_TIMEOUT=3 PT_FLIGHT_SEQ=61 PT_FLIGHT_HOSTS=1 \
      sh "$here/../comm/flight_test.sh" mpi "$mode" "$bin" "$P" "$run" \
      >"$mh_dir/$mode.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && mh_startup_failed "$mh_dir/$mode.log" && [ $attempt -lt 2 ] || break
    echo "(Open MPI failed to start on the simulated hosts; retrying)"
    attempt=$((attempt + 1))
    sleep 1
  done
  grep -E "^partrain: |^flight_test|^first mismatch|^FAIL|^PASS" "$mh_dir/$mode.log"
  [ $rc -eq 0 ] || { echo "FAIL: $mode across 2 hosts"; fail=1; }
done
[ $fail -eq 0 ] && echo "PASS multihost_flight_test"
exit $fail
