#!/bin/bash
# Restart on failure (issue 39, item 5), on the shm launcher or, when an
# mpirun is given, under mpirun through scripts/mpirun-restart.sh:
#   test_restart.sh PARTRAIN [MPIRUN]
# A tiny model, dp 4, 10 steps, a checkpoint every 2; rank 2 killed by the
# PT_FAULT knob at dp group 0's collective #11 (step 6's first bucket: after the
# step-4 checkpoint):
#   - --max-restarts 1: one restart line, the run resumes and ends at the
#     uninterrupted run's final loss and gradient norm, bitwise; every
#     survivor of the failed run wrote its flight recorder;
#   - --elastic on 4 -> 3 ranks (the planner's layout on a cluster file):
#     every step's loss within 1e-5 of the single worker's;
#   - --max-restarts 0, an error a rank reports itself (never restarted),
#     and the options' misuse: one line each.
# Under mpirun: the wrapper's plain and elastic restarts, the same checks.
set -u
P=$1 MPIRUN=${2:-}
T=$(mktemp -d /tmp/pt-restart-XXXXXX)
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/expect.sh"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
cd "$T" || exit 1
export PT_LOG=warn OPENBLAS_NUM_THREADS=1
for i in $(seq 1 400); do echo "the quick brown fox $i jumps over the lazy dog"; done >train.txt
cat >cfg.json <<'EOF'
{"model": {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 256, "seq_len": 16},
 "data": {"train": "train.txt"},
 "train": {"steps": 10, "batch_size": 12, "warmup_steps": 1, "val_every": 0, "threads": 1},
 "parallel": {"dp": 4},
 "comm": {"timeout": 3},
 "checkpoint": {"dir": "ck", "every": 2},
 "log": {"metrics": "m.jsonl", "every": 1}}
EOF
cat >cpu.json <<'EOF'
{"name": "cores", "nodes": 1, "devices_per_node": 4,
 "device": {"name": "core", "peak_flops": {"fp32": 5e10}, "memory_bytes": 4e9, "memory_bw": 1e10},
 "links": {"intra_node": {"bw": 5e9, "latency": 2e-6}, "inter_node": {"bw": 5e9, "latency": 2e-6}}}
EOF
FAULT=kill:rank=2:group=dp:seq=11

# the last line's loss and gradient norm, as written
final() { grep '"grad_norm"' "$1" | tail -1 | grep -o '"loss":[^,]*,"lr":[^,]*,"grad_norm":[^,]*'; }
# every step of $1 within 1e-5 (relative) of the single worker's $2
follows() {
    python3 - "$1" "$2" <<'EOF'
import json, sys
# step lines only: the run record, validation and save lines carry no loss
steps = lambda f: [r for r in map(json.loads, open(f)) if "step" in r and "loss" in r]
one = {r["step"]: r["loss"] for r in steps(sys.argv[2])}
worst = max(abs(r["loss"] - one[r["step"]]) / one[r["step"]] for r in steps(sys.argv[1]))
print("largest relative difference %.3g" % worst)
sys.exit(0 if worst <= 1e-5 else 1)
EOF
}

"$P" train --config cfg.json --nproc 4 --set log.metrics=ref.jsonl --set checkpoint.dir=ckref \
    >/dev/null 2>"$T/err" || bad "the uninterrupted run" "$(tail -2 "$T/err")"
"$P" train --config cfg.json --set parallel.dp=1 --set log.metrics=one.jsonl \
    --set checkpoint.dir=ck1 >/dev/null 2>"$T/err" || bad "the single worker" "$(tail -2 "$T/err")"

if [ -z "$MPIRUN" ]; then
# ---- shm: --max-restarts 1, bitwise ----
rm -rf ck m.jsonl fl
t0=$(date +%s.%N)
PT_FAULT=$FAULT "$P" train --config cfg.json --nproc 4 --max-restarts 1 --set log.flight=fl/ \
    >/dev/null 2>err.txt
rc=$?
echo "restart run: exit $rc, $(echo "$(date +%s.%N) - $t0" | bc) s" >&2
grep '^partrain: ' err.txt >&2
if [ $rc -eq 0 ] && [ "$(grep -c '^partrain: restart 1 of 1 after rank 2' err.txt)" = 1 ] &&
    [ "$(final m.jsonl)" = "$(final ref.jsonl)" ]; then
    ok "--max-restarts 1: one restart, the final loss bitwise ($(final m.jsonl))"
else
    bad "--max-restarts 1" "exit $rc, final $(final m.jsonl) vs $(final ref.jsonl)"
fi
if grep '^partrain: rank 2 killed' err.txt | grep -qE "dp group 0: allreduce #11 \([^)]*\): ranks? 2(, [0-9]+)* never arrived"; then
    ok "the failure's line names rank 2, dp group 0, allreduce #11"
