/* Private to the planner's search (search.c, search_keep.c): its state,
 * and what it keeps and remembers between layouts (search_keep.c): the
 * fastest fitting layouts and the smallest rejected ones, each layout's
 * memory by name, the recompute modes known not to fit, the stage cuts
 * and the pass lists.
 *
 * Not here: the layout space (plan_space_impl.h), the models. */
#ifndef PT_PLAN_SEARCH_IMPL_H
#define PT_PLAN_SEARCH_IMPL_H

#include <stdint.h>

#include "plan_memory_impl.h"
#include "plan_space_impl.h"
#include "plan_time_impl.h"

#define PT_PLAN_KEEP     256 /* fitting layouts kept, fastest first */
#define PT_PLAN_REJECTED 8   /* rejected layouts kept, smallest memory first */

/* a layout's memory by the hash of its name (search_keep.c) */
#define MEMO_SLOTS 4096
typedef struct {
    uint64_t key; /* 0: empty */
    pt_plan_mem mem;
} memo;

/* uniform recompute modes known not to fit, by family and ZeRO variant:
 * the highest mode + 1 (0: none known) */
#define DEAD_SLOTS 16384
typedef struct {
    uint64_t key;
    unsigned char mode;
} dead;

/* One stage cut of the search's cache (p x v entries in st). */
typedef struct cut_node {
    /* its micro-batches and schedule (0 and NULL at v = 1, where the cut
     * depends on neither: pt_stage_split_for simulates the schedule at
     * v > 1) */
    int m;
    const pt_sched *sched;
    int dp; /* the update weighs a step over batch / dp sequences */
    struct cut_node *next;
    pt_stage st[];
} cut_node;

/* The search's state (one per pt_plan_search). */
typedef struct {
    const pt_config *base;
    const pt_cluster *cl;
    int world;
    pt_plan_space sp;     /* the layouts, the fixed keys, the reasons dropped */
    pt_plan_capacity cap; /* what a rank may hold */
    pt_plan_entry *fit;   /* max-heap on step time, PT_PLAN_KEEP */
    int n_fit;
    long n_fitting;
    pt_plan_entry rej[PT_PLAN_REJECTED]; /* by total memory, ascending */
    int n_rej;
    long n_valid, n_eval, n_sim;
    /* the ranks' pass lists of the last few (schedule, m, pp, v): a
     * family's ZeRO variants and the kept layouts share them */
    struct {
        char name[16];
        int m, p, v;
        pt_schedule *lists;
    } lists[4];
    int lists_next;
    pt_plan_pipe pipe, wide; /* wide: full recompute's, for the overlap window bound */
    /* the stage cut per (pp, virtual stages), a list by schedule and
     * micro-batches at v > 1 (the cut simulates the schedule there):
     * computed once (pt_stage_split_for tries up to 2e6 cuts at v > 1).
     * The key suffices: parallel.stage_layers is the same in every layout
     * of a search (the fixed key, or empty until explain_layers writes out
     * the cut that the cache already holds) */
    cut_node *cut[PT_PLAN_MAX_STAGES + 1][PT_SCHEDULE_MAX_VIRTUAL + 1];
    pt_plan_mem mem, mem2;
    memo *memo;
    pt_plan_memory_cache *mcache; /* what layouts share of their memory */
    /* (family without recompute, ZeRO, group) -> the highest recompute mode
     * + 1 known not to fit, uniform (0: none known); DEAD_SLOTS, overwritten */
    dead *dead;
    long n_mem;
    double mem_s;
} plan_search;

/* A search's state for base's layouts of `world` ranks on cl (all lent;
 * the space not yet set), or NULL when out of memory. */
plan_search *pt_plan_search_new(const pt_config *base, const pt_cluster *cl, int world);
/* NULL-safe. */
void pt_plan_search_free(plan_search *s);

/* ---- the kept sets ---- */

/* The step time a layout must beat to be kept (infinite until full). */
double pt_plan_keep_bound(const plan_search *s);
/* Keep e if it is among the PT_PLAN_KEEP fastest so far. */
void pt_plan_keep_fit(plan_search *s, const pt_plan_entry *e);
/* Keep l, whose memory m does not fit, if among the PT_PLAN_REJECTED smallest. */
void pt_plan_keep_rejected(plan_search *s, const pt_plan_layout *l, const pt_plan_mem_rank *m);

/* ---- what a search remembers ---- */

/* pt_plan_memory of l (through the search's caches: each layout once). */
pt_status pt_plan_search_mem(plan_search *s, const pt_plan_layout *l, pt_plan_mem *out);
/* Recompute mode r of l's family and ZeRO variant does not fit, uniform:
 * nor does any lower mode (mark); whether that is known (is). */
void pt_plan_mark_dead(plan_search *s, const pt_plan_layout *l, int r);
int pt_plan_is_dead(const plan_search *s, const pt_plan_layout *l, int r);
/* l's stage cut (p x v entries, lent: the search's), computed once. */
pt_status pt_plan_search_cut(plan_search *s, const pt_plan_layout *l, const pt_stage **out);
/* s->pipe.lists: l's ranks' pass lists (lent; built once per (schedule,
 * m, pp, v) of the last 4). */
pt_status pt_plan_search_lists(plan_search *s, const pt_plan_layout *l);

#endif
