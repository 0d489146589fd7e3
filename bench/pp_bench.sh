#!/bin/sh
# Pipeline parallelism, measured against its formula: per model config and
# micro-batch count m, the one-rank baseline (one thread, the same global
# batch, parallel.microbatches=1) and pp=2 (two ranks, one thread each,
# train.threads=1) under every schedule. Runs ALTERNATE: each round runs the
# baseline and every schedule once, the order rotated by one each round (the
# machine is shared and noisy). The pp runs write a Chrome trace
# (log.trace), from which the script takes the mean F, B, W (or BW) pass
# time over the timed steps, per stage and over both stages. A pass's time
# is its compute, the sum of the module events nested in its pass event
# (which begins once its input has arrived, and also holds posting its
# sends; a W pass: its whole event); pass_wall_ms in the JSON keeps the
# whole events.
#
# Formula bubble: `partrain bench schedule` with tf, tb, tw from zb1's trace
# of the same config and m (split B and W passes; mean over rounds); when zb1
# is not measured, each schedule's own times with tb = tw = BW/2 (column
# "times" says which). The bubble is a ratio: scaling all three times leaves
# it unchanged, so a whole stage's times serve the chunked schedules too.
#
# Columns: step_ms (median over rounds of each run's median timed step),
# speed-up = baseline_ms / pp_ms, bubble (median over the timed steps and
# rounds of the metric), formula bubble, |difference|, then the same run
# replayed on an ideal runtime from its own trace (bench/pp_replay.py):
# stage = the schedule at each stage's mean pass times (the formula plus
# the stages' imbalance), replay = at each pass's own time (plus its
# jitter), rt = bubble - replay (what the runtime adds: hand-overs, wake-
# ups; each round's pass order at the formula's times must give the
# formula, else the script stops); ideal = 2 * (1 - formula bubble), the
# speed-up of a runtime that adds nothing on cores that never slow each
# other; goal = 0.9 * 2 / (1 + formula bubble) (issue 13's; above ideal
# where the bubble exceeds 0.316) and whether the speed-up meets it,
# ratio = speed-up / ideal (issue 40's: at least 0.9 for gpt2_256 at m 2, 4,
# 8 under 1f1b and zb1), infl = a rank's compute in a step (m v passes of each kind at their mean)
# over half the baseline's step (what the split costs beyond the bubble:
# shared cores, smaller products), stage_acts per stage (MiB, the
# PT_MEM_ACTS peak). One JSON line per (config, m, schedule).
#
#   bench/pp_bench.sh [--rounds R] [--warmup W] [--steps S] [--configs "small gpt2"]
#                     [--micro "2 4 8"] [--schedules "gpipe 1f1b interleaved zb1 zbv"] [--save]
#
# Configs: small = L6 C384 NH6 V256 T256 batch 8; gpt2 = L12 C768 NH12 V50257
# T64 batch 4; gpt2_256 = gpt2 at T256 batch 8 (issue 40's pipeline goal)
# (an m that does not divide the batch is skipped, said on stderr).
# PARTRAIN_B=path adds every schedule run by a second binary (rows "S@B",
# in the same rounds and rotation: an A/B of two builds, interleaved; the
# baseline and the formula's pass times are the first binary's).
# interleaved runs with parallel.virtual_stages=2; zbv always has 2 chunks.
# --save also writes the output to bench/results/pp_<date>.txt.
# PARTRAIN=path overrides the binary (default: build-bench/src/cli/partrain,
# built if missing).
set -eu
ROUNDS=3 WARMUP=2 STEPS=4 CONFIGS="small gpt2" MICRO="2 4 8" SAVE=0
SCHEDULES="gpipe 1f1b interleaved zb1 zbv"
while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --configs) CONFIGS=$2; shift 2 ;;
    --micro) MICRO=$2; shift 2 ;;
    --schedules) SCHEDULES=$2; shift 2 ;;
    --save) SAVE=1; shift ;;
    -h | --help) sed -n '2,52p' "$0"; exit 0 ;;
    *) echo "pp_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
BIN=${PARTRAIN:-$ROOT/build-bench/src/cli/partrain}
BIN_B=${PARTRAIN_B:-}
# a stage waits for its neighbour's pass through the pass's length: gpt2_256's
# passes on a loaded 2-core machine outlast comm.timeout's default 10 s
TIMEOUT=${PP_BENCH_TIMEOUT:-600}
if [ -z "${PARTRAIN:-}" ]; then
    cmake -S "$ROOT" -B "$ROOT/build-bench" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$ROOT/build-bench" --target partrain -j2 >/dev/null
