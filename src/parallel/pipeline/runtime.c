/* The executor (pipeline.h, pt_pipeline): every step, at every layout, is
 * a schedule run here -- this rank's list of F, BW, or B and W passes of
 * each micro-batch and chunk (pt_schedule), over its chunks' modules in
 * activation blocks of its own. With one stage (pp = 1) the model is one
 * chunk and nothing is sent; with several each chunk receives its input
 * from the rank that holds the virtual stage below and its output gradient
 * from the one above, and sends its own onward, all by non-blocking
 * point-to-point. The strategies act at the model's hook points (the
 * trainer installs the stack there); the executor knows none of them.
 *
 * Communicators: splits of the pp group, one per (message kind, receiving
 * chunk), so that on each one a rank sends to ONE rank and receives from
 * ONE, in increasing micro-batch order at both ends (a chunk's forwards and
 * backwards run in that order in every schedule): a send that waits for
 * its receiver then holds up only messages the receiver takes after it. (By
 * direction instead, interleaving at p 2 deadlocked under MPI: rank 1's
 * gradient for chunk 1 waited in its lane ahead of the one for chunk 0 that
 * rank 0 needed first.)
 *
 * Buffers: BLOCKS of memory, each one micro-batch of a chunk (its slot:
 * pt_model_slot_new_range_in, its received output gradient dy, its sent
 * input gradient dx). Shared: as many as the micro-batches the schedule
 * holds at once over all of a rank's chunks, each as large as the largest
 * chunk's, and every chunk has a view of every block, so that the memory
 * is the schedule's count whichever chunk each micro-batch is in. Or each
 * chunk's own, as many as it holds at once, each its own size, where that
 * is less (chunks of unequal size: ZB-V's first chunk holds 3 micro-batches
 * where its second holds 1). A block's sends complete before it is
 * reused. Under a split backward, SETS of deferred scratch (one per module
 * of a chunk: what a W reads after its B that its context cannot hold), as
 * many as the list has W's pending at once: a B takes one, its W frees it.
 *
 * Not here: the schedules' lists (schedule.c and this folder's generators),
 * the stage cut (stages.c), the tied embedding (tied.c), the update after
 * the passes (the strategy stack). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/parallel.h"

enum { K_ACT, K_GRAD, K_NKIND };

/* A chunk: its modules and neighbours, and a view of every block it may
 * use (its slot, dy and dx carved from the block's memory; NULL for a block
 * of another chunk's own). */
typedef struct {
    int first, last;            /* modules */
    int g;                      /* virtual stage */
    int prev, next;             /* pp-group ranks of virtual stages g - 1, g + 1 (-1: none) */
    int prev_chunk, next_chunk; /* their chunks there */
    int chunk;                  /* this chunk's index on this rank */
    pt_model_slot **slot;       /* per block */
    float **dy, **dx;           /* per block (NULL where the chunk has no such neighbour) */
    int *slot_of;               /* per micro-batch: the block holding it, -1 */
} chunk;

struct pt_pipeline {
    pt_model *m;
    int p, r, v, M, L;
    int split;
    const pt_schedule *sched;                     /* lent */
    pt_comm *c[K_NKIND][PT_SCHEDULE_MAX_VIRTUAL]; /* by kind and the receiving chunk */
    chunk ch[PT_SCHEDULE_MAX_VIRTUAL];
    int nblocks;
    float *mem;                          /* the blocks, PT_MEM_ACTS */
    size_t *blk_off;                     /* per block: its first float in mem */
    int *blk_chunk;                      /* per block: the chunk it serves, -1 any */
    int *owner;                          /* per block: chunk x M + micro-batch held, -1 free */
    pt_comm_req **send_act, **send_grad; /* per block, in flight */
    pt_comm_req **recv_grad;             /* per block: its dy, posted at its forward */
    size_t *nfl;                         /* per block: floats of its micro-batch's stream */
    pt_module_scratch **scratch;         /* split: nsets sets of nscr */
    int nscr;                            /* modules of the largest chunk */
    int nsets;                           /* the list's most W's pending at once */
    int *set_of;                         /* per block: its pending W's set, -1 none */
    int *set_busy;                       /* per set */
    size_t rc;                           /* floats of one stream buffer (rows x C) */
    int tp, C; /* rows of a micro-batch's stream: B T / tp (sequence parallelism) */
    int head_here, head_stage;
    pt_trace *trace;
    /* the last step's waits for neighbours, and the span of its passes */
    uint64_t wait_ns, span0, span1;
    uint64_t first_ns, last_ns; /* the step's first pass's work began, its last's ended */
    uint64_t compute_ns;        /* when the current pass's work began (its wait done) */
    uint64_t busy_ns;           /* the step's passes' work */
};

