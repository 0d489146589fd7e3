/* Private to the planner's search: the layout space it ranks (space.c),
 * walked family by family under the keys a caller fixes, and the one
 * reason to give when no candidate is valid.
 *
 * Not here: what a layout costs and the ranking (search.c). */
#ifndef PT_PLAN_SPACE_IMPL_H
#define PT_PLAN_SPACE_IMPL_H

#include <stdint.h>

#include "partrain/plan.h"

/* The keys a caller may fix (pt_plan_search's `fixed`), in this order. */
enum {
    PT_FIX_DP,
    PT_FIX_TP,
    PT_FIX_PP,
    PT_FIX_ZERO,
    PT_FIX_ZG,
    PT_FIX_SP,
    PT_FIX_SCHED,
    PT_FIX_M,
    PT_FIX_V,
    PT_FIX_REC,
    PT_FIX_SREC,
    PT_FIX_WHOLE,
    PT_FIX_LAYERS,
    PT_FIX_THREADS,
    PT_FIX_N
};

#define PT_PLAN_WHY 16 /* distinct rejection reasons counted */

typedef struct {
    const pt_config *base;
    pt_config *scratch; /* base with the layout under test written in (lent) */
    int world, fix[PT_FIX_N];
    int n_cut; /* entries of the fixed parallel.stage_layers (0: not fixed) */
    /* the candidates dropped so far, by reason (digits aside), first seen first */
    struct {
        uint64_t key;
        long n;
        char text[256];
    } why[PT_PLAN_WHY];
    int n_why;
    long n_dropped;
} pt_plan_space;

/* The space of world ranks for base with the keys named in fixed[] held
 * at base's values; scratch: a copy of base to write layouts into. */
void pt_plan_space_init(pt_plan_space *sp, const pt_config *base, pt_config *scratch,
                        const char *const *fixed, int n_fixed, int world);

/* What the walk hands over: each valid group (dp, tp, pp, sp, m) with the
 * validity of its ZeRO variants (zvalid[z (dp + 1) + g], lent for the
 * call; nvalid of them), then each of its families (schedule, virtual
 * stages, recompute) with the layout in l (ZeRO fields unset). */
typedef struct {
    void *ctx;
    pt_status (*group)(void *ctx, const pt_plan_layout *l, const int *zvalid, int nvalid);
    pt_status (*family)(void *ctx, const pt_plan_layout *l);
} pt_plan_space_visitor;

/* Every family of sp in the search's order (tp, pp, sp, m, schedule, v,
 * recompute), or none where the fixed keys contradict themselves. Stops
 * at a visitor's error. */
pt_status pt_plan_space_walk(pt_plan_space *sp, const pt_plan_space_visitor *v);

/* A candidate dropped for `reason` (counted; the walk's own and those
 * that the search finds invalid later). */
void pt_plan_space_drop(pt_plan_space *sp, const char *reason);

/* The error when no layout of the space is valid: one line naming the
 * fixed keys' own contradiction, or the reason that dropped the most
 * candidates, with the fixed keys it names (PT_ERR_INVALID). */
pt_status pt_plan_space_error(const pt_plan_space *sp);

#endif
