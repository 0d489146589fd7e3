#!/bin/sh
# partrain train with model.recompute: 3 steps of a tiny model under
# selective and full give none's metrics -- loss and grad_norm of every
# step, the same text (the gradients are the same bits) -- at --nproc 1 and
# at parallel.tp = 2 (the recompute's collectives rerun; plain and sequence
# parallel), under ZeRO-3 and the gpipe schedule, with fewer peak
# activation bytes (metrics' mem.acts) in each mode; a bad value is one
# line naming the key; --help lists it.
#   test_recompute_cli.sh PARTRAIN CONFIG
set -u
bin=$1 config=$2
dir=$(mktemp -d /tmp/pt-test-recompute-cli-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

i=0
while [ $i -lt 200 ]; do echo "the quick brown fox jumps over the lazy dog $i." >> "$dir/train.txt"; i=$((i + 1)); done
set -- --config "$config" --set model.n_layer=2 --set model.n_embd=32 --set model.n_head=2 \
  --set model.seq_len=16 --set train.batch_size=4 --set train.steps=3 --set train.threads=1 \
  --set train.val_every=0 --set log.every=1 --set checkpoint.dir= \
  --set data.train="$dir/train.txt" --set data.val=

# "step loss grad_norm" of each step line
steps() { sed -n 's/^{"step":\([0-9]*\),"loss":\([^,]*\),.*"grad_norm":\([^,]*\),.*/\1 \2 \3/p' "$1"; }

# the peak activation bytes of the first step line (after the run record)
acts() { sed -n '/"mem":{/{s/.*"mem":{[^}]*"acts":\([0-9]*\).*/\1/p;q;}' "$1"; }

# run NAME NPROC ARGS...: the step lines of one run into $dir/NAME.s
run() {
  name=$1 np=$2
  shift 2
  "$bin" train "$@" --nproc "$np" --set log.metrics="$dir/$name.jsonl" 2> "$dir/err" ||
    fail "$name run failed: $(cat "$dir/err")"
  steps "$dir/$name.jsonl" > "$dir/$name.s"
  [ "$(wc -l < "$dir/$name.s")" = 3 ] || fail "$name: expected 3 step lines, got $(wc -l < "$dir/$name.s")"
}
# layout L NPROC ARGS...: none, selective and full under one layout
layout() {
  l=$1 np=$2
  shift 2
  run none$l $np "$@" --set model.recompute=none
  for mode in selective full; do
    run $mode$l $np "$@" --set model.recompute=$mode
    cmp -s "$dir/none$l.s" "$dir/$mode$l.s" ||
      fail "$l: $mode's loss/grad_norm differ from none's: $(paste "$dir/none$l.s" "$dir/$mode$l.s")"
  done
  # the mode reached the model: each keeps fewer activation bytes
  a0=$(acts "$dir/none$l.jsonl") a1=$(acts "$dir/selective$l.jsonl") a2=$(acts "$dir/full$l.jsonl")
  [ -n "$a0" ] && [ -n "$a1" ] && [ -n "$a2" ] && [ "$a1" -lt "$a0" ] && [ "$a2" -lt "$a1" ] ||
    fail "$l: mem.acts none $a0, selective $a1, full $a2: expected strictly decreasing"
}
layout tp1 1 "$@"
layout tp2 2 "$@" --set parallel.tp=2
layout tp2-sp 2 "$@" --set parallel.tp=2 --set parallel.sequence_parallel=true
# ZeRO-3 gathers a unit's parameters again before its backward: the
# recompute runs after that plug point
layout dp2-zero3 2 "$@" --set parallel.dp=2 --set parallel.zero=3
# gpipe: two micro-batches' contexts in flight, one backward scratch
layout gpipe 1 "$@" --set parallel.microbatches=2 --set parallel.schedule=gpipe

"$bin" train "$@" --set model.recompute=some > "$dir/out" 2> "$dir/err"
[ $? -ne 0 ] || fail "model.recompute=some accepted"
# OpenBLAS's re-run notice (an info line on some Intel CPUs) is not ours
[ "$(grep -vc '^partrain info: OpenBLAS chose its' "$dir/err")" = 1 ] && grep -q "model.recompute" "$dir/err" ||
  fail "model.recompute=some: expected one line naming the key, got: $(cat "$dir/err")"
"$bin" train --help 2>&1 | grep -q "model.recompute" || fail "--help does not list model.recompute"

[ $fails -eq 0 ] && echo "test_recompute_cli: ok"
exit $fails
