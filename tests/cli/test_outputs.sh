#!/usr/bin/env bash
# Output paths (docs/untrusted.md): every output option of every command
# refuses what is not a regular file (checkpoint.dir: not a directory), a
# missing folder and a file where a folder should be, with one line naming
# the path, before any work, and leaves the thing there as it was (a FIFO
# stays a FIFO, a device a device, nothing new in the directory). Then each
# writer under a file size limit (ulimit -f; partrain ignores SIGXFSZ
# itself): exit 1, one line naming the file and "File too large", no
# temporary left, a file that was there untouched.
# Usage: test_outputs.sh PATH/TO/partrain
set -u
P=${1:?usage: test_outputs.sh PATH/TO/partrain}
[ -x "$P" ] || { echo "test_outputs: $P is not an executable" >&2; exit 1; }
# ok, bad, expect_fail, expect_fail_run, expect_ok
. "$(dirname "${BASH_SOURCE[0]}")/expect.sh"
T=$(mktemp -d /tmp/pt-test-out-XXXXXX) # short: a socket's path must fit sun_path
trap 'rm -rf "$T"' EXIT
cd "$T"

for i in $(seq 1 300); do echo "the quick brown fox $i jumps over the lazy dog"; done >train.txt
cat >tiny.json <<'EOF'
{
  "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 256, "seq_len": 16},
  "data": {"train": "train.txt"},
  "train": {"steps": 4, "batch_size": 2, "warmup_steps": 1, "val_every": 0, "threads": 1},
  "log": {"every": 1}
}
EOF
cat >cpu.json <<'EOF'
{"name": "two-cores", "nodes": 1, "devices_per_node": 2,
 "device": {"name": "core", "peak_flops": {"fp32": 5e10}, "memory_bytes": 4e9, "memory_bw": 1e10},
 "links": {"intra_node": {"bw": 5e9, "latency": 2e-6}, "inter_node": {"bw": 5e9, "latency": 2e-6}}}
EOF

# ---- the things that are not regular files (never the machine's own /dev) ----
mkfifo fifo
mkdir adir
echo "a file" >afile
kinds=("fifo:a FIFO" "adir:a directory")
if mknod null c 1 3 2>/dev/null; then
    kinds+=("null:a character device")
else
    echo "note: mknod not permitted here (not root): the device cases are skipped" >&2
fi
if python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' sock 2>/dev/null; then
    kinds+=("sock:a socket")
else
    echo "note: no python3 to make a socket: the socket cases are skipped" >&2
fi

# what each special file is (test -p/-c/-S/-d), to see it unchanged after
kind_ok() {
    case $1 in
    fifo) [ -p fifo ] ;;
    null) [ -c null ] ;;
    sock) [ -S sock ] ;;
    adir) [ -d adir ] && [ -z "$(ls -A adir)" ] ;;
    afile) [ -f afile ] && [ "$(cat afile)" = "a file" ] ;;
    esac
}

# refused NAME PATTERN CMD...: expect_fail (under a timeout: a writer that
# opens a FIFO blocks) and nothing in this directory changed: no file made,
# each special file still what it was
refused() {
    local name=$1 before
    before=$(ls -A | grep -vx 'out\|err')
    expect_fail "$@"
    [ "$(ls -A | grep -vx 'out\|err')" = "$before" ] || bad "$name" "left: $(ls -A | tr '\n' ' ')"
    for k in fifo null sock adir afile; do
        [ ! -e $k ] && [ ! -L $k ] && continue
        kind_ok $k || bad "$name" "$k changed: $(ls -ld $k)"
    done
}

PLAN=("$P" plan --config tiny.json --cluster cpu.json)
TRAIN=("$P" train --config tiny.json)

