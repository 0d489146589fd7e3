#!/bin/sh
# `partrain bench comm` end to end on tiny sizes (tests/comm_mpi/CMakeLists.txt):
# the run re-executes itself under mpirun, every backend (shm, mpi,
# mpi_native, memcpy) reports every op with the JSON fields of DESIGN's
# contract, the human table prints, and no shared-memory segment is left.
set -u
partrain=$1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail=0
before=$(ls /dev/shm | grep -c '^partrain' || true)
if ! "$partrain" bench comm --nproc 2 --max-bytes 64 --rounds 1 --iters 20 --json >"$out"; then
  echo "FAIL: bench comm --json exited non-zero"; fail=1
fi
cat "$out"
for be in shm mpi mpi_native memcpy; do
  for op in allreduce reduce_scatter allgather broadcast; do
    n=$(grep -c "\"op\":\"$op\",\"backend\":\"$be\"" "$out")
    if [ "$n" -ne 4 ]; then echo "FAIL: $op/$be: $n lines, expected 4 (8..64 bytes)"; fail=1; fi
  done
done
for field in '"ranks":' '"bytes":' '"usec":' '"busbw_gbps":'; do
  grep -q "$field" "$out" || { echo "FAIL: no $field in the JSON lines"; fail=1; }
done
if ! "$partrain" bench comm --nproc 3 --max-bytes 16 --rounds 1 --iters 5 --ops allreduce >"$out"; then
  echo "FAIL: bench comm (table) exited non-zero"; fail=1
fi
cat "$out"
grep -q "allreduce, 3 ranks" "$out" || { echo "FAIL: no table header for 3 ranks"; fail=1; }
after=$(ls /dev/shm | grep -c '^partrain' || true)
if [ "$after" -gt "$before" ]; then echo "FAIL: shared-memory segments left in /dev/shm"; fail=1; fi
[ $fail -eq 0 ] && echo "PASS bench_smoke"
exit $fail
