/* Sharded data parallel: ZeRO stages 1, 2 and 3 (FSDP) and hybrid sharding
 * (parallel.h). The unit of sharding is a MODULE's region of the flat
 * buffers: rank r of the shard group owns pt_comm_shard(count, g, r) of
 * every module, so each in-place reduce-scatter / all-gather covers exactly
 * one module (an FSDP unit) and a rank's shard is one slice per module, each
 * with its own AdamW state.
 *
 * Buffers by stage (n parameters, g ranks in the shard group):
 *   1: the model's flat params and grads (n each); moments 2n/g.
 *   2: flat params (n); the flat gradient buffer is DROPPED: each module
 *      accumulates into a pool buffer of its own size (model.h's module
 *      redirection), reduce-scattered after its backward and returned to
 *      the pool; the rank keeps its gradient slices (n/g) across
 *      micro-batches. In flight at once: the embedding's (it also takes the
 *      tied head's wte gradient, so it lives through the whole backward),
 *      the module computing and the one reduce-scattering.
 *   3: flat params dropped too: the rank keeps its parameter slices (n/g);
 *      a module's parameters are all-gathered into a pool buffer just before
 *      its forward (the next module's all-gather is launched, non-blocking,
 *      first: prefetch) and released right after; again for its backward.
 *      The head reads wte, which the embedding owns: the embedding stays
 *      gathered from its forward through the head's, and is gathered with
 *      the head for the head's backward.
 *      A module kept whole (parallel.zero_whole) is stage 2 inside stage 3:
 *      its full parameters stay resident (PT_MEM_PARAMS, the rank's slice
 *      a view into them, so no pool buffer), its gradients go through the
 *      pool and the reduce-scatter as above, and after the step the
 *      updated slices are all-gathered into the whole copy.
 * The pools are allocated up front for the most buffers the schedule above
 * holds at once, so hooks allocate nothing.
 *
 * Exactness: each element's update is the single-worker AdamW update of the
 * same summed gradient; only float summation order differs (as in plain
 * data parallel). The global norm is the sum of the ranks' partial squares,
 * computed in double and carried through the float all-reduce as hi + lo.
 *
 * Not here: data sharding and loss scaling (trainer), stage 1's all-reduce
 * buckets (pt_ddp). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/parallel.h"

typedef struct {
    float *p;
    size_t n;
    int used;
} poolbuf;

typedef struct {
    size_t off, count; /* the module's region */
    size_t so, sn;     /* this rank's slice, relative to off */
    pt_adamw *opt;     /* NULL when sn == 0 */
    float *pshard;     /* stage 3: parameter slice (PT_MEM_PARAMS; into `whole` when set) */
    float *whole;      /* stage 3, kept whole: the module's parameters (PT_MEM_PARAMS) */
    float *gshard;     /* stage >= 2: summed gradient slice (PT_MEM_GRADS) */
    poolbuf *pbuf;     /* stage 3: gathered parameters, or NULL */
    pt_comm_req *preq; /* all-gather in flight into pbuf */
    poolbuf *gbuf;     /* stage >= 2: working gradients, or NULL */
    pt_comm_req *greq; /* reduce-scatter in flight on gbuf */
} piece;

struct pt_zero {
    pt_model *m;
    pt_comm *group; /* shard group (owned) */
    pt_comm *cross; /* same index across groups (owned; NULL: one group) */
    int stage, g, grank, overlap, keep;
    int gindex;   /* which shard group: dp rank / g (HSDP: 0..dp/g-1) */
    int W, wrank; /* the dp group: its size and this rank's index */
    pt_adamw_hparams hp;
    int np; /* modules: 0 embedding, 1..L blocks, L+1 head */
    piece *p;
    int rs_pending;   /* module whose reduce-scatter is in flight, -1: none */
    poolbuf *pool[2]; /* [0] params, [1] grads; room for np + 4 each */
    int npool[2];
    uint64_t bytes_seen;
    uint64_t hook_wait_ns; /* time the hooks blocked on collectives */
    int per_step;          /* reduce-scatter after a unit's last micro-batch only */
    pt_trace *trace;       /* lent; NULL: none */
    long step;             /* labels trace events */
};

/* st, with "what: " before the message when it failed. */
static pt_status named(pt_status st, const char *what) {
    if (st == PT_OK) return st;
    char msg[256];
    snprintf(msg, sizeof msg, "%s", pt_error_message());
    return pt_error_set(st, "%s: %s", what, msg);
}

