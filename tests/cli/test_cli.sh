#!/usr/bin/env bash
# CLI tests: every bad input gets a non-zero exit and exactly ONE line on
# stderr, "partrain: ...", naming the input; and a tiny train -> resume ->
# eval -> sample round trip works. Usage: test_cli.sh PATH/TO/partrain
set -u
P=${1:?usage: test_cli.sh PATH/TO/partrain}
[ -x "$P" ] || { echo "test_cli: $P is not an executable" >&2; exit 1; }
# ok, bad, expect_fail, expect_fail_run, expect_ok
. "$(dirname "${BASH_SOURCE[0]}")/expect.sh"
T=$(mktemp -d /tmp/pt-test-cli-XXXXXX)
trap 'rm -rf "$T"' EXIT
cd "$T"

# a small text corpus
for i in $(seq 1 300); do echo "the quick brown fox $i jumps over the lazy dog"; done >train.txt
head -c 3000 train.txt >val.txt
cat >tiny.json <<'EOF'
{
  "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 256, "seq_len": 16},
  "data": {"train": "train.txt", "val": "val.txt"},
  "train": {"steps": 6, "batch_size": 2, "warmup_steps": 1, "val_every": 3, "val_batches": 1,
            "threads": 1},
  "checkpoint": {"dir": "ck", "every": 3},
  "log": {"metrics": "m/metrics.jsonl", "every": 1}
}
EOF

# ---- --help ----
expect_ok "train --help" "$P" train --help
grep -q "model.n_layer" out && grep -q "train.grad_clip" out || bad "train --help" "no key table"
expect_ok "eval --help" "$P" eval --help
expect_ok "sample --help" "$P" sample --help

# ---- bad config ----
printf '{"model": {"n_layer": 2,}' >badjson.json
expect_fail "bad JSON" "badjson.json" "$P" train --config badjson.json
expect_fail "missing config" "nope.json" "$P" train --config nope.json
printf '{"model": {"n_layers": 2}}' >unknown.json
expect_fail "unknown key" "model.n_layers" "$P" train --config unknown.json
expect_fail "unknown --set key" "train.speed" "$P" train --config tiny.json --set train.speed=3
printf '{"model": {"n_layer": "two"}}' >type.json
expect_fail "wrong type" "model.n_layer" "$P" train --config type.json
expect_fail "wrong type --set" "train.steps" "$P" train --config tiny.json --set train.steps=many
expect_fail "negative size" "model.n_embd" "$P" train --config tiny.json --set model.n_embd=-16
expect_fail "zero size" "train.batch_size" "$P" train --config tiny.json --set train.batch_size=0
expect_fail "zero seq_len" "model.seq_len" "$P" train --config tiny.json --set model.seq_len=0
expect_fail "n_embd % n_head" "model.n_head" "$P" train --config tiny.json --set model.n_head=3
expect_fail "tp 2 without ranks" "parallel.tp = 2" "$P" train --config tiny.json --set parallel.tp=2
expect_fail "unknown option" "--frobnicate" "$P" train --frobnicate

# ---- bad data ----
expect_fail "missing data" "missing.txt" "$P" train --config tiny.json --set data.train=missing.txt
mkdir -p adir
expect_fail "unreadable data (a directory)" "adir" "$P" train --config tiny.json --set data.train=adir
: >empty.txt
expect_fail "empty data" "empty.txt" "$P" train --config tiny.json --set data.train=empty.txt
printf 'short' >short.txt
expect_fail "data shorter than a sequence" "short.txt" "$P" train --config tiny.json --set data.val=short.txt
# llm.c .bin: magic 20240520 (0x0134d888), version 1, 4 tokens, one of them 300
{
    printf '\x88\xd8\x34\x01\x01\x00\x00\x00\x04\x00\x00\x00'
    head -c $((1024 - 12)) /dev/zero
    printf '\x01\x00\x2c\x01\x02\x00\x03\x00'
} >big.bin
expect_fail "token >= vocab in .bin" "big.bin" "$P" train --config tiny.json --set data.train=big.bin
grep -qF "offset 1" err || bad "token >= vocab in .bin" "no offset: $(cat err)"