fi
DATA="$ROOT/data/fortunes/train.txt"
[ -f "$DATA" ] || { echo "pp_bench.sh: $DATA missing (scripts/prepare-data.sh)" >&2; exit 1; }
for s in $SCHEDULES; do
    case "$s" in gpipe | 1f1b | interleaved | zb1 | zbv) ;;
    *) echo "pp_bench.sh: unknown schedule '$s' (gpipe 1f1b interleaved zb1 zbv)" >&2; exit 2 ;;
    esac
done
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
TMP=$(mktemp -d /tmp/pt-pp-bench-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
OUTFILE=/dev/null
if [ "$SAVE" = 1 ]; then
    mkdir -p "$ROOT/bench/results"
    OUTFILE="$ROOT/bench/results/pp_$(date -u '+%Y-%m-%d_%H%M').txt"
fi
START=$(date +%s)

shape() { # config -> "L C NH V T batch"
    case "$1" in
    small) echo "6 384 6 256 256 8" ;;
    gpt2) echo "12 768 12 50257 64 4" ;;
    gpt2_256) echo "12 768 12 50257 256 8" ;;
    *) echo "pp_bench.sh: unknown config '$1' (small gpt2 gpt2_256)" >&2; exit 2 ;;
    esac
}

# run CONFIG M SCHED ROUND: one training run; SCHED "base" is the one-rank
# baseline. Appends one JSON line (its medians, pass times, stage_acts) to
# $TMP/CONFIG_M_SCHED.
run() {
    cfg=$1 m=$2 sch=$3 rd=$4 bin=$BIN
    case "$sch" in *@B) bin=$BIN_B ;; esac
    set -- $(shape "$cfg")
    tag="${cfg}_${m}_${sch}_$rd"
    if [ "$sch" = base ]; then
        par="--set parallel.microbatches=1"
    else
        par="--nproc 2 --set parallel.pp=2 --set parallel.schedule=${sch%@B} --set parallel.microbatches=$m"
        par="$par --set log.trace=$TMP/$tag.trace.json"
        [ "${sch%@B}" = interleaved ] && par="$par --set parallel.virtual_stages=2"
    fi
    # shellcheck disable=SC2086
    if ! "$bin" train $par --set model.n_layer=$1 --set model.n_embd=$2 --set model.n_head=$3 \
        --set model.vocab_size=$4 --set model.seq_len=$5 --set train.batch_size=$6 \
        --set train.steps=$((WARMUP + STEPS)) --set train.warmup_steps=0 --set train.lr=3e-4 \
        --set train.threads=1 --set data.train="$DATA" --set comm.timeout=$TIMEOUT \
        --set log.metrics="$TMP/$tag.jsonl" >"$TMP/$tag.log" 2>&1; then
        echo "pp_bench.sh: run $tag failed; its last lines:" >&2
        tail -3 "$TMP/$tag.log" >&2
        exit 1
    fi
    python3 - "$TMP/$tag.jsonl" "$TMP/$tag.trace.json" "$WARMUP" "$ROOT/bench" "$sch" <<'PY' >>"$TMP/${cfg}_${m}_$sch"
import bisect, json, os, re, statistics, sys
metrics, trace, warmup, bench, sch = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
sys.path.insert(0, bench)
import pp_replay
rows = [json.loads(l) for l in open(metrics)]
rows = [r for r in rows if "step_ms" in r and r["step"] > warmup]
out = {"step_ms": statistics.median(r["step_ms"] for r in rows)}
if "bubble" in rows[0]:
    out["bubbles"] = [r["bubble"] for r in rows]
    out["stage_acts"] = rows[-1]["stage_acts"]