for entry in "${kinds[@]}"; do
    f=${entry%%:*} what=${entry#*:}
    refused "plan --write $f" "--write $f: is $what, not a regular file" timeout 20 "${PLAN[@]}" --write $f
    refused "plan --trace $f" "--trace $f: is $what, not a regular file" timeout 20 "${PLAN[@]}" --trace $f
    # before measuring: --quick alone takes seconds, the timeout says so
    refused "calibrate --out $f" "--out $f: is $what, not a regular file" timeout 20 "$P" calibrate --quick --out $f
    refused "calibrate --probe --out $f" "--out $f: is $what, not a regular file" timeout 20 "$P" calibrate --probe 0.05 --out $f
    refused "log.metrics $f" "log.metrics: $f: is $what, not a regular file" timeout 20 "${TRAIN[@]}" --set log.metrics=$f
    refused "log.trace $f" "log.trace: $f: is $what, not a regular file" timeout 20 "${TRAIN[@]}" --set log.trace=$f
    [ $f = adir ] && continue
    refused "checkpoint.dir $f" "checkpoint.dir: $f: is $what, not a directory" timeout 20 "${TRAIN[@]}" --set checkpoint.dir=$f
done
refused "checkpoint.dir a regular file" "checkpoint.dir: afile: is a regular file, not a directory" \
    timeout 20 "${TRAIN[@]}" --set checkpoint.dir=afile
# before forking ranks (one line, no rank's), before planning (no
# "layout auto" line), before resuming
refused "log.metrics fifo, two ranks" "log.metrics: fifo: is a FIFO" timeout 20 "${TRAIN[@]}" \
    --set parallel.dp=2 --nproc 2 --set log.metrics=fifo
refused "log.trace fifo, layout auto" "log.trace: fifo: is a FIFO" timeout 20 "${TRAIN[@]}" \
    --layout auto --cluster cpu.json --set log.trace=fifo
refused "checkpoint.dir fifo, resume" "checkpoint.dir: fifo: is a FIFO" timeout 20 "${TRAIN[@]}" \
    --set checkpoint.dir=fifo --resume
# a folder that is missing, or a file where a folder goes
missing_folder() { # NAME CMD... (the path is appended)
    local name=$1
    shift
    refused "$name in a missing folder" "nope/x.json: folder nope does not exist" \
        timeout 20 "$@"nope/x.json
    refused "$name under a file" "afile/x.json: Not a directory (afile is a regular file)" \
        timeout 20 "$@"afile/x.json
}
missing_folder "plan --write" "${PLAN[@]}" --write=
missing_folder "plan --trace" "${PLAN[@]}" --trace=
missing_folder "calibrate --out" "$P" calibrate --quick --out=
missing_folder "calibrate --probe --out" "$P" calibrate --probe 0.05 --out=
missing_folder "log.trace" "${TRAIN[@]}" --set log.trace=
# log.metrics and checkpoint.dir make missing folders; under a file they cannot
refused "log.metrics under a file" "log.metrics: afile/m/x.jsonl: Not a directory (afile is a regular file)" \
    timeout 20 "${TRAIN[@]}" --set log.metrics=afile/m/x.jsonl
refused "checkpoint.dir under a file" "checkpoint.dir: afile/ck: Not a directory (afile is a regular file)" \
    timeout 20 "${TRAIN[@]}" --set checkpoint.dir=afile/ck

# ---- under a file size limit ----
# limited BLOCKS CMD...: CMD under `ulimit -f BLOCKS` (1 KiB each), stdout
# to /dev/null and stderr through a pipe into $T/err (neither is a regular
# file the limit applies to); no `trap '' XFSZ`: partrain must ignore it.
limited() {
    local blocks=$1
    shift
    (ulimit -f "$blocks" && exec "$@") 2>&1 >/dev/null | cat >"$T/err"
    return "${PIPESTATUS[0]}"
}
# expect_limited NAME FILE BLOCKS CMD...: exit 1 (not a signal's 128+),
# one "partrain: " line (besides the launcher's "rank N exited ..." summary)
# naming FILE with "File too large", nothing about a signal
expect_limited() {
    local name=$1 file=$2 blocks=$3
    shift 3
    limited "$blocks" "$@"
    local rc=$?
    local lines
    lines=$(grep '^partrain: ' "$T/err" | grep -v '^partrain: rank [0-9]* exited with code 1')
    if [ $rc -eq 0 ]; then
        bad "$name" "exit 0"
    elif [ $rc -ge 128 ]; then
        bad "$name" "killed (exit $rc): $(tail -2 "$T/err")"
    elif [ "$(printf '%s\n' "$lines" | grep -c .)" -ne 1 ]; then
        bad "$name" "expected one 'partrain: ' line: $(tail -3 "$T/err")"
    elif ! printf '%s\n' "$lines" | grep -qF -- "$file" ||
        ! printf '%s\n' "$lines" | grep -qF "File too large"; then
        bad "$name" "line lacks '$file' or the reason: $lines"
    elif grep -qi "signal" "$T/err"; then
        bad "$name" "a signal: $(grep -i signal "$T/err")"
    else
        ok "$name"
    fi
}
# no_tmp NAME: no temporary left in this directory (nor in DIR, if given)
no_tmp() {
    local left
    left=$(ls -A . ${2:-} | grep -i 'tmp')
    [ -z "$left" ] || bad "$1" "left $left"
}

echo "the old plan" >plan.json
expect_limited "plan --write over the limit" "plan.json: write failed" 0 "${PLAN[@]}" --write plan.json
no_tmp "plan --write over the limit"
[ "$(cat plan.json)" = "the old plan" ] || bad "plan --write over the limit" "plan.json changed"
echo "the old trace" >trace.json
expect_limited "plan --trace over the limit" "trace.json: write failed" 0 "${PLAN[@]}" --trace trace.json
no_tmp "plan --trace over the limit"
[ "$(cat trace.json)" = "the old trace" ] || bad "plan --trace over the limit" "trace.json changed"
echo "the old probe" >probe.json
expect_limited "calibrate --probe --out over the limit" "probe.json: write failed" 0 \
    "$P" calibrate --probe 0.05 --out probe.json
no_tmp "calibrate --probe --out over the limit"
[ "$(cat probe.json)" = "the old probe" ] || bad "calibrate --out over the limit" "probe.json changed"
# log.trace: the parts and the merge, 1 KiB (the trace is larger)
expect_limited "log.trace over the limit" "log.trace: " 1 "${TRAIN[@]}" --set log.trace=trace.json
no_tmp "log.trace over the limit"
[ "$(cat trace.json)" = "the old trace" ] && [ -z "$(ls -A | grep 'trace\.json\.rank')" ] ||
    bad "log.trace over the limit" "trace.json changed or parts left: $(ls -A)"
# log.metrics is a stream (written line by line): the failed write is named
expect_limited "log.metrics over the limit" "log.metrics: m.jsonl: write failed" 1 "${TRAIN[@]}" \
    --set log.metrics=m.jsonl --set train.steps=20
no_tmp "log.metrics over the limit"
# a checkpoint save: the file named, latest still the step saved before
"${TRAIN[@]}" --set checkpoint.dir=ck --set train.steps=2 >/dev/null 2>&1 ||
    bad "a first checkpoint" "exit $?"
expect_limited "checkpoint save over the limit" "/model.safetensors: write failed" 8 \
    "${TRAIN[@]}" --set checkpoint.dir=ck --resume
no_tmp "checkpoint save over the limit" ck
[ "$(cat ck/latest)" = step_00000002 ] && [ ! -e ck/step_00000004 ] ||
    bad "checkpoint save over the limit" "ck: $(ls -A ck), latest $(cat ck/latest)"
# the same through the launcher (--nproc 1: a forked rank), not "killed by signal 25"
expect_limited "checkpoint save over the limit, a forked rank" "/model.safetensors: write failed" 8 \
    "${TRAIN[@]}" --set checkpoint.dir=ck --resume --nproc 1
no_tmp "checkpoint save over the limit, a forked rank" ck
[ "$(cat ck/latest)" = step_00000002 ] || bad "checkpoint save, a forked rank" "latest $(cat ck/latest)"

# ---- calibrate --probe --out writes the probe's line there ----
"$P" calibrate --probe 0.05 --out probe.json >out 2>err
rc=$?
if [ $rc -eq 0 ] && python3 - probe.json out <<'PY'; then
import json, sys
f, out = open(sys.argv[1]).read(), open(sys.argv[2]).read()
d = json.loads(f)
sys.exit(0 if f == out and 0 < d["lo"] <= d["probe_flops_s"] <= d["hi"] else 1)
PY
    ok "calibrate --probe --out: the printed line, in the file"
else
    bad "calibrate --probe --out" "exit $rc: $(cat probe.json out err)"
fi
"$P" calibrate --help | grep -q -- "--probe SECONDS \[--out FILE\]" && ok "calibrate --help: --probe --out" ||
    bad "calibrate --help" "no --probe SECONDS [--out FILE]"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
