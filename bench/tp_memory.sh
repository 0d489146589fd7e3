#!/bin/sh
# Tensor parallelism: memory and communication per rank, measured next to
# the formulas (docs/parallel.md, "Tensor parallelism").
#
# Runs `partrain train` for a few steps on a small model (L 4, C 128, NH 4,
# V 256, T 128; global batch 8, one micro-batch; 1 thread per rank) at
# tp = 1, 2, 4, each alone and at dp 2 with ZeRO 0..3, and reads the last
# step's metrics: `mem` (per category the largest peak over ranks) and
# `tp_comm_bytes` (bytes rank 0 sent on its tp group in the step). A second
# depth (L 2) at dp 1 gives activations and communication PER LAYER as the
# difference of the two runs over the two layers, which cancels everything
# that does not grow with depth (embedding, head, backward scratch). A
# third (L 12, dp 2 x tp 2, ZeRO 0..3) shows ZeRO's saving once the shard
# outweighs its unit buffers; and L 2, 4 with parallel.sequence_parallel
# at t = 2, 4.
#
# Formulas (Psi_t = this rank's parameters, N = s b tokens per micro-batch,
# h = C, a = NH, s = T, b = micro-batch sequences):
#   Psi_t            L (12 h^2/t + 7h/t + 6h) + (V_pad/t) h + s h + 2h
#   params, grads    4 Psi_t bytes each (float32); ZeRO 3 (params), 2 (grads): / dp
#   optim            8 Psi_t (AdamW m, v); ZeRO >= 1: / dp
#   acts per layer   ours: 4 [4Nh + 12Nh/t + 4N + a s^2 b/t]
#                    Korthikanti et al. 2022 (fp16, dropout): s b h (10 + 24/t + 5as/(ht))
#                    the same tensors at float32 without dropout:
#                    s b h (16 + 48/t) + 4 a s^2 b/t
#   comm per layer   4 all-reduces of (t-1)/t * 2 s b h elements per step (Korthikanti),
#                    x 4 bytes: what comm.c counts a rank as sending
#
#   bench/tp_memory.sh [--steps S] [--json]
#
# --json: only the JSON lines (one per measurement). PARTRAIN=path overrides
# the binary (default build/src/cli/partrain, built if missing).
set -eu
STEPS=3 JSON_ONLY=0
while [ $# -gt 0 ]; do
    case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --json) JSON_ONLY=1; shift ;;
    -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "tp_memory.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
BIN=${PARTRAIN:-$ROOT/build/src/cli/partrain}
if [ -z "${PARTRAIN:-}" ] && [ ! -x "$BIN" ]; then
    cmake -S "$ROOT" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$ROOT/build" --target partrain -j2 >/dev/null