/* Wait for *req (freed) and record it: the comm thread's span on the comm
 * track, the time this thread blocked on the main track (when > 1 us). */
static pt_status wait_req(pt_zero *z, pt_comm_req **req, const char *what, int unit) {
    uint64_t a = pt_time_ns(), s = 0, e = 0;
    pt_status st = named(pt_comm_wait_timed(*req, &s, &e), what);
    uint64_t w = pt_time_ns();
    *req = NULL;
    z->hook_wait_ns += w - a;
    if (!z->trace) return st;
    char name[40];
    snprintf(name, sizeof name, "%s m%d", what, unit);
    if (s && e >= s) pt_trace_add(z->trace, name, "comm", PT_TRACE_COMM, s, e, z->step);
    snprintf(name, sizeof name, "wait %s m%d", what, unit);
    if (w - a > 1000) pt_trace_add(z->trace, name, "wait", PT_TRACE_MAIN, a, w, z->step);
    return st;
}

void pt_zero_set_trace(pt_zero *z, pt_trace *t) {
    z->trace = t;
}

void pt_zero_note_step(pt_zero *z, long step) {
    z->step = step;
}

/* ---- pools ---- */

static pt_status pool_add(pt_zero *z, int kind, size_t n, int count) {
    for (int k = 0; k < count; k++) {
        PT_ASSERT(z->npool[kind] < z->np + 4);
        poolbuf *b = &z->pool[kind][z->npool[kind]];
        b->p = pt_mem_alloc(kind ? PT_MEM_GRADS : PT_MEM_PARAMS, n * sizeof(float));
        if (!b->p && n) return pt_error_set(PT_ERR_NOMEM, "zero: unit buffer (%zu floats)", n);
        b->n = n;
        z->npool[kind]++;
    }
    return PT_OK;
}

/* A free buffer of n floats: the pool is sized for the schedule, so none
 * free is our bug. */
static poolbuf *pool_get(pt_zero *z, int kind, size_t n) {
    for (int k = 0; k < z->npool[kind]; k++) {
        poolbuf *b = &z->pool[kind][k];
        if (!b->used && b->n == n) {
            b->used = 1;
            return b;
        }
    }
    PT_ASSERT(!"zero: no free unit buffer of this size");
    return NULL;
}

/* ---- lifecycle ---- */

static void redirect(pt_zero *z, int i);

