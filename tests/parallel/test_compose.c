/* The composition matrix (issue 14, item 1): data, tensor and pipeline
 * parallelism together, with every ZeRO stage (and HSDP), sequence
 * parallelism, the pipeline schedules, micro-batches, virtual stages and
 * recompute modes, through the parity harness against one worker (loss
 * and gradient norm per step, the parameters at the end, under AdamW with
 * clipping and SGD without). test_dp, test_tp and test_pp cover each
 * dimension with at most one other; here all three meet on 8 ranks.
 *
 * Default: dp 2 x tp 2 x pp 2 with ZeRO 0-3 and each feature on top, HSDP
 * on 8 ranks, an everything-at-once layout. --full: the rest of the matrix
 * (other schedules and micro-batch counts, pp 4 meshes, 4-rank meshes,
 * ZeRO at dp 1). Checkpoints saved on the mesh and resumed elsewhere
 * (shm). The asynchronous modes (stale, local_sgd) under a pipeline, against
 * the same mode at dp alone (shm).
 *
 * shm: pt_launch forks the ranks. --mpi: under mpirun, the layouts of the
 * world's size run (the features on top of the ZeRO stages with --full). */
#include <cjson/cJSON.h>

#include "parallel/parity_harness.h"
#include "parallel/ckpt_test.h"

/* 3 blocks (5 modules): 4 virtual stages at pp 2 (interleaved, zbv);
 * 5 blocks at pp 4 (test_pp.c says why not 7); 6 for 3 chunks a rank. */
#define L3   "model.n_layer=3 "
#define L5   "model.n_layer=5 "
#define L6   "model.n_layer=6 "
#define MESH "parallel.dp=2 parallel.tp=2 parallel.pp=2 "

static void test_zero_stages(void) {
    static const char *const layouts[] = {
        L3 MESH "parallel.microbatches=2",
        L3 MESH "parallel.microbatches=2 parallel.zero=1",
        L3 MESH "parallel.microbatches=2 parallel.zero=2",
        L3 MESH "parallel.microbatches=2 parallel.zero=3",
    };
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) parity_check(layouts[k]);
}

static void test_features(void) {
    static const char *const layouts[] = {
        L3 MESH "parallel.microbatches=2 parallel.zero=1 parallel.sequence_parallel=true",
        L3 MESH "parallel.microbatches=2 parallel.zero=1 parallel.schedule=zb1",
        L3 MESH "parallel.microbatches=2 parallel.zero=1 parallel.schedule=interleaved "
                "parallel.virtual_stages=2",
        L3 MESH "parallel.microbatches=2 parallel.zero=1 parallel.schedule=zbv",
        L3 MESH "parallel.microbatches=2 parallel.zero=1 model.recompute=selective",
        L3 MESH "parallel.microbatches=2 parallel.zero=3 model.recompute=full",
        /* everything at once */
        L3 MESH "parallel.microbatches=4 parallel.zero=3 parallel.sequence_parallel=true "
                "parallel.schedule=zbv model.recompute=full",
    };
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) parity_check(layouts[k]);
}

/* HSDP: shards inside groups of zero_group ranks, replicas across them. */
static void test_hsdp(void) {
    static const char *const layouts[] = {
        L3 "parallel.dp=4 parallel.pp=2 parallel.microbatches=2 parallel.zero=2 "
           "parallel.zero_group=2",
        L3 "parallel.dp=4 parallel.pp=2 parallel.microbatches=2 parallel.zero=3 "
           "parallel.zero_group=2 parallel.schedule=zb1",
    };
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) parity_check(layouts[k]);
}

/* The asynchronous modes under a pipeline (and tensor parallelism): the
 * mode's run follows the same mode at dp alone (the pipeline and tp are
 * exact; the mode is what it is; shm only: the reference has another
 * world size). A pipeline that armed every step's buckets in slot 0 left
 * stale's rounds unfinished and failed here. */
typedef struct {
    const char *layout, *ref;
} modes_case;

#define DGA     "parallel.sync=stale parallel.stale_mode=dga "
#define DELAYED "parallel.sync=stale parallel.stale_mode=delayed "
#define LOCAL   "parallel.sync=local_sgd parallel.sync_every=4 "
#define DP2M2   L3 "parallel.dp=2 parallel.microbatches=2 "

static void modes_check(const modes_case *cases, size_t n) {
    for (size_t k = 0; k < n; k++) parity_check_against(cases[k].layout, cases[k].ref);
}

static void test_modes(void) {
    static const modes_case cases[] = {
        {DP2M2 "parallel.pp=2 " DGA, DP2M2 DGA},
        {DP2M2 "parallel.pp=2 parallel.schedule=zb1 " DELAYED "parallel.staleness=2",
         DP2M2 DELAYED "parallel.staleness=2"},
        {DP2M2 "parallel.pp=2 parallel.tp=2 parallel.schedule=zbv " LOCAL "parallel.outer=nesterov",
         DP2M2 LOCAL "parallel.outer=nesterov"},
    };
    modes_check(cases, sizeof cases / sizeof cases[0]);
}