/* st, with "pipeline what: " before the message when it failed. */
static pt_status named(pt_status st, const char *what) {
    if (st == PT_OK) return st;
    char msg[256];
    snprintf(msg, sizeof msg, "%s", pt_error_message());
    return pt_error_set(st, "pipeline %s: %s", what, msg);
}

static int tag_of(int g_dest, int mb) {
    return 64 + g_dest * PT_SCHEDULE_MAX_MICRO + mb;
}

/* Wait for req (freed); waiting for a neighbour counts as such. */
static pt_status wait_req(pt_pipeline *q, pt_comm_req **req, const char *what, int neighbour) {
    if (!*req) return PT_OK;
    uint64_t a = pt_time_ns();
    pt_status st = pt_comm_wait(*req);
    *req = NULL;
    if (neighbour) q->wait_ns += pt_time_ns() - a;
    return named(st, what);
}

/* Every request of the blocks complete (a failed step's receives too): the
 * first error. */
static pt_status drain(pt_pipeline *q) {
    pt_status st = PT_OK;
    for (int k = 0; k < q->nblocks; k++) {
        pt_comm_req **r[3] = {&q->send_act[k], &q->send_grad[k], &q->recv_grad[k]};
        for (int j = 0; j < 3; j++) {
            pt_status e = wait_req(q, r[j], j == 2 ? "receive of gradients" : "send", 0);
            if (st == PT_OK) st = e;
        }
    }
    return st;
}

void pt_pipeline_free(pt_pipeline *q) {
    if (!q) return;
    if (q->send_act && q->send_grad && q->recv_grad) drain(q);
    for (int c = 0; c < q->v; c++) {
        chunk *h = &q->ch[c];
        for (int k = 0; h->slot && k < q->nblocks; k++) pt_model_slot_free(h->slot[k]);
        free(h->slot);
        free(h->dy);
        free(h->dx);
        free(h->slot_of);
    }
    if (q->scratch)
        for (int k = 0; k < q->nsets * q->nscr; k++) pt_module_scratch_free(q->scratch[k]);
    free(q->scratch);
    free(q->set_of);
    free(q->set_busy);
    pt_mem_free(q->mem);
    free(q->blk_off);
    free(q->blk_chunk);
    free(q->owner);
    free(q->send_act);
    free(q->send_grad);
    free(q->recv_grad);
    free(q->nfl);
    for (int k = 0; k < K_NKIND; k++)
        for (int d = 0; d < PT_SCHEDULE_MAX_VIRTUAL; d++) pt_comm_free(q->c[k][d]);
    free(q);
}

/* The chunks' modules and neighbours, and each one's floats per block
 * (fl[c]: its slot, dy unless it ends with the head, dx unless it starts
 * with the embedding). */
static void place_chunks(pt_pipeline *q, const pt_stage *stages, size_t *fl) {
    const pt_schedule *s = q->sched;
    int G = q->p * q->v;
    for (int c = 0; c < q->v; c++) {
        chunk *h = &q->ch[c];
        h->g = pt_schedule_virtual_stage(s, c);
        h->chunk = c;
        h->first = stages[h->g].first;
        h->last = stages[h->g].last;
        h->prev = h->g > 0 ? pt_schedule_locate(s->name, q->p, q->v, h->g - 1, &h->prev_chunk) : -1;
        h->next =
            h->g < G - 1 ? pt_schedule_locate(s->name, q->p, q->v, h->g + 1, &h->next_chunk) : -1;
        fl[c] = pt_pipeline_block_floats(q->m, h->first, h->last, pt_model_max_batch(q->m));
        if (h->last - h->first + 1 > q->nscr) q->nscr = h->last - h->first + 1;
    }
    int c0;
    q->head_stage = pt_schedule_locate(s->name, q->p, q->v, G - 1, &c0);
    q->head_here = q->head_stage == q->r;
}

