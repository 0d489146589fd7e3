#!/bin/sh
# Where partrain's training step spends its time: perf samples with DWARF call
# stacks over bench_step, each sample charged to the partrain kernel on its
# stack (pt_matmul_*, pt_attention_*, ...; the sgemm inside a kernel is split
# out), or to the model's own memset/memcpy. Only samples under
# pt_trainer_step_batch count (init and the sgemm peak are left out).
#
#   bench/profile_step.sh CONFIG THREADS [STEPS]
#
# Needs perf (linux-perf) with perf_event_paranoid <= 2.
set -eu
CONFIG=${1:-tiny} THREADS=${2:-1} STEPS=${3:-3}
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
BENCH=${BENCH_STEP:-$ROOT/build-bench/bench/bench_step}
DATA=$(mktemp /tmp/profile_step.XXXXXX)
trap 'rm -f "$DATA"' EXIT
perf record -q -o "$DATA" --call-graph dwarf,32768 -F 499 -- \
    "$BENCH" --config "$CONFIG" --threads "$THREADS" --warmup 1 --steps "$STEPS" --peak-n 64
perf script -i "$DATA" -F comm,tid,ip,sym 2>/dev/null | /usr/bin/python3 -c '
import collections, re, sys
KERNELS = ("pt_matmul_forward_wt", "pt_matmul_backward_wt", "pt_matmul_forward",
           "pt_matmul_forward_res", "pt_matmul_gelu_forward", "pt_matmul_backward",
           "pt_matmul_backward_set", "pt_attention_forward", "pt_attention_backward",
           "pt_attention_backward_set", "pt_matmul_backward_gelu_set",
           "pt_layernorm_forward", "pt_layernorm_backward", "pt_layernorm_backward_res",
           "pt_softmax_xent_forward_backward", "pt_encoder_forward", "pt_encoder_backward",
           "pt_adamw_update", "pt_adamw_update_sumsq", "pt_sum_squares", "pt_model_zero_grads")
counts, total, in_step = collections.Counter(), 0, 0
def charge(stack):
    global in_step
    syms = [s for s in stack]
    if not syms:
        return
    # Worker threads of the pool or OpenBLAS have no trainer frame on their
    # stack: charge them by their leaf and the pool function they run.
    leaf = syms[0]
    worker = "pt_trainer_step_batch" not in syms and any(
        s in ("worker_main", "blas_thread_server") for s in syms)
    if not worker and "pt_trainer_step_batch" not in syms:
        return
    in_step += 1
    kern = next((s for s in syms if s in KERNELS), None)
    blas = "SKYLAKEX" in leaf or leaf.startswith(("sgemm", "cblas", "blas_", "exec_blas")) or "openblas" in leaf
    if worker:
        kern = kern or next((s for s in syms if s.endswith("_part")), None) or "(worker) " + leaf
        counts[("worker: " + kern) + (" [sgemm]" if blas else "")] += 1
    elif kern:
        counts[kern + (" [sgemm]" if blas else "")] += 1
    elif leaf.startswith(("__memset", "__memmove", "__memcpy")):
        owner = next((s for s in syms if s.startswith("pt_")), "?")
        counts["memset/memcpy in " + owner] += 1
    else:
        owner = next((s for s in syms if s.startswith("pt_")), "?")
        counts["other: " + leaf + " in " + owner] += 1
stack = []
for line in sys.stdin:
    if not line.strip():
        charge(stack)
        stack = []
        continue
    if line[0] not in " \t":
        stack = []
        continue
    parts = line.split()
    if len(parts) >= 2:
        stack.append(re.sub(r"\+0x[0-9a-f]+$", "", parts[1]))
charge(stack)
print("%% of step samples (%d samples under pt_trainer_step_batch and pool workers)" % in_step)
for k, c in counts.most_common(40):
    print("%6.1f%%  %s" % (100.0 * c / max(in_step, 1), k))
'