pt_status pt_zero_new(pt_zero **out, pt_model *m, pt_comm *world, const pt_zero_options *opt,
                      const pt_adamw_hparams *hp) {
    *out = NULL;
    int W = pt_comm_size(world), r = pt_comm_rank(world);
    int g = opt->group > 0 ? opt->group : W;
    if (opt->stage < 1 || opt->stage > 3)
        return pt_error_set(PT_ERR_INVALID, "parallel.zero = %d (1, 2 or 3)", opt->stage);
    if (g > W || W % g != 0)
        return pt_error_set(PT_ERR_INVALID, "parallel.zero_group (%d) must divide parallel.dp (%d)",
                            g, W);
    pt_status st = PT_OK;
    pt_zero *z = calloc(1, sizeof *z);
    if (!z) return pt_error_set(PT_ERR_NOMEM, "zero");
    z->m = m;
    z->stage = opt->stage;
    z->hp = *hp;
    z->g = g;
    z->W = W;
    z->wrank = r;
    z->overlap = opt->overlap;
    z->keep = opt->keep_params;
    z->per_step = opt->per_step;
    z->rs_pending = -1;
    PT_CHECK_GOTO(st, pt_comm_split(world, r / g, r, &z->group), fail);
    if (g < W) PT_CHECK_GOTO(st, pt_comm_split(world, r % g, r, &z->cross), fail);
    z->grank = pt_comm_rank(z->group);
    z->gindex = r / g;
    z->np = pt_model_num_modules(m);
    z->p = calloc((size_t)z->np, sizeof *z->p);
    z->pool[0] = calloc((size_t)z->np + 4, sizeof(poolbuf));
    z->pool[1] = calloc((size_t)z->np + 4, sizeof(poolbuf));
    int ntens = pt_model_num_tensors(m);
    pt_optim_segment *segs = malloc((size_t)ntens * sizeof *segs);
    if (!z->p || !z->pool[0] || !z->pool[1] || !segs) {
        free(segs);
        st = pt_error_set(PT_ERR_NOMEM, "zero tables");
        goto fail;
    }
    const float *flat = pt_model_params(m);
    for (int i = 0; i < z->np; i++) {
        piece *pc = &z->p[i];
        pt_model_module_region(m, i, &pc->off, &pc->count);
        pt_comm_shard(pc->count, g, z->grank, &pc->so, &pc->sn);
        if (z->stage >= 2) {
            pc->gshard = pt_mem_alloc(PT_MEM_GRADS, pc->sn * sizeof(float));
            if (!pc->gshard && pc->sn) st = pt_error_set(PT_ERR_NOMEM, "zero: gradient shard");
        }
        if (st == PT_OK && z->stage >= 3 && opt->whole && opt->whole[i] && pc->count) {
            pc->whole = pt_mem_alloc(PT_MEM_PARAMS, pc->count * sizeof(float));
            if (!pc->whole)
                st = pt_error_set(PT_ERR_NOMEM, "zero: whole module %d (%zu floats)", i, pc->count);
            else
                memcpy(pc->whole, flat + pc->off, pc->count * sizeof(float));
            pc->pshard = pc->whole ? pc->whole + pc->so : NULL;
        } else if (st == PT_OK && z->stage >= 3) {
            pc->pshard = pt_mem_alloc(PT_MEM_PARAMS, pc->sn * sizeof(float));
            if (!pc->pshard && pc->sn)
                st = pt_error_set(PT_ERR_NOMEM, "zero: parameter shard");
            else
                memcpy(pc->pshard, flat + pc->off + pc->so, pc->sn * sizeof(float));
        }
        if (st != PT_OK || !pc->sn) continue;
        /* segments: the tensors intersected with the slice (a cut tensor
         * keeps its decay flag on both sides of the cut) */
        int ns = 0;
        size_t lo = pc->off + pc->so, hi = lo + pc->sn;
        for (int k = 0; k < ntens; k++) {
            const pt_param_info *t = pt_model_tensor(m, k);
            size_t a = t->offset > lo ? t->offset : lo;
            size_t e = t->offset + t->numel < hi ? t->offset + t->numel : hi;
            if (a < e) segs[ns++] = (pt_optim_segment){a - lo, e - a, t->decay};
        }
        st = pt_adamw_new(&pc->opt, pc->sn, segs, ns, hp);
    }
    free(segs);
    if (st != PT_OK) goto fail;
    if (z->stage >= 2) {
        /* unit buffers for the most the schedule holds at once (file comment):
         * per size, the embedding 1, blocks 2 (all with keep_params), head 1;
         * parameters only for the units gathered (not kept whole) */
        int L = z->np - 2;
        size_t emb = z->p[0].count, blk = 0, head = z->p[L + 1].count;
        int nown = 0, ngat = 0; /* blocks held (all, or a pipeline stage's); of them gathered */
        for (int i = 1; i <= L; i++)
            if (z->p[i].count) {
                blk = z->p[i].count;
                nown++;
                ngat += !z->p[i].whole;
            }
        /* a split backward (B and W apart) holds every unit between them */
        int nblk = opt->per_step ? nown : nown < 2 ? nown : 2;
        int pblk = z->keep || opt->per_step ? ngat : ngat < 2 ? ngat : 2;
        PT_CHECK_GOTO(st, pool_add(z, 1, emb, 1), fail);
        PT_CHECK_GOTO(st, pool_add(z, 1, blk, nblk), fail);
        PT_CHECK_GOTO(st, pool_add(z, 1, head, 1), fail);
        if (z->stage >= 3) {
            PT_CHECK_GOTO(st, pool_add(z, 0, emb, !z->p[0].whole), fail);
            PT_CHECK_GOTO(st, pool_add(z, 0, blk, pblk), fail);
            PT_CHECK_GOTO(st, pool_add(z, 0, head, !z->p[L + 1].whole), fail);
        }
        pt_model_drop_flat(m, z->stage >= 3, 1);
        for (int i = 0; i < z->np; i++)
            if (z->p[i].whole) redirect(z, i);
    }
    z->bytes_seen = pt_comm_sent_bytes(z->group) + pt_comm_sent_bytes(z->cross);
    *out = z;
    return PT_OK;
fail:
    pt_zero_free(z);
    return st;
}

