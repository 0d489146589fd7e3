/* Tensor parallelism (Megatron-style; src/model/modules_tp.c) through the
 * parity harness against one worker: tp 2 and 4 (4 heads), a vocabulary
 * that t does not divide (padded rows), micro-batches, sequence
 * parallelism, dp 2 x tp 2 with overlapped buckets and ZeRO 1, 2, 3; loss and gradient norm per
 * step and the parameters at the end (gathered from the slices into GPT-2's
 * layout), under AdamW with clipping and SGD without.
 *
 * shm: pt_launch forks the ranks. --mpi: under mpirun, the layouts of the
 * world's size run. */
#include "parallel/parity_harness.h"

#define HEADS4 "model.n_head=4 "

static void test_tp_alone(void) {
    static const char *const layouts[] = {
        "parallel.tp=2",
        HEADS4 "parallel.tp=2",
        HEADS4 "parallel.tp=4",
        /* 62 rows: padded to 64 at t 4 (rank 3 holds 14 real rows and 2
         * padding), and 61 at t 2 (one padding row) */
        HEADS4 "model.vocab_size=62 parallel.tp=4",
        "model.vocab_size=61 parallel.tp=2",
        "parallel.tp=2 parallel.microbatches=2",
        "parallel.tp=2 parallel.microbatches=4 parallel.schedule=gpipe",
        /* sequence parallelism: rows of the LayerNorm and residual regions */
        "parallel.tp=2 parallel.sequence_parallel=true",
        HEADS4 "model.vocab_size=62 parallel.tp=4 parallel.sequence_parallel=true",
        "parallel.tp=2 parallel.sequence_parallel=true parallel.microbatches=2",
    };
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) parity_check(layouts[k]);
}

static void test_dp_tp(void) {
    static const char *const layouts[] = {
        "parallel.dp=2 parallel.tp=2",
        "parallel.dp=2 parallel.tp=2 parallel.microbatches=2 parallel.bucket_mb=0.004",
        "parallel.dp=2 parallel.tp=2 parallel.overlap=false",
        "parallel.dp=2 parallel.tp=2 parallel.zero=1",
        "parallel.dp=2 parallel.tp=2 parallel.zero=2",
        "parallel.dp=2 parallel.tp=2 parallel.zero=3",
        "parallel.dp=2 parallel.tp=2 parallel.zero=3 parallel.microbatches=2",
        "parallel.dp=2 parallel.tp=2 parallel.sequence_parallel=true parallel.zero=2",
        "parallel.dp=2 parallel.tp=2 parallel.sequence_parallel=true parallel.zero=3",
    };
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) parity_check(layouts[k]);
}

/* The asynchronous modes and HSDP under tensor parallelism: a mode's run
 * at dp 2 x tp 2 follows the same mode at dp 2 alone, step by step, within
 * the harness's bounds (tensor parallelism is exact; the mode is what it
 * is; shm only: the reference runs on a world of 2), and ZeRO 1 and 3
 * sharded in groups of 2 inside dp 4 x tp 2 (8 ranks) follow one worker. */
static void test_modes_compose(void) {
    static const char *const modes[] = {
        "parallel.sync=stale parallel.stale_mode=dga",
        "parallel.sync=stale parallel.stale_mode=delayed",
        "parallel.sync=local_sgd parallel.sync_every=4",
        "parallel.sync=local_sgd parallel.sync_every=4 parallel.outer=nesterov",
    };
    for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++) {
        char dp_only[256], with_tp[256];
        snprintf(dp_only, sizeof dp_only, "parallel.dp=2 %s", modes[k]);
        snprintf(with_tp, sizeof with_tp, "parallel.dp=2 parallel.tp=2 %s", modes[k]);
        parity_check_against(with_tp, dp_only); /* shm only */
    }
    parity_check("parallel.dp=4 parallel.tp=2 parallel.zero=3 parallel.zero_group=2");
    parity_check("parallel.dp=4 parallel.tp=2 parallel.zero=1 parallel.zero_group=2");
}

int main(int argc, char **argv) {
    if (parity_init(argc, argv, "test-tp")) return 1;
    RUN(test_tp_alone);
    RUN(test_dp_tp);
    RUN(test_modes_compose);
    return parity_done();
}
