#!/bin/sh
# partrain train --nproc end to end: a dp=2 run writes metrics with the
# data-parallel fields and a trace that is valid JSON with both ranks' main
# and comm tracks; bad input fails with one clear line. Usage: test_dp_cli.sh PARTRAIN
set -u
bin=$1
dir=$(mktemp -d /tmp/pt-test-dp-cli-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

i=0
while [ $i -lt 400 ]; do echo "the quick brown fox jumps over the lazy dog $i." >> "$dir/train.txt"; i=$((i + 1)); done
head -c 3000 "$dir/train.txt" > "$dir/val.txt"
set -- --set model.n_layer=2 --set model.n_embd=32 --set model.n_head=2 --set model.seq_len=16 \
  --set train.batch_size=8 --set train.steps=6 --set train.threads=1 --set train.val_every=0 \
  --set data.train="$dir/train.txt" --set data.val="$dir/val.txt"

"$bin" train "$@" --set parallel.dp=2 --nproc 2 --set log.metrics="$dir/m.jsonl" \
  --set log.trace="$dir/trace.json" 2> "$dir/err" || fail "dp=2 run failed: $(cat "$dir/err")"
steps=$(grep -c '"loss"' "$dir/m.jsonl")
[ "$steps" = 6 ] || fail "expected 6 step lines, got $steps"
for k in compute_ms comm_ms exposed_comm_ms comm_bytes '"world":2' 'dp2-tp1-pp1-zero0' '"mem"'; do
  grep -q "$k" "$dir/m.jsonl" || fail "metrics lack $k"
done
# every step line names the whole mesh (DESIGN's metrics contract)
[ "$(grep -c '"loss".*"layout":"dp2-tp1-pp1-zero0"' "$dir/m.jsonl")" = 6 ] ||
  fail "step lines without the layout dp2-tp1-pp1-zero0"
[ -f "$dir/trace.json" ] || fail "no trace"
ls "$dir"/trace.json.rank* > /dev/null 2>&1 && fail "trace parts left behind"
if command -v python3 > /dev/null; then
  python3 - "$dir/trace.json" << 'PY' || fail "trace is not valid or lacks tracks"
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
tracks = {(e["pid"], e.get("tid")) for e in ev if e["ph"] == "X"}
names = {e["name"] for e in ev}
assert {(0, 0), (0, 1), (1, 0), (1, 1)} <= tracks, tracks
assert "optimizer" in names and "wait grads" in names and "bwd h.0" in names, names
assert any(n.startswith("allreduce b") for n in names), names
PY
fi

# stale and local_sgd checkpoints continue bitwise: a run saving at step 3
# and going on to 6, then a resume from its step 3 to 6, write the same
# step 6 (dp index 0's model and moments, the rank-state files: each dp
# index's own, replica<d>, and what all hold alike, sync)
resume_check() { # NAME ARGS...
  name=$1
  shift
  "$bin" train "$@" --set parallel.dp=2 --nproc 2 --set checkpoint.dir="$dir/$name" \
    --set checkpoint.every=3 2> "$dir/err" || fail "$name run failed: $(cat "$dir/err")"
  cp -r "$dir/$name/step_00000006" "$dir/$name-straight"
  echo step_00000003 > "$dir/$name/latest"
  "$bin" train "$@" --set parallel.dp=2 --nproc 2 --set checkpoint.dir="$dir/$name" \
    --set checkpoint.every=3 --resume 2> "$dir/err" || fail "$name resume failed: $(cat "$dir/err")"
  [ -f "$dir/$name-straight/replica1.safetensors" ] && [ -f "$dir/$name-straight/sync.safetensors" ] ||
    fail "$name: no rank-state files: $(ls "$dir/$name-straight")"
  for f in $(cd "$dir/$name-straight" && ls *.safetensors); do
    cmp -s "$dir/$name-straight/$f" "$dir/$name/step_00000006/$f" ||
      fail "$name: $f differs between the straight and the resumed run"
  done
}
resume_check stale "$@" --set parallel.sync=stale
resume_check nesterov "$@" --set parallel.sync=local_sgd --set parallel.outer=nesterov
# a missing rank-state file: the resume fails naming it
rm "$dir/stale/step_00000006/replica1.safetensors"
"$bin" train "$@" --set parallel.dp=2 --nproc 2 --set parallel.sync=stale \
  --set checkpoint.dir="$dir/stale" --set train.steps=8 --resume 2> "$dir/err" &&
  fail "resume without replica1.safetensors succeeded"
grep -q "step_00000006/replica1.safetensors: No such file" "$dir/err" ||
  fail "missing rank file message: $(cat "$dir/err")"
# every rank returns that error: it is printed once (the launcher adds its
# summary line)
[ "$(grep -c "replica1.safetensors" "$dir/err")" -le 2 ] &&
  [ "$(grep -c "^partrain: rank [0-9]*: " "$dir/err")" -eq 0 ] ||
  fail "the agreed error printed per rank: $(cat "$dir/err")"

# bad input: one line naming the problem, exit 1
"$bin" train "$@" --nproc 2 2> "$dir/err" && fail "dp=1 with --nproc 2 succeeded"
grep -q "parallel.dp = 1 but --nproc 2" "$dir/err" || fail "dp/nproc message: $(cat "$dir/err")"
"$bin" train "$@" --set parallel.dp=2 2> "$dir/err" && fail "dp=2 without ranks succeeded"
grep -q "parallel.dp = 2" "$dir/err" || fail "dp without --nproc message: $(cat "$dir/err")"
"$bin" train "$@" --set parallel.dp=3 --nproc 3 2> "$dir/err" && fail "uneven shares accepted"
grep -q "divisible by parallel.dp" "$dir/err" || fail "uneven message: $(cat "$dir/err")"
"$bin" train "$@" --nproc 0 2> "$dir/err" && fail "--nproc 0 accepted"

[ $fails = 0 ] && echo "test_dp_cli: ok"
exit $fails