fi
TMP=$(mktemp -d /tmp/pt-tp-memory-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
# byte-level text: the repository's own docs (memory and bytes do not depend on it)
cat "$ROOT"/docs/*.md "$ROOT"/README.md >"$TMP/train.txt"
L=4 C=128 NH=4 V=256 T=128 B=8

run() { # layers dp tp zero metrics-file [sequence_parallel]
    world=$(($2 * $3))
    nproc_arg=""
    [ "$world" -gt 1 ] && nproc_arg="--nproc $world"
    # shellcheck disable=SC2086
    if ! OPENBLAS_NUM_THREADS=1 "$BIN" train --set model.n_layer="$1" --set model.n_embd=$C \
        --set model.n_head=$NH --set model.vocab_size=$V --set model.seq_len=$T \
        --set train.batch_size=$B --set train.steps="$STEPS" --set train.warmup_steps=0 \
        --set train.threads=1 --set train.val_every=0 --set parallel.dp="$2" \
        --set parallel.tp="$3" --set parallel.zero="$4" $nproc_arg \
        --set parallel.sequence_parallel="${6:-false}" \
        --set data.train="$TMP/train.txt" --set log.metrics="$5" >"$TMP/log" 2>&1; then
        echo "tp_memory.sh: L $1 dp $2 tp $3 zero $4 failed:" >&2
        tail -3 "$TMP/log" >&2
        exit 1
    fi
}

for t in 1 2 4; do
    run 2 1 "$t" 0 "$TMP/m_2_1_${t}_0.jsonl"
    for dp in 1 2; do
        for z in 0 1 2 3; do
            [ "$dp" = 1 ] && [ "$z" != 0 ] && continue
            run $L "$dp" "$t" "$z" "$TMP/m_${L}_${dp}_${t}_$z.jsonl"
        done
    done
done
# sequence parallelism: per layer, as above
for t in 2 4; do
    run 2 1 "$t" 0 "$TMP/sp_2_$t.jsonl" true
    run $L 1 "$t" 0 "$TMP/sp_${L}_$t.jsonl" true
done
# ZeRO's saving beyond its unit buffers shows with depth: 12 blocks at dp 2 x tp 2
DEEP=12
for z in 0 1 2 3; do
    run $DEEP 2 2 "$z" "$TMP/m_${DEEP}_2_2_$z.jsonl"
done

[ "$JSON_ONLY" = 1 ] || echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), partrain $(git -C "$ROOT" rev-parse --short HEAD), L $L C $C NH $NH V $V T $T global batch $B, $STEPS steps, last step's metrics"
python3 - "$TMP" "$JSON_ONLY" $L $C $NH $V $T $B $DEEP <<'PY'
import json, os, sys
tmp, json_only = sys.argv[1], sys.argv[2] == "1"
L, C, NH, V, T, B, DEEP = map(int, sys.argv[3:10])
out = []

def last(f):
    rows = [json.loads(l) for l in open(os.path.join(tmp, f))]
    return [r for r in rows if "step_ms" in r][-1]

def psi(t, layers):
    vpad = -(-V // t) * t
    return layers * (12 * C * C // t + 7 * C // t + 6 * C) + vpad // t * C + T * C + 2 * C

def say(s):
    if not json_only:
        print(s)

KiB = 1024.0
say("\nParameters, gradients, optimizer state per rank (KiB; measured / formula: 4 Psi_t, 4 Psi_t, 8 Psi_t; ZeRO divides by dp)")
say("%-22s %9s %14s %14s %14s %14s" % ("layout", "Psi_t", "params", "grads", "optim", "p+g+o"))
for layers, t, dp in [(L, 1, 1), (L, 1, 2), (L, 2, 1), (L, 2, 2), (L, 4, 1), (L, 4, 2), (DEEP, 2, 2)]:
    if layers != L:
        say("at L %d:" % layers)
    for z in range(4):
        if dp == 1 and z:
            continue
        r = last("m_%d_%d_%d_%d.jsonl" % (layers, dp, t, z))
        p = psi(t, layers)
        fp = 4 * p / (dp if z >= 3 else 1)
        fg = 4 * p / (dp if z >= 2 else 1)
        fo = 8 * p / (dp if z >= 1 else 1)
        m = r["mem"]
        pgo = m["params"] + m["grads"] + m["optim"]
        cell = lambda a, b: "%6.0f / %-6.0f" % (a / KiB, b / KiB)
        say("%-22s %9d %14s %14s %14s %14s" % (r["layout"], p, cell(m["params"], fp),
            cell(m["grads"], fg), cell(m["optim"], fo), cell(pgo, fp + fg + fo)))
        out.append({"bench": "tp_memory", "kind": "state", "layout": r["layout"], "L": layers, "dp": dp,
                    "tp": t, "zero": z, "psi_t": p, "mem": m,
                    "formula": {"params": fp, "grads": fg, "optim": fo}})

s, b, h, a = T, B, C, NH
N = s * b
say("\nActivations per layer (KiB, dp 1, one micro-batch of b = %d sequences: (acts(L %d) - acts(2)) / %d)" % (b, L, L - 2))
say("%-4s %10s %10s %14s %16s" % ("t", "measured", "ours", "Korthikanti", "K. fp32 no drop"))
for t in (1, 2, 4):
    r4, r2 = last("m_%d_1_%d_0.jsonl" % (L, t)), last("m_2_1_%d_0.jsonl" % t)
    meas = (r4["mem"]["acts"] - r2["mem"]["acts"]) / (L - 2)
    ours = 4 * (4 * N * h + 12 * N * h // t + 4 * N + a * s * s * b // t)
    kor = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    k32 = s * b * h * (16 + 48 / t) + 4 * a * s * s * b / t
    say("%-4d %10.1f %10.1f %14.1f %16.1f" % (t, meas / KiB, ours / KiB, kor / KiB, k32 / KiB))
    out.append({"bench": "tp_memory", "kind": "acts_per_layer", "tp": t, "s": s, "b": b, "h": h,
                "a": a, "measured": meas, "ours": ours, "korthikanti_fp16": kor,
                "korthikanti_fp32_no_dropout": k32})

say("\nWith sequence parallelism (KiB per layer; ours: 4[16sbh/t + 4sb/t + as^2b/t]; Korthikanti: sbh(34 + 5as/h)/t; fp32 no dropout: (64 sbh + 4as^2b)/t)")
say("%-4s %10s %10s %14s %16s" % ("t", "measured", "ours", "Korthikanti", "K. fp32 no drop"))
for t in (2, 4):
    r4, r2 = last("sp_%d_%d.jsonl" % (L, t)), last("sp_2_%d.jsonl" % t)
    meas = (r4["mem"]["acts"] - r2["mem"]["acts"]) / (L - 2)
    ours = 4 * (16 * N * h // t + 4 * N // t + a * s * s * b // t)
    kor = s * b * h * (34 + 5 * a * s / h) / t
    k32 = (64 * s * b * h + 4 * a * s * s * b) / t
    say("%-4d %10.1f %10.1f %14.1f %16.1f" % (t, meas / KiB, ours / KiB, kor / KiB, k32 / KiB))
    out.append({"bench": "tp_memory", "kind": "acts_per_layer_sp", "tp": t, "s": s, "b": b, "h": h,
                "a": a, "measured": meas, "ours": ours, "korthikanti_fp16": kor,
                "korthikanti_fp32_no_dropout": k32})

say("\nCommunication per layer per step on the tp group (bytes rank 0 sent, dp 1: (tp_comm_bytes(L %d) - (L 2)) / %d)" % (L, L - 2))
say("%-4s %12s %18s %14s %16s" % ("t", "measured", "4 AR 2(t-1)/t sbh", "step total", "step formula"))
for t in (1, 2, 4):
    r4, r2 = last("m_%d_1_%d_0.jsonl" % (L, t)), last("m_2_1_%d_0.jsonl" % t)
    meas = (r4["tp_comm_bytes"] - r2["tp_comm_bytes"]) / (L - 2)
    ar = lambda x: 2 * (t - 1) * x // t
    form = 4 * ar(4 * N * h)
    # the whole step (tests/parallel/test_tp_bytes.c): (4L + 2) all-reduces of N h,
    # one of N * 4 (cross-entropy statistics), an all-gather of t N, the norm's 2 floats
    step = 0 if t == 1 else (4 * L + 2) * ar(4 * N * h) + ar(16 * N) + (t - 1) * 4 * t * N // t + ar(8)
    say("%-4d %12.0f %18d %14d %16d" % (t, meas, form, r4["tp_comm_bytes"], step))
    out.append({"bench": "tp_memory", "kind": "comm_per_layer", "tp": t, "measured": meas,
                "formula": form, "step_measured": r4["tp_comm_bytes"], "step_formula": step})
say("with sequence parallelism: 10 all-gathers / reduce-scatters of (t-1)/t sbh elements + 2 all-reduces of 2h")
for t in (2, 4):
    r4, r2 = last("sp_%d_%d.jsonl" % (L, t)), last("sp_2_%d.jsonl" % t)
    meas = (r4["tp_comm_bytes"] - r2["tp_comm_bytes"]) / (L - 2)
    ar = lambda x: 2 * (t - 1) * x // t
    ag = lambda x: (t - 1) * x // t
    form = 10 * ag(4 * N * h) + 2 * ar(8 * h)
    step = (10 * L + 5) * ag(4 * N * h) + (2 * L + 1) * ar(8 * h) + ar(16 * N) + ag(4 * t * N) + ar(8)
    say("%-4d %12.0f %18d %14d %16d" % (t, meas, form, r4["tp_comm_bytes"], step))
    out.append({"bench": "tp_memory", "kind": "comm_per_layer_sp", "tp": t, "measured": meas,
                "formula": form, "step_measured": r4["tp_comm_bytes"], "step_formula": step})

if not json_only:
    print()
for o in out:
    print(json.dumps(o))
PY
