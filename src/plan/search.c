/* The planner's search: every layout of `world` ranks that the config
 * validator and the schedule check accept (the space, space.c), each with
 * its memory (pt_plan_memory) and, when it fits the device, its step time
 * (pt_plan_time_predict's model), ranked by step time.
 *
 * Per part: a pipeline whose only overflowing stages are some of its
 * ranks recomputes on those alone (the cheapest mode that fits each,
 * model.stage_recompute); ZeRO-3 keeps the embedding and the head whole
 * when they fit (parallel.zero_whole); the stage cut is the runtime's
 * balanced one, written out (parallel.stage_layers) when it is uneven.
 *
 * Speed (GPT-3 175B on 1,024 ranks, docs/plan.md): the config is copied
 * once and the layout written into that copy; validity is decided once per
 * (dp, tp, pp, sp, micro-batches, ZeRO) and the schedule check once per
 * schedule; the pipeline is simulated once for the ZeRO variants of a
 * layout (ZeRO moves no pass) and only when the layout could enter the
 * kept set (its busiest rank's compute alone beats the slowest kept);
 * only the PT_PLAN_KEEP fastest fitting layouts and the few smallest
 * rejected ones are kept. A variant the memory model refuses (the
 * runtime's validator, with its real schedule and per-part keys) is
 * dropped with its reason; the search goes on.
 *
 * Not here: what it keeps and remembers between layouts (search_keep.c),
 * the models themselves (memory.c, time.c), output (the CLI). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_search_impl.h"

static const char *recompute_name(int r) {
    return r == PT_RECOMPUTE_FULL ? "full" : r == PT_RECOMPUTE_SELECTIVE ? "selective" : "none";
}

/* What a rank needs of s->cap.bytes (pt_plan_mem_need: its step's peak,
 * and its share of a checkpoint save's scratch); need_all: the largest
 * over the stages (each stage's own step and save: `max` pairs the
 * largest step with the largest save, which may be two stages'). */
static double need(const plan_search *s, const pt_plan_mem_rank *m) {
    return pt_plan_mem_need(m, &s->cap);
}
static double need_all(const plan_search *s, const pt_plan_mem *m) {
    double most = 0;
    for (int r = 0; r < m->n_stage; r++)
        if (need(s, &m->stage[r]) > most) most = need(s, &m->stage[r]);
    return most;
}

/* ---- per-part choices ---- */

/* "stage layers 7,8,8,7" into l when the runtime's balanced cut is uneven. */
static void explain_layers(const pt_config *c, pt_plan_entry *e, const plan_search *s) {
    pt_plan_layout *l = &e->layout;
    if (l->pp < 2 || l->virtual_stages > 1 || s->sp.fix[PT_FIX_LAYERS] || l->stage_layers[0])
        return;
    /* the cut is the pipeline's just simulated (s->pipe, one chunk a rank) */
    const pt_plan_pipe *pp = &s->pipe;
    int L = c->model.n_layer, uneven = 0;
    size_t n = 0;
    for (int k = 0; k < l->pp; k++) {
        int first = pp->first[k] < 1 ? 1 : pp->first[k], last = pp->last[k] > L ? L : pp->last[k];
        int blocks = last >= first ? last - first + 1 : 0;
        if (blocks * l->pp != L) uneven = 1;
        n += (size_t)snprintf(l->stage_layers + n, sizeof l->stage_layers - n, "%s%d", k ? "," : "",
                              blocks);
        if (n >= sizeof l->stage_layers) {
            l->stage_layers[0] = 0;
            return;
        }
    }
    if (!uneven) {
        l->stage_layers[0] = 0;
        return;
    }
    if (e->n_why < 4)
        snprintf(e->why[e->n_why++], sizeof e->why[0],
                 "stages hold %s blocks: the embedding and the head make the end stages heavier "
                 "(the cut balanced by flops)",
                 l->stage_layers);
}