# ---- a real run, resume, eval, sample ----
expect_ok "train" "$P" train --config tiny.json
[ -f ck/latest ] && [ -f ck/step_00000006/model.safetensors ] || bad "train" "no checkpoint"
grep -q '"val_loss"' m/metrics.jsonl && grep -q '"tokens_per_s"' m/metrics.jsonl &&
    grep -q '"layout":"dp1-tp1-pp1-zero0"' m/metrics.jsonl || bad "train" "metrics lack keys"
[ "$(grep -c '"loss"' m/metrics.jsonl)" -eq 6 ] || bad "train" "expected 6 step lines"
expect_ok "resume to 8 steps" "$P" train --config tiny.json --set train.steps=8 --resume
[ -f ck/step_00000008/state.json ] || bad "resume" "no step 8 checkpoint"
expect_ok "eval" "$P" eval --checkpoint ck --data val.txt
grep -q '^loss [0-9]' out || bad "eval" "no loss line: $(cat out)"
expect_ok "sample" "$P" sample --checkpoint ck --prompt "the quick" --tokens 20 --seed 3
cp out sample1
"$P" sample --checkpoint ck --prompt "the quick" --tokens 20 --seed 3 >sample2 2>/dev/null
cmp -s sample1 sample2 || bad "sample" "same seed, different text"

# ---- determinism across processes: same config, same bits ----
"$P" train --config tiny.json --set checkpoint.dir=da --set log.metrics= >/dev/null 2>&1
"$P" train --config tiny.json --set checkpoint.dir=db --set log.metrics= >/dev/null 2>&1
if cmp -s da/step_00000006/model.safetensors db/step_00000006/model.safetensors &&
    cmp -s da/step_00000006/optim_v.safetensors db/step_00000006/optim_v.safetensors; then
    ok "determinism: two runs, same bits"
else
    bad "determinism" "two runs of one config differ"
fi
# 6 straight == 3 + resume + 3, through the CLI: resume from the step-3
# checkpoint that the straight run saved on its way (checkpoint.every 3)
mkdir -p dc && cp -r da/step_00000003 dc/ && echo step_00000003 >dc/latest
"$P" train --config tiny.json --set checkpoint.dir=dc --set log.metrics= --resume >/dev/null 2>&1
if cmp -s da/step_00000006/model.safetensors dc/step_00000006/model.safetensors; then
    ok "resume: 3 + 3 steps == 6 steps, bit for bit"
else
    bad "resume" "3 + resume + 3 differs from 6 straight"
fi

# ---- bad checkpoints ----
expect_fail "eval: missing checkpoint" "nockpt" "$P" eval --checkpoint nockpt --data val.txt
expect_fail "eval: missing data" "nodata.txt" "$P" eval --checkpoint ck --data nodata.txt
expect_fail "eval: data shorter than a window" "short.txt" "$P" eval --checkpoint ck --data short.txt
expect_fail "resume: another shape" "model.n_embd" "$P" train --config tiny.json --set model.n_embd=32 --resume
expect_fail "resume: nothing to resume" "none" "$P" train --config tiny.json --set checkpoint.dir=none --resume
mkdir -p other && cp -r ck/step_00000008 other/ && echo step_00000008 >other/latest
# a model.safetensors of another shape (2 layers) in place of this one
"$P" train --config tiny.json --set model.n_layer=2 --set checkpoint.dir=ck2 --set train.steps=1 \
    --set data.val= >/dev/null 2>&1
