/* Pipeline parallelism in the trainer: this rank's stage runs its
 * schedule's passes (parallel.h, pt_schedule: F, BW, or B and W, of each
 * micro-batch and chunk), receiving each chunk's input from the rank that
 * holds the virtual stage below and its output gradient from the one above,
 * and sending its own onward, all by non-blocking point-to-point.
 *
 * Communicators: splits of the pp group, one per (message kind, receiving
 * chunk), so that on each one a rank sends to ONE rank and receives from
 * ONE, in increasing micro-batch order at both ends (a chunk's forwards and
 * backwards run in that order in every schedule): a send that waits for
 * its receiver then holds up only messages the receiver takes after it. (By
 * direction instead, interleaving at p 2 deadlocked under MPI: rank 1's
 * gradient for chunk 1 waited in its lane ahead of the one for chunk 0 that
 * rank 0 needed first.) One more carries the tied wte between the first
 * and the last stage.
 *
 * The tied embedding: the stage that holds the head but not the embedding
 * keeps a copy of wte (pt_model_tied_wte), refreshed from the embedding's
 * stage at the first forward of every step (and of every validation pass),
 * and sends the head's wte gradient back after the head's last backward of
 * the step, which the embedding's stage adds into its own before the
 * module's gradient is final (before its buckets launch, before ZeRO's
 * reduce-scatter). Only the embedding's stage optimizes wte; the copy
 * follows it.
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
 * Not here: the schedules' lists (parallel/schedule.c), the stage cut
 * (parallel/stages.c), the update after the passes (trainer_step.c). */
#include "trainer_impl.h"

#include <stdlib.h>
#include <string.h>

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

struct pt_pipe {
    int p, r, v, M, L;
    int split;
    pt_comm *pp;
    pt_comm *c[K_NKIND][PT_SCHEDULE_MAX_VIRTUAL]; /* by kind and the receiving chunk */
    pt_comm *tied;                                /* first <-> last stage: wte and its gradient */
    chunk ch[PT_SCHEDULE_MAX_VIRTUAL];
    /* BLOCKS, shared: one micro-batch of any chunk each, as many as the
     * schedule holds at once over all chunks (pt_schedule.in_flight), each
     * as large as the largest chunk's micro-batch. Or, where that is less
     * memory (chunks of unequal size), each chunk's own: as many as it
     * holds at once (chunk_in_flight), each its own size */
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
    /* tied wte: the embedding's stage sends (wte_send) and receives the head's
     * gradient (wte_recv into wte_grad); the head's stage the reverse */
    int emb_here, head_here, tied_peer; /* tied_peer: pp rank, -1 none */
    int head_stage;
    float *wte_grad;
    size_t wte_n;
    pt_comm_req *wte_send, *wte_recv, *grad_send, *grad_recv;
    int want_wte;  /* the embedding's stage: send wte at the next module-0 forward */
    int skip_tied; /* test hook PT_PLANT_PP_TIED */
    pt_status err;
    char errmsg[256];
    /* the step's waits for neighbours, and the span of its passes */
    uint64_t wait_ns, span0, span1;
    uint64_t compute_ns; /* when the current pass's work began (its wait done) */
    uint64_t busy_ns;    /* the step's passes' work */
};

static void keep(pt_pipe *q, pt_status st, const char *what) {
    if (st == PT_OK || q->err != PT_OK) return;
    q->err = st;
    snprintf(q->errmsg, sizeof q->errmsg, "pipeline %s: %s", what, pt_error_message());
}

/* The communicator of messages of `kind` to chunk `chunk` of their
 * receiver: each rank sends on it to one rank (the holder of its chunk's
 * neighbour virtual stage) and receives on it from one, both in increasing
 * micro-batch order, so that neither end's lane ever waits for a message
 * the other end will send later. */
static pt_comm *comm_to(pt_pipe *q, int kind, int chunk) {
    return q->c[kind][chunk];
}

static int tag_of(int g_dest, int mb) {
    return 64 + g_dest * PT_SCHEDULE_MAX_MICRO + mb;
}

/* Wait for req, counting the time as waiting for a neighbour. */
static void wait_neighbour(pt_pipe *q, pt_comm_req **req, const char *what) {
    if (!*req) return;
    uint64_t a = pt_time_ns();
    keep(q, pt_comm_wait(*req), what);
    *req = NULL;
    q->wait_ns += pt_time_ns() - a;
}