static pt_status alloc_tables(pt_pipeline *q, size_t total) {
    for (int c = 0; c < q->v; c++) {
        chunk *h = &q->ch[c];
        h->slot = calloc((size_t)q->nblocks, sizeof *h->slot);
        h->dy = calloc((size_t)q->nblocks, sizeof *h->dy);
        h->dx = calloc((size_t)q->nblocks, sizeof *h->dx);
        h->slot_of = malloc((size_t)q->M * sizeof *h->slot_of);
        if (!h->slot || !h->dy || !h->dx || !h->slot_of)
            return pt_error_set(PT_ERR_NOMEM, "pipeline slots");
        for (int mb = 0; mb < q->M; mb++) h->slot_of[mb] = -1;
    }
    size_t nb = (size_t)q->nblocks;
    q->blk_off = malloc(nb * sizeof *q->blk_off);
    q->blk_chunk = malloc(nb * sizeof *q->blk_chunk);
    q->owner = malloc(nb * sizeof *q->owner);
    q->send_act = calloc(nb, sizeof *q->send_act);
    q->send_grad = calloc(nb, sizeof *q->send_grad);
    q->recv_grad = calloc(nb, sizeof *q->recv_grad);
    q->nfl = calloc(nb, sizeof *q->nfl);
    q->nsets = q->split ? pt_schedule_pending_w(q->sched) : 0;
    if (q->split) {
        q->scratch = calloc((size_t)(q->nsets * q->nscr), sizeof *q->scratch);
        q->set_of = malloc(nb * sizeof *q->set_of);
        q->set_busy = calloc((size_t)q->nsets, sizeof *q->set_busy);
    }
    q->mem = pt_mem_alloc(PT_MEM_ACTS, total * sizeof(float));
    if (!q->blk_off || !q->blk_chunk || !q->owner || !q->send_act || !q->send_grad ||
        !q->recv_grad || !q->nfl || (q->split && (!q->scratch || !q->set_of || !q->set_busy)) ||
        !q->mem)
        return pt_error_set(PT_ERR_NOMEM, "pipeline activations (%d blocks, %zu bytes)", q->nblocks,
                            total * sizeof(float));
    return PT_OK;
}

/* Carve the blocks: their offsets, and every chunk's views of each. */
static pt_status carve(pt_pipeline *q, const size_t *fl, int per_chunk, size_t total) {
    const pt_schedule *s = q->sched;
    for (int k = 0, c = 0, in_c = 0; k < q->nblocks; k++) {
        if (per_chunk) {
            while (in_c == s->chunk_in_flight[c]) c++, in_c = 0;
            q->blk_chunk[k] = c;
            in_c++;
        } else {
            q->blk_chunk[k] = -1;
        }
        /* shared blocks: each the largest chunk's (total / nblocks) */
        size_t prev = k && per_chunk ? fl[q->blk_chunk[k - 1]] : total / (size_t)q->nblocks;
        q->blk_off[k] = k ? q->blk_off[k - 1] + prev : 0;
    }
    /* a zero-bubble W reads what its B left: module j's scratch of a set,
     * sized for the kinds of module j of the chunks */
    for (int k = 0; k < q->nsets; k++)
        for (int j = 0; j < q->nscr; j++) {
            unsigned kinds = 0;
            for (int c = 0; c < q->v; c++)
                if (q->ch[c].first + j <= q->ch[c].last)
                    kinds |= 1u << pt_model_module_kind(q->m, q->ch[c].first + j);
            PT_CHECK(pt_module_scratch_new_deferred(&q->scratch[k * q->nscr + j], q->m,
                                                    pt_model_max_batch(q->m), kinds));
        }
    for (int k = 0; k < q->nblocks; k++) {
        q->owner[k] = -1;
        if (q->split) q->set_of[k] = -1;
        float *blk = q->mem + q->blk_off[k];
        for (int c = 0; c < q->v; c++) {
            chunk *h = &q->ch[c];
            if (q->blk_chunk[k] >= 0 && q->blk_chunk[k] != c) continue;
            PT_CHECK(pt_model_slot_new_range_in(&h->slot[k], q->m, h->first, h->last, blk));
            float *b = blk + pt_model_slot_bytes(q->m, h->first, h->last) / sizeof(float);
            if (h->last <= q->L) h->dy[k] = b, b += q->rc;
            if (h->first > 0) h->dx[k] = b;
        }
    }
    return PT_OK;
}