cp ck2/step_00000001/model.safetensors other/step_00000008/model.safetensors
expect_fail "eval: checkpoint of another shape" "model.safetensors" "$P" eval --checkpoint other --data val.txt
cp ck/step_00000008/model.safetensors other/step_00000008/model.safetensors
truncate -s -100 other/step_00000008/model.safetensors
expect_fail "eval: truncated checkpoint" "model.safetensors" "$P" eval --checkpoint other --data val.txt
cp ck/step_00000008/model.safetensors other/step_00000008/model.safetensors
printf 'garbage!' | dd of=other/step_00000008/model.safetensors bs=1 seek=8 conv=notrunc 2>/dev/null
expect_fail "eval: corrupt checkpoint header" "model.safetensors" "$P" eval --checkpoint other --data val.txt
printf '\xff\xff\xff\xff' | dd of=other/step_00000008/model.safetensors bs=1 seek=0 conv=notrunc 2>/dev/null
expect_fail "sample: corrupt header length" "model.safetensors" "$P" sample --checkpoint other --prompt x
printf '{ not json' >other/step_00000008/state.json
expect_fail "eval: corrupt state.json" "state.json" "$P" eval --checkpoint other --data val.txt
cp ck/step_00000008/optim_m.safetensors ck/m.bak
truncate -s 5 ck/step_00000008/optim_m.safetensors
expect_fail "resume: truncated optimizer state" "optim_m.safetensors" "$P" train --config tiny.json --set train.steps=10 --resume
expect_fail "sample: bad --tokens" "--tokens" "$P" sample --checkpoint ck --prompt x --tokens -1
# options with a value, parsed alike by every subcommand (cli_common.c):
# "--x V" or "--x=V", a missing value named
expect_ok "eval: --opt=value forms" "$P" eval --checkpoint=ck --data=val.txt --batch=2 --threads=1
grep -q '^loss [0-9]' out || bad "eval --opt=value" "no loss line: $(cat out)"
expect_fail "eval: --batch without a value" "--batch needs a value" "$P" eval --checkpoint ck --data val.txt --batch
expect_fail "sample: --seed without a value" "--seed needs a value" "$P" sample --checkpoint ck --prompt x --seed
expect_fail "train: --set without a value" "--set needs a value" "$P" train --config tiny.json --set
expect_fail "train: bad --nproc" "--nproc must be an integer in [1, 1024]" "$P" train --config tiny.json --nproc 0

# ---- inputs that are not regular files: refused at once, never waited on ----
# (timeout: a regression that blocks on the FIFO fails instead of hanging)
mkfifo fifo
expect_fail "config is a FIFO" "fifo: is a FIFO" timeout 10 "$P" train --config fifo
expect_fail "data.train is a FIFO" "fifo: is a FIFO" timeout 10 "$P" train --config tiny.json --set data.train=fifo
expect_fail "data.val is a FIFO" "fifo: is a FIFO" timeout 10 "$P" train --config tiny.json --set data.val=fifo
expect_fail "eval --data is a FIFO" "fifo: is a FIFO" timeout 10 "$P" eval --checkpoint ck --data fifo
expect_fail "data.train is a device" "/dev/zero: is a character device" timeout 10 "$P" train --config tiny.json --set data.train=/dev/zero
mkdir -p fl && mkfifo fl/latest
expect_fail "latest is a FIFO" "latest: is a FIFO" timeout 10 "$P" eval --checkpoint fl --data val.txt
for f in state.json model.safetensors; do
    rm -rf ff && mkdir -p ff && cp -r ck/step_00000008 ff/ && echo step_00000008 >ff/latest
    rm ff/step_00000008/$f && mkfifo ff/step_00000008/$f
    expect_fail "eval: $f is a FIFO" "$f: is a FIFO" timeout 10 "$P" eval --checkpoint ff --data val.txt
    expect_fail "sample: $f is a FIFO" "$f: is a FIFO" timeout 10 "$P" sample --checkpoint ff --prompt x
    expect_fail "resume: $f is a FIFO" "$f: is a FIFO" timeout 10 "$P" train --config tiny.json --set checkpoint.dir=ff --set train.steps=9 --resume
done

# ---- output writes are checked ----
# (test_outputs.sh: every output path of every command, and each writer
# under a file size limit)
# a file size limit (EFBIG: partrain ignores SIGXFSZ itself, as a full quota
# would fail writes)
limited() { (ulimit -f 4 && exec "$@"); }
expect_fail_run "trace over the file size limit" "log.trace: " limited "$P" train --config tiny.json \
    --set checkpoint.dir= --set log.metrics= --set log.trace=tr.json
grep -qF "File too large" err || bad "trace over the file size limit" "no reason: $(cat err)"
[ -z "$(ls -A | grep '^\.\{0,1\}tr\.json')" ] || bad "trace over the file size limit" "left a partial trace: $(ls -A)"
expect_fail_run "metrics over the file size limit" "log.metrics: mlim.jsonl: write failed" limited "$P" train --config tiny.json \
    --set checkpoint.dir= --set log.metrics=mlim.jsonl --set train.steps=20
grep -qF "File too large" err || bad "metrics over the file size limit" "no reason: $(cat err)"
# two ranks: rank 0's metrics fail; the job fails and says why
limited "$P" train --config tiny.json --set parallel.dp=2 --nproc 2 --set checkpoint.dir= \
    --set log.metrics=mlim2.jsonl --set train.steps=20 >out 2>err
