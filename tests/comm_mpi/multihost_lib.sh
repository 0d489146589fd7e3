# Shared by the multihost tests (multihost_test.sh, multihost_tp_test.sh):
# simulated hosts from ../shared/multihost/hosts.sh and Open MPI over TCP
# between them. Sourced, POSIX sh.
#
#   mh_setup NAME N     exit 77 (CTest SKIP_RETURN_CODE) unless network
#                       namespaces can be made here; take the machine-wide
#                       lock; make hosts pt-h1..pt-hN; on exit remove them,
#                       every process left in them and $mh_dir
#   mh_mpirun ARGS...   $mpirun from host 1 with the flags every test needs
#                       (rsh agent, session directories, TCP only on the
#                       hosts' network, keepalive); prefixed by $mh_wrap
#   mh_startup_failed FILE
#                       whether FILE shows an Open MPI start-up failure
#
# $mh_dir is a fresh folder for the test's files (removed on exit). The
# shared folder: $PT_SHARED_DIR, else <repo root>/../shared.
mh_root=${PT_SOURCE_DIR:-$(git rev-parse --show-toplevel 2>/dev/null || pwd)}
mh_shared=${PT_SHARED_DIR:-$mh_root/../shared}
mh_hosts=$mh_shared/multihost/hosts.sh
mh_wrap=""
mh_n=0

mh_setup() {
  mh_name=$1
  mh_n=$2
  [ -f "$mh_hosts" ] || mh_skip "$mh_hosts not found (set PT_SHARED_DIR to the shared folder)"
  [ "$(id -u)" = 0 ] || mh_skip "needs root (network namespaces)"
  command -v ip >/dev/null 2>&1 || mh_skip "needs iproute2 (ip)"
  ip netns add "pt-probe-$$" >/dev/null 2>&1 || mh_skip "ip netns not permitted here"
  ip netns del "pt-probe-$$"
  # One run at a time on this machine: the hosts' names (pt-h1..) are
  # fixed, so a second run's `hosts.sh down` would tear down the first's.
  exec 9>/tmp/partrain-multihost.lock
  flock -w 120 9 || mh_skip "another multihost test held the lock for 120 s"
  # Also Open MPI's session directories, for this run only: the simulated
  # hosts share /tmp and the host name, so another mpirun on this machine
  # could otherwise pick the same job-family directory.
  mh_dir=$(mktemp -d)
  trap mh_cleanup EXIT
  trap 'exit 1' INT TERM
  sh "$mh_hosts" down >/dev/null 2>&1 # a previous run killed before its trap
  sh "$mh_hosts" up "$mh_n" || { echo "FAIL: hosts.sh up $mh_n"; exit 1; }
}

mh_skip() {
  echo "SKIP $mh_name: $*"
  exit 77
}

mh_cleanup() {
  # Processes we started inside the hosts (a daemon cut off from mpirun
  # may linger); then the namespaces themselves.
  i=1
  while [ $i -le $mh_n ]; do
    for p in $(ip netns pids "pt-h$i" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    i=$((i + 1))
  done
  sh "$mh_hosts" down
  rm -rf "$mh_dir"
}

# Open MPI notices a dead host only through TCP keepalive on its control
# connections (oob_tcp_keepalive_*: default 300 s); without it mpirun hangs
# while tearing the job down. About 3 s here (see docs/mpi.md).
mh_mpirun() {
  $mh_wrap ip netns exec pt-h1 "$mpirun" \
    --mca plm_rsh_agent "$(sh "$mh_hosts" agent)" \
    --mca orte_tmpdir_base "$mh_dir" \
    --mca btl tcp,self --mca btl_tcp_if_include 10.213.0.0/24 \
    --mca oob_tcp_if_include 10.213.0.0/24 \
    --mca oob_tcp_keepalive_time 1 --mca oob_tcp_keepalive_intvl 1 \
    --mca oob_tcp_keepalive_probes 3 "$@"
}

# The daemons of the simulated hosts share one /tmp, which real hosts never
# do, and sometimes race on it at start-up ("mkdir ... File exists",
# "orte_init failed": about 1 start in 10 here): such a failure, before any
# of our code ran, is worth a retry.
mh_startup_failed() {
  grep -q -E "orte_init failed|unable to reliably start|ORTE_ERROR_LOG" "$1"
}

# mh_run_placed BIN OUT: run "BIN --mpi" on every rank through the caller's
# mpi() function, each rank first printing "placement: rank R on
# 10.213.0.H" (the host it really runs on); a start-up failure before any
# rank ran (mh_startup_failed) is retried, twice. Sets rc; prints OUT.
mh_run_placed() {
  probe='echo "placement: rank $OMPI_COMM_WORLD_RANK on $(ip -o -4 addr show | grep -o "10\.213\.0\.[0-9]*")"; exec "$0" --mpi'
  attempt=1
  while :; do
    mpi sh -c "$probe" "$1" >"$2" 2>&1
    rc=$?
    [ $rc -ne 0 ] && mh_startup_failed "$2" && ! grep -q "^placement:" "$2" && [ $attempt -lt 3 ] || break
    echo "(Open MPI failed to start on the simulated hosts, attempt $attempt; retrying)"
    attempt=$((attempt + 1))
    sleep 1
  done
  cat "$2"
}