pt_status pt_pipeline_new(pt_pipeline **out, pt_model *m, const pt_schedule *s,
                          const pt_stage *stages, pt_comm *pp) {
    *out = NULL;
    pt_status st = PT_OK;
    pt_pipeline *q = calloc(1, sizeof *q);
    if (!q) return pt_error_set(PT_ERR_NOMEM, "pipeline");
    *q = (pt_pipeline){.m = m,
                       .p = s->stages,
                       .r = s->stage,
                       .v = s->virtual_stages,
                       .M = s->microbatches,
                       .L = pt_model_config_of(m)->n_layer,
                       .split = s->split,
                       .sched = s};
    PT_ASSERT((q->p > 1) == (pp != NULL));
    /* collective over pp, in the same order on every rank */
    for (int k = 0; pp && k < K_NKIND; k++)
        for (int d = 0; d < q->v; d++)
            PT_CHECK_GOTO(st, pt_comm_split(pp, 0, q->r, &q->c[k][d]), fail);
    int tp = 1, tpr = 0;
    pt_model_tp(m, &tp, &tpr);
    const pt_model_config *cfg = pt_model_config_of(m);
    size_t N = (size_t)pt_model_max_batch(m) * (size_t)cfg->seq_len;
    /* under sequence parallelism the stream is this rank's rows */
    int sp = pt_model_sequence_parallel(m);
    q->rc = (sp ? N / (size_t)tp : N) * (size_t)cfg->n_embd;
    q->tp = sp ? tp : 1;
    q->C = cfg->n_embd;
    size_t fl[PT_SCHEDULE_MAX_VIRTUAL];
    place_chunks(q, stages, fl);
    /* shared blocks, or each chunk's own where that is smaller */
    int per_chunk;
    size_t total =
        pt_schedule_blocks(q->v, s->in_flight, s->chunk_in_flight, fl, &per_chunk, &q->nblocks);
    PT_ASSERT(q->nblocks >= 1);
    PT_CHECK_GOTO(st, alloc_tables(q, total), fail);
    PT_CHECK_GOTO(st, carve(q, fl, per_chunk, total), fail);
    *out = q;
    return PT_OK;
fail:
    pt_pipeline_free(q);
    return st;
}

void pt_pipeline_set_trace(pt_pipeline *q, pt_trace *t) {
    q->trace = t;
}

size_t pt_pipeline_block_floats(const pt_model *m, int first, int last, int max_B) {
    const pt_model_config *cfg = pt_model_config_of(m);
    int tp = 1, r = 0;
    pt_model_tp(m, &tp, &r);
    size_t N = (size_t)max_B * (size_t)cfg->seq_len;
    size_t rc = (pt_model_sequence_parallel(m) ? N / (size_t)tp : N) * (size_t)cfg->n_embd;
    size_t fl = pt_model_slot_bytes_at(m, first, last, max_B) / sizeof(float) +
                (size_t)((last <= cfg->n_layer) + (first > 0)) * rc;
    return (fl + 15) & ~(size_t)15; /* 64-byte aligned blocks */
}

/* ---- the passes ---- */

static pt_status take_slot(pt_pipeline *q, chunk *h, int mb) {
    for (int k = 0; k < q->nblocks; k++)
        if (q->owner[k] < 0 && (q->blk_chunk[k] < 0 || q->blk_chunk[k] == h->chunk)) {
            /* the block's last sends read it */
            PT_CHECK(wait_req(q, &q->send_act[k], "send of activations", 0));
            PT_CHECK(wait_req(q, &q->send_grad[k], "send of gradients", 0));
            q->owner[k] = (int)(h - q->ch) * q->M + mb;
            h->slot_of[mb] = k;
            return PT_OK;
        }
    PT_ASSERT(!"pipeline: more micro-batches in flight than the schedule said");
    return PT_ERR_INTERNAL;
}

static void release_slot(pt_pipeline *q, chunk *h, int mb) {
    int k = h->slot_of[mb];
    q->owner[k] = -1;
    h->slot_of[mb] = -1;
}

/* grads: the micro-batch's backward follows (not validation): its output
 * gradient's receive is posted now, so that the rank above can complete
 * its send whenever it runs its backward, whatever this rank is doing:
 * a send never waits for its receiver's main thread (which might wait for
 * the sender: a deadlock, seen with rendezvous-size messages under MPI). */
