/* Bucketed gradient synchronization. Buckets are slices of the flat gradient
 * buffer, cut from the END (the head's region) toward the start (and always
 * at the embedding's boundary), because
 * backward finishes modules in reverse order: a bucket is complete once the
 * module holding its LOWEST element has finished backward (the tied wte
 * gradient lives in module 0's region, so it is final only after the
 * embedding, even though the head writes into it first). A module larger
 * than the bucket size is split over several buckets; small modules share
 * one. Launch order is the bucket order on every rank (comm.h's ordering
 * contract).
 *
 * A slot is one round of in-flight all-reduces with its own buffer (or the
 * model's gradients, in place). Staleness k uses k+1 slots: step t's round
 * runs while step t+1 computes into the model's gradients.
 *
 * comm.grad_dtype = bf16 (pt_ddp_options.bf16): a bucket's sum travels in
 * bf16, on point-to-point: each rank rounds its gradient to bf16 and sends
 * every other rank its share of the bucket (pt_comm_shard's), sums the
 * shares it receives of its own part in fp32 in rank order, rounds the sum
 * to bf16 and sends it to every other rank: 4 n (p-1)/p bytes a rank, half
 * the fp32 ring's 8 n (p-1)/p, and the same bf16 sum on every rank. It runs
 * at the bucket's launch and blocks (no overlap with the backward); the
 * gradient norm and the optimizer read the fp32 values of those sums.
 *
 * Not here: averaging (the trainer scales the loss by 1/global tokens, so
 * the SUM is the global mean gradient), clipping, the optimizer. */
#include <stdlib.h>
#include <string.h>

#include "partrain/kernels.h"
#include "partrain/parallel.h"

typedef struct {
    size_t offset, count;
    int ready; /* module after whose backward the bucket is complete */
    char name[24];
} bucket;

typedef struct {
    float *grads;       /* the model's (in place) or owned (PT_MEM_COMM) */
    pt_comm_req **reqs; /* per bucket; NULL when not launched */
    int launched;       /* buckets launched so far */
    int busy;           /* a round is in flight */
    long step;
    uint64_t launch_ns; /* when the last bucket was launched */
    uint64_t bytes16;   /* bf16 sums done, counted at the round's wait as the fp32 ones */
    int buckets16;
} slot;

struct pt_ddp {
    pt_model *m;
    pt_comm *c;
    int nb;
    bucket *b;
    int nslots, in_place;
    slot *slots;
    int active;     /* slot of the open round; -1: none */
    int launch_now; /* the open round launches from pt_ddp_module_done */
    char errmsg[256];
    pt_trace *trace;
    pt_sync_stats stats;
    /* bf16: the rounded bucket (cap) and the shares received (p x share) */
    int bf16;
    pt_bf16 *w16, *r16;
    pt_comm_req **reqs16; /* 2 p */
};