void pt_zero_free(pt_zero *z) {
    if (!z) return;
    for (int i = 0; z->p && i < z->np; i++) {
        piece *pc = &z->p[i];
        if (pc->preq) pt_comm_wait(pc->preq);
        if (pc->greq) pt_comm_wait(pc->greq);
        pt_adamw_free(pc->opt);
        pt_mem_free(pc->gshard);
        pt_mem_free(pc->whole ? pc->whole : pc->pshard);
    }
    for (int k = 0; k < 2; k++) {
        for (int j = 0; z->pool[k] && j < z->npool[k]; j++) pt_mem_free(z->pool[k][j].p);
        free(z->pool[k]);
    }
    free(z->p);
    pt_comm_free(z->cross);
    pt_comm_free(z->group);
    free(z);
}

/* ---- stage 3: parameters of a unit ---- */

static void redirect(pt_zero *z, int i) {
    piece *pc = &z->p[i];
    pt_model_set_module_buffers(z->m, i,
                                pc->whole  ? pc->whole
                                : pc->pbuf ? pc->pbuf->p
                                           : NULL,
                                pc->gbuf ? pc->gbuf->p : NULL);
}

/* Launch the all-gather of unit i's parameters (no-op when gathered or
 * gathering). */
static pt_status prefetch(pt_zero *z, int i) {
    piece *pc = &z->p[i];
    /* count 0: a module a pipeline stage does not hold; whole: resident */
    if (z->stage < 3 || pc->pbuf || !pc->count || pc->whole) return PT_OK;
    pc->pbuf = pool_get(z, 0, pc->count);
    memcpy(pc->pbuf->p + pc->so, pc->pshard, pc->sn * sizeof(float));
    redirect(z, i);
    return named(pt_comm_iallgather(z->group, pc->pbuf->p, pc->count, &pc->preq),
                 "parameter all-gather");
}

static pt_status ensure(pt_zero *z, int i) {
    piece *pc = &z->p[i];
    PT_CHECK(prefetch(z, i));
    return pc->preq ? wait_req(z, &pc->preq, "all-gather", i) : PT_OK;
}

static pt_status release(pt_zero *z, int i) {
    piece *pc = &z->p[i];
    if (z->stage < 3 || !pc->pbuf) return PT_OK;
    pt_status st = PT_OK;
    if (pc->preq) st = wait_req(z, &pc->preq, "all-gather", i); /* prefetched, never used */
    pc->pbuf->used = 0;
    pc->pbuf = NULL;
    redirect(z, i);
    return st;
}

pt_status pt_zero_release_params(pt_zero *z) {
    pt_status st = PT_OK;
    for (int i = 0; i < z->np; i++) {
        pt_status e = release(z, i);
        if (st == PT_OK) st = e;
    }
    return st;
}

pt_status pt_zero_before_forward(pt_zero *z, int i) {
    if (z->stage < 3) return PT_OK;
    PT_CHECK(ensure(z, i));
    if (i == z->np - 1) PT_CHECK(ensure(z, 0)); /* the head reads wte */
    return i + 1 < z->np ? prefetch(z, i + 1) : PT_OK;
}

pt_status pt_zero_after_forward(pt_zero *z, int i) {
    if (z->stage < 3 || z->keep) return PT_OK;
    if (i == z->np - 1) return pt_zero_release_params(z); /* the head and the embedding (wte) */
    return i != 0 ? release(z, i) : PT_OK;
}

/* ---- gradients of a unit (stage >= 2) ---- */

static pt_status finish_rs(pt_zero *z, int i);

static pt_status take_grads(pt_zero *z, int i) {
    piece *pc = &z->p[i];
    if (pc->gbuf && z->rs_pending == i) {
        /* still reduce-scattering the previous micro-batch's sum (the
         * embedding's, finished last): collect it before accumulating */
        z->rs_pending = -1;
        PT_CHECK(finish_rs(z, i));
    }
    if (pc->gbuf || !pc->count) return PT_OK;
    pc->gbuf = pool_get(z, 1, pc->count);
    memset(pc->gbuf->p, 0, pc->count * sizeof(float));
    redirect(z, i);
    return PT_OK;
}

/* Wait for unit i's reduce-scatter, add this rank's slice into its shard,
 * return the buffer. */
static pt_status finish_rs(pt_zero *z, int i) {
    piece *pc = &z->p[i];
    if (!pc->gbuf) return PT_OK;
    pt_status st = pc->greq ? wait_req(z, &pc->greq, "reduce-scatter", i) : PT_OK;
    const float *s = pc->gbuf->p + pc->so;
    for (size_t k = 0; st == PT_OK && k < pc->sn; k++) pc->gshard[k] += s[k];
    pc->gbuf->used = 0;
    pc->gbuf = NULL;
    redirect(z, i);
    return st;
}

