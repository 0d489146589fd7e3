#!/usr/bin/env bash
# partrain's OpenBLAS core check (src/cli/main.c): when OpenBLAS runs kernels
# below what the CPU supports, partrain sets OPENBLAS_CORETYPE and re-runs
# itself once, saying so in one line; a value the user set is left alone; the
# marker stops a second re-run. OpenBLAS's choice is faked with an LD_PRELOAD
# shim (fake_corename.c) that reports "Prescott" while OPENBLAS_CORETYPE is
# unset. Usage: test_blas_reexec.sh PATH/TO/partrain PATH/TO/libfake_corename.so
set -u
P=${1:?usage: test_blas_reexec.sh PARTRAIN SHIM}
SHIM=${2:?usage: test_blas_reexec.sh PARTRAIN SHIM}
T=$(mktemp -d /tmp/pt-test-reexec-XXXXXX)
trap 'rm -rf "$T"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $1" >&2; }
bad() { fail=$((fail + 1)); echo "FAIL $1: $2" >&2; }

flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]]; }
if has avx512f && has avx512bw && has avx512vl && has avx512dq; then
    want=SkylakeX
elif has avx2 && has fma; then
    want=Haswell
else
    echo "skip: this CPU has no AVX2+FMA, so no kernel to advise" >&2
    exit 77
fi
# The sanitizer build links ASan's runtime, which wants to be loaded first.
export ASAN_OPTIONS="${ASAN_OPTIONS:-}${ASAN_OPTIONS:+:}verify_asan_link_order=0"
unset OPENBLAS_CORETYPE PT_BLAS_REEXEC
export PT_LOG=info

# 1. Prescott on an AVX2 / AVX-512 CPU: one line, then the re-run does the work.
LD_PRELOAD=$SHIM "$P" --help >"$T/out" 2>"$T/err"
rc=$?
n=$(grep -c "re-running with OPENBLAS_CORETYPE=$want" "$T/err")
if [ $rc -ne 0 ]; then
    bad "re-exec" "exit $rc: $(cat "$T/err")"
elif [ "$n" -ne 1 ] || [ "$(wc -l <"$T/err")" -ne 1 ]; then
    bad "re-exec" "expected one line naming $want on stderr, got: $(cat "$T/err")"
elif ! grep -q "Prescott" "$T/err"; then
    bad "re-exec" "the line does not name OpenBLAS's choice: $(cat "$T/err")"
elif [ "$(grep -c '^usage: partrain' "$T/out")" -ne 1 ]; then
    bad "re-exec" "expected the command to run once after the re-run: $(cat "$T/out")"
else
    ok "re-exec"
fi

# 2. The user's OPENBLAS_CORETYPE is respected: no re-run, no line.
OPENBLAS_CORETYPE=Prescott LD_PRELOAD=$SHIM "$P" --help >"$T/out" 2>"$T/err"
rc=$?
if [ $rc -ne 0 ] || [ -s "$T/err" ]; then
    bad "user coretype" "exit $rc, stderr: $(cat "$T/err")"
else
    ok "user coretype"
fi

# 3. The marker stops a loop: a re-run that still gets Prescott warns once
#    and carries on.
PT_BLAS_REEXEC=$want LD_PRELOAD=$SHIM "$P" --help >"$T/out" 2>"$T/err"
rc=$?
if [ $rc -ne 0 ] || [ "$(wc -l <"$T/err")" -ne 1 ] || ! grep -q "warn: OpenBLAS runs its Prescott" "$T/err"; then
    bad "loop guard" "exit $rc, stderr: $(cat "$T/err")"
else
    ok "loop guard"
fi

# 4. A failing command after the re-run: its exit status and its one error line.
LD_PRELOAD=$SHIM "$P" train --config "$T/no-such.json" >"$T/out" 2>"$T/err"
rc=$?
if [ $rc -eq 0 ] || [ $rc -ge 128 ] || [ "$(grep -c '^partrain: ' "$T/err")" -ne 1 ] ||
    ! grep -q "no-such.json" "$T/err"; then
    bad "error after re-exec" "exit $rc, stderr: $(cat "$T/err")"
else
    ok "error after re-exec"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
