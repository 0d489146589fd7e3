#!/bin/sh
# partrain train --nproc end to end under ZeRO: dp=2 runs at stages 1-3 (and
# HSDP at dp=4) write metrics with the layout, comm_bytes, mem and
# mem_current, the trace holds the stage-3 all-gathers and reduce-scatters,
# the final loss equals the zero=0 run's to 1e-5, a zero=3 checkpoint
# resumes under dp=1, and bad settings fail with one line.
# Usage: test_zero_cli.sh PARTRAIN
set -u
bin=$1
dir=$(mktemp -d /tmp/pt-test-zero-cli-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

i=0
while [ $i -lt 400 ]; do echo "the quick brown fox jumps over the lazy dog $i." >> "$dir/train.txt"; i=$((i + 1)); done
set -- --set model.n_layer=3 --set model.n_embd=32 --set model.n_head=2 --set model.seq_len=16 \
  --set train.batch_size=8 --set train.steps=6 --set train.threads=1 --set train.val_every=0 \
  --set data.train="$dir/train.txt"

last_loss() { grep '"loss"' "$1" | tail -1 | sed 's/.*"loss":\([^,]*\),.*/\1/'; }

"$bin" train "$@" --set parallel.dp=2 --nproc 2 --set log.metrics="$dir/m0.jsonl" 2> "$dir/err" ||
  fail "zero=0 run failed: $(cat "$dir/err")"
ref=$(last_loss "$dir/m0.jsonl")
for z in 1 2 3; do
  "$bin" train "$@" --set parallel.dp=2 --set parallel.zero=$z --nproc 2 \
    --set log.metrics="$dir/m$z.jsonl" --set log.trace="$dir/t$z.json" \
    --set checkpoint.dir="$dir/ck$z" 2> "$dir/err" || fail "zero=$z run failed: $(cat "$dir/err")"
  for k in "dp2-tp1-pp1-zero$z" comm_bytes '"mem":{' '"mem_current":{' '"optim"'; do
    grep -q "$k" "$dir/m$z.jsonl" || fail "zero=$z metrics lack $k"
  done
  l=$(last_loss "$dir/m$z.jsonl")
  python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(abs(a-b)>1e-5*abs(b))" \
    "$l" "$ref" || fail "zero=$z final loss $l vs zero=0 $ref"
done
python3 - "$dir/t3.json" << 'PY' || fail "zero=3 trace lacks its collectives"
import json, sys
names = {e["name"] for e in json.load(open(sys.argv[1]))["traceEvents"]}
assert "all-gather m0" in names and "reduce-scatter m1" in names and "zero step" in names, names
PY
# HSDP layout string
"$bin" train "$@" --set parallel.dp=4 --set parallel.zero=2 --set parallel.zero_group=2 --nproc 4 \
  --set log.metrics="$dir/mh.jsonl" 2> "$dir/err" || fail "HSDP run failed: $(cat "$dir/err")"
grep -q "dp4-tp1-pp1-zero2-g2" "$dir/mh.jsonl" || fail "HSDP layout missing"
# the zero=3 dp=2 checkpoint (full tensors) resumes under one worker
"$bin" train "$@" --set train.steps=8 --set checkpoint.dir="$dir/ck3" --resume 2> "$dir/err" ||
  fail "dp=1 resume of a zero=3 checkpoint failed: $(cat "$dir/err")"
# bad settings: one line naming the key
"$bin" train "$@" --set parallel.dp=4 --set parallel.zero=1 --set parallel.zero_group=3 --nproc 4 \
  2> "$dir/err" && fail "zero_group 3 of dp 4 accepted"
grep -q "parallel.zero_group" "$dir/err" || fail "zero_group message: $(cat "$dir/err")"
"$bin" train "$@" --set parallel.dp=2 --set parallel.zero=2 --set parallel.sync=stale --nproc 2 \
  2> "$dir/err" && fail "zero with stale accepted"
grep -q "parallel.zero" "$dir/err" || fail "zero/stale message: $(cat "$dir/err")"

[ $fails = 0 ] && echo "test_zero_cli: ok"
exit $fails
