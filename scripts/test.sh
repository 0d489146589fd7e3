#!/usr/bin/env bash
# The whole test suite: installs what it needs, builds the release tree and
# the sanitizer tree (ASan + UBSan), and runs CTest in both; then the same
# tests in a build without -march=native (no AVX-512 code: OpenBLAS products).
#   bash scripts/test.sh             # release + sanitizers (what CI runs)
#   bash scripts/test.sh --quick     # release only
#   bash scripts/test.sh --full      # also the slow "full" tier (with 20 s a target of
#                                    # fuzzing, scripts/fuzz.sh; installs clang for it)
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
if [ "$mode" = --full ]; then PT_FULL=1 bash scripts/setup.sh; else bash scripts/setup.sh; fi

# Open MPI refuses to run as root unless told; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1

labels=(-L quick)
[ "$mode" = --full ] && labels=()
# One test per core: the multi-rank tests oversubscribe anyway (one BLAS
# thread a rank), and the tests that must run alone say so (RUN_SERIAL:
# the simulated hosts); serial, the three trees took 28 minutes.
jobs=(-j "$(nproc)")
# The heaviest parity tests on shm (label heavy: test_pp, test_tp,
# test_pp_ckpt, test_compose; about 390 s of CPU under ASan) run in the
# release and portable trees; under the sanitizers the same binaries run
# under mpirun (test_pp_mpi_np2/np4, test_tp_mpi_np4, test_compose_mpi_np8)
# and their paths in test_perpart and test_tp_ckpt, so that CI stays inside
# its 20 minutes (20m47s with them, on a slow day); --full runs them all.
asan_skip=(-LE heavy)
[ "$mode" = --full ] && asan_skip=()

echo "== release build: tests"
ctest --test-dir build --output-on-failure "${jobs[@]}" "${labels[@]}"

if [ "$mode" != --quick ]; then
  echo "== sanitizer build (ASan + UBSan): tests"
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DPT_SANITIZE=ON >/dev/null
  cmake --build build-asan -j "$(nproc)" >/dev/null
  # Open MPI's own allocations are never freed before exit: not ours to report.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
  LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0" \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure "${jobs[@]}" "${labels[@]}" "${asan_skip[@]}"

  # Both trees above are -march=native (AVX-512 on some CI machines, not on
  # others); the kernels' portable vector code and the OpenBLAS-only GEMM
  # path are what CPUs without AVX-512 run: the whole suite runs on them too.
  echo "== portable build (no -march=native): tests"
  cmake -S . -B build-portable -DCMAKE_BUILD_TYPE=Release -DPT_NATIVE=OFF >/dev/null
  cmake --build build-portable -j "$(nproc)" >/dev/null
  ctest --test-dir build-portable --output-on-failure "${jobs[@]}" "${labels[@]}"
fi