static pt_status forward(pt_pipeline *q, chunk *h, const pt_batch *b, double *loss_sum, int grads) {
    PT_CHECK(take_slot(q, h, b->micro));
    int k = h->slot_of[b->micro];
    pt_model_slot *s = h->slot[k];
    q->nfl[k] = (size_t)b->B * (size_t)b->T / (size_t)q->tp * (size_t)q->C;
    size_t bytes = q->nfl[k] * sizeof(float);
    if (h->first > 0) {
        pt_comm_req *req = NULL;
        PT_CHECK(named(pt_comm_irecv(q->c[K_ACT][h->chunk], pt_model_slot_stream(s, h->first - 1),
                                     bytes, h->prev, tag_of(h->g, b->micro), &req),
                       "receive of activations"));
        PT_CHECK(wait_req(q, &req, "receive of activations", 1));
    }
    float loss = 0;
    q->compute_ns = pt_time_ns(); /* the pass's work starts: after its wait */
    PT_CHECK(pt_model_forward_range(q->m, s, b, h->first, h->last, &loss));
    if (grads && h->last <= q->L)
        PT_CHECK(named(pt_comm_irecv(q->c[K_GRAD][h->chunk], h->dy[k], bytes, h->next,
                                     tag_of(h->g, b->micro), &q->recv_grad[k]),
                       "receive of gradients"));
    if (h->last == q->L + 1) {
        *loss_sum += loss;
        return PT_OK;
    }
    return named(pt_comm_isend(q->c[K_ACT][h->next_chunk], pt_model_slot_stream(s, h->last), bytes,
                               h->next, tag_of(h->g + 1, b->micro), &q->send_act[k]),
                 "send of activations");
}

/* The deferred scratch set of block k's micro-batch of chunk h from its B
 * (take) to its W (give back): its contexts' scratch, else the model's. */
static void lend_set(pt_pipeline *q, chunk *h, int k, int take) {
    int set = q->set_of[k];
    if (take) {
        PT_ASSERT(set < 0);
        for (set = 0; set < q->nsets && q->set_busy[set]; set++) continue;
        PT_ASSERT(set < q->nsets); /* pending_w counted them */
    }
    q->set_busy[set] = take;
    q->set_of[k] = take ? set : -1;
    for (int i = h->first; i <= h->last; i++)
        pt_module_ctx_set_scratch(pt_model_slot_ctx(h->slot[k], i),
                                  take ? q->scratch[set * q->nscr + (i - h->first)] : NULL);
}

static pt_status backward(pt_pipeline *q, chunk *h, int mb, int split) {
    int k = h->slot_of[mb];
    PT_ASSERT(k >= 0);
    pt_model_slot *s = h->slot[k];
    if (split) lend_set(q, h, k, 1);
    size_t bytes = q->nfl[k] * sizeof(float);
    if (h->last <= q->L) PT_CHECK(wait_req(q, &q->recv_grad[k], "receive of gradients", 1));
    q->compute_ns = pt_time_ns();
    PT_CHECK(pt_model_backward_range(q->m, s, h->first, h->last, h->last <= q->L ? h->dy[k] : NULL,
                                     h->first > 0 ? h->dx[k] : NULL, split));
    if (h->first > 0)
        PT_CHECK(named(pt_comm_isend(q->c[K_GRAD][h->prev_chunk], h->dx[k], bytes, h->prev,
                                     tag_of(h->g - 1, mb), &q->send_grad[k]),
                       "send of gradients"));
    if (!split) release_slot(q, h, mb);
    return PT_OK;
}

static pt_status weight(pt_pipeline *q, chunk *h, int mb) {
    int k = h->slot_of[mb];
    PT_ASSERT(k >= 0);
    q->compute_ns = pt_time_ns();
    PT_CHECK(pt_model_backward_weight_range(q->m, h->slot[k], h->first, h->last));
    lend_set(q, h, k, 0);
    release_slot(q, h, mb);
    return PT_OK;
}

