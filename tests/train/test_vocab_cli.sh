#!/bin/sh
# Vocabularies above 65,536 end to end: token data in llm.c's uint32 file
# (written by make_tokens through pt_data_write), a tiny model trained on
# one rank and vocabulary-parallel at tp 2, the loss at init near ln V and
# tp 2's losses the one rank's (the parity rule); a token past the
# vocabulary is one line naming the file.
#   test_vocab_cli.sh PARTRAIN MAKE_TOKENS quick|full
# quick: V 70,000, 2 steps. full: V 128,256 (Llama 3's), 12 steps that
# must learn, and a checkpoint saved at tp 2 resumed on one rank (wte's
# safetensors shape (128256, C) both ways) that follows the straight run.
set -u
bin=$1 mk=$2 tier=$3
dir=$(mktemp -d /tmp/pt-test-vocab-cli-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

if [ "$tier" = full ]; then V=128256 steps=12; else V=70000 steps=2; fi
"$mk" "$dir/train.bin" 8192 $V 64 7 || fail "make_tokens failed"
# ids up to V - 1 > 65,535: the uint32 file, 4 bytes a token
size=$(wc -c < "$dir/train.bin")
[ "$size" = $((1024 + 4 * 8192)) ] || fail "train.bin: $size bytes, expected the uint32 file's $((1024 + 4 * 8192))"

cat > "$dir/c.json" <<JSON
{"model": {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": $V, "seq_len": 16},
 "data": {"train": "$dir/train.bin"},
 "train": {"steps": $steps, "batch_size": 4, "lr": 1e-2, "warmup_steps": 0, "val_every": 0,
           "threads": 1},
 "log": {"every": 1}, "checkpoint": {"dir": ""}}
JSON

# "step loss" of each step line
steps() { sed -n 's/^{"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1"; }
# run NAME NPROC ARGS...: the step lines of one run into $dir/NAME.s
run() {
  name=$1 np=$2
  shift 2
  "$bin" train --config "$dir/c.json" --nproc "$np" --set log.metrics="$dir/$name.jsonl" "$@" \
    2> "$dir/err" || fail "$name run failed: $(cat "$dir/err")"
  steps "$dir/$name.jsonl" > "$dir/$name.s"
}
# same A B FROM: the losses of steps >= FROM agree within 1e-5 relative
same() {
  awk -v from="$3" 'NR == FNR { if ($1 >= from) ref[$1] = $2; next }
    $1 >= from { n++; d = $2 - ref[$1]; if (d < 0) d = -d; if (!($1 in ref) || d > 1e-5 * ref[$1]) bad++ }
    END { exit !(n > 0 && bad == 0) }' "$dir/$1.s" "$dir/$2.s"
}

run tp1 1
[ "$(wc -l < "$dir/tp1.s")" = "$steps" ] || fail "tp1: expected $steps step lines: $(cat "$dir/tp1.s")"
# at init the logits are near 0 (weights of std 0.02): the loss is ln V
awk -v V=$V 'NR == 1 { l = $2; exit !(l == l + 0 && l - log(V) < 0.05 && log(V) - l < 0.05) }' \
  "$dir/tp1.s" || fail "step 1 loss $(head -1 "$dir/tp1.s"), expected ln $V"
# full: the tp 2 run saves at step 6 on its way (resumed below)
ck=""
[ "$tier" = full ] && ck="--set checkpoint.dir=$dir/ck --set checkpoint.every=6"
run tp2 2 --set parallel.tp=2 $ck
same tp1 tp2 1 || fail "tp 2 (vocabulary-parallel) differs from one rank: $(paste "$dir/tp1.s" "$dir/tp2.s")"

if [ "$tier" = full ]; then
  # learns: 64 distinct ids of 128,256, the last steps well below ln V
  awk -v V=$V 'END { exit !($2 < log(V) - 1) }' "$dir/tp1.s" ||
    fail "did not learn: $(cat "$dir/tp1.s")"
  # saved at step 6 under tp 2, resumed to 12 on one rank: the straight run's losses
  [ -f "$dir/ck/step_00000006/model.safetensors" ] || fail "no step 6 checkpoint: $(ls -R "$dir/ck")"
  mkdir -p "$dir/ck1" && cp -r "$dir/ck/step_00000006" "$dir/ck1/" && echo step_00000006 > "$dir/ck1/latest"
  run resumed 1 --set checkpoint.dir="$dir/ck1" --resume
  [ "$(wc -l < "$dir/resumed.s")" = 6 ] || fail "resumed: expected steps 7-12: $(cat "$dir/resumed.s")"
  same tp1 resumed 7 || fail "resumed at tp 1 differs: $(paste "$dir/tp1.s" "$dir/resumed.s")"
fi

# a vocabulary too small for the file: one line naming it and the token
"$bin" train --config "$dir/c.json" --set model.vocab_size=65536 > "$dir/out" 2> "$dir/err"
[ $? -ne 0 ] || fail "vocab_size 65536 accepted tokens up to $((V - 1))"
[ "$(grep -vc '^partrain info: OpenBLAS chose its' "$dir/err")" = 1 ] &&
  grep -q "train.bin: token .* is >= vocab_size 65536" "$dir/err" ||
  fail "vocab_size 65536: expected one line naming the file and the token, got: $(cat "$dir/err")"

[ $fails -eq 0 ] && echo "test_vocab_cli ($tier): ok"
exit $fails
