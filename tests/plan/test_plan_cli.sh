#!/usr/bin/env bash
# partrain plan end to end: the table, --json's fields, --write then
# `partrain train --plan FILE` running the planned layout, --trace as valid
# Chrome trace JSON, and bad inputs as one "partrain: " line with a
# non-zero exit. Usage: test_plan_cli.sh PATH/TO/partrain
set -u
P=${1:?usage: test_plan_cli.sh PATH/TO/partrain}
T=$(mktemp -d /tmp/pt-test-plan-XXXXXX)
trap 'rm -rf "$T"' EXIT
cd "$T"
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $1" >&2; }
bad() { fail=$((fail + 1)); echo "FAIL $1: $2" >&2; }

# expect_fail NAME RC PATTERN CMD...: exit RC, one stderr line "partrain: ..." with PATTERN
expect_fail() {
    local name=$1 want=$2 pattern=$3
    shift 3
    "$@" >out 2>err
    local rc=$? lines
    lines=$(grep -vc '^partrain info: OpenBLAS chose its' err)
    if [ $rc -ne "$want" ]; then
        bad "$name" "exit $rc, wanted $want: $(cat err)"
    elif [ "$lines" -ne 1 ] || ! grep -q '^partrain: ' err; then
        bad "$name" "expected one 'partrain: ' line: $(cat err)"
    elif ! grep -qF -- "$pattern" err; then
        bad "$name" "message lacks '$pattern': $(cat err)"
    else
        ok "$name"
    fi
}

for i in $(seq 1 300); do echo "the quick brown fox $i jumps over the lazy dog"; done >train.txt
cat >tiny.json <<'EOF'
{
  "model": {"n_layer": 2, "n_embd": 16, "n_head": 2, "vocab_size": 256, "seq_len": 16},
  "data": {"train": "train.txt"},
  "train": {"steps": 4, "batch_size": 8, "warmup_steps": 1, "val_every": 0},
  "log": {"every": 1}
}
EOF
cat >cpu.json <<'EOF'
{"name": "two-cores", "nodes": 1, "devices_per_node": 2,
 "device": {"name": "core", "peak_flops": {"fp32": 5e10}, "memory_bytes": 4e9, "memory_bw": 1e10},
 "links": {"intra_node": {"bw": 5e9, "latency": 2e-6}, "inter_node": {"bw": 5e9, "latency": 2e-6}}}
EOF
sed 's/"memory_bytes": 4e9/"memory_bytes": 1e6/' cpu.json >tiny-mem.json

# ---- the table ----
if "$P" plan --config tiny.json --cluster cpu.json >table.txt 2>err &&
    grep -q "valid layouts of 2 ranks on two-cores" table.txt && grep -q "^1 " table.txt &&
    grep -q "step ms" table.txt; then
    ok "table"
else
    bad "table" "$(cat table.txt err)"
fi

# ---- --json: every field of every line ----
if "$P" plan --config tiny.json --cluster cpu.json --json --top 3 >lines.json 2>err &&
    python3 - lines.json <<'EOF'
import json, sys
need = ["layout", "dp", "tp", "pp", "zero", "zero_group", "sequence_parallel", "schedule",
        "microbatches", "virtual_stages", "recompute", "fits", "reason", "mem", "why"]
timed = ["step_ms", "tokens_per_s", "mfu", "breakdown"]
rows = [json.loads(l) for l in open(sys.argv[1])]
assert sum(r["fits"] for r in rows) == 3, rows
for r in rows:
    for k in need + (timed if r["fits"] else []):
        assert k in r, (k, r)
    assert r["dp"] * r["tp"] * r["pp"] == 2
    for c in ["params", "grads", "optim", "acts", "comm", "scratch", "total"]:
        assert c in r["mem"], c
fit = [r["step_ms"] for r in rows if r["fits"]]
assert fit == sorted(fit)
EOF
then
    ok "--json fields"
else
    bad "--json fields" "$(cat err)"
fi

# ---- --write, then train --plan runs it ----
if "$P" plan --config tiny.json --cluster cpu.json --write plan.json --trace trace.json >/dev/null 2>err; then
    ok "--write and --trace"
else
    bad "--write and --trace" "$(cat err)"
fi
n=$(python3 -c 'import json; c=json.load(open("plan.json"))["config"]["parallel"]; print(c["dp"]*c["tp"]*c["pp"])' 2>/dev/null)
if [ -n "$n" ] && python3 -c 'import json; p=json.load(open("plan.json")); assert p["plan"]["layout"] and "step_ms" in p["plan"]["predicted"]'; then
    ok "plan file"
else
    bad "plan file" "$(head -c 400 plan.json)"
fi
np=""
[ "${n:-1}" -gt 1 ] && np="--nproc $n"
# shellcheck disable=SC2086
if OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 60 "$P" train --plan plan.json --set train.steps=2 $np >out 2>err; then
    ok "train --plan"
else
    bad "train --plan" "exit $?: $(tail -3 err)"
fi
# log.probe: the speed probe's rate on every step line, and only with it
if "$P" train --config tiny.json --set train.steps=2 --set log.probe=true \
    --set log.metrics=probe.jsonl >/dev/null 2>err &&
    "$P" train --config tiny.json --set train.steps=2 --set log.metrics=noprobe.jsonl \
        >/dev/null 2>>err && python3 -c '
import json
on = [json.loads(l) for l in open("probe.jsonl") if "step_ms" in l]
off = [json.loads(l) for l in open("noprobe.jsonl") if "step_ms" in l]
assert len(on) == 2 and all(r["probe_flops_s"] > 0 for r in on)
assert off and not any("probe_flops_s" in r for r in off)
'; then
    ok "log.probe"