static void wait_send(pt_pipe *q, pt_comm_req **req, const char *what) {
    if (!*req) return;
    keep(q, pt_comm_wait(*req), what);
    *req = NULL;
}

void pt_pipe_free(pt_pipe *q) {
    if (!q) return;
    for (int k = 0; k < q->nblocks; k++) {
        if (q->send_act) wait_send(q, &q->send_act[k], "send");
        if (q->send_grad) wait_send(q, &q->send_grad[k], "send");
        if (q->recv_grad) wait_send(q, &q->recv_grad[k], "recv");
    }
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
    wait_send(q, &q->wte_send, "send");
    wait_send(q, &q->grad_send, "send");
    wait_send(q, &q->wte_recv, "recv");
    wait_send(q, &q->grad_recv, "recv");
    pt_mem_free(q->wte_grad);
    for (int k = 0; k < K_NKIND; k++)
        for (int d = 0; d < PT_SCHEDULE_MAX_VIRTUAL; d++) pt_comm_free(q->c[k][d]);
    pt_comm_free(q->tied);
    free(q);
}

pt_status pt_pipe_new(pt_pipe **out, pt_model *m, pt_comm *pp, const pt_schedule *s,
                      const pt_stage *stages) {
    *out = NULL;
    pt_status st = PT_OK;
    pt_pipe *q = calloc(1, sizeof *q);
    if (!q) return pt_error_set(PT_ERR_NOMEM, "pipeline");
    q->p = s->stages;
    q->r = s->stage;
    q->v = s->virtual_stages;
    q->M = s->microbatches;
    q->L = pt_model_config_of(m)->n_layer;
    q->split = s->split;
    q->pp = pp;
    int G = q->p * q->v;
    /* collective over pp, in the same order on every rank */
    for (int k = 0; k < K_NKIND; k++)
        for (int d = 0; d < q->v; d++)
            PT_CHECK_GOTO(st, pt_comm_split(pp, 0, q->r, &q->c[k][d]), fail);
    PT_CHECK_GOTO(st, pt_comm_split(pp, 0, q->r, &q->tied), fail);
    int tp = 1, tpr = 0;
    pt_model_tp(m, &tp, &tpr);
    const pt_model_config *cfg = pt_model_config_of(m);
    size_t N = (size_t)pt_model_max_batch(m) * (size_t)cfg->seq_len;
    /* under sequence parallelism the stream is this rank's rows */
    int sp = pt_model_sequence_parallel(m);
    q->rc = (sp ? N / (size_t)tp : N) * (size_t)cfg->n_embd;
    q->tp = sp ? tp : 1;
    q->C = cfg->n_embd;
    /* the chunks, and each one's micro-batch: its slot and gradients */
    size_t fl[PT_SCHEDULE_MAX_VIRTUAL];
    for (int c = 0; c < q->v; c++) {
        chunk *h = &q->ch[c];
        h->g = pt_schedule_virtual_stage(s, c);
        h->chunk = c;
        h->first = stages[h->g].first;
        h->last = stages[h->g].last;
        h->prev = h->g > 0 ? pt_schedule_locate(s->name, q->p, q->v, h->g - 1, &h->prev_chunk) : -1;
        h->next =
            h->g < G - 1 ? pt_schedule_locate(s->name, q->p, q->v, h->g + 1, &h->next_chunk) : -1;
        /* dy unless the chunk ends with the head; dx unless it starts with the embedding */
        fl[c] = pt_model_slot_bytes(m, h->first, h->last) / sizeof(float) +
                (size_t)((h->last <= q->L) + (h->first > 0)) * q->rc;
        fl[c] = (fl[c] + 15) & ~(size_t)15; /* 64-byte aligned blocks */
        if (h->last - h->first + 1 > q->nscr) q->nscr = h->last - h->first + 1;
    }
    /* shared blocks, or each chunk's own where that is smaller */
    int per_chunk;
    size_t total =
        pt_schedule_blocks(q->v, s->in_flight, s->chunk_in_flight, fl, &per_chunk, &q->nblocks);
    PT_ASSERT(q->nblocks >= 1);
    for (int c = 0; c < q->v; c++) {
        chunk *h = &q->ch[c];
        h->slot = calloc((size_t)q->nblocks, sizeof *h->slot);
        h->dy = calloc((size_t)q->nblocks, sizeof *h->dy);
        h->dx = calloc((size_t)q->nblocks, sizeof *h->dx);
        h->slot_of = malloc((size_t)q->M * sizeof *h->slot_of);
        if (!h->slot || !h->dy || !h->dx || !h->slot_of) {
            st = pt_error_set(PT_ERR_NOMEM, "pipeline slots");
            goto fail;
        }
        for (int mb = 0; mb < q->M; mb++) h->slot_of[mb] = -1;
    }
    q->blk_off = malloc((size_t)q->nblocks * sizeof *q->blk_off);
    q->blk_chunk = malloc((size_t)q->nblocks * sizeof *q->blk_chunk);
    q->owner = malloc((size_t)q->nblocks * sizeof *q->owner);
    q->send_act = calloc((size_t)q->nblocks, sizeof *q->send_act);
    q->send_grad = calloc((size_t)q->nblocks, sizeof *q->send_grad);
    q->recv_grad = calloc((size_t)q->nblocks, sizeof *q->recv_grad);
    q->nfl = calloc((size_t)q->nblocks, sizeof *q->nfl);
    q->nsets = q->split ? pt_schedule_pending_w(s) : 0;
    if (q->split) {
        q->scratch = calloc((size_t)(q->nsets * q->nscr), sizeof *q->scratch);
        q->set_of = malloc((size_t)q->nblocks * sizeof *q->set_of);
        q->set_busy = calloc((size_t)q->nsets, sizeof *q->set_busy);
    }
    q->mem = pt_mem_alloc(PT_MEM_ACTS, total * sizeof(float));
    if (!q->blk_off || !q->blk_chunk || !q->owner || !q->send_act || !q->send_grad ||
        !q->recv_grad || !q->nfl || (q->split && (!q->scratch || !q->set_of || !q->set_busy)) ||
        !q->mem) {
        st = pt_error_set(PT_ERR_NOMEM, "pipeline activations (%d blocks, %zu bytes)", q->nblocks,
                          total * sizeof(float));
        goto fail;
    }
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
                    kinds |= 1u << pt_model_module_kind(m, q->ch[c].first + j);
            PT_CHECK_GOTO(st,
                          pt_module_scratch_new_deferred(&q->scratch[k * q->nscr + j], m,
                                                         pt_model_max_batch(m), kinds),
                          fail);
        }
    for (int k = 0; k < q->nblocks; k++) {
        q->owner[k] = -1;
        if (q->split) q->set_of[k] = -1;
        float *blk = q->mem + q->blk_off[k];
        for (int c = 0; c < q->v; c++) {
            chunk *h = &q->ch[c];
            if (q->blk_chunk[k] >= 0 && q->blk_chunk[k] != c) continue;
            PT_CHECK_GOTO(st, pt_model_slot_new_range_in(&h->slot[k], m, h->first, h->last, blk),
                          fail);
            float *b = blk + pt_model_slot_bytes(m, h->first, h->last) / sizeof(float);
            if (h->last <= q->L) h->dy[k] = b, b += q->rc;
            if (h->first > 0) h->dx[k] = b;
        }
    }
    /* the tied wte: which stages hold the embedding and the head */
    int c0, cl;
    int r_emb = pt_schedule_locate(s->name, q->p, q->v, 0, &c0);
    int r_head = pt_schedule_locate(s->name, q->p, q->v, G - 1, &cl);
    q->emb_here = r_emb == q->r;
    q->head_here = r_head == q->r;
    q->head_stage = r_head;
    q->tied_peer = r_emb == r_head ? -1 : q->emb_here ? r_head : q->head_here ? r_emb : -1;
    if (q->tied_peer >= 0 && q->emb_here) {
        q->wte_n = pt_model_tensor(m, 0)->numel; /* wte is module 0's first tensor */
        q->wte_grad = pt_mem_alloc(PT_MEM_COMM, q->wte_n * sizeof(float));
        if (!q->wte_grad) {
            st = pt_error_set(PT_ERR_NOMEM, "pipeline: the tied wte's gradient");
            goto fail;
        }
    } else if (q->tied_peer >= 0) {
        float *tp_p, *tp_g;
        pt_model_tied_wte(m, &tp_p, &tp_g, &q->wte_n);
    }
    *out = q;
    return PT_OK;
