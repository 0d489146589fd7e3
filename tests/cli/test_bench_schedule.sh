#!/usr/bin/env bash
# `partrain bench schedule`: gpipe's bubble at p 2, m 4 is (p-1)/(m+p-1) =
# 1/5, in text and JSON; zbv at p 256, m 256 builds (its makespan and
# in_flight); bad arguments exit 2 with one "partrain: " line.
# Usage: test_bench_schedule.sh PATH/TO/partrain
set -u
P=${1:?usage: test_bench_schedule.sh PATH/TO/partrain}
T=$(mktemp -d /tmp/pt-test-bsched-XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0
bad() { fail=$((fail + 1)); echo "FAIL $1: $2" >&2; }
ok() { echo "ok   $1" >&2; }

out=$("$P" bench schedule --schedule gpipe --pp 2 --microbatches 4 2>&1)
b=$(printf '%s\n' "$out" | awk '$1 == "bubble" {print $2}')
[ "$b" = "0.200000" ] && ok "gpipe bubble text" || bad "gpipe bubble text" "got '$b': $out"

out=$("$P" bench schedule --schedule gpipe --pp 2 --microbatches 4 --json 2>&1)
printf '%s\n' "$out" | grep -q '"bubble":0.200000,' && ok "gpipe bubble json" ||
    bad "gpipe bubble json" "$out"
# 12 unit passes per rank and 3 idle: makespan 15; gpipe holds all 4
printf '%s\n' "$out" | grep -q '"makespan":15,.*"in_flight":\[4,4\]' && ok "gpipe makespan" ||
    bad "gpipe makespan" "$out"

# zbv at p 256, m 256 in one build of every rank's list (its list scheduler
# was O(m p^2) a build and the bench built p of them: minutes; this test's
# timeout catches that coming back). Unit times: makespan 6m + p-1 = 1791,
# the lower bound; every rank holds its cap of 2p = 512 chunks.
out=$("$P" bench schedule --schedule zbv --pp 256 --microbatches 256 --json 2>&1)
printf '%s\n' "$out" | grep -q '"makespan":1791,"build_s":[0-9.]*,' && ok "zbv p 256 makespan" ||
    bad "zbv p 256 makespan" "$(printf '%s\n' "$out" | head -c 300)"
n512=$(printf '%s\n' "$out" | sed -n 's/.*"in_flight":\[\([0-9,]*\)\].*/\1/p' | tr ',' '\n' |
    grep -cx 512)
[ "$n512" = 256 ] && ok "zbv p 256 in_flight" || bad "zbv p 256 in_flight" "$n512 ranks at 512"

# expect2 NAME PATTERN ARGS...: exit 2, one stderr line "partrain: ...PATTERN"
expect2() {
    local name=$1 pattern=$2
    shift 2
    "$P" bench schedule "$@" >"$T/out" 2>"$T/err"
    local rc=$? lines
    lines=$(grep -vc '^partrain info: OpenBLAS chose its' "$T/err")
    if [ $rc -ne 2 ]; then
        bad "$name" "exit $rc, expected 2: $(cat "$T/err")"
    elif [ "$lines" -ne 1 ] || ! grep -q "^partrain: .*$pattern" "$T/err"; then
        bad "$name" "expected one 'partrain: ...$pattern' line: $(cat "$T/err")"
    else
        ok "$name"
    fi
}
expect2 "unknown schedule" "parallel.schedule = nosuch" --schedule nosuch --pp 2 --microbatches 4
expect2 "bad pp" "--pp" --schedule gpipe --pp x --microbatches 4
expect2 "negative tw" "--tw" --schedule zb1 --pp 2 --microbatches 4 --tw -1
expect2 "missing microbatches" "--microbatches" --schedule gpipe --pp 2
expect2 "zbv v 3" "parallel.virtual_stages" --schedule zbv --pp 2 --microbatches 4 --virtual-stages 3

[ $fail -eq 0 ] || { echo "test_bench_schedule: $fail failed" >&2; exit 1; }
echo "test_bench_schedule: all passed" >&2
