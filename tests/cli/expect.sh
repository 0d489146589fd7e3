# The CLI tests' checks, sourced by test_cli.sh and test_outputs.sh: every bad
# input gets a non-zero exit and exactly ONE line on stderr, "partrain: ...",
# naming the input. Needs $T (the test's temporary directory) set before use;
# counts in $pass and $fail.
pass=0
fail=0

ok() { pass=$((pass + 1)); echo "ok   $1" >&2; }
bad() { fail=$((fail + 1)); echo "FAIL $1: $2" >&2; }

# expect_fail NAME PATTERN CMD...: non-zero exit, one stderr line that starts
# with "partrain: " and contains PATTERN (fixed string).
expect_fail() {
    local name=$1 pattern=$2
    shift 2
    "$@" >"$T/out" 2>"$T/err"
    local rc=$? lines
    # On CPUs where OpenBLAS picks kernels below the CPU's, partrain says once
    # that it re-runs itself (test_blas_reexec.sh): not part of the error.
    lines=$(grep -vc '^partrain info: OpenBLAS chose its' "$T/err")
    if [ $rc -eq 0 ]; then
        bad "$name" "exit 0"
    elif [ $rc -ge 128 ]; then
        bad "$name" "crashed (exit $rc): $(cat "$T/err")"
    elif [ "$lines" -ne 1 ]; then
        bad "$name" "expected one line on stderr, got $lines: $(cat "$T/err")"
    elif ! grep -q '^partrain: ' "$T/err"; then
        bad "$name" "no 'partrain: ' prefix: $(cat "$T/err")"
    elif ! grep -qF -- "$pattern" "$T/err"; then
        bad "$name" "message lacks '$pattern': $(cat "$T/err")"
    else
        ok "$name"
    fi
}

# expect_fail_run NAME PATTERN CMD...: a run that fails after it started
# (progress lines before): non-zero exit, and its last stderr line is the one
# "partrain: " line, containing PATTERN.
expect_fail_run() {
    local name=$1 pattern=$2
    shift 2
    "$@" >"$T/out" 2>"$T/err"
    local rc=$?
    if [ $rc -eq 0 ]; then
        bad "$name" "exit 0"
    elif [ $rc -ge 124 ]; then
        bad "$name" "crashed or timed out (exit $rc): $(tail -3 "$T/err")"
    elif [ "$(grep -c '^partrain: ' "$T/err")" -ne 1 ] || ! tail -1 "$T/err" | grep -q '^partrain: '; then
        bad "$name" "expected one 'partrain: ' line, last: $(tail -3 "$T/err")"
    elif ! tail -1 "$T/err" | grep -qF -- "$pattern"; then
        bad "$name" "message lacks '$pattern': $(tail -1 "$T/err")"
    else
        ok "$name"
    fi
}

expect_ok() {
    local name=$1
    shift
    if "$@" >"$T/out" 2>"$T/err"; then ok "$name"; else bad "$name" "exit $?: $(tail -3 "$T/err")"; fi
}