fail:
    pt_pipe_free(q);
    return st;
}

/* ---- the tied wte ---- */

/* Before a step's (or a validation's) passes: the head's stage posts the
 * receive of wte (and the embedding's stage that of the head's gradient,
 * when grads). */
static void tied_begin(pt_pipe *q, pt_model *m, int grads) {
    if (q->tied_peer < 0) return;
    if (q->head_here) {
        float *p, *g;
        size_t n;
        pt_model_tied_wte(m, &p, &g, &n);
        keep(q, pt_comm_irecv(q->tied, p, n * sizeof(float), q->tied_peer, 1, &q->wte_recv),
             "receive of the tied wte");
    } else {
        q->want_wte = 1;
        if (grads)
            keep(q,
                 pt_comm_irecv(q->tied, q->wte_grad, q->wte_n * sizeof(float), q->tied_peer, 2,
                               &q->grad_recv),
                 "receive of the tied wte's gradient");
    }
}

void pt_pipe_before_forward(pt_pipe *q, pt_model *m, int module) {
    if (q->tied_peer < 0) return;
    if (module == 0 && q->emb_here && q->want_wte) { /* parameters gathered (ZeRO-3) by now */
        keep(q,
             pt_comm_isend(q->tied, pt_model_module_params(m, 0), q->wte_n * sizeof(float),
                           q->tied_peer, 1, &q->wte_send),
             "send of the tied wte");
        q->want_wte = 0;
    }
    if (module == q->L + 1 && q->head_here) wait_neighbour(q, &q->wte_recv, "receive of wte");
}

