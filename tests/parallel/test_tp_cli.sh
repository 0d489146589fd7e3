#!/bin/sh
# partrain train at parallel.tp = 2 end to end (issue 12): the default
# config (configs/default.json) shrunk to a tiny model, 20 steps at
# `--set parallel.tp=2 --nproc 2` and at `--nproc 1`; the metrics' loss and
# gradient norm of every step agree within 1e-5 relative, and the step lines
# name the layout dp1-tp2-pp1-zero0; the same with sequence parallelism
# (dp1-tp2-sp-pp1-zero0).
# Then the tensor-parallel errors of issue 12, item 7: one line, before any
# rank starts; and --help describes the keys.
#   test_tp_cli.sh PARTRAIN CONFIG
set -u
bin=$1 config=$2
dir=$(mktemp -d /tmp/pt-test-tp-cli-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

i=0
while [ $i -lt 400 ]; do echo "the quick brown fox jumps over the lazy dog $i." >> "$dir/train.txt"; i=$((i + 1)); done
head -c 3000 "$dir/train.txt" > "$dir/val.txt"
# n_head 2: divisible by tp 2; no checkpoints (their tp layout is another test's)
set -- --config "$config" --set model.n_layer=2 --set model.n_embd=32 --set model.n_head=2 \
  --set model.seq_len=16 --set train.batch_size=8 --set train.steps=20 --set train.threads=1 \
  --set train.val_every=0 --set log.every=1 --set checkpoint.dir= \
  --set data.train="$dir/train.txt" --set data.val="$dir/val.txt"

"$bin" train "$@" --nproc 1 --set log.metrics="$dir/m1.jsonl" 2> "$dir/err" ||
  fail "tp=1 run failed: $(cat "$dir/err")"
# "step loss grad_norm" of each step line
steps() { sed -n 's/^{"step":\([0-9]*\),"loss":\([^,]*\),.*"grad_norm":\([^,]*\),.*/\1 \2 \3/p' "$1"; }
val() { grep '"step":20,"val_loss"' "$1" | sed 's/.*"val_loss":\([^,]*\),.*/\1/'; }
steps "$dir/m1.jsonl" > "$dir/s1"
[ "$(wc -l < "$dir/s1")" = 20 ] || fail "tp=1: expected 20 step lines, got $(wc -l < "$dir/s1")"

# tp_run NAME LAYOUT ARGS...: the run at --nproc 2 names LAYOUT on its 20
# step lines, and its loss and grad norm per step are tp 1's within 1e-5
tp_run() {
  name=$1 layout=$2
  shift 2
  "$bin" train "$@" --nproc 2 --set log.metrics="$dir/$name.jsonl" 2> "$dir/err" ||
    fail "$name run failed: $(cat "$dir/err")"
  [ "$(grep -c "\"loss\".*\"layout\":\"$layout\"" "$dir/$name.jsonl")" = 20 ] ||
    fail "$name: expected 20 step lines naming $layout"
  steps "$dir/$name.jsonl" > "$dir/$name.s"
  paste -d ' ' "$dir/s1" "$dir/$name.s" | awk -v name="$name" '
    function rel(a, b) { d = a - b; if (d < 0) d = -d; s = a < 0 ? -a : a; return s > 0 ? d / s : d }
    NF != 6 || $1 != $4 { print "step lines do not pair up: " $0; bad = 1; next }
    rel($2, $5) > 1e-5 { printf "step %d: loss %s at tp 1, %s at %s\n", $1, $2, $5, name; bad = 1 }
    rel($3, $6) > 1e-5 { printf "step %d: grad_norm %s at tp 1, %s at %s\n", $1, $3, $6, name; bad = 1 }
    END { exit bad }' > "$dir/diff" || fail "$name differs from tp=1: $(cat "$dir/diff")"
  # the validation loss is the same bits under every layout
  v1=$(val "$dir/m1.jsonl") v2=$(val "$dir/$name.jsonl")
  [ -n "$v1" ] && [ "$v1" = "$v2" ] || fail "final val_loss: $v1 at tp 1, $v2 at $name"
}
tp_run tp2 dp1-tp2-pp1-zero0 "$@" --set parallel.tp=2
tp_run tp2-sp dp1-tp2-sp-pp1-zero0 "$@" --set parallel.tp=2 --set parallel.sequence_parallel=true

# bad input: one line naming the problem, exit 1, no rank started
# expect_err NAME PATTERN ARGS...
expect_err() {
  name=$1 pattern=$2
  shift 2
  # info logging on: a rank that started would say so on stderr
  PT_LOG=info "$bin" train "$@" > "$dir/out" 2> "$dir/err" && fail "$name: exit 0"
  # On CPUs where OpenBLAS picks kernels below the CPU's, partrain says once
  # that it re-runs itself (test_blas_reexec.sh): not part of the error.
  [ "$(grep -vc '^partrain info: OpenBLAS chose its' "$dir/err")" = 1 ] ||
    fail "$name: expected one line, got: $(cat "$dir/err")"
  grep -qF -- "$pattern" "$dir/err" || fail "$name: message lacks '$pattern': $(cat "$dir/err")"
}
expect_err "tp 4 with 2 heads" "parallel.tp (4) must divide model.n_head (2)" \
  "$@" --set parallel.tp=4 --nproc 4
expect_err "tp 2 with 3 heads" "parallel.tp (2) must divide model.n_head (3)" \
  "$@" --set model.n_head=3 --set model.n_embd=48 --set parallel.tp=2 --nproc 2
expect_err "dp x tp < nproc" "(1 x 2 x 1 = 2) must be the number of ranks (set parallel.dp=2)" \
  "$@" --set parallel.tp=2 --nproc 4
expect_err "dp x tp > nproc" "(2 x 2 x 1 = 4) must be the number of ranks (set parallel.dp=1)" \
  "$@" --set parallel.dp=2 --set parallel.tp=2 --nproc 2
expect_err "nproc not a multiple of tp" "--nproc 3 is not a multiple of parallel.tp x parallel.pp (2 x 1 = 2)" \
  "$@" --set parallel.dp=2 --set parallel.tp=2 --nproc 3
expect_err "tp without ranks" "their product 2 must be the world size, but there is 1 rank" \
  "$@" --set parallel.tp=2
expect_err "sequence parallel, seq_len 15" "model.seq_len (15) must be divisible by parallel.tp (2)" \
  "$@" --set model.seq_len=15 --set parallel.tp=2 --set parallel.sequence_parallel=true --nproc 2
expect_err "sequence parallel at tp 1" "parallel.sequence_parallel needs parallel.tp > 1" \
  "$@" --set parallel.sequence_parallel=true

# --help describes the tp keys and their constraints
"$bin" train --help > "$dir/help" 2>&1 || fail "train --help failed"
grep -q "^  parallel.tp .*tensor-parallel.*must divide model.n_head" "$dir/help" ||
  fail "train --help does not describe parallel.tp: $(grep parallel.tp "$dir/help")"
grep -q "^  parallel.sequence_parallel .*seq_len divisible by tp" "$dir/help" ||
  fail "train --help does not describe parallel.sequence_parallel"

[ $fails = 0 ] && echo "test_tp_cli: ok"
exit $fails