rc=$?
if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -qF "log.metrics: mlim2.jsonl: write failed" err &&
    grep -qF "File too large" err; then
    ok "metrics over the file size limit, two ranks"
else
    bad "metrics over the file size limit, two ranks" "exit $rc: $(cat err)"
fi

# ---- checkpoint.dir: checked before step 1, locked, pruned ----
expect_fail "checkpoint.dir is a file" "checkpoint.dir: train.txt: is a regular file, not a directory" "$P" train --config tiny.json --set checkpoint.dir=train.txt
expect_fail "checkpoint.dir under a file" "checkpoint.dir: train.txt/ck: Not a directory" "$P" train --config tiny.json --set checkpoint.dir=train.txt/ck
# a second job on a directory in use is refused, naming the holder
"$P" train --config tiny.json --set checkpoint.dir=cklock --set train.steps=1000000 --set log.metrics= \
    --set data.val= >/dev/null 2>&1 &
holder=$!
for _ in $(seq 1 100); do
    [ "$(cat cklock/.lock 2>/dev/null)" = "$holder" ] && break
    sleep 0.1
done
expect_fail "checkpoint.dir in use" "cklock: in use by another job (pid $holder" "$P" train --config tiny.json --set checkpoint.dir=cklock
kill -KILL $holder 2>/dev/null
wait $holder 2>/dev/null
expect_ok "checkpoint.dir free again" "$P" train --config tiny.json --set checkpoint.dir=cklock --set train.steps=2 --set log.metrics=
expect_ok "checkpoint.keep" "$P" train --config tiny.json --set checkpoint.dir=ckkeep --set checkpoint.every=1 --set checkpoint.keep=2 --set log.metrics=
[ "$(ls ckkeep | tr '\n' ' ')" = "latest step_00000005 step_00000006 " ] || bad "checkpoint.keep" "left: $(ls -a ckkeep | tr '\n' ' ')"
grep -q "checkpoint.keep" <("$P" train --help) || bad "checkpoint.keep" "not in --help"

# ---- issue 37: the config's lists, its numbers, one line from the ranks, plan files ----
cat >pipe.json <<'EOF'
{
  "model": {"n_layer": 4, "n_embd": 16, "n_head": 2, "vocab_size": 256, "seq_len": 16},
  "data": {"train": "train.txt"},
  "train": {"steps": 2, "batch_size": 4, "warmup_steps": 1, "val_every": 0, "threads": 1},
  "log": {"every": 1}
}
EOF
PP2="--set parallel.pp=2 --nproc 2"
# item 6: under interleaved the cut names pp x v chunks, not a pp of 4
# shellcheck disable=SC2086
expect_fail "stage cut: pp x v named" "parallel.pp x parallel.virtual_stages = 2 x 2 = 4 chunks" \
    "$P" train --config pipe.json $PP2 --set parallel.schedule=interleaved \
    --set parallel.virtual_stages=2 --set parallel.microbatches=2 --set parallel.stage_layers=2,2
# item 7: the empty entry is the one blamed
# shellcheck disable=SC2086
expect_fail "stage_recompute: the empty entry" 'model.stage_recompute = "full,none,": entry 3 is empty' \
    "$P" train --config pipe.json $PP2 --set model.stage_recompute=full,none,
# item 8: interleaved without virtual_stages runs the schedule's own 2 chunks
# shellcheck disable=SC2086
expect_ok "interleaved: virtual_stages defaulted" "$P" train --config pipe.json $PP2 \
    --set parallel.schedule=interleaved --set parallel.microbatches=2
grep -q "2 stages x 2 chunks" "$T/err" || bad "interleaved: virtual_stages defaulted" "no 2 chunks: $(grep pipeline "$T/err")"
# item 9: one list grammar (blanks around entries, no empty entry, no sign,
# the limit named), refused before any rank starts
# shellcheck disable=SC2086
expect_fail "stage_layers: trailing comma" 'parallel.stage_layers = "2,2,": entry 3 is empty' \
    "$P" train --config pipe.json $PP2 --set parallel.stage_layers=2,2,
# shellcheck disable=SC2086
expect_fail "stage_layers: leading comma" 'entry 1 is empty' \
    "$P" train --config pipe.json $PP2 --set parallel.stage_layers=,4