void pt_pipe_after_forward(pt_pipe *q, int module) {
    /* before ZeRO-3 releases the unit the send reads */
    if (module == 0 && q->wte_send) wait_send(q, &q->wte_send, "send of the tied wte");
}

/* Module i's gradients are final for the step (its last BW or W). */
void pt_pipe_grads_final(pt_pipe *q, pt_model *m, int module) {
    if (q->tied_peer < 0) return;
    if (module == q->L + 1 && q->head_here) {
        float *p, *g;
        size_t n;
        pt_model_tied_wte(m, &p, &g, &n);
        keep(q, pt_comm_isend(q->tied, g, n * sizeof(float), q->tied_peer, 2, &q->grad_send),
             "send of the tied wte's gradient");
    } else if (module == 0 && q->emb_here && q->grad_recv) {
        wait_neighbour(q, &q->grad_recv, "receive of the tied wte's gradient");
        float *g = pt_model_module_grads(m, 0);
        for (size_t k = 0; !q->skip_tied && k < q->wte_n; k++) g[k] += q->wte_grad[k];
    }
}

/* ---- the passes ---- */

static int take_slot(pt_pipe *q, chunk *h, int mb) {
    for (int k = 0; k < q->nblocks; k++)
        if (q->owner[k] < 0 && (q->blk_chunk[k] < 0 || q->blk_chunk[k] == h->chunk)) {
            /* the block's last sends read it */
            wait_send(q, &q->send_act[k], "send of activations");
            wait_send(q, &q->send_grad[k], "send of gradients");
            q->owner[k] = (int)(h - q->ch) * q->M + mb;
            h->slot_of[mb] = k;
            return k;
        }
    PT_ASSERT(!"pipeline: more micro-batches in flight than the schedule said");
    return -1;
}

static void release_slot(pt_pipe *q, chunk *h, int mb) {
    int k = h->slot_of[mb];
    q->owner[k] = -1;
    h->slot_of[mb] = -1;
}

/* grads: the micro-batch's backward follows (not validation): its output
 * gradient's receive is posted now, so that the rank above can complete
 * its send whenever it runs its backward, whatever this rank is doing:
 * a send never waits for its receiver's main thread (which might wait for
 * the sender: a deadlock, seen with rendezvous-size messages under MPI). */
