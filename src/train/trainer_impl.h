/* Private to the trainer's files (trainer_new.c: building and freeing;
 * trainer_step.c: one optimizer step; trainer_run.c: the loop, metrics,
 * validation and the trace; trainer_ckpt.c: saving and resuming): the
 * trainer's state and the few helpers they share. */
#ifndef PT_TRAINER_IMPL_H
#define PT_TRAINER_IMPL_H

#include "train_impl.h"

#include <stdio.h>

#include "partrain/parallel.h"

typedef enum { MODE_SYNC, MODE_STALE, MODE_LOCAL } sync_mode;

struct pt_trainer {
    pt_config cfg;
    pt_model *model;
    pt_schedule sched;     /* the step's passes (parallel.schedule) */
    pt_model_slot **slots; /* sched.in_flight; slots[0] the model's own (the rest owned) */
    pt_adamw *opt;
    pt_data *train, *val;
    pt_rng data_rng;
    int step;
    int micro_B, local_B;
    int *inputs, *targets; /* (batch_size, T): the global batch */
    char layout[64];
    size_t mem_peak[PT_MEM_NCAT], mem_peak_total;
    size_t mem_cur[PT_MEM_NCAT], mem_cur_total; /* at the end of the step (max over ranks) */
    FILE *metrics;
    int metrics_errno; /* the first failed metrics write's errno (0: none) */
    int ckpt_lock;     /* rank 0 with checkpoint.dir: fd of DIR/.lock, flocked (else -1) */
    /* data parallel */
    pt_comm *world;       /* lent; NULL: one worker. Job-level only: the strategies run on dp */
    pt_mesh *mesh;        /* dp x tp x pp over world (owned; parallel.h) */
    pt_comm *dp;          /* the mesh's dp group (the mesh's; NULL: dp = 1): gradients, ZeRO,
                             local_sgd's averaging */
    int dp_rank, dp_size; /* this rank's index in dp, and dp: its share of the batch */
    pt_comm *tp;          /* the mesh's tp group (the mesh's; NULL: tp = 1): the model's
                             collectives, the norm, full tensors from slices */
    int tp_rank;          /* this rank's index in tp */
    pt_model *full;       /* tp > 1: the whole model's tensor table (no buffers), the layout of
                             checkpoints and gathered parameters */
    pt_comm *aux;         /* split of world for metrics / validation / trace (owned), so that
                             the dp group's byte counters hold gradient traffic only */
    int rank, nranks;     /* in the world */
    sync_mode mode;
    pt_ddp *ddp;
    pt_local_sgd *lsgd;
    pt_zero *zero;    /* parallel.zero >= 1 with dp > 1 */
    int dga;          /* stale with parallel.stale_mode = dga */
    float *dga_local; /* dga: (staleness+1) x P, this rank's gradient of each in-flight step */
    pt_plant plant;   /* test hook: PT_TEST_PLANT, read once at creation (parallel.h) */
    int pipe_start;   /* stale: the step the pipeline (re)started at: 0, or a resume that could
                         not continue it; step s's round is applied at s + k when s >= this */
    /* trace */
    pt_trace *trace;
    uint64_t trace_t0;
    uint64_t hook_t0;
    char (*mod_name)[16];
};

/* tp rank 0 of tp gets the whole model's full tensors (full: laid out like
 * the tp = 1 model's flat buffer) from every rank's slice buffer local
 * (laid out like m, this rank's slice model); the other ranks' full is
 * unused. Collective over tp (tp_full.c). */
pt_status pt_tp_gather_full(pt_comm *tp, const pt_model *m, const float *local, float *full);

/* Prefix the last error message with prefix ("prefix: message"); returns st
 * (trainer_new.c). */
pt_status pt_trainer_prefix_error(pt_status st, const char *prefix);

#endif
