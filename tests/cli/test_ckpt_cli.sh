#!/usr/bin/env bash
# Sliced checkpoints through `partrain train --nproc N`:
#  - the files are plain safetensors that a reader with nothing of
#    partrain's loads (st_check.py: header length, JSON, F32, GPT-2's names
#    and full shapes, offsets tiling the data to the file's end), saved at
#    dp 2 x tp 2 ZeRO-3, pp 2 interleaved, dp 2 local_sgd (its sync and
#    replica files too); the dp 2 x tp 2 ZeRO-3 model holds the one
#    worker's values (within float rounding);
#  - checkpoint.async is in `train --help`, and its files are byte for byte
#    those of a synchronous save of the same steps (state.json too, but for
#    the key itself);
#  - bad checkpoints, each one line before step 1: state.json's model and
#    the files disagree, a truncated slice, rank_state listing a group a
#    file lacks, per-rank state resumed at a dp it cannot reshard to.
# Usage: test_ckpt_cli.sh PATH/TO/partrain
set -u
P=${1:?usage: test_ckpt_cli.sh PATH/TO/partrain}
command -v python3 >/dev/null || { echo "test_ckpt_cli: no python3, skipped" >&2; exit 77; }
CHECK="python3 $(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/st_check.py"
. "$(dirname "${BASH_SOURCE[0]}")/expect.sh"
T=$(mktemp -d /tmp/pt-test-ckpt-cli-XXXXXX)
trap 'rm -rf "$T"' EXIT
cd "$T"
export PT_LOG=warn

for i in $(seq 1 300); do echo "the quick brown fox $i jumps over the lazy dog"; done >train.txt
cat >tiny.json <<'EOF'
{
  "model": {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 256, "seq_len": 16},
  "data": {"train": "train.txt"},
  "train": {"steps": 4, "batch_size": 8, "warmup_steps": 1, "val_every": 0, "threads": 1},
  "checkpoint": {"every": 2},
  "log": {"every": 100}
}
EOF
train() { "$P" train --config tiny.json "$@"; }

# ---- the files, read without partrain ----
expect_ok "train dp2 x tp2 zero3" train --nproc 4 --set parallel.dp=2 --set parallel.tp=2 \
    --set parallel.zero=3 --set checkpoint.dir=mesh
expect_ok "train one worker" train --set checkpoint.dir=one
expect_ok "train pp2 interleaved" train --nproc 2 --set parallel.pp=2 --set parallel.microbatches=2 \
    --set parallel.schedule=interleaved --set checkpoint.dir=inter
expect_ok "train dp2 local_sgd nesterov" train --nproc 2 --set parallel.dp=2 \
    --set parallel.sync=local_sgd --set parallel.outer=nesterov --set parallel.sync_every=3 \
    --set checkpoint.dir=lsgd
for d in mesh one inter lsgd; do
    if $CHECK $d/step_00000004 >out 2>&1; then ok "st_check $d"; else bad "st_check $d" "$(cat out)"; fi
done
# 28 tensors a group at 2 layers: replica1 params, m, v; sync anchor, momentum
grep -q "replica1.safetensors: 84 tensors" out && grep -q "sync.safetensors: 56 tensors" out ||
    bad "st_check lsgd" "no replica1 (3 groups) or sync (2 groups): $(cat out)"
if $CHECK --diff mesh/step_00000004/model.safetensors one/step_00000004/model.safetensors 1e-4 \
    >out 2>&1; then ok "dp2 x tp2 zero3 model = one worker's"; else bad "--diff" "$(cat out)"; fi

# ---- checkpoint.async: the same bytes ----
"$P" train --help | grep -q "checkpoint.async" && ok "train --help: checkpoint.async" ||
    bad "train --help" "no checkpoint.async"
for a in false true; do
    expect_ok "train dp2 x tp2 zero3 async=$a" train --nproc 4 --set parallel.dp=2 \
        --set parallel.tp=2 --set parallel.zero=3 --set checkpoint.dir=async-$a \
        --set checkpoint.async=$a
done
same=1
for s in 2 4; do
    for f in model optim_m optim_v; do
        cmp -s async-false/step_0000000$s/$f.safetensors async-true/step_0000000$s/$f.safetensors ||
            same=0
    done
    python3 - async-false/step_0000000$s/state.json async-true/step_0000000$s/state.json <<'PY' || same=0
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
for s in (a, b):
    del s["config"]["checkpoint"]["async"], s["config"]["checkpoint"]["dir"]
sys.exit(a != b)
PY
done
[ $same = 1 ] && ok "async files = sync files, steps 2 and 4" || bad "async" "files differ"

# ---- bad checkpoints: one line, before step 1 ----
resume() { train --set train.steps=6 --resume "$@"; }
edit() { # edit STATE_JSON PYTHON_STATEMENT (on s)
    python3 -c "import json,sys; p=sys.argv[1]; s=json.load(open(p)); $2; json.dump(s, open(p, 'w'))" "$1"
}
cp -r one mis && edit mis/step_00000004/state.json 's["config"]["model"]["n_embd"] = 64'
expect_fail "files disagree with state.json" \
    "model.safetensors: tensor 'wte.weight' has shape [256, 32], expected [256, 64]" \
    resume --set model.n_embd=64 --set checkpoint.dir=mis
cp -r mesh cut && truncate -s -100 cut/step_00000004/optim_v.safetensors
expect_fail "a truncated slice" "optim_v.safetensors: the tensors cover 136704 data bytes but the file holds 136604 (truncated" resume --nproc 2 --set parallel.tp=2 \
    --set checkpoint.dir=cut
expect_ok "train dp2 stale dga" train --nproc 2 --set parallel.dp=2 --set parallel.sync=stale \
    --set checkpoint.dir=dga
cp -r dga group && edit group/step_00000004/state.json \
    's["rank_state"]["files"]["replica1"].append("stale.step_9.local")'
expect_fail "rank_state lists a group the file lacks" "replica1.safetensors: missing tensor" \
    resume --nproc 2 --set parallel.dp=2 --set parallel.sync=stale --set checkpoint.dir=group
cp -r dga dga4
expect_fail "per-rank state at another dp" "does not carry over to this run's dp4 stale dga" \
    resume --nproc 4 --set parallel.dp=4 --set parallel.sync=stale --set checkpoint.dir=dga4
expect_ok "... unless checkpoint.drop_rank_state" resume --nproc 4 --set parallel.dp=4 \
    --set parallel.sync=stale --set checkpoint.dir=dga4 --set checkpoint.drop_rank_state=true
expect_ok "per-rank state at another tp and pp" resume --nproc 4 --set parallel.dp=2 \
    --set parallel.pp=2 --set parallel.microbatches=2 --set parallel.sync=stale \
    --set checkpoint.dir=dga --set train.steps=8

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