/* The entry of layout l that fits, with its pipeline already in s->pipe. */
static void add_fitting(plan_search *s, const pt_plan_layout *l, const pt_plan_mem_rank *m,
                        const char (*why)[256], int n_why) {
    pt_plan_entry e;
    memset(&e, 0, sizeof e);
    e.layout = *l, e.mem = *m, e.fits = 1;
    pt_plan_time_finish(s->base, l, s->cl, &s->pipe, &e.time);
    if (e.time.step_s >= pt_plan_keep_bound(s)) return;
    for (int i = 0; i < n_why && i < 4; i++) memcpy(e.why[e.n_why++], why[i], sizeof e.why[0]);
    explain_layers(s->base, &e, s);
    pt_plan_keep_fit(s, &e);
}

/* A lower bound on the pipeline's makespan from the pass times alone:
 * rank r starts no earlier than the first micro-batch's forwards on the
 * stages before it, and (one chunk a rank, backwards not split) its last
 * pass is a backward after which every earlier stage runs one more. Exact
 * for 1f1b and gpipe at equal stages. Each pass at its shortest, with the
 * other pipeline ranks computing or not (they differ where ranks share
 * devices). */
static double pipe_bound(const pt_plan_pipe *pp, const pt_plan_layout *l) {
    if (pp->p == 1) return pp->busy[0];
    int split = pt_sched_find(l->schedule)->split;
    double best = 0, head = 0, tail = 0;
    for (int r = 0; r < pp->p; r++) {
        double b = pp->busy_lo[r];
        if (pp->v == 1) b += head + (split ? 0 : tail);
        if (b > best) best = b;
        if (pp->v == 1)
            head += fmin(pp->f[r], pp->fa[r]),
                tail += fmin(pp->b[r], pp->ba[r]) + fmin(pp->w[r], pp->wa[r]);
    }
    return best;
}

/* The pipeline of l into s->pipe: 1 when simulated; 0 when even its
 * busiest rank's passes (no bubble, no data-parallel traffic) lose to
 * every kept layout, or on an error (*st). */
static int pipe_for(plan_search *s, const pt_plan_layout *l, pt_status *st) {
    pt_plan_pipe *pp = &s->pipe;
    const pt_stage *cut = NULL;
    *st = pt_plan_search_cut(s, l, &cut);
    if (*st != PT_OK) return 0;
    *st = pt_plan_pipe_times_split(s->base, l, s->cl, cut, pp);
    if (*st != PT_OK) return 0;
    if (pipe_bound(pp, l) >= pt_plan_keep_bound(s)) return 0;
    s->n_sim++;
    *st = pt_plan_search_lists(s, l);
    if (*st == PT_OK) *st = pt_plan_pipe_run_fast(l, pp);
    return *st == PT_OK;
}

static void set_schedule(pt_plan_layout *l, const char *name, int v) {
    snprintf(l->schedule, sizeof l->schedule, "%s", name);
    l->virtual_stages = v;
}

/* Per-stage recompute for a layout that overflows under recompute none:
 * each overflowing stage takes the cheapest mode that fits it. 1 with l's
 * stage_recompute and why lines set; 0 when no assignment fits or every
 * stage would need the same mode (the uniform layout covers that). */