pt_status pt_ddp_new(pt_ddp **out, pt_model *m, pt_comm *c, const pt_ddp_options *opt) {
    *out = NULL;
    if (opt->nslots < 1 || (opt->in_place && opt->nslots != 1))
        return pt_error_set(PT_ERR_INVALID, "ddp: %d slots (in place needs exactly 1)",
                            opt->nslots);
    size_t cap = opt->bucket_bytes / sizeof(float);
    if (cap < 1) cap = 1;
    pt_ddp *d = calloc(1, sizeof *d);
    if (!d) return pt_error_set(PT_ERR_NOMEM, "ddp");
    d->m = m;
    d->c = c;
    d->active = -1;
    d->in_place = opt->in_place;
    d->nslots = opt->nslots;
    d->bf16 = opt->bf16;
    size_t n = pt_model_num_params(m);
    int nmod = pt_model_num_modules(m);
    size_t maxb = n / cap + (size_t)nmod + 1;
    d->b = calloc(maxb, sizeof *d->b);
    d->slots = calloc((size_t)d->nslots, sizeof *d->slots);
    if (!d->b || !d->slots) goto nomem;
    /* cut from the top: the open bucket is [lo, hi) */
    size_t hi = n, lo = n;
    for (int i = nmod - 1; i >= 0; i--) {
        size_t off, cnt;
        pt_model_module_region(m, i, &off, &cnt);
        PT_ASSERT(off + cnt == lo);
        /* The embedding finishes backward LAST (and holds the tied wte), so
         * whatever shares a bucket with it waits for the end of backward:
         * close the open bucket at its boundary, so that only the
         * embedding's own all-reduce is left after backward (measured at
         * dp=2, 1 MiB buckets: exposed 4.4 -> see docs/parallel.md). */
        if (i == 0 && hi > lo) {
            d->b[d->nb++] = (bucket){lo, hi - lo, 1, ""};
            hi = lo;
        }
        while (lo > off) {
            size_t take = cap - (hi - lo);
            if (take > lo - off) take = lo - off;
            lo -= take;
            if (hi - lo == cap) {
                d->b[d->nb++] = (bucket){lo, hi - lo, i, ""};
                hi = lo;
            }
        }
    }
    if (hi > lo) d->b[d->nb++] = (bucket){lo, hi - lo, 0, ""};
    PT_ASSERT((size_t)d->nb <= maxb && lo == 0);
    for (int k = 0; k < d->nb; k++) snprintf(d->b[k].name, sizeof d->b[k].name, "allreduce b%d", k);
    for (int s = 0; s < d->nslots; s++) {
        slot *sl = &d->slots[s];
        sl->reqs = calloc((size_t)d->nb, sizeof *sl->reqs);
        if (!sl->reqs) goto nomem;
        if (d->in_place) {
            sl->grads = pt_model_grads(m);
        } else {
            sl->grads = pt_mem_alloc(PT_MEM_COMM, n * sizeof(float));
            if (!sl->grads) goto nomem;
        }
    }
    if (d->bf16) {
        size_t big = 0, p = (size_t)pt_comm_size(c);
        for (int k = 0; k < d->nb; k++) big = d->b[k].count > big ? d->b[k].count : big;
        size_t share = big / p + 1;
        d->w16 = pt_mem_alloc(PT_MEM_COMM, (big + p * share) * sizeof(pt_bf16));
        d->reqs16 = calloc(2 * p, sizeof *d->reqs16);
        if (!d->w16 || !d->reqs16) goto nomem;
        d->r16 = d->w16 + big;
    }
    *out = d;
    return PT_OK;
nomem:
    pt_ddp_free(d);
    return pt_error_set(PT_ERR_NOMEM, "ddp buckets");
}

void pt_ddp_free(pt_ddp *d) {
    if (!d) return;
    for (int s = 0; d->slots && s < d->nslots; s++) {
        slot *sl = &d->slots[s];
        for (int k = 0; sl->reqs && k < d->nb; k++)
            if (sl->reqs[k]) pt_comm_wait(sl->reqs[k]);
        if (!d->in_place) pt_mem_free(sl->grads);
        free(sl->reqs);
    }
    pt_mem_free(d->w16);
    free(d->reqs16);
    free(d->slots);
    free(d->b);
    free(d);
}

int pt_ddp_num_buckets(const pt_ddp *d) {
    return d->nb;
}

void pt_ddp_bucket(const pt_ddp *d, int i, size_t *offset, size_t *count, int *ready_module) {
    PT_ASSERT(i >= 0 && i < d->nb);
    *offset = d->b[i].offset;
    *count = d->b[i].count;
    if (ready_module) *ready_module = d->b[i].ready;
}

float *pt_ddp_slot_grads(pt_ddp *d, int s) {
    PT_ASSERT(s >= 0 && s < d->nslots);
    return d->slots[s].grads;
}

int pt_ddp_slot_busy(const pt_ddp *d, int s) {
    PT_ASSERT(s >= 0 && s < d->nslots);
    return d->slots[s].busy;
}

void pt_ddp_set_trace(pt_ddp *d, pt_trace *t) {
    d->trace = t;
}