else
    bad "log.probe" "$(tail -3 err)"
fi
if python3 -c '
import json
d = json.load(open("trace.json"))
ev = [e for e in d["traceEvents"] if e.get("ph") == "X"]
assert any(e["cat"] == "pipeline" for e in ev)
assert any(e["cat"] == "optim" for e in ev)
'; then
    ok "trace JSON"
else
    bad "trace JSON" "$(head -c 300 trace.json)"
fi

# ---- bad input ----
expect_fail "no cluster" 2 "--cluster" "$P" plan --config tiny.json
expect_fail "missing cluster file" 1 "nope.json" "$P" plan --config tiny.json --cluster nope.json
expect_fail "fixed tp that no layout takes" 1 "no layout of 2 ranks is valid with parallel.tp=3 (fixed)" \
    "$P" plan --config tiny.json --cluster cpu.json --set parallel.tp=3
# a device of 1 MB (the least a cluster may say) and a 4 MB embedding
expect_fail "nothing fits" 1 "fits on no layout of 2 ranks: the smallest" \
    "$P" plan --config tiny.json --cluster tiny-mem.json --set model.vocab_size=65536
# vocabularies of real models plan (Gemma's 256,000); past an int32 token id, one line
if "$P" plan --config tiny.json --cluster cpu.json --set model.vocab_size=256000 --top 1 \
    >gemma.txt 2>err && grep -q "^1 " gemma.txt; then
    ok "vocab 256,000"
else
    bad "vocab 256,000" "$(cat gemma.txt err)"
fi
expect_fail "vocab past an int32" 1 "model.vocab_size must be in [1, 2147483647]" \
    "$P" plan --config tiny.json --cluster cpu.json --set model.vocab_size=2147483648
# a cluster's quantities in their ranges: no inf step, no null in a plan file
sed 's/"fp32": 5e10/"fp32": 1e-300/' cpu.json >slow.json
expect_fail "peak_flops of 1e-300" 1 \
    "slow.json: device.peak_flops.fp32 must be a number in [1e6, 1e18] flop/s (got 1e-300)" \
    "$P" plan --config tiny.json --cluster slow.json --write never.json
[ -e never.json ] && bad "no plan file" "never.json written" || ok "no plan file"
sed 's/"nodes": 1,/"nodes": 1000000,/' cpu.json >huge.json
expect_fail "a world beyond --world's cap" 1 \
    "huge.json: nodes x devices_per_node (1000000 x 2 = 2000000 ranks) must be at most 1048576 ranks" \
    "$P" plan --config tiny.json --cluster huge.json
sed 's/"links"/"profile": {"version": 1, "cpu": "c", "binary": "b", "cores": 2, "memory_bw": 1e10, "elementwise_s": 1e-10, "adamw_s": 1e-9, "sgd_s": 1e-9, "gemm": [], "modules": []},\n "links"/' \
    cpu.json >empty-profile.json
expect_fail "a profile without measurements" 1 \
    "empty-profile.json: profile.gemm and profile.modules are empty" \
    "$P" plan --config tiny.json --cluster empty-profile.json
expect_fail "train --plan with --config" 2 "not both" "$P" train --plan plan.json --config tiny.json
expect_fail "train --plan missing" 1 "missing.json" "$P" train --plan missing.json
grep -q -- "--plan FILE" <("$P" train --help) && ok "train --help" || bad "train --help" "no --plan"
grep -q -- "--cluster FILE" <("$P" plan --help) && ok "plan --help" || bad "plan --help" "no --cluster"

# ---- train --layout auto: the plan's top layout, said on stderr, and run ----
"$P" plan --config tiny.json --cluster cpu.json --world 2 --json --top 1 >top.json 2>/dev/null
want=$(python3 -c 'import json; print(json.loads(open("top.json").readline())["layout"])')
if OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 60 "$P" train --config tiny.json \
    --layout auto --cluster cpu.json --nproc 2 --set train.steps=2 \
    --set log.metrics=auto.jsonl >out 2>err &&
    grep -qF "layout auto: $want, the fastest of" err && grep -q "predicted:" err &&
    python3 -c 'import json,sys; r=[json.loads(l) for l in open("auto.jsonl")]; sys.exit(r[-1]["world"] != 2)'; then
    ok "train --layout auto"
else
    bad "train --layout auto" "wanted $want: $(tail -5 err)"
fi
# a --set layout key stays fixed
if timeout 60 "$P" train --config tiny.json --layout auto --cluster cpu.json --nproc 2 \
    --set parallel.pp=2 --set train.steps=1 >out 2>err && grep -q "layout auto: dp1-tp1-pp2" err; then
    ok "train --layout auto, fixed key"
else
    bad "train --layout auto, fixed key" "$(tail -3 err)"
fi
expect_fail "layout not auto" 2 "--layout must be auto" "$P" train --config tiny.json --layout manual
expect_fail "layout with plan" 2 "give one of them" "$P" train --plan plan.json --layout auto
expect_fail "layout under mpi" 2 "partrain plan --write" \
    "$P" train --config tiny.json --layout auto --backend mpi
expect_fail "cluster without layout" 2 "--cluster is for --layout auto" \
    "$P" train --config tiny.json --cluster cpu.json
expect_fail "layout, nothing valid" 1 "no layout of 2 ranks is valid" \
    "$P" train --config tiny.json --layout auto --cluster cpu.json --nproc 2 --set parallel.tp=3

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