static int per_stage_recompute(plan_search *s, pt_plan_layout *l, const pt_plan_mem *none,
                               char (*why)[256], int *n_why) {
    int p = l->pp, mode[PT_PLAN_MAX_STAGES];
    if (p < 2 || s->sp.fix[PT_FIX_REC] || s->sp.fix[PT_FIX_SREC] || none->n_stage != p) return 0;
    pt_plan_layout t = *l;
    pt_plan_mem *m = &s->mem2;
    int any_none = 0, any_other = 0;
    for (int k = 0; k < p; k++) {
        mode[k] = need(s, &none->stage[k]) <= s->cap.bytes ? 0 : -1;
        /* recomputation shrinks activations only: a stage over without them stays over */
        if (mode[k] < 0 &&
            need(s, &none->stage[k]) - none->stage[k].cat[PT_MEM_ACTS] > s->cap.bytes)
            return 0;
    }
    for (int r = PT_RECOMPUTE_SELECTIVE; r <= PT_RECOMPUTE_FULL; r++) {
        t.recompute = r;
        if (pt_plan_search_mem(s, &t, m) != PT_OK || m->n_stage != p) return 0;
        if (need_all(s, m) > s->cap.bytes) pt_plan_mark_dead(s, &t, r);
        for (int k = 0; k < p; k++)
            if (mode[k] < 0 && need(s, &m->stage[k]) <= s->cap.bytes) mode[k] = r;
    }
    size_t n = 0;
    for (int k = 0; k < p; k++) {
        if (mode[k] < 0) return 0;
        any_none |= mode[k] == 0, any_other |= mode[k] > 0;
        n += (size_t)snprintf(l->stage_recompute + n, sizeof l->stage_recompute - n, "%s%s",
                              k ? "," : "", recompute_name(mode[k]));
        if (n >= sizeof l->stage_recompute) return 0;
    }
    if (!any_none || !any_other) return 0;
    for (int k = 0; k < p && *n_why < 3; k++)
        if (mode[k] > 0)
            snprintf(why[(*n_why)++], 256,
                     "stage %d recomputes (%s): %.1f GB a rank with %.1f GB of activations "
                     "would not fit: %s",
                     k, recompute_name(mode[k]), need(s, &none->stage[k]) / 1e9,
                     none->stage[k].cat[PT_MEM_ACTS] / 1e9, s->cap.what);
    return 1;
}

/* s->pipe as l's pass times; for recompute none, s->wide as full
 * recompute's (the widest overlap window a per-stage variant can have). */
static pt_status family_times(plan_search *s, const pt_plan_layout *l) {
    const pt_stage *cut = NULL;
    PT_CHECK(pt_plan_search_cut(s, l, &cut));
    PT_CHECK(pt_plan_pipe_times_split(s->base, l, s->cl, cut, &s->pipe));
    if (l->recompute != PT_RECOMPUTE_NONE || s->sp.fix[PT_FIX_REC] || s->sp.fix[PT_FIX_SREC] ||
        l->pp < 2)
        return PT_OK;
    pt_plan_layout f = *l;
    f.recompute = PT_RECOMPUTE_FULL;
    return pt_plan_pipe_times_split(s->base, &f, s->cl, cut, &s->wide);
}

/* A lower bound on variant t's step (t's family in s->pipe, family_times):
 * the pipeline's bound plus t's exact data-parallel traffic and optimizer
 * given that makespan, with the widest overlap window its per-stage
 * variants could have. Least over ZeRO-3's whole and sharded modules. */
static double variant_bound(plan_search *s, const pt_plan_layout *t, double lb) {
    pt_plan_pipe *pp = &s->pipe;
    double keep[PT_PLAN_MAX_STAGES];
    int widen = t->recompute == PT_RECOMPUTE_NONE && !s->sp.fix[PT_FIX_REC] &&
                !s->sp.fix[PT_FIX_SREC] && pp->p > 1;
    for (int r = 0; widen && r < pp->p; r++) {
        keep[r] = pp->last_bw[r];
        if (s->wide.last_bw[r] > pp->last_bw[r]) pp->last_bw[r] = s->wide.last_bw[r];
    }
    double mk = pp->makespan, mk0 = pp->makespan_nop2p;
    pp->makespan = pp->makespan_nop2p = lb;
    pt_plan_time tm;
    pt_plan_time_finish(s->base, t, s->cl, pp, &tm);
    double best = tm.step_s;
    if (t->zero == 3 && !s->sp.fix[PT_FIX_WHOLE]) {
        pt_plan_layout w = *t;
        snprintf(w.zero_whole, sizeof w.zero_whole, "embedding,head");
        pt_plan_time_finish(s->base, &w, s->cl, pp, &tm);
        if (tm.step_s < best) best = tm.step_s;
    }
    pp->makespan = mk, pp->makespan_nop2p = mk0;
    for (int r = 0; widen && r < pp->p; r++) pp->last_bw[r] = keep[r];
    return best;
}