static void forward(pt_pipe *q, pt_model *m, chunk *h, const pt_batch *b, double *loss_sum,
                    int grads) {
    int k = take_slot(q, h, b->micro);
    pt_model_slot *s = h->slot[k];
    q->nfl[k] = (size_t)b->B * (size_t)b->T / (size_t)q->tp * (size_t)q->C;
    size_t bytes = q->nfl[k] * sizeof(float);
    if (h->first > 0) {
        pt_comm_req *req = NULL;
        keep(q,
             pt_comm_irecv(comm_to(q, K_ACT, h->chunk), pt_model_slot_stream(s, h->first - 1),
                           bytes, h->prev, tag_of(h->g, b->micro), &req),
             "receive of activations");
        wait_neighbour(q, &req, "receive of activations");
    }
    float loss = 0;
    q->compute_ns = pt_time_ns(); /* the pass's work starts: after its wait */
    keep(q, pt_model_forward_range(m, s, b, h->first, h->last, &loss), "forward");
    if (grads && h->last <= q->L)
        keep(q,
             pt_comm_irecv(comm_to(q, K_GRAD, h->chunk), h->dy[k], bytes, h->next,
                           tag_of(h->g, b->micro), &q->recv_grad[k]),
             "receive of gradients");
    if (h->last == q->L + 1)
        *loss_sum += loss;
    else
        keep(q,
             pt_comm_isend(comm_to(q, K_ACT, h->next_chunk), pt_model_slot_stream(s, h->last),
                           bytes, h->next, tag_of(h->g + 1, b->micro), &q->send_act[k]),
             "send of activations");
}

/* The deferred scratch set of block k's micro-batch of chunk h from its B
 * (take) to its W (give back): its contexts' scratch, else the model's. */