# shellcheck disable=SC2086
expect_fail "stage_layers: a sign" "entry 1 ('+2') is not a non-negative integer" \
    "$P" train --config pipe.json $PP2 --set parallel.stage_layers=+2,2
# shellcheck disable=SC2086
expect_fail "stage_layers: 20 digits" "entry 1 (99999999999999999999) is over the limit 4 (model.n_layer)" \
    "$P" train --config pipe.json $PP2 --set parallel.stage_layers=99999999999999999999,2
# shellcheck disable=SC2086
expect_ok "stage_layers: blanks around entries" "$P" train --config pipe.json $PP2 \
    --set "parallel.stage_layers= 1 , 3 "
grep -q "embedding + 1 block | 3 blocks + head" "$T/err" ||
    bad "stage_layers: blanks around entries" "cut: $(grep pipeline "$T/err")"
expect_ok "zero_whole: blanks around entries" "$P" train --config pipe.json --nproc 2 \
    --set parallel.dp=2 --set parallel.zero=3 --set "parallel.zero_whole=head, embedding"
expect_fail "zero_whole: an empty entry" 'parallel.zero_whole = "head,,h.0": entry 2 is empty' \
    "$P" train --config pipe.json --set parallel.zero=3 --set parallel.zero_whole=head,,h.0
"$P" train --help >"$T/out" 2>&1
if grep -q "a list is a string of entries separated by commas" "$T/out" &&
    grep -Eq "parallel.stage_layers +list" "$T/out"; then
    ok "--help: the list grammar"
else
    bad "--help: the list grammar" "not stated"
fi
# item 10: integer limits and values as integers
expect_fail "integer limits as integers" "parallel.pp must be in [1, 1048576] (got 0)" \
    "$P" train --config pipe.json --set parallel.pp=0
expect_fail "integer values as integers" "(got 100000000000)" \
    "$P" train --config pipe.json --set parallel.pp=1e11
# item 11: one line from a job of ranks; what the config decides before they fork
expect_fail "--resume without checkpoint.dir, 2 ranks" "--resume needs checkpoint.dir" \
    "$P" train --config pipe.json --set parallel.dp=2 --nproc 2 --resume
# (PT_LOG=warn: the ranks' progress lines are not part of the error)
expect_fail "a rank's error: one line" "data.val: missing.txt" \
    env PT_LOG=warn "$P" train --config pipe.json --set parallel.dp=2 --nproc 2 --set data.val=missing.txt
expect_fail "checkpoint.dir is a file, 2 ranks: one line" "checkpoint.dir: train.txt: is a regular file, not a directory" \
    env PT_LOG=warn "$P" train --config pipe.json --set parallel.dp=2 --nproc 2 --set checkpoint.dir=train.txt
expect_fail "nothing to resume, 2 ranks: one line" "nockpt: not a checkpoint" \
    env PT_LOG=warn "$P" train --config pipe.json --set parallel.dp=2 --nproc 2 \
    --set checkpoint.dir=nockpt --resume
# item 13: train --plan checks the plan section, naming the file and the field
conf=$(tr -d '\n' <pipe.json)
echo "{\"config\": $conf}" >noplan.json
expect_fail "plan file: no plan" 'noplan.json: no "plan" object' "$P" train --plan noplan.json
echo "{\"config\": $conf, \"plan\": \"hello\"}" >strplan.json
expect_fail "plan file: plan a string" "strplan.json: plan must be an object (got a string)" \
    "$P" train --plan strplan.json
echo "{\"config\": $conf, \"plan\": {\"layout\": \"dp2-tp1-pp1-zero0-none-m1-rnone\"}}" >otherplan.json
expect_fail "plan file: another layout" \
    'otherplan.json: plan.layout is "dp2-tp1-pp1-zero0-none-m1-rnone", but its config runs dp1-tp1-pp1-zero0-none-m1-rnone' \
    "$P" train --plan otherplan.json
echo "{\"config\": $conf, \"plan\": {\"layout\": \"dp1-tp1-pp1-zero0-none-m1-rnone\", \"predicted\": {\"layout\": \"dp1-tp1-pp2-zero0-1f1b-m1-rnone\"}}}" >predplan.json
expect_fail "plan file: predicted of another layout" "predplan.json: plan.predicted.layout is" \
    "$P" train --plan predplan.json

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