/* Whether a layout whose memory m did not fit proves that no variant
 * sharded no more than it fits: under bf16, each stage's parameters,
 * gradients and optimizer state only grow as sharding shrinks (a lower
 * ZeRO stage, a smaller group) and its activations stay, so a stage over
 * without its communication buffers (ZeRO-3's gathered units, which a
 * lower stage does not have) stays over. Under fp32 the gradient and
 * parameter pools of ZeRO 2 and 3 and a save's scratch (a ZeRO rank
 * receives its slice's shards) can make a more sharded variant the larger
 * for a small model: nothing is proved. */
static int bounds_lower_variants(const plan_search *s, const pt_plan_mem *m) {
    if (!pt_plan_bf16(s->base)) return 0;
    for (int k = 0; k < m->n_stage; k++)
        if (m->stage[k].total - m->stage[k].cat[PT_MEM_COMM] > s->cap.bytes) return 1;
    return 0;
}

/* A candidate's own error: it is dropped with its reason, the search goes
 * on (out of memory ends it). */
static pt_status candidate_error(plan_search *s, pt_status st) {
    if (st == PT_OK || st == PT_ERR_NOMEM) return st;
    pt_plan_space_drop(&s->sp, pt_error_message());
    return PT_OK;
}

/* The ZeRO variants of one layout family (its pipeline shared), the most
 * sharded first (ZeRO-3 over the whole dp group, then smaller groups, then
 * lower stages): a variant sharded no more than one that did not fit is
 * passed over where that proves it cannot fit (bounds_lower_variants).
 * Memory, then the time of those that fit; a variant is evaluated only
 * while the family's lower bound can still enter the kept set. */
static pt_status zero_variants(plan_search *s, pt_plan_layout *l, const int *zvalid, double bound) {
    int dp = l->dp, simulated = 0, nvar = 0;
    int zs[4 * 64], gs[4 * 64];
    pt_status st = PT_OK;
    for (int z = 3; z >= 0; z--) {
        if (s->sp.fix[PT_FIX_ZERO] ? z != s->base->parallel.zero : (z > 0 && dp == 1)) continue;
        /* g = 0 (the whole dp group) first, then the groups largest first */
        for (int gi = 0; gi <= dp && nvar < 4 * 64; gi++) {
            int g = gi == 0 ? 0 : dp + 1 - gi;
            if (g > 0 && (z == 0 || g == 1 || g == dp || dp % g)) continue;
            if (s->sp.fix[PT_FIX_ZG] && g != s->base->parallel.zero_group) continue;
            if (!zvalid[z * (dp + 1) + g]) continue;
            zs[nvar] = z, gs[nvar++] = g;
        }
    }
    PT_CHECK(family_times(s, l));
    double lb = pipe_bound(&s->pipe, l);
    /* variants that did not fit and bound the rest: one sharding no more
     * than theirs (a lower or equal ZeRO stage over a group no larger)
     * cannot fit either */
    int nfail = 0, fz[4 * 64], fg[4 * 64];
    for (int k = 0; k < nvar; k++) {
        if (bound >= pt_plan_keep_bound(s)) break;
        int ge = gs[k] ? gs[k] : dp, dominated = 0;
        for (int j = 0; j < nfail && !dominated; j++) dominated = zs[k] <= fz[j] && ge <= fg[j];
        if (dominated) continue;
        pt_plan_layout t = *l;
        t.zero = zs[k], t.zero_group = gs[k];
        /* known not to fit from a sibling family's per-stage attempt; a
         * uniform mode has no per-stage rescue of its own but none */
        if (t.recompute != PT_RECOMPUTE_NONE && pt_plan_is_dead(s, &t, t.recompute)) continue;
        if (!s->sp.fix[PT_FIX_WHOLE]) t.zero_whole[0] = 0;
        /* s->pipe is the family's until a pipeline is simulated */
        if (!simulated && k > 0) PT_CHECK(family_times(s, l));
        if (variant_bound(s, &t, lb) >= pt_plan_keep_bound(s)) continue;
        s->n_eval++;
        st = pt_plan_search_mem(s, &t, &s->mem);
        if (st != PT_OK) { /* the runtime refuses this variant: its reason */
            PT_CHECK(candidate_error(s, st));
            continue;
        }
        char why[4][256];
        int n_why = 0;
        /* ZeRO-3: the embedding and the head whole (no gathers) when they
         * fit; tried where the sharded layout does not fit too, since for
         * a small model the gathered units' pool can outweigh what
         * sharding those two saves */
        if (t.zero == 3 && !s->sp.fix[PT_FIX_WHOLE]) {
            pt_plan_layout w = t;
            snprintf(w.zero_whole, sizeof w.zero_whole, "embedding,head");
            if (pt_plan_search_mem(s, &w, &s->mem2) == PT_OK &&
                need_all(s, &s->mem2) <= s->cap.bytes) {
                snprintf(why[n_why++], 256,
                         "embedding and head kept whole under ZeRO-3: %.1f GB a rank, "
                         "and %s; no gathers for them",
                         s->mem2.max.total / 1e9, s->cap.what);
                t = w;
                s->mem = s->mem2;
            }
        }
        if (need_all(s, &s->mem) > s->cap.bytes) {
            pt_plan_mem none = s->mem;
            if (t.recompute != PT_RECOMPUTE_NONE ||
                !per_stage_recompute(s, &t, &none, why, &n_why) ||
                pt_plan_search_mem(s, &t, &s->mem) != PT_OK ||
                need_all(s, &s->mem) > s->cap.bytes) {
                t.stage_recompute[0] = 0;
                pt_plan_keep_rejected(s, &t, &none.max);
                if (t.recompute != PT_RECOMPUTE_NONE) pt_plan_mark_dead(s, &t, t.recompute);
                if (bounds_lower_variants(s, &none)) fz[nfail] = zs[k], fg[nfail++] = ge;
                continue;
            }
        }
        s->n_fitting++;
        if (!simulated || t.stage_recompute[0]) {
            /* a per-stage recompute changes the passes: its own pipeline */
            if (!pipe_for(s, &t, &st)) {
                if (st != PT_OK) return st;
                simulated = 0;
                continue;
            }
            simulated = !t.stage_recompute[0];
        }
        add_fitting(s, &t, &s->mem.max, (const char(*)[256])why, n_why);
    }
    return st;
}