static void lend_set(pt_pipe *q, chunk *h, int k, int take) {
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

static void backward(pt_pipe *q, pt_model *m, chunk *h, int mb, int split) {
    int k = h->slot_of[mb];
    PT_ASSERT(k >= 0);
    pt_model_slot *s = h->slot[k];
    if (split) lend_set(q, h, k, 1);
    size_t bytes = q->nfl[k] * sizeof(float);
    if (h->last <= q->L) wait_neighbour(q, &q->recv_grad[k], "receive of gradients");
    q->compute_ns = pt_time_ns();
    keep(q,
         pt_model_backward_range(m, s, h->first, h->last, h->last <= q->L ? h->dy[k] : NULL,
                                 h->first > 0 ? h->dx[k] : NULL, split),
         "backward");
    if (h->first > 0)
        keep(q,
             pt_comm_isend(comm_to(q, K_GRAD, h->prev_chunk), h->dx[k], bytes, h->prev,
                           tag_of(h->g - 1, mb), &q->send_grad[k]),
             "send of gradients");
    if (!split) release_slot(q, h, mb);
}

static void weight(pt_pipe *q, pt_model *m, chunk *h, int mb) {
    int k = h->slot_of[mb];
    PT_ASSERT(k >= 0);
    q->compute_ns = pt_time_ns();
    keep(q, pt_model_backward_weight_range(m, h->slot[k], h->first, h->last), "weight gradients");
    lend_set(q, h, k, 0);
    release_slot(q, h, mb);
}

/* Complete every send of the step (their buffers are the slots'). */
static void drain(pt_pipe *q) {
    for (int k = 0; k < q->nblocks; k++) {
        wait_send(q, &q->send_act[k], "send of activations");
        wait_send(q, &q->send_grad[k], "send of gradients");
        wait_send(q, &q->recv_grad[k], "receive of gradients"); /* a failed step's */
    }
    wait_send(q, &q->wte_send, "send of the tied wte");
    wait_send(q, &q->grad_send, "send of the tied wte's gradient");
    /* a receive the passes did not reach (a failed step) */
    wait_send(q, &q->wte_recv, "receive of the tied wte");
    wait_send(q, &q->grad_recv, "receive of the tied wte's gradient");
}

static pt_status take_error(pt_pipe *q) {
    if (q->err == PT_OK) return PT_OK;
    pt_status st = q->err;
    q->err = PT_OK;
    return pt_error_set(st, "%s", q->errmsg);
}

pt_status pt_pipe_step(pt_pipe *q, pt_trainer *t, const pt_schedule *sc, const int *inputs,
                       const int *targets, float dloss, size_t base, double *loss_sum) {
    pt_model *m = t->model;
    int T = t->cfg.model.seq_len, mB = t->micro_B;
    q->wait_ns = q->busy_ns = 0;
    q->span0 = pt_time_ns();
    tied_begin(q, m, 1);
    int armed = 0;
    for (int k = 0; k < sc->npass; k++) {
        const pt_pass *ps = &sc->pass[k];
        chunk *h = &q->ch[ps->chunk];
        int mb = ps->micro;
        uint64_t a = pt_time_ns();
        const char *name = "F";
        if (ps->kind == PT_PASS_FORWARD) {
            size_t off = base + (size_t)mb * (size_t)mB * (size_t)T;
            pt_batch b = {inputs + off, targets + off, dloss, mB, T, mb, mb == q->M - 1};
            forward(q, m, h, &b, loss_sum, 1);
        } else {
            /* the step's first backward of its last micro-batch precedes
             * every module's final one: arm the buckets (stale: in this
             * step's slot, as pt_trainer_step_batch does) */
            if (t->ddp && !armed && mb == q->M - 1 && ps->kind != PT_PASS_BACKWARD_WEIGHT) {
                int slot = t->mode == MODE_STALE ? t->step % (t->cfg.parallel.staleness + 1) : 0;
                pt_ddp_begin(t->ddp, slot, t->cfg.parallel.overlap, t->step + 1);
                armed = 1;
            }
            if (ps->kind == PT_PASS_BACKWARD_WEIGHT) {
                name = "W";
                weight(q, m, h, mb);
            } else {
                name = ps->kind == PT_PASS_BACKWARD ? "BW" : "B";
                backward(q, m, h, mb, ps->kind == PT_PASS_BACKWARD_INPUT);
            }
        }
        uint64_t done = pt_time_ns();
        q->busy_ns += done - q->compute_ns;
        if (t->trace) {
            char ev[40];
            if (q->v > 1)
                snprintf(ev, sizeof ev, "%s%d c%d", name, mb, ps->chunk);
            else
                snprintf(ev, sizeof ev, "%s%d", name, mb);
            /* the pass is its work; the wait for its input before it is the bubble */
            if (q->compute_ns > a + 1000)
                pt_trace_add(t->trace, "wait", "wait", PT_TRACE_MAIN, a, q->compute_ns,
                             t->step + 1);
            pt_trace_add(t->trace, ev, "pipeline", PT_TRACE_MAIN, q->compute_ns, done, t->step + 1);
        }
    }
    drain(q);
    q->span1 = pt_time_ns();
    return take_error(q);
}

/* Validation: one forward of a micro-batch through every chunk in model
 * order (every rank visits its chunks in increasing virtual stage, so the
 * receives come in send order); *loss on the head's stage. */
pt_status pt_pipe_forward(pt_pipe *q, pt_trainer *t, const pt_batch *b, int refresh, float *loss) {
    pt_model *m = t->model;
    if (refresh) tied_begin(q, m, 0);
    double sum = 0;
    for (int c = 0; c < q->v; c++) {
        chunk *h = &q->ch[c];
        forward(q, m, h, b, &sum, 0);
        /* forward-only: the block is free again once its send is done */
        release_slot(q, h, b->micro);
    }
    drain(q);
    *loss = (float)sum;
    return take_error(q);
}

void pt_pipe_take_stats(pt_pipe *q, uint64_t *busy_ns, uint64_t *span_ns) {
    *busy_ns = q->busy_ns;
    *span_ns = q->span1 > q->span0 ? q->span1 - q->span0 : 0;
}

int pt_pipe_has_head(const pt_pipe *q) {
    return q->head_here;
}

uint64_t pt_pipe_sent_bytes(const pt_pipe *q) {
    uint64_t b = 0;
    pt_comm *all[K_NKIND * PT_SCHEDULE_MAX_VIRTUAL + 1];
    int n = 0;
    for (int k = 0; k < K_NKIND; k++)
        for (int d = 0; d < q->v; d++) all[n++] = q->c[k][d];
    all[n++] = q->tied;
    for (int i = 0; i < n; i++) {
        pt_comm_stats s;
        pt_comm_get_stats(all[i], &s);
        for (int k = 0; k < PT_OP_COUNT; k++) b += s.bytes_sent[k];
    }
    return b;
}

int pt_pipe_head_stage(const pt_pipe *q) {
    return q->head_stage;
}

void pt_pipe_test_plant(pt_pipe *q, pt_plant plant) {
    q->skip_tied = plant == PT_PLANT_PP_TIED;
}
