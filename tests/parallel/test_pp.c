/* Pipeline parallelism (src/train/trainer_pipe.c, the schedules of
 * src/parallel/pipeline/) through the parity harness against one worker:
 * pp 2 and 4, every schedule, m 2, 4 and 8 micro-batches, with n_layer not
 * divisible by p (uneven stages), an explicit stage_layers cut, and
 * composed with data parallelism (ZeRO 1, 2, 3) and tensor parallelism;
 * loss and gradient norm per step and the parameters at the end (gathered
 * from every stage into GPT-2's layout), under AdamW with clipping and SGD
 * without.
 *
 * shm: pt_launch forks the ranks. --mpi: under mpirun, the layouts of the
 * world's size run. */
#include "parallel/parity_harness.h"

/* 3 blocks (5 modules) at pp 2, 5 at pp 4; 6 blocks (8 modules) where 8
 * virtual stages are needed (interleaved and zbv at pp 4). Not 7: with 7
 * blocks even one worker's own micro-batches (gpipe, m 4, no pipeline)
 * leave the M = 1 oracle by 1.9e-5 in the gradient norm at step 7 under
 * AdamW (float re-association, amplified) -- that model tests the
 * oracle's conditioning, not the pipeline. */
#define L3 "model.n_layer=3 "
#define L5 "model.n_layer=5 "
#define L6 "model.n_layer=6 "

static void test_schedules(void) {
    static const char *const scheds[] = {"gpipe", "1f1b", "zb1"};
    static const int ms[] = {2, 4, 8};
    char layout[256];
    for (size_t s = 0; s < sizeof scheds / sizeof scheds[0]; s++)
        for (size_t k = 0; k < sizeof ms / sizeof ms[0]; k++) {
            snprintf(layout, sizeof layout,
                     L3 "parallel.pp=2 parallel.schedule=%s parallel.microbatches=%d", scheds[s],
                     ms[k]);
            parity_check(layout);
            snprintf(layout, sizeof layout,
                     L5 "parallel.pp=4 parallel.schedule=%s parallel.microbatches=%d", scheds[s],
                     ms[k]);
            parity_check(layout);
        }
    /* interleaved: m a multiple of p; zbv: two chunks per rank in a V */
    static const int mi[] = {2, 4, 8};
    for (size_t k = 0; k < sizeof mi / sizeof mi[0]; k++) {
        snprintf(layout, sizeof layout,
                 L3 "parallel.pp=2 parallel.schedule=interleaved parallel.virtual_stages=2 "
                    "parallel.microbatches=%d",
                 mi[k]);
        parity_check(layout);
        snprintf(layout, sizeof layout,
                 L3 "parallel.pp=2 parallel.schedule=zbv parallel.microbatches=%d", mi[k]);
        parity_check(layout);
    }
    static const int m4[] = {4, 8};
    for (size_t k = 0; k < sizeof m4 / sizeof m4[0]; k++) {
        snprintf(layout, sizeof layout,
                 L6 "parallel.pp=4 parallel.schedule=interleaved parallel.virtual_stages=2 "
                    "parallel.microbatches=%d",
                 m4[k]);
        parity_check(layout);
    }
    for (size_t k = 0; k < sizeof mi / sizeof mi[0]; k++) {
        snprintf(layout, sizeof layout,
                 L6 "parallel.pp=4 parallel.schedule=zbv parallel.microbatches=%d", mi[k]);
        parity_check(layout);
    }
    /* the default schedule at pp > 1 (1f1b), one micro-batch, and a cut by hand */
    parity_check(L3 "parallel.pp=2");
    parity_check(L5 "parallel.pp=2 parallel.microbatches=4 parallel.stage_layers=1,4");
}

static void test_compose(void) {
    static const char *const layouts[] = {
        L3 "parallel.pp=2 parallel.dp=2 parallel.microbatches=2",
        L3 "parallel.pp=2 parallel.dp=2 parallel.microbatches=4 parallel.bucket_mb=0.004",
        L3 "parallel.pp=2 parallel.dp=2 parallel.microbatches=2 parallel.zero=1",
        L3 "parallel.pp=2 parallel.dp=2 parallel.microbatches=2 parallel.zero=2",
        L3 "parallel.pp=2 parallel.dp=2 parallel.microbatches=2 parallel.zero=3",
        L3 "parallel.pp=2 parallel.dp=2 parallel.microbatches=4 parallel.zero=2 "
           "parallel.schedule=zb1",
        L3 "parallel.pp=2 parallel.dp=2 parallel.microbatches=4 parallel.zero=3 "
           "parallel.schedule=zbv",
        L3 "parallel.pp=2 parallel.tp=2 parallel.microbatches=2",
        L3 "parallel.pp=2 parallel.tp=2 parallel.microbatches=4 parallel.schedule=zb1",
        L3 "parallel.pp=2 parallel.tp=2 parallel.microbatches=2 parallel.sequence_parallel=true",
        /* deferred W's scratch shares the gathered rows (sequence parallelism) */
        L3 "parallel.pp=2 parallel.tp=2 parallel.microbatches=4 parallel.sequence_parallel=true "
           "parallel.schedule=zb1",
    };
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) parity_check(layouts[k]);
}

/* Activation recomputation inside pipeline stages: a zero-bubble W after
 * its B reads what the B recomputed (the context's own scratch). */
static void test_recompute(void) {
    static const char *const layouts[] = {
        L3 "parallel.pp=2 parallel.microbatches=4 model.recompute=selective",
        L3 "parallel.pp=2 parallel.microbatches=4 model.recompute=full",
        L3 "parallel.pp=2 parallel.microbatches=4 parallel.schedule=zb1 model.recompute=selective",
        L3 "parallel.pp=2 parallel.microbatches=4 parallel.schedule=zb1 model.recompute=full",
        L3 "parallel.pp=2 parallel.microbatches=4 parallel.schedule=zbv model.recompute=full",
        L6 "parallel.pp=4 parallel.microbatches=8 parallel.schedule=interleaved "
           "parallel.virtual_stages=2 model.recompute=selective",
        L3 "parallel.pp=2 parallel.tp=2 parallel.microbatches=2 model.recompute=full",
    };
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) parity_check(layouts[k]);
}

int main(int argc, char **argv) {
    if (parity_init(argc, argv, "test-pp")) return 1;
    RUN(test_schedules);
    RUN(test_compose);
    RUN(test_recompute);
    return parity_done();
}