/* The reduce-scatter in flight, if any, finished. */
static pt_status finish_pending(pt_zero *z) {
    int i = z->rs_pending;
    z->rs_pending = -1;
    return i >= 0 ? finish_rs(z, i) : PT_OK;
}

pt_status pt_zero_before_backward(pt_zero *z, int i) {
    if (z->stage < 2) return PT_OK;
    int head = i == z->np - 1;
    PT_CHECK(ensure(z, i));
    if (head) PT_CHECK(ensure(z, 0));
    PT_CHECK(take_grads(z, i));
    if (head) PT_CHECK(take_grads(z, 0)); /* the head accumulates into wte */
    return i > 0 ? prefetch(z, i - 1) : PT_OK;
}

pt_status pt_zero_module_done(pt_zero *z, int i, int last) {
    if (z->stage < 2) return PT_OK;
    piece *pc = &z->p[i];
    if (i == z->np - 1) PT_CHECK(release(z, 0));
    PT_CHECK(release(z, i));
    if (!pc->count || (z->per_step && !last)) return PT_OK;
    /* one reduce-scatter in flight: finish the previous one first */
    PT_CHECK(finish_pending(z));
    PT_CHECK(
        named(pt_comm_ireduce_scatter(z->group, pc->gbuf->p, pc->count, PT_REDUCE_SUM, &pc->greq),
              "gradient reduce-scatter"));
    z->rs_pending = i;
    return z->overlap ? PT_OK : finish_pending(z);
}

/* ---- the optimizer step ---- */

static float *pslice(pt_zero *z, int i) {
    piece *pc = &z->p[i];
    return z->stage >= 3 ? pc->pshard : pt_model_params(z->m) + pc->off + pc->so;
}
static float *gslice(pt_zero *z, int i) {
    piece *pc = &z->p[i];
    return z->stage >= 2 ? pc->gshard : pt_model_grads(z->m) + pc->off + pc->so;
}

/* Wait for every unit's step collective (params: the all-gathers, else the
 * gradient ones); the first error, st's when set. */
static pt_status wait_all(pt_zero *z, int params, pt_status st) {
    for (int i = 0; i < z->np; i++) {
        pt_comm_req **req = params ? &z->p[i].preq : &z->p[i].greq;
        if (!*req) continue;
        pt_status e = pt_comm_wait(*req);
        *req = NULL;
        if (st == PT_OK) st = e;
    }
    return st;
}

pt_status pt_zero_step(pt_zero *z, pt_update *u) {
    pt_status st = PT_OK;
    PT_CHECK(finish_pending(z));
    /* HSDP: stages 2 and 3 reduce-scattered inside the group only, so the
     * group's sums are summed across groups here. Stage 1's buckets are
     * all-reduced over the WORLD by the trainer's pt_ddp: its gradients are
     * already the global sum, and summing them again across groups would
     * multiply them by the number of groups (the bug of issue 10, item 2). */
    if (z->cross && z->stage >= 2) {
        /* every reduce-scatter is finished: greq is free to carry these */
        for (int i = 0; i < z->np && st == PT_OK; i++)
            if (z->p[i].sn)
                st = pt_comm_iallreduce(z->cross, gslice(z, i), z->p[i].sn, PT_REDUCE_SUM,
                                        &z->p[i].greq);
        st = wait_all(z, 0, st);
        if (st != PT_OK) return pt_error_set(st, "gradient all-reduce across groups");
    }
    /* global norm: partial squares of the slices, summed over the group */
    double total;
    if (u->reduce_norm) { /* and then over the tp group and the stages (the stack's) */
        double parts[2] = {0, 0}, q[2];
        for (int i = 0; i < z->np; i++) {
            pt_grad_sumsq_parts(z->m, gslice(z, i), z->p[i].off + z->p[i].so, z->p[i].sn, q);
            parts[0] += q[0];
            parts[1] += q[1];
        }
        PT_CHECK(pt_grad_parts_sum(z->group, parts));
        PT_CHECK(u->reduce_norm(u->norm_arg, parts, &total));
    } else {
        double part = 0;
        for (int i = 0; i < z->np; i++) part += pt_optim_grad_sumsq(gslice(z, i), z->p[i].sn);
        float hl[2];
        hl[0] = (float)part;
        hl[1] = (float)(part - (double)hl[0]);
        PT_CHECK(pt_comm_allreduce(z->group, hl, 2, PT_REDUCE_SUM));
        total = (double)hl[0] + (double)hl[1];
    }
    float scale = pt_optim_clip_scale(total, u->clip);
    for (int i = 0; i < z->np; i++)
        if (z->p[i].opt) pt_adamw_step(z->p[i].opt, pslice(z, i), gslice(z, i), u->lr, scale);
    if (z->stage >= 2)
        for (int i = 0; i < z->np; i++) memset(z->p[i].gshard, 0, z->p[i].sn * sizeof(float));
    if (z->stage >= 3) PT_CHECK(pt_zero_release_params(z)); /* kept ones are stale now */
    /* stages 1 and 2, and stage 3's whole modules: everyone's updated
     * slices to everyone */
    float *params = pt_model_params(z->m);
    for (int i = 0; i < z->np && st == PT_OK; i++) {
        if (z->stage >= 3 && !z->p[i].whole) continue;
        float *dst = z->stage >= 3 ? z->p[i].whole : params + z->p[i].off;
        st = pt_comm_iallgather(z->group, dst, z->p[i].count, &z->p[i].preq);
    }
    st = wait_all(z, 1, st);
    if (st != PT_OK) return pt_error_set(st, "parameter all-gather");
    u->norm = (float)sqrt(total);
    return PT_OK;
}

