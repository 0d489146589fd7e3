/* Private to the planner's memory model and search: pt_plan_memory with
 * what one layout shares with others kept across calls, so that a search
 * over thousands of layouts of one model cuts each pipeline once, builds
 * each pass list once and each stage's tensor table once.
 *
 * Here too the stage as the model reads it (memory_stage.c).
 *
 * Not here: the model itself (memory.c), the public API (partrain/plan.h). */
#ifndef PT_PLAN_MEMORY_IMPL_H
#define PT_PLAN_MEMORY_IMPL_H

#include "partrain/parallel.h"
#include "partrain/plan.h"

/* What pt_plan_memory computes that depends on part of a layout only: the
 * stage cut per (schedule, pp, v, stage_layers), the pass lists' counts
 * per (schedule, m, pp, v) and rank, the table-only model per (tp, sp,
 * recompute, modules held). One per search (not shared between threads);
 * it holds one model config at a time and forgets everything when called
 * with another. */
typedef struct pt_plan_memory_cache pt_plan_memory_cache;

pt_status pt_plan_memory_cache_new(pt_plan_memory_cache **out);
/* Lookups answered from k so far (a test's check that it is used). */
long pt_plan_memory_cache_hits(const pt_plan_memory_cache *k);
/* NULL-safe. */
void pt_plan_memory_cache_free(pt_plan_memory_cache *k);
/* pt_plan_memory through k: exactly its numbers and errors (k NULL: no
 * caching, pt_plan_memory itself). */
pt_status pt_plan_memory_cached(pt_plan_memory_cache *k, const pt_config *model,
                                const pt_plan_layout *l, const pt_cluster *cl, pt_plan_mem *out);

/* ---- a stage (memory_stage.c) ---- */

/* What the memory model reads of a rank's pass list (pt_schedule). */
typedef struct {
    int virtual_stages, split, in_flight, pending_w;
    int chunk_in_flight[PT_SCHEDULE_MAX_VIRTUAL];
    int vstage[PT_SCHEDULE_MAX_VIRTUAL]; /* pt_schedule_virtual_stage per chunk */
    size_t bytes;                        /* pt_schedule_bytes */
} sched_sum;

/* What the bf16 regime reads of a stage's table-only model: a few
 * hundred bytes where the model is tens of kB (a search keeps thousands). */
typedef struct {
    size_t params_bytes; /* pt_model_buffer_bytes(m, 0, PT_MEM_PARAMS) */
    size_t n;            /* pt_model_num_params */
    size_t cnt[];        /* the stage model's L + 2: pt_model_module_region's counts */
} model_sum;

/* One pipeline stage's layout, shared by both regimes. */
typedef struct {
    sched_sum sched;
    pt_model *m;        /* fp32: table only (max_B 0), this stage's tp slice */
    const model_sum *u; /* bf16: the same model summed up */
    int own;            /* m or u is this stage's (else the cache's, lent) */
    int first[PT_SCHEDULE_MAX_VIRTUAL], last[PT_SCHEDULE_MAX_VIRTUAL];
    int emb_here, head_here, tied_peer;
    int blocks[PT_SCHEDULE_MAX_VIRTUAL]; /* blocks of each chunk */
    int most_modules;                    /* modules of the rank's largest chunk */
    int head_chunk;                      /* the chunk holding the head (head_here) */
    /* m's (or u's) blocks: the model's, or, shortened (shorten()), fewer;
     * first[] and last[] are m's module indices, glob[i] the model's index
     * of m's module i (NULL: the same) */
    int L;
    int *glob;
} stage_info;

/* c's stage cut (p x v entries, p > 1) into *cut: k's, or computed into
 * buf (PT_PLAN_MAX_STAGES x PT_SCHEDULE_MAX_VIRTUAL). */
pt_status pt_plan_stage_cut(pt_plan_memory_cache *k, const pt_config *c, pt_stage *buf,
                            const pt_stage **cut);
/* c's p ranks' pass list summaries into *out: k's, or computed into buf
 * (PT_PLAN_MAX_STAGES). */
pt_status pt_plan_stage_scheds(pt_plan_memory_cache *k, const pt_config *c, sched_sum *buf,
                               const sched_sum **out);
/* Pipeline rank r's stage of c's layout (its chunks from cut, its list
 * from sum) with its table-only model at recompute rc: fp32 the model,
 * bf16 its summary; lent from k (shortened), or built whole and owned
 * (k NULL). Freed with pt_plan_stage_free. */
pt_status pt_plan_stage_new(stage_info *s, const pt_config *c, const pt_stage *cut, int r,
                            pt_recompute rc, const sched_sum *sum, int gpu,
                            pt_plan_memory_cache *k);
void pt_plan_stage_free(stage_info *s);
/* k (NULL: nothing) holds model m's figures from now on: another model's
 * are forgotten. */
void pt_plan_memory_cache_model(pt_plan_memory_cache *k, const pt_model_config *m);

#endif