if os.path.exists(trace):
    # A pipeline pass's event spans its wait for the neighbour's activations
    # or gradients too; its compute is the sum of the module events
    # (cat forward / backward) nested in it, on the same rank (pid).
    ev = json.load(open(trace))["traceEvents"]
    mods = {}
    for e in ev:
        if e.get("ph") == "X" and e.get("cat") in ("forward", "backward"):
            mods.setdefault(e["pid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for v in mods.values():
        v.sort()
    starts = {p: [a for a, _ in v] for p, v in mods.items()}
    name = re.compile(r"^(F|BW|B|W)\d+( c\d+)?$")
    kinds, walls = {}, {}  # kind -> stage (pid) -> [ms]
    for e in ev:
        if e.get("cat") != "pipeline" or e.get("args", {}).get("step", 0) <= warmup:
            continue
        k = name.match(e["name"])
        if not k:
            continue
        p, a, b = e["pid"], e["ts"], e["ts"] + e["dur"]
        i, busy = bisect.bisect_left(starts.get(p, []), a), 0.0
        while i < len(starts.get(p, [])) and mods[p][i][0] < b:
            if mods[p][i][1] <= b:
                busy += mods[p][i][1] - mods[p][i][0]
            i += 1
        # W waits for no one (no receive), and its module events start at the
        # preceding B's last hook (no before-hook on the weight pass): whole event
        if k.group(1) == "W":
            busy = b - a
        kinds.setdefault(k.group(1), {}).setdefault(str(p), []).append(busy / 1e3)
        walls.setdefault(k.group(1), {}).setdefault(str(p), []).append(e["dur"] / 1e3)
    # mean pass time (ms) per kind: over both stages, and per stage
    for key, src in (("pass_ms", kinds), ("pass_wall_ms", walls)):
        out[key] = {k: statistics.mean(d for v in s.values() for d in v) for k, s in src.items()}
        out[key + "_stage"] = {k: {p: statistics.mean(v) for p, v in sorted(s.items())}
                               for k, s in src.items()}
    sch = sch.split("@")[0]
    v = 2 if sch in ("interleaved", "zbv") else 1
    rp = pp_replay.replay(trace, 2, sch, v, warmup)
    out["replay"], out["stage"], out["trace"] = rp["replay"], rp["stage"], trace
print(json.dumps(out))
PY
}

{
    echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, partrain $(git -C "$ROOT" rev-parse --short HEAD) (A: $BIN${BIN_B:+, B: $BIN_B}), rounds $ROUNDS, warm-up $WARMUP, timed $STEPS; load at start $(cut -d' ' -f1-3 /proc/loadavg)"
    printf "%-8s %2s %-11s %9s %7s %7s %7s %6s %6s %6s %6s %6s %5s %6s %4s %5s %6s %-15s %s\n" config m \
        schedule step_ms speedup bubble formula diff stage replay rt ideal ratio goal met infl times \
        stage_acts_MiB "compute_ms F/B/W/BW (stage0 | stage1)"
} | tee "$OUTFILE"
for cfg in $CONFIGS; do
    set -- $(shape "$cfg")
    batch=$6
    for m in $MICRO; do
        if [ $((batch % m)) != 0 ]; then
            echo "pp_bench.sh: $cfg: m $m does not divide the batch $batch: skipped" >&2
            continue
        fi
        runs="base $SCHEDULES"
        [ -n "$BIN_B" ] && runs="$runs $(for s in $SCHEDULES; do printf '%s@B ' "$s"; done)"
        nruns=$(echo $runs | wc -w)
        r=1
        while [ "$r" -le "$ROUNDS" ]; do
            # rotate the order by r-1
            k=0
            order=$(for s in $runs; do echo "$(( (k - r + 1 + nruns * ROUNDS) % nruns )) $s"; k=$((k + 1)); done |
                sort -n | cut -d' ' -f2)
            for s in $order; do run "$cfg" "$m" "$s" "$r"; done
            r=$((r + 1))
        done
        python3 - "$BIN" "$TMP" "$cfg" "$m" "$SCHEDULES${BIN_B:+ $(for s in $SCHEDULES; do printf '%s@B ' "$s"; done)}" "$ROOT/bench" "$WARMUP" <<'PY' | tee -a "$OUTFILE"
import json, statistics, subprocess, sys
bin_, tmp, cfg, m, schedules = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5].split()
sys.path.insert(0, sys.argv[6])
import pp_replay
warmup = int(sys.argv[7])
load = lambda s: [json.loads(l) for l in open("%s/%s_%d_%s" % (tmp, cfg, m, s))]
med = statistics.median
base = load("base")
base_ms = med(r["step_ms"] for r in base)
def times(runs, key="pass_ms"):  # mean over rounds of each kind's mean pass time
    ks = {k for r in runs for k in r[key]}
    return {k: statistics.mean(r[key][k] for r in runs if k in r[key]) for k in ks}