uint64_t pt_zero_take_wait_ns(pt_zero *z) {
    uint64_t w = z->hook_wait_ns;
    z->hook_wait_ns = 0;
    return w;
}

void pt_zero_counts(const pt_zero *z, pt_comm_counts *k) {
    pt_comm_counts_add(k, PT_GROUP_ZERO, z->group);
    pt_comm_counts_add(k, PT_GROUP_ZERO, z->cross);
}

uint64_t pt_zero_take_bytes(pt_zero *z) {
    uint64_t now = pt_comm_sent_bytes(z->group) + pt_comm_sent_bytes(z->cross);
    uint64_t d = now - z->bytes_seen;
    z->bytes_seen = now;
    return d;
}

/* ---- checkpoints ---- */

pt_status pt_zero_gather_params(pt_zero *z, float *full) {
    if (z->stage < 3) {
        memcpy(full, pt_model_params(z->m), pt_model_num_params(z->m) * sizeof(float));
        return PT_OK;
    }
    for (int i = 0; i < z->np; i++) {
        piece *pc = &z->p[i];
        memcpy(full + pc->off + pc->so, pslice(z, i), pc->sn * sizeof(float));
    }
    for (int i = 0; i < z->np; i++)
        PT_CHECK(pt_comm_allgather(z->group, full + z->p[i].off, z->p[i].count));
    return PT_OK;
}

/* Per module, in the order params, m, v: what this rank holds. Parameters
 * that every rank holds whole (stages 1, 2, a module kept whole) are
 * written a part per dp rank; shards (stage 3's parameters, every stage's
 * moments) by their holder, spread over HSDP's groups, which hold copies. */
pt_status pt_zero_state(pt_zero *z, pt_state_visit *v) {
    if (v->mode == PT_STATE_RESTART) return PT_OK;
    if (v->mode == PT_STATE_LOAD) PT_CHECK(pt_zero_release_params(z));
    for (int i = 0; i < z->np; i++) {
        pt_adamw *o = z->p[i].opt;
        if (!o) continue;
        if (v->mode == PT_STATE_LOAD)
            pt_adamw_set_t(o, v->optim_t);
        else
            v->optim_t = pt_adamw_t(o);
    }
    static const char *const names[] = {"params", "optim_m", "optim_v"};
    int ngroups = z->W / z->g;
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < z->np; i++) {
            piece *pc = &z->p[i];
            pt_state_region r = {names[k], -1, pc->off + pc->so, pc->sn, NULL, z->gindex, ngroups};
            if (k == 0 && (z->stage < 3 || pc->whole)) { /* whole on every rank */
                r = (pt_state_region){names[k], -1, pc->off, pc->count, NULL, z->wrank, z->W};
                r.data = pc->whole ? pc->whole : pt_model_params(z->m) + pc->off;
            } else if (k == 0) {
                r.data = pc->pshard;
            } else if (pc->opt) {
                r.data = k == 1 ? pt_adamw_m(pc->opt) : pt_adamw_v(pc->opt);
            }
            if (r.data && r.n) PT_CHECK(v->region(v, &r));
        }
    return PT_OK;
}

size_t pt_zero_optim_bytes(const pt_zero *z) {
    size_t b = 0;
    for (int i = 0; i < z->np; i++)
        b += (size_t)pt_optim_state_count(&z->hp) * z->p[i].sn * sizeof(float);
    return b;
}