/* A layout family: everything but ZeRO, and the lower bound on its step. */
typedef struct {
    double bound;
    int tp, pp, sp, m, v, rec;
    const pt_sched *sched;
    long zv; /* offset in the pool of the group's ZeRO validity (4 (dp + 1) ints) */
} family;

static int cmp_family(const void *a, const void *b) {
    double x = ((const family *)a)->bound, y = ((const family *)b)->bound;
    return x < y ? -1 : x > y;
}

static int cmp_step(const void *a, const void *b) {
    double x = ((const pt_plan_entry *)a)->time.step_s, y = ((const pt_plan_entry *)b)->time.step_s;
    return x < y ? -1 : x > y;
}

/* Phase 1 (the space's walk): every valid family with the lower bound on
 * its step, and each group's ZeRO validity in a pool. */
typedef struct {
    plan_search *s;
    family *fam;
    long nfam, capfam;
    int *pool;
    long npool, cappool, zv; /* zv: the group's offset in the pool */
    int nz;                  /* its valid ZeRO variants */
} walk;

static pt_status on_group(void *ctx, const pt_plan_layout *l, const int *zvalid, int nvalid) {
    walk *w = ctx;
    long need = 4 * (long)(l->dp + 1);
    if (w->npool + need > w->cappool) {
        long nc = 2 * (w->npool + need);
        int *g = realloc(w->pool, sizeof *g * (size_t)nc);
        if (!g) return pt_error_set(PT_ERR_NOMEM, "plan: validity of %ld layouts", nc);
        w->pool = g, w->cappool = nc;
    }
    memcpy(w->pool + w->npool, zvalid, sizeof *w->pool * (size_t)need);
    w->zv = w->npool, w->nz = nvalid;
    w->npool += need;
    return PT_OK;
}