/* One pass of the list; *name gets its trace label's kind. */
static pt_status run_pass(pt_pipeline *q, const pt_pass *ps, const pt_pipeline_batch *pb,
                          double *loss_sum, const char **name) {
    chunk *h = &q->ch[ps->chunk];
    int mb = ps->micro;
    switch (ps->kind) {
    case PT_PASS_FORWARD: {
        size_t off = (size_t)mb * (size_t)pb->B * (size_t)pb->T;
        pt_batch b = {pb->tokens + off, pb->targets + off, pb->dloss, pb->B, pb->T, mb,
                      mb == q->M - 1};
        *name = "F";
        return forward(q, h, &b, loss_sum, 1);
    }
    case PT_PASS_BACKWARD:
        *name = "BW";
        return backward(q, h, mb, 0);
    case PT_PASS_BACKWARD_INPUT:
        *name = "B";
        return backward(q, h, mb, 1);
    case PT_PASS_BACKWARD_WEIGHT:
        *name = "W";
        return weight(q, h, mb);
    }
    return PT_ERR_INTERNAL;
}

/* The pass is its work; the wait for its input before it is the bubble. */
static void trace_pass(pt_pipeline *q, const pt_pass *ps, const char *name, uint64_t a,
                       uint64_t done, long step) {
    char ev[40];
    if (q->v > 1)
        snprintf(ev, sizeof ev, "%s%d c%d", name, ps->micro, ps->chunk);
    else
        snprintf(ev, sizeof ev, "%s%d", name, ps->micro);
    if (q->compute_ns > a + 1000)
        pt_trace_add(q->trace, "wait", "wait", PT_TRACE_MAIN, a, q->compute_ns, step);
    pt_trace_add(q->trace, ev, "pipeline", PT_TRACE_MAIN, q->compute_ns, done, step);
}

pt_status pt_pipeline_step(pt_pipeline *q, const pt_pipeline_batch *pb, double *loss_sum) {
    const pt_schedule *sc = q->sched;
    q->wait_ns = q->busy_ns = 0;
    q->span0 = q->first_ns = q->last_ns = pt_time_ns();
    pt_status st = PT_OK;
    for (int k = 0; k < sc->npass && st == PT_OK; k++) {
        const char *name = "";
        uint64_t a = pt_time_ns();
        st = run_pass(q, &sc->pass[k], pb, loss_sum, &name);
        uint64_t done = pt_time_ns();
        q->busy_ns += done - q->compute_ns;
        if (k == 0) q->first_ns = q->compute_ns;
        q->last_ns = done;
        if (q->trace && st == PT_OK) trace_pass(q, &sc->pass[k], name, a, done, pb->step);
    }
    pt_status e = drain(q);
    q->span1 = pt_time_ns();
    return st != PT_OK ? st : e;
}

/* Validation: one forward of a micro-batch through every chunk in model
 * order (every rank visits its chunks in increasing virtual stage, so the
 * receives come in send order); *loss on the head's stage. */
pt_status pt_pipeline_forward(pt_pipeline *q, const pt_batch *b, float *loss) {
    double sum = 0;
    pt_status st = PT_OK;
    for (int c = 0; c < q->v && st == PT_OK; c++) {
        chunk *h = &q->ch[c];
        st = forward(q, h, b, &sum, 0);
        /* forward-only: the block is free again once its send is done */
        if (h->slot_of[b->micro] >= 0) release_slot(q, h, b->micro);
    }
    pt_status e = drain(q);
    *loss = (float)sum;
    return st != PT_OK ? st : e;
}

void pt_pipeline_get_stats(const pt_pipeline *q, pt_pipeline_stats *s) {
    s->busy_ns = q->busy_ns;
    s->span_ns = q->span1 > q->span0 ? q->span1 - q->span0 : 0;
    s->wait_ns = q->wait_ns;
    s->lead_ns = q->first_ns > q->span0 ? q->first_ns - q->span0 : 0;
    s->tail_ns = q->span1 > q->last_ns ? q->span1 - q->last_ns : 0;
    pt_comm_counts k = {0};
    for (int kind = 0; kind < K_NKIND; kind++)
        for (int d = 0; d < q->v; d++) pt_comm_counts_add(&k, PT_GROUP_PP, q->c[kind][d]);
    s->sent_bytes = k.sent[PT_GROUP_PP];
    s->comm_ns = k.comm_ns[PT_GROUP_PP];
}

int pt_pipeline_has_head(const pt_pipeline *q) {
    return q->head_here;
}

int pt_pipeline_head_stage(const pt_pipeline *q) {
    return q->head_stage;
}