static void test_modes_full(void) {
    static const modes_case cases[] = {
        {DP2M2 "parallel.pp=2 " LOCAL, DP2M2 LOCAL},
        {DP2M2 "parallel.pp=2 parallel.tp=2 " DGA, DP2M2 DGA},
        {DP2M2 "parallel.pp=2 parallel.schedule=interleaved parallel.virtual_stages=2 " DGA
               "parallel.staleness=2",
         DP2M2 DGA "parallel.staleness=2"},
        {L3 "parallel.dp=4 parallel.pp=2 parallel.microbatches=2 " LOCAL,
         L3 "parallel.dp=4 parallel.microbatches=2 " LOCAL},
    };
    modes_check(cases, sizeof cases / sizeof cases[0]);
}

/* Checkpoints across the mesh: saved at step SAVE_AT under one layout and
 * resumed under another, against the uninterrupted one-worker run (shm
 * only: the layouts have different world sizes). */
static void test_ckpt(void) {
    static const ckpt_case cases[] = {
        {L3, MESH "parallel.microbatches=2 parallel.zero=3", "parallel.pp=1"},
        {L3, "parallel.pp=1", MESH "parallel.microbatches=2 parallel.zero=1"},
    };
    if (!use_mpi) ckpt_cross_layout(cases, sizeof cases / sizeof cases[0]);
}

static void test_ckpt_full(void) {
    static const ckpt_case cases[] = {
        {L3, MESH "parallel.microbatches=2 parallel.zero=2 parallel.schedule=zbv",
         "parallel.dp=4 parallel.pp=2 parallel.microbatches=2 parallel.zero=3 "
         "parallel.zero_group=2"},
        {L3, MESH "parallel.microbatches=2 parallel.zero=1 parallel.sequence_parallel=true",
         MESH "parallel.microbatches=4 parallel.zero=3 parallel.schedule=zb1"},
    };
    if (!use_mpi) ckpt_cross_layout(cases, sizeof cases / sizeof cases[0]);
}

/* The rest of the matrix (--full). */
static void test_full(void) {
    static const char *const layouts[] = {
        /* dp 2 x tp 2 x pp 2: other schedules, micro-batch counts, ZeRO
         * stages under the split-backward schedules, small buckets */
        L3 MESH "parallel.microbatches=4 parallel.zero=2 parallel.schedule=gpipe",
        L3 MESH "parallel.microbatches=4 parallel.zero=3 parallel.schedule=interleaved "
                "parallel.virtual_stages=2 parallel.sequence_parallel=true",
        L3 MESH "parallel.microbatches=4 parallel.zero=2 parallel.schedule=zbv "
                "model.recompute=selective",
        L3 MESH "parallel.microbatches=2 parallel.zero=3 parallel.schedule=zb1 "
                "parallel.zero_keep_params=true",
        L3 MESH "parallel.microbatches=2 parallel.zero=1 parallel.bucket_mb=0.004",
        L3 MESH "parallel.microbatches=1 parallel.zero=2 parallel.sequence_parallel=true",
        /* padded vocabulary (61 rows, 31 a rank) in the tied head's stage */
        L3 "model.vocab_size=61 " MESH "parallel.microbatches=2 parallel.zero=3",
        /* an uneven cut by hand; three chunks a rank */
        L5 MESH "parallel.microbatches=2 parallel.zero=2 parallel.stage_layers=1,4",
        L6 MESH "parallel.microbatches=2 parallel.zero=2 parallel.schedule=interleaved "
                "parallel.virtual_stages=3",
        /* a shard group of one rank: ZeRO-3's code paths, nothing sharded */
        L3 MESH "parallel.microbatches=2 parallel.zero=3 parallel.zero_group=1",
        /* other 8-rank meshes */
        L3 "parallel.dp=4 parallel.tp=2 parallel.zero=2 parallel.zero_group=2 "
           "parallel.sequence_parallel=true",
        "model.n_layer=4 model.n_head=4 model.vocab_size=63 parallel.tp=4 parallel.pp=2 "
        "parallel.microbatches=8 parallel.zero=3 parallel.schedule=zbv "
        "parallel.sequence_parallel=true",
        L5 "parallel.dp=2 parallel.pp=4 parallel.microbatches=4 parallel.zero=1",
        L5 "parallel.dp=2 parallel.pp=4 parallel.microbatches=2 parallel.zero=3 "
           "parallel.schedule=zb1",
        L5 "parallel.tp=2 parallel.pp=4 parallel.microbatches=4 parallel.schedule=zb1 "
           "parallel.sequence_parallel=true",
        /* 4 ranks: ZeRO at dp 1 (nothing to shard: the plain optimizer) */
        L3 "parallel.tp=2 parallel.pp=2 parallel.microbatches=2 parallel.zero=1",
        L3 "parallel.tp=2 parallel.pp=2 parallel.microbatches=4 parallel.zero=3 "
           "parallel.schedule=zbv",
    };
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) parity_check(layouts[k]);
}

int main(int argc, char **argv) {
    int full = 0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--full")) full = 1;
    if (parity_init(argc, argv, full ? "test-compose-full" : "test-compose")) return 1;
    /* Under mpirun the quick tier keeps the ZeRO stages and HSDP (each rank
     * a process: 8 of them took ASan 84 s over the whole default list); the
     * features on top move to --full there. */
    if (!full) {
        RUN(test_zero_stages);
        RUN(test_hsdp);
        RUN(test_modes); /* shm only */
        RUN(test_ckpt);  /* shm only */
    }
    if (full == use_mpi) RUN(test_features);
    if (full) {
        RUN(test_full);
        RUN(test_modes_full); /* shm only */
        RUN(test_ckpt_full);  /* shm only */
    }
    return parity_done();
}