static pt_status on_family(void *ctx, const pt_plan_layout *l0) {
    walk *w = ctx;
    plan_search *s = w->s;
    pt_plan_layout l = *l0;
    pt_status st = family_times(s, &l);
    if (st != PT_OK) return candidate_error(s, st);
    /* the family's bound: its least variant's */
    const int *zvalid = w->pool + w->zv;
    double lb = pipe_bound(&s->pipe, &l), fb = INFINITY;
    for (int z = 0; z <= 3; z++)
        for (int g = 0; g <= l.dp; g++) {
            if (!zvalid[z * (l.dp + 1) + g]) continue;
            l.zero = z, l.zero_group = g;
            double b = variant_bound(s, &l, lb);
            if (b < fb) fb = b;
        }
    if (w->nfam == w->capfam) {
        long nc = w->capfam ? 2 * w->capfam : 1024;
        family *g = realloc(w->fam, sizeof *g * (size_t)nc);
        if (!g) return pt_error_set(PT_ERR_NOMEM, "plan: %ld layouts", nc);
        w->fam = g, w->capfam = nc;
    }
    family *f = &w->fam[w->nfam++];
    f->bound = fb, f->tp = l.tp, f->pp = l.pp, f->sp = l.sequence_parallel;
    f->m = l.microbatches, f->sched = pt_sched_find(l.schedule), f->v = l.virtual_stages;
    f->rec = l.recompute;
    f->zv = w->zv;
    s->n_valid += w->nz;
    return PT_OK;
}

/* Phase 2: the families best bound first, until none can beat the kept. */
static pt_status evaluate(plan_search *s, walk *w) {
    pt_plan_layout l;
    memset(&l, 0, sizeof l);
    const pt_config *c = s->base;
    l.threads = c->train.threads;
    if (s->sp.fix[PT_FIX_SREC])
        snprintf(l.stage_recompute, sizeof l.stage_recompute, "%s", c->train.stage_recompute);
    if (s->sp.fix[PT_FIX_WHOLE])
        snprintf(l.zero_whole, sizeof l.zero_whole, "%s", c->parallel.zero_whole);
    if (s->sp.fix[PT_FIX_LAYERS])
        snprintf(l.stage_layers, sizeof l.stage_layers, "%s", c->parallel.stage_layers);
    if (w->nfam > 0) qsort(w->fam, (size_t)w->nfam, sizeof *w->fam, cmp_family);
    for (long i = 0; i < w->nfam; i++) {
        const family *f = &w->fam[i];
        if (f->bound >= pt_plan_keep_bound(s)) break;
        l.tp = f->tp, l.pp = f->pp, l.dp = s->world / f->tp / f->pp, l.sequence_parallel = f->sp;
        l.microbatches = f->m, l.recompute = f->rec;
        set_schedule(&l, f->sched->name, f->v);
        PT_CHECK(zero_variants(s, &l, w->pool + f->zv, f->bound));
    }
    return PT_OK;
}

/* The result: the fitting by step time, each with its transfer split (the
 * search simulated with transfers only), then the rejected by memory. */
static pt_status result(plan_search *s, pt_plan_result *out) {
    out->entry = malloc(sizeof *out->entry * (size_t)(s->n_fit + s->n_rej + 1));
    if (!out->entry) return pt_error_set(PT_ERR_NOMEM, "plan: %d results", s->n_fit + s->n_rej);
    memcpy(out->entry, s->fit, sizeof *s->fit * (size_t)s->n_fit);
    qsort(out->entry, (size_t)s->n_fit, sizeof *out->entry, cmp_step);
    memcpy(out->entry + s->n_fit, s->rej, sizeof *s->rej * (size_t)s->n_rej);
    out->n = s->n_fit + s->n_rej, out->n_fit = s->n_fit;
    for (int i = s->n_fit; i < out->n; i++) PT_ASSERT(pt_plan_entry_finite(&out->entry[i]));
    out->n_considered = s->n_valid;
    out->n_evaluated = s->n_eval;
    out->n_fitting = s->n_fitting;
    for (int i = 0; i < out->n_fit; i++) {
        pt_plan_entry *e = &out->entry[i];
        if (e->layout.pp == 1) continue;
        const pt_stage *cut = NULL;
        PT_CHECK(pt_plan_search_cut(s, &e->layout, &cut));
        PT_CHECK(pt_plan_pipe_times_split(s->base, &e->layout, s->cl, cut, &s->pipe));
        PT_CHECK(pt_plan_search_lists(s, &e->layout));
        PT_CHECK(pt_plan_pipe_run(&e->layout, &s->pipe));
        pt_plan_time_finish(s->base, &e->layout, s->cl, &s->pipe, &e->time);
    }
    /* the cluster's ranges bound every rate: a non-finite figure is ours */
    for (int i = 0; i < out->n_fit; i++) PT_ASSERT(pt_plan_entry_finite(&out->entry[i]));
    return PT_OK;
}

