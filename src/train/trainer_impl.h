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
    pt_model *model;      /* this rank's: its tp slice of its stage's modules */
    pt_model *full;       /* tp or pp > 1: the whole model's tensor table (no buffers), the
                             layout of checkpoints and gathered parameters */
    pt_schedule sched;    /* this rank's passes (parallel.schedule) */
    pt_stage *stages;     /* the pp x virtual_stages cut of the modules (one with pp = 1) */
    unsigned char *owned; /* pp > 1: pp x (n_layer + 2) flags, stage r's modules */
    pt_pipeline *pipe;    /* the executor, at every layout */
    pt_stack stack;       /* the strategies, in order (trainer_new.c's STACK) */
    pt_adamw *opt;        /* the optimizer entry's (owned here; NULL under ZeRO) */
    /* lent by their stack entries (checkpoints ask the stack: the state slots) */
    pt_zero *zero;   /* parallel.zero >= 1 with dp > 1: the test seam's gather */
    pt_dp_sync *dps; /* the data-parallel buckets, sync or stale: the log line */
    sync_mode mode;  /* parallel.sync */
    int dga;         /* stale with parallel.stale_mode = dga */
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
    /* the mesh: the strategies run on its groups, never on the world */
    pt_comm *world;        /* lent; NULL: one worker. Job-level only */
    pt_mesh *mesh;         /* dp x tp x pp over world (owned; parallel.h) */
    pt_comm *dp, *tp, *pp; /* the mesh's groups (NULL: a group of one) */
    pt_comm *mp;           /* the model-parallel group, tp x pp (NULL: both 1): full tensors
                              from every stage's slices */
    int dp_rank, dp_size;  /* this rank's index in dp, and dp: its share of the batch */
    int tp_rank;           /* this rank's index in tp */
    int pp_rank, pp_size;  /* this rank's stage, and pp */
    pt_comm *aux;          /* split of world for metrics / validation / trace (owned), so that
                              the groups' byte counters hold their own traffic only */
    int rank, nranks;      /* in the world */
    pt_trace *trace;
    uint64_t trace_t0;
    char *plan_json;                  /* pt_trainer_set_plan's (owned; NULL: none) */
    struct pt_ckpt_async *ckpt_async; /* checkpoint.async: the writer thread (ckpt_async.c) */
    uint64_t ckpt_written;            /* bytes this rank wrote in its last save */
};

/* ---- the metrics file (trainer_metrics.c) ---- */

/* printf onto log.metrics, remembering the first failed write's errno */
void pt_metrics_printf(pt_trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Flush the line written; a failed write is an error naming the file. */
pt_status pt_metrics_flush(pt_trainer *t);
/* Rank 0: open log.metrics (its folder made; appended to on resume) and
 * write the run record. Nothing elsewhere or without log.metrics. */
pt_status pt_metrics_open(pt_trainer *t);
/* One step's line (elapsed_s: since the loop began); a validation's (its
 * time val_ms); a save's. */
pt_status pt_metrics_step(pt_trainer *t, const pt_step_info *info, double elapsed_s);
pt_status pt_metrics_val(pt_trainer *t, float val_loss, double elapsed_s, double val_ms);
pt_status pt_metrics_save(pt_trainer *t, double elapsed_s, double save_ms);
/* Close log.metrics; returns st, or the close's failure when st is PT_OK. */
pt_status pt_metrics_close(pt_trainer *t, pt_status st);
/* The plan's predicted step time and memory a rank (bytes): 1 when the
 * run has a plan with both (pt_trainer_set_plan), else 0. */
int pt_trainer_planned(const pt_trainer *t, double *step_ms, double *mem_bytes);
/* The schedule's formula bubble at equal pass times (-1: no pipeline). */
double pt_trainer_formula_bubble(const pt_trainer *t);

/* checkpoint.async: the writers' lane (a split of the world, collective)
 * and the writer; nothing otherwise (trainer_ckpt.c). */
pt_status pt_trainer_ckpt_open(pt_trainer *t);
/* Wait for the save in flight and free the writer (pt_ckpt_async_free). */
void pt_trainer_ckpt_close(pt_trainer *t);

/* Full tensors on the model-parallel group's rank 0 (full: laid out like
 * the whole tp = 1 model's flat buffer) from every member's buffer local
 * (laid out like its own model: member r = pp_i x tp + tp_i holds tp slice
 * tp_i of stage pp_i's modules, owned[pp_i] of the trainer's table), one
 * tensor at a time. Collective over t->mp (tp_full.c): the test seam's
 * gather of the parameters (checkpoints write by slice, ckpt_impl.h). */
pt_status pt_mp_gather_full(const pt_trainer *t, const float *local, float *full);

/* Prefix the last error message with prefix ("prefix: message"); returns st
 * (trainer_new.c). */
pt_status pt_trainer_prefix_error(pt_status st, const char *prefix);

#endif
