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

/* The pipeline runtime of this rank's stage (trainer_pipe.c). */
typedef struct pt_pipe pt_pipe;

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
    pt_model *full;       /* tp or pp > 1: the whole model's tensor table (no buffers), the
                             layout of checkpoints and gathered parameters */
    pt_comm *pp;          /* the mesh's pp group (the mesh's; NULL: pp = 1) */
    pt_comm *mp;          /* the mesh's model-parallel group, tp x pp (NULL: both 1): full
                             tensors from every stage's slices */
    int pp_rank, pp_size; /* this rank's stage, and pp */
    pt_stage *stages;     /* pp > 1: the pp x virtual_stages cut of the modules */
    unsigned char *owned; /* pp > 1: pp x (n_layer + 2) flags, stage r's modules */
    pt_pipe *pipe;        /* pp > 1 */
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

/* Full tensors on the model-parallel group's rank 0 (full: laid out like
 * the whole tp = 1 model's flat buffer) from every member's buffer local
 * (laid out like its own model: member r = pp_i x tp + tp_i holds tp slice
 * tp_i of stage pp_i's modules, owned[pp_i] of the trainer's table).
 * Collective over t->mp (tp_full.c). */
pt_status pt_mp_gather_full(const pt_trainer *t, const float *local, float *full);
/* The same tensors one at a time, for a writer: on the group's rank 0,
 * sink(arg, src, src_arg) is called once and pulls the whole model's
 * tensors from src in order; the others send theirs. Each member's own
 * tensors come from own(own_arg, k, ..), k = 0, 1, .. over t->model's,
 * every one of them even when the writer stops early (a source may be a
 * collective: ZeRO's shards gathered module by module). Rank 0's scratch
 * is a member's largest tensor and, tp > 1, the largest tensor tp splits.
 * Collective over t->mp (tp_full.c); _flat takes them from local, laid
 * out like t->model's flat buffer. */
typedef pt_status (*pt_mp_sink)(void *arg, pt_st_tensor_source src, void *src_arg);
pt_status pt_mp_stream_full(const pt_trainer *t, pt_st_tensor_source own, void *own_arg,
                            pt_mp_sink sink, void *arg);
pt_status pt_mp_stream_flat(const pt_trainer *t, const float *local, pt_mp_sink sink, void *arg);

/* The pipeline (trainer_pipe.c): built over the stage's model and pp group
 * for schedule s (lent) and the virtual stages' cut. */
pt_status pt_pipe_new(pt_pipe **out, pt_model *m, pt_comm *pp, const pt_schedule *s,
                      const pt_stage *stages);
void pt_pipe_free(pt_pipe *q);
/* One step's passes in the schedule's order: loss_sum gets the head's
 * micro-batch losses (the head's stage only). */
pt_status pt_pipe_step(pt_pipe *q, pt_trainer *t, const pt_schedule *sc, const int *inputs,
                       const int *targets, float dloss, size_t base, double *loss_sum);
/* One micro-batch's forward through every stage (validation); *loss on the
 * head's stage, 0 elsewhere. refresh: the head's copy of the tied wte is
 * sent first (the first forward after a step; parameters change only in
 * steps). */
pt_status pt_pipe_forward(pt_pipe *q, pt_trainer *t, const pt_batch *b, int refresh, float *loss);
/* Hooks' parts: the tied wte's transfers. */
void pt_pipe_before_forward(pt_pipe *q, pt_model *m, int module);
void pt_pipe_after_forward(pt_pipe *q, int module);
void pt_pipe_grads_final(pt_pipe *q, pt_model *m, int module);
/* The last step's passes: their work (waits excluded), and their span
 * (the step's first pass to the end of its last send). */
void pt_pipe_take_stats(pt_pipe *q, uint64_t *busy_ns, uint64_t *span_ns);
int pt_pipe_has_head(const pt_pipe *q);
/* The test hook's pipeline plants (PT_PLANT_PP_TIED). */
void pt_pipe_test_plant(pt_pipe *q, pt_plant plant);
/* The pp rank that holds the head. */
int pt_pipe_head_stage(const pt_pipe *q);
/* Bytes this rank has sent to other stages since the pipeline was made. */
uint64_t pt_pipe_sent_bytes(const pt_pipe *q);

/* Prefix the last error message with prefix ("prefix: message"); returns st
 * (trainer_new.c). */
pt_status pt_trainer_prefix_error(pt_status st, const char *prefix);

#endif