pt_status pt_plan_search(const pt_config *base, const char *const *fixed, int n_fixed,
                         const pt_cluster *cl, int world, pt_plan_result *out) {
    memset(out, 0, sizeof *out);
    if (world < 1)
        return pt_error_set(PT_ERR_INVALID, "plan: --world must be >= 1 (got %d)", world);
    plan_search *s = pt_plan_search_new(base, cl, world);
    pt_config *scratch = malloc(sizeof *scratch);
    walk w = {0};
    pt_status st = PT_OK;
    if (!s || !scratch) {
        st = pt_error_set(PT_ERR_NOMEM, "plan: search state");
        goto done;
    }
    *scratch = *base;
    pt_plan_space_init(&s->sp, base, scratch, fixed, n_fixed, world);
    pt_plan_rank_capacity(cl, world, &s->cap);
    w.s = s;
    uint64_t t_start = pt_time_ns();
    pt_plan_space_visitor vis = {&w, on_group, on_family};
    st = pt_plan_space_walk(&s->sp, &vis);
    uint64_t t_phase1 = pt_time_ns();
    if (st == PT_OK) st = evaluate(s, &w);
    uint64_t t_phase2 = pt_time_ns();
    if (st == PT_OK) st = result(s, out);
    if (pt_knob_int("PT_PLAN_STATS"))
        fprintf(stderr,
                "plan: %ld families, %ld valid, %ld evaluated, %ld fit, %ld simulated, %ld "
                "memory calls (%.2f s); families %.2f s, evaluation %.2f s, all %.2f s\n",
                w.nfam, s->n_valid, s->n_eval, s->n_fitting, s->n_sim, s->n_mem, s->mem_s,
                (double)(t_phase1 - t_start) / 1e9, (double)(t_phase2 - t_phase1) / 1e9,
                (double)(pt_time_ns() - t_start) / 1e9);
    if (st != PT_OK) goto done;
    if (w.nfam == 0 || (s->n_fit == 0 && s->n_rej == 0 && s->n_eval > 0)) {
        st = pt_plan_space_error(&s->sp);
    } else if (s->n_fit == 0 && s->n_rej > 0) {
        char lname[PT_PLAN_NAME_MAX];
        pt_plan_layout_name(&s->rej[0].layout, lname, sizeof lname);
        st = pt_error_set(PT_ERR_INVALID, "fits on no layout of %d ranks: the smallest (%s) %s",
                          world, lname, s->rej[0].reason);
    } else if (s->n_fit == 0) {
        st = pt_error_set(PT_ERR_INVALID,
                          "no layout of %d ranks has a finite predicted step (%ld valid)", world,
                          s->n_valid);
    }
done:
    free(w.fam);
    free(w.pool);
    pt_plan_search_free(s);
    free(scratch);
    return st;
}

int pt_plan_entry_finite(const pt_plan_entry *e) {
    const pt_plan_mem_rank *m = &e->mem;
    const pt_plan_time *t = &e->time;
    double v[] = {m->slack,     m->total,     m->save,      t->step_s,       t->compute_s,
                  t->bubble_s,  t->optim_s,   t->bubble,    t->tokens_per_s, t->mfu,
                  t->comm_s[0], t->comm_s[1], t->comm_s[2], t->comm_s[3]};
    int ok = 1;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) ok &= isfinite(v[i]) != 0;
    for (int k = 0; k < PT_MEM_NCAT; k++) ok &= isfinite(m->cat[k]) != 0;
    return ok;
}

void pt_plan_result_free(pt_plan_result *r) {
    if (!r) return;
    free(r->entry);
    memset(r, 0, sizeof *r);
}