else
    bad "the failure's line" "$(grep '^partrain: rank' err.txt)"
fi
if [ -s fl/flight-rank0.json ] && [ -s fl/flight-rank1.json ] && [ -s fl/flight-rank3.json ] &&
    [ ! -e fl/flight-rank2.json ] && "$P" flight fl >flight.txt 2>&1 &&
    grep -q "^first mismatch: dp group 0: allreduce #11" flight.txt; then
    ok "every survivor's flight dump, and partrain flight on them"
else
    bad "flight dumps" "$(ls fl 2>&1) $(head -3 flight.txt 2>&1)"
fi

# ---- shm: --elastic, 4 -> 3 ranks ----
rm -rf ck m.jsonl
PT_FAULT=$FAULT "$P" train --config cfg.json --nproc 4 --max-restarts 1 --elastic \
    --cluster cpu.json >/dev/null 2>err.txt
rc=$?
grep '^partrain: \|^layout auto' err.txt >&2
if [ $rc -eq 0 ] && grep -q '^partrain: restart 1 of 1 after rank 2.*, 3 ranks' err.txt &&
    follows m.jsonl one.jsonl >&2 && grep -q '"step":10,' m.jsonl; then
    ok "--elastic 4 -> 3: $(grep -o 'layout auto: [^ ]*' err.txt), follows the single worker"
else
    bad "--elastic" "exit $rc: $(grep '^partrain' err.txt | tail -2)"
fi

# ---- not restarted, and misuse ----
rm -rf ck m.jsonl
PT_FAULT=$FAULT "$P" train --config cfg.json --nproc 4 --max-restarts 0 >/dev/null 2>err.txt
if [ $? -ne 0 ] && ! grep -q restart err.txt && [ "$(grep -c '^partrain: ' err.txt)" = 1 ]; then
    ok "--max-restarts 0: the failure ends the run"
else
    bad "--max-restarts 0" "$(grep '^partrain' err.txt)"
fi
rm -rf ck
expect_fail_run "an error of the ranks' own is not restarted" "data.val" \
    "$P" train --config cfg.json --nproc 4 --max-restarts 2 --set data.val=missing.txt
expect_fail "--max-restarts without checkpoint.dir" "--max-restarts needs checkpoint.dir" \
    "$P" train --config cfg.json --nproc 4 --max-restarts 1 --set checkpoint.dir=
expect_fail "--elastic without --max-restarts" "--elastic is a way to restart" \
    "$P" train --config cfg.json --nproc 4 --elastic
expect_fail "--max-restarts under mpirun" "scripts/mpirun-restart.sh" \
    "$P" train --config cfg.json --backend mpi --max-restarts 1
expect_fail "--max-restarts out of range" "--max-restarts" \
    "$P" train --config cfg.json --nproc 4 --max-restarts -1
expect_fail "log.flight in a missing folder" "log.flight: " \
    "$P" train --config cfg.json --nproc 4 --set log.flight=nowhere/at/all
expect_fail "--resume=auto without checkpoint.dir" "--resume=auto needs checkpoint.dir" \
    "$P" train --config cfg.json --resume=auto --set checkpoint.dir=

else
# ---- mpirun, through the wrapper ----
    W="$SRC/scripts/mpirun-restart.sh"
    M=(--mpirun "$MPIRUN" -np 4 --oversubscribe --bind-to none -x PT_FAULT=$FAULT)
    rm -rf ck m.jsonl
    bash "$W" --max-restarts 1 "${M[@]}" -- "$P" train --config cfg.json >/dev/null 2>err.txt
    rc=$?
    grep '^partrain: ' err.txt >&2
    if [ $rc -eq 0 ] && [ "$(grep -c '^partrain: restart 1 of 1' err.txt)" = 1 ] &&
        [ "$(final m.jsonl)" = "$(final ref.jsonl)" ]; then
        ok "mpirun-restart.sh: one restart, the final loss bitwise"
    else
        bad "mpirun-restart.sh" "exit $rc, final $(final m.jsonl) vs $(final ref.jsonl)"
    fi
    rm -rf ck m.jsonl
    bash "$W" --max-restarts 1 --elastic --cluster cpu.json "${M[@]}" -- "$P" train \
        --config cfg.json >/dev/null 2>err.txt
    rc=$?
    grep '^partrain: ' err.txt >&2
    if [ $rc -eq 0 ] && grep -q 'on 3 ranks' err.txt && follows m.jsonl one.jsonl >&2 &&
        grep -q '"step":10,' m.jsonl; then
        ok "mpirun-restart.sh --elastic 4 -> 3: follows the single worker"
    else
        bad "mpirun-restart.sh --elastic" "exit $rc: $(grep '^partrain' err.txt | tail -2)"
    fi
fi
echo "$pass passed, $fail failed" >&2
[ $fail -eq 0 ]
