#!/usr/bin/env bash
# Fuzzes the parsers of untrusted files with libFuzzer: builds fuzz/'s
# targets with clang (-fsanitize=fuzzer,address,undefined, every library
# instrumented) in build-fuzz/, then runs each for SECONDS (default 60),
# starting from the seed corpus fuzz/corpus/<target> and the saved crashers
# tests/fuzz_regress/<target>. New inputs go to build-fuzz/corpus/<target>
# (not committed); a crash leaves build-fuzz/crash-<target>-* and fails the
# script: save it under tests/fuzz_regress/<target>/ once fixed, so that
# the quick tier replays it.
#   bash scripts/fuzz.sh        # 60 s a target
#   bash scripts/fuzz.sh 20     # what the full tier runs
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-60}
targets=(safetensors config data cluster plan state metrics)
cc=${PT_FUZZ_CC:-clang}
if ! command -v "$cc" >/dev/null; then
  echo "fuzz: $cc not found (apt-get install clang)" >&2
  exit 1
fi

# Debug + ASan/UBSan (PT_SANITIZE) + coverage (PT_FUZZ); portable code, no
# MPI: the parsers are what is fuzzed, not the kernels.
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=Debug -DPT_SANITIZE=ON \
  -DPT_FUZZ=ON -DPT_NATIVE=OFF -DPT_WITH_MPI=OFF >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]/#/fuzz_}" >/dev/null

export OPENBLAS_NUM_THREADS=1 PT_LOG=error
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export ASAN_OPTIONS=detect_leaks=1
failed=()
for t in "${targets[@]}"; do
  work=build-fuzz/corpus/$t
  mkdir -p "$work"
  seeds=(fuzz/corpus/"$t")
  [ -d tests/fuzz_regress/"$t" ] && seeds+=(tests/fuzz_regress/"$t")
  dict=()
  [ -f fuzz/"$t".dict ] && dict=(-dict=fuzz/"$t".dict)
  echo "== fuzz_$t: $secs s"
  if ! build-fuzz/fuzz/fuzz_"$t" "${dict[@]}" -max_total_time="$secs" -max_len=16384 -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=build-fuzz/crash-"$t"- \
      "$work" "${seeds[@]}" 2>build-fuzz/fuzz_"$t".log; then
    tail -40 build-fuzz/fuzz_"$t".log >&2
    failed+=("$t")
  else
    grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb' build-fuzz/fuzz_"$t".log || true
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (inputs in build-fuzz/crash-*)" >&2
  exit 1
fi
echo "fuzz: no crash in ${targets[*]} ($secs s each)"