zb1 = times(load("zb1")) if "zb1" in schedules else None
rows, lines = [], []
for label in schedules:
    runs = load(label)
    s = label.split("@")[0]
    ms = med(r["step_ms"] for r in runs)
    bub = med(b for r in runs for b in r["bubbles"])
    stage = med(b for r in runs for b in r["stage"])
    rep = med(b for r in runs for b in r["replay"])
    own = times(runs)
    if zb1 and all(k in zb1 for k in "FBW"):
        tf, tb, tw, src = zb1["F"], zb1["B"], zb1["W"], "zb1"
    elif "BW" in own:
        tf, tb, tw, src = own["F"], own["BW"] / 2, own["BW"] / 2, "BW/2"
    else:
        tf, tb, tw, src = own["F"], own["B"], own["W"], "own"
    v = 2 if s in ("interleaved", "zbv") else 1
    f = json.loads(subprocess.run([bin_, "bench", "schedule", "--schedule", s, "--pp", "2",
                                   "--microbatches", str(m), "--virtual-stages", str(v),
                                   "--tf", "%.6f" % tf, "--tb", "%.6f" % tb, "--tw", "%.6f" % tw,
                                   "--json"], check=True, capture_output=True, text=True).stdout)
    # the replay's dependencies are the schedule's: each round's pass order
    # at the formula's times gives the formula
    for r in runs:
        u = pp_replay.replay(r["trace"], 2, s, v, warmup, {"F": tf, "B": tb, "W": tw})["uniform"]
        if abs(u - f["bubble"]) > 1e-4:
            sys.exit("pp_bench.sh: %s m %d %s: the replay at the formula's times gives %.6f, "
                     "the formula %.6f" % (cfg, m, label, u, f["bubble"]))
    speedup = base_ms / ms
    # a rank's passes in a step (m x v of each kind) over half the baseline's step
    infl = m * v * sum(own.values()) / (base_ms / 2)
    goal = 0.9 * 2 / (1 + f["bubble"])
    ideal = 2 * (1 - f["bubble"])  # a perfect runtime: busy / makespan = 1 - bubble
    acts = [a / 2**20 for a in runs[-1]["stage_acts"]]
    per = {k: [statistics.mean(r["pass_ms_stage"][k][p] for r in runs) for p in ("0", "1")]
           for k in own}
    order = [k for k in ("F", "B", "W", "BW") if k in own]
    ptxt = "/".join("%.0f" % own[k] for k in order) + " (" + \
        "/".join("%.0f" % per[k][0] for k in order) + " | " + \
        "/".join("%.0f" % per[k][1] for k in order) + ")"
    rows.append("%-8s %2d %-11s %9.1f %6.2fx %7.3f %7.3f %6.3f %6.3f %6.3f %+6.3f %5.2fx %5.3f %5.2fx %4s %5.2f %6s %-15s %s" % (
        cfg, m, label, ms, speedup, bub, f["bubble"], abs(bub - f["bubble"]), stage, rep, bub - rep, ideal, speedup / ideal, goal,
        "yes" if speedup >= goal else "no", infl, src, "/".join("%.1f" % a for a in acts), ptxt))
    lines.append(json.dumps({"bench": "pp", "config": cfg, "pp": 2, "microbatches": m, "schedule": s,
                      "binary": "B" if label.endswith("@B") else "A", "ideal_ratio": speedup / ideal,
                      "virtual_stages": v, "threads_per_rank": 1,
                      "baseline_ms": base_ms, "step_ms": ms, "speedup": speedup,
                      "bubble": bub, "formula_bubble": f["bubble"],
                      "bubble_diff": abs(bub - f["bubble"]), "stage_bubble": stage,
                      "replay_bubble": rep, "runtime_bubble": bub - rep, "ideal_speedup": ideal, "goal_speedup": goal,
                      "compute_inflation": infl,
                      "goal_met": speedup >= goal, "times_from": src,
                      "tf_ms": tf, "tb_ms": tb, "tw_ms": tw, "formula_makespan_ms": f["makespan"],
                      "in_flight": f["in_flight"], "pass_ms": own, "pass_ms_stage": per,
                      "pass_wall_ms": times(runs, "pass_wall_ms"),
                      "stage_acts_mib": acts, "baseline_runs": [r["step_ms"] for r in base],
                      "runs": [r["step_ms"] for r in runs]}))
print("\n".join(rows + lines))
PY
    done
done
echo "# took $(( $(date +%s) - START )) s" | tee -a "$OUTFILE"
