/* Private to the planner's memory model and search: pt_plan_memory with
 * what one layout shares with others kept across calls, so that a search
 * over thousands of layouts of one model cuts each pipeline once, builds
 * each pass list once and each stage's tensor table once.
 *
 * Not here: the model itself (memory.c), the public API (partrain/plan.h). */
#ifndef PT_PLAN_MEMORY_IMPL_H
#define PT_PLAN_MEMORY_IMPL_H

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

#endif