void pt_ddp_take_stats(pt_ddp *d, pt_sync_stats *out) {
    *out = d->stats;
    memset(&d->stats, 0, sizeof d->stats);
}

void pt_ddp_begin(pt_ddp *d, int s, int launch, long step) {
    PT_ASSERT(s >= 0 && s < d->nslots && !d->slots[s].busy && d->active < 0);
    slot *sl = &d->slots[s];
    sl->busy = 1;
    sl->launched = 0;
    sl->step = step;
    d->active = s;
    d->launch_now = launch;
}

static float f32_of(pt_bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Post the receives, then the sends, then wait for all: reqs (2 p). */
static pt_status exchange(pt_comm *c, pt_comm_req **reqs, int phase, pt_bf16 *w16, pt_bf16 *r16,
                          size_t n, size_t share) {
    int p = pt_comm_size(c), me = pt_comm_rank(c), nr = 0;
    size_t off, cnt, moff, mcnt;
    pt_comm_shard(n, p, me, &moff, &mcnt);
    pt_status st = PT_OK;
    /* one tag a phase: each exchange completes before the next starts, and
     * a pair's messages of one tag arrive in order (MPI bounds tags at
     * 32767, so not one a bucket) */
    int tag = 0x5b16 + phase;
    for (int q = 0; q < p && st == PT_OK; q++) {
        if (q == me) continue;
        pt_comm_shard(n, p, q, &off, &cnt);
        /* phase 0: q's share of my part; phase 1: q's part of the sum */
        void *dst = phase == 0 ? (void *)(r16 + (size_t)q * share) : (void *)(w16 + off);
        size_t bytes = (phase == 0 ? mcnt : cnt) * sizeof(pt_bf16);
        if ((st = pt_comm_irecv(c, dst, bytes, q, tag, &reqs[nr])) == PT_OK) nr++;
    }
    for (int q = 0; q < p && st == PT_OK; q++) {
        if (q == me) continue;
        pt_comm_shard(n, p, q, &off, &cnt);
        const void *src = phase == 0 ? (const void *)(w16 + off) : (const void *)(w16 + moff);
        size_t bytes = (phase == 0 ? cnt : mcnt) * sizeof(pt_bf16);
        if ((st = pt_comm_isend(c, src, bytes, q, tag, &reqs[nr])) == PT_OK) nr++;
    }
    for (int i = 0; i < nr; i++) {
        pt_status e = pt_comm_wait(reqs[i]);
        if (st == PT_OK) st = e;
    }
    return st;
}

/* g (n) = the sum over the ranks of bf16(g), in fp32 then rounded to bf16
 * (the file's opening comment); blocking. */
static pt_status allreduce_bf16(pt_ddp *d, float *g, size_t n) {
    pt_comm *c = d->c;
    int p = pt_comm_size(c), me = pt_comm_rank(c);
    size_t share = n / (size_t)p + 1, moff, mcnt;
    pt_comm_shard(n, p, me, &moff, &mcnt);
    pt_comm_req **reqs = d->reqs16;
    pt_bf16_from_f32(d->w16, g, n);
    PT_CHECK(exchange(c, reqs, 0, d->w16, d->r16, n, share));
    memcpy(d->r16 + (size_t)me * share, d->w16 + moff, mcnt * sizeof(pt_bf16));
    for (size_t i = 0; i < mcnt; i++) { /* my part of the sum, in rank order */
        float sum = 0.0f;
        for (int q = 0; q < p; q++) sum += f32_of(d->r16[(size_t)q * share + i]);
        g[moff + i] = sum;
    }
    pt_bf16_from_f32(d->w16 + moff, g + moff, mcnt);
    PT_CHECK(exchange(c, reqs, 1, d->w16, d->r16, n, share));
    pt_bf16_to_f32(g, d->w16, n);
    return PT_OK;
}

static pt_status launch(pt_ddp *d, slot *sl) {
    int k = sl->launched++;
    if (k == d->nb - 1) sl->launch_ns = pt_time_ns();
    const bucket *b = &d->b[k];
    const float *g = pt_model_grads(d->m);
    if (!d->in_place) memcpy(sl->grads + b->offset, g + b->offset, b->count * sizeof(float));
    pt_status st;
    if (d->bf16) {
        sl->reqs[k] = NULL; /* done when it returns */
        uint64_t a = pt_time_ns();
        st = allreduce_bf16(d, sl->grads + b->offset, b->count);
        uint64_t p = (uint64_t)pt_comm_size(d->c);
        sl->bytes16 += 4 * (p - 1) * b->count / p; /* half an fp32 all-reduce's */
        sl->buckets16++;
        uint64_t z = pt_time_ns();
        d->stats.comm_ns += z - a;
        if (z > d->stats.end_ns) d->stats.end_ns = z;
        pt_trace_add(d->trace, b->name, "comm", PT_TRACE_COMM, a, z, sl->step);
    } else {
        st = pt_comm_iallreduce(d->c, sl->grads + b->offset, b->count, PT_REDUCE_SUM, &sl->reqs[k]);
    }
    if (st != PT_OK) {
        sl->reqs[k] = NULL;
        char msg[256];
        snprintf(msg, sizeof msg, "%s", pt_error_message());
        return pt_error_set(st, "gradient all-reduce: %s", msg);
    }
    return PT_OK;
}

pt_status pt_ddp_module_done(pt_ddp *d, int module) {
    if (d->active < 0 || !d->launch_now) return PT_OK;
    slot *sl = &d->slots[d->active];
    while (sl->launched < d->nb && d->b[sl->launched].ready >= module) PT_CHECK(launch(d, sl));
    return PT_OK;
}

pt_status pt_ddp_launch_all(pt_ddp *d) {
    if (d->active < 0) return PT_OK;
    slot *sl = &d->slots[d->active];
    d->active = -1;
    while (sl->launched < d->nb) PT_CHECK(launch(d, sl));
    return PT_OK;
}

pt_status pt_ddp_wait(pt_ddp *d, int s) {
    PT_ASSERT(s >= 0 && s < d->nslots);
    if (d->active == s) PT_CHECK(pt_ddp_launch_all(d));
    slot *sl = &d->slots[s];
    if (!sl->busy) return PT_OK;
    pt_status st = PT_OK;
    uint64_t w0 = pt_time_ns();
    d->stats.bytes += sl->bytes16;
    d->stats.buckets += sl->buckets16;
    sl->bytes16 = 0;
    sl->buckets16 = 0;
    for (int k = 0; k < d->nb; k++) {
        if (!sl->reqs[k]) continue;
        uint64_t a = 0, z = 0;
        pt_status e = pt_comm_wait_timed(sl->reqs[k], &a, &z);
        sl->reqs[k] = NULL;
        if (e != PT_OK) {
            if (st == PT_OK) {
                st = e;
                snprintf(d->errmsg, sizeof d->errmsg, "%s", pt_error_message());
            }
            continue;
        }
        d->stats.comm_ns += z - a;
        if (z > d->stats.end_ns) d->stats.end_ns = z;
        uint64_t p = (uint64_t)pt_comm_size(d->c), b = d->b[k].count * sizeof(float);
        d->stats.bytes += 2 * (p - 1) * b / p; /* as pt_comm_stats counts an all-reduce */
        d->stats.buckets++;
        pt_trace_add(d->trace, d->b[k].name, "comm", PT_TRACE_COMM, a, z, sl->step);
    }
    uint64_t w1 = pt_time_ns();
    d->stats.exposed_ns += w1 - w0;
    d->stats.wait_start_ns = w0;
    d->stats.wait_end_ns = w1;
    d->stats.launch_ns = sl->launch_ns;
    pt_trace_add(d->trace, "wait grads", "wait", PT_TRACE_MAIN, w0, w1, sl->step);
    sl->busy = 0;
    if (st != PT_OK) return pt_error_set(st, "gradient all-reduce: %s", d->errmsg);
    return PT_OK;
}
