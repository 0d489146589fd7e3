/* The tied embedding across a pipeline with its update split, as a stack
 * entry "tied" (parallel.h; the whole-update one is tied.c). GPT-2's LM head
 * reads wte, which the embedding owns; the head's stage keeps a copy
 * (pt_model_tied_wte). Here the two stages share wte's update by rows,
 * rather than the embedding's stage doing all of it while the head's waits
 * (gpt2 at pp 2: wte is 38.6 M of the embedding stage's 102 M parameters,
 * and the update is memory-bound):
 *
 *   rows [0, h)   the embedding's stage updates them (its optimizer skips
 *                 the rest of wte: pt_adamw_set_skip);
 *   rows [h, V)   the head's stage updates them, with an optimizer of its
 *                 own over its copy's rows (this entry's).
 *
 * A step: after its last backward each stage sends the other the rows of
 * its partial gradient the other updates (a reduce-scatter by hand) and
 * adds the other's rows into its own (the sum of two floats is the same
 * either way round, so both halves are the single worker's sum); the
 * stage's half enters the global norm once; after the optimizer step
 * (clipped by the same global norm) each sends its updated rows and
 * receives the other's (an all-gather), so both copies are whole and equal
 * again before the update point returns: validation, a checkpoint and the
 * next step read them as they are. A checkpoint's main files carry the
 * embedding's buffers: before a save the head's stage sends its rows'
 * optimizer state there (the skipped range, which no step touches), and
 * after a load (at the next begin, the reads done) the embedding's stage
 * sends the head's its wte and that state (the state slot).
 *
 * Only where each stage's optimizer is its own, whole buffer (no data
 * parallelism: the head's rows would need their own all-reduce, ZeRO its
 * own shards); elsewhere tied.c's entry serves.
 *
 * Not here: the activations between stages (pipeline/runtime.c). */
#include <stdio.h>
#include <stdlib.h>

#include "partrain/parallel.h"

typedef struct {
    pt_model *m;
    pt_comm *c;    /* first <-> last stage (owned split of pp) */
    pt_adamw *opt; /* the stage's optimizer (lent) */
    pt_adamw *own; /* the head's stage: its rows' optimizer */
    int emb_here, peer, L, part;
    int reload;     /* a checkpoint was loaded: refresh the head's copy at the next begin */
    size_t lo, hi;  /* floats of rows [0, h) and [h, V) */
    size_t wte_off; /* the embedding's stage: wte's offset in the flat buffer */
    float *recv;    /* the other stage's partial gradient of this stage's rows */
    pt_comm_req *g_send, *g_recv;
    uint64_t sent_seen;
} tied_split;

static pt_status named(pt_status st, const char *what) {
    return pt_error_wrap(st, "pipeline %s", what);
}

static pt_status wait(pt_comm_req **r, const char *what) {
    return named(pt_comm_wait_once(r), what);
}

/* This stage's wte and its gradient: the embedding's own, or the copy. */
static void wte(tied_split *t, float **p, float **g) {
    if (t->emb_here) {
        *p = pt_model_module_params(t->m, 0);
        *g = pt_model_module_grads(t->m, 0);
    } else {
        size_t n;
        pt_model_tied_wte(t->m, p, g, &n);
    }
}

/* The rows this stage updates, and the other's: offsets into wte. */
static size_t mine_at(const tied_split *t) {
    return t->emb_here ? 0 : t->lo;
}
static size_t mine_n(const tied_split *t) {
    return t->emb_here ? t->lo : t->hi;
}
static size_t theirs_at(const tied_split *t) {
    return t->emb_here ? t->lo : 0;
}
static size_t theirs_n(const tied_split *t) {
    return t->emb_here ? t->hi : t->lo;
}

static pt_status reload(tied_split *t);

/* Posted before the passes, so that the other's send never waits for
 * this rank's main thread. */
static pt_status split_begin(void *self, pt_step_begin *b) {
    tied_split *t = self;
    if (t->reload) PT_CHECK(reload(t));
    if (b->eval) return PT_OK;
    return named(pt_comm_irecv(t->c, t->recv, mine_n(t) * sizeof(float), t->peer, 2, &t->g_recv),
                 "receive of the tied wte's gradient");
}

/* After the stage's module of wte has its final gradient (the head's, or
 * the embedding's): the other stage's rows go to it. */
static pt_status split_grads(void *self, const pt_hook_point *p) {
    tied_split *t = self;
    if (!p->last || p->module != (t->emb_here ? 0 : t->L + 1) || !t->g_recv) return PT_OK;
    float *w, *g;
    wte(t, &w, &g);
    return named(
        pt_comm_isend(t->c, g + theirs_at(t), theirs_n(t) * sizeof(float), t->peer, 2, &t->g_send),
        "send of the tied wte's gradient");
}

/* Every transfer complete (a failed step's too). */
static pt_status split_end(void *self, const pt_step_begin *b) {
    (void)b;
    tied_split *t = self;
    pt_status st = wait(&t->g_send, "send of the tied wte's gradient");
    pt_status e = wait(&t->g_recv, "receive of the tied wte's gradient");
    return st == PT_OK ? e : st;
}

/* The other stage's part of this stage's rows, added (the step's passes
 * are over: split_end waited for it). */
static pt_status split_sync(void *self, pt_update *u) {
    (void)u;
    tied_split *t = self;
    float *w, *g;
    wte(t, &w, &g);
    g += mine_at(t);
    for (size_t k = 0, n = mine_n(t); k < n; k++) g[k] += t->recv[k];
    return PT_OK;
}

/* The head's rows count here, once (the embedding's stage's optimizer
 * counts its own and skips these). */
static pt_status split_norm(void *self, double parts[2]) {
    tied_split *t = self;
    if (t->emb_here) return PT_OK;
    float *w, *g;
    wte(t, &w, &g);
    parts[t->part] += pt_optim_grad_sumsq(g + t->lo, t->hi);
    return PT_OK;
}

/* Both halves of the updated rows, each to the other stage. */
static pt_status exchange_rows(tied_split *t) {
    float *w, *g;
    wte(t, &w, &g);
    pt_comm_req *s = NULL, *r = NULL;
    pt_status st =
        pt_comm_irecv(t->c, w + theirs_at(t), theirs_n(t) * sizeof(float), t->peer, 3, &r);
    if (st == PT_OK)
        st = pt_comm_isend(t->c, w + mine_at(t), mine_n(t) * sizeof(float), t->peer, 3, &s);
    pt_status e1 = wait(&s, "send of the tied wte's rows");
    pt_status e2 = wait(&r, "receive of the tied wte's rows");
    st = named(st, "exchange of the tied wte's rows");
    return st != PT_OK ? st : e1 != PT_OK ? e1 : e2;
}

/* After the stage's optimizer (earlier on the stack), which left the
 * global sum of squares in u: the head's rows at the same clip scale,
 * then the rows exchanged. */
static pt_status split_update(void *self, pt_update *u) {
    tied_split *t = self;
    if (u->skip) return PT_OK;
    if (!t->emb_here) {
        float *w, *g;
        wte(t, &w, &g);
        pt_adamw_step(t->own, w + t->lo, g + t->lo, u->lr, pt_optim_clip_scale(u->sumsq, u->clip));
    }
    return exchange_rows(t);
}

/* The head's rows' optimizer state (n floats of each buffer the rule
 * keeps) to or from the embedding's stage's skipped range. */
static pt_status move_state(tied_split *t, int to_head) {
    float *mine[2] = {pt_adamw_m(t->emb_here ? t->opt : t->own),
                      pt_adamw_v(t->emb_here ? t->opt : t->own)};
    size_t at = t->emb_here ? t->wte_off + t->lo : 0;
    for (int k = 0; k < 2; k++) {
        if (!mine[k]) continue;
        size_t bytes = t->hi * sizeof(float);
        int send = t->emb_here == to_head;
        pt_status st = send ? pt_comm_send(t->c, mine[k] + at, bytes, t->peer, 4 + k)
                            : pt_comm_recv(t->c, mine[k] + at, bytes, t->peer, 4 + k);
        PT_CHECK(named(st, "tied wte's optimizer state"));
    }
    return PT_OK;
}

/* After a load: the embedding's stage's wte and the head's rows' state
 * (read into its skipped range) to the head's copy and optimizer. */
static pt_status reload(tied_split *t) {
    t->reload = 0;
    float *w, *g;
    wte(t, &w, &g);
    size_t bytes = (t->lo + t->hi) * sizeof(float);
    pt_status st = t->emb_here ? pt_comm_send(t->c, w, bytes, t->peer, 6)
                               : pt_comm_recv(t->c, w, bytes, t->peer, 6);
    PT_CHECK(named(st, "tied wte after a load"));
    PT_CHECK(move_state(t, 1));
    if (!t->emb_here) pt_adamw_set_t(t->own, pt_adamw_t(t->opt));
    return PT_OK;
}

/* A checkpoint's regions are the embedding's stage's (the optimizer
 * entry's whole buffers, wte's rows all there): before a save the head's
 * rows' state goes into its skipped range; a load reads them there, and
 * the next begin (a step's or a validation's: after the reads) hands them
 * and wte to the head's stage. Lists no region of its own. */
static pt_status split_state(void *self, pt_state_visit *v) {
    tied_split *t = self;
    /* (loaded and not stepped since: the range holds the loaded state) */
    if (v->mode == PT_STATE_SAVE) return t->reload ? PT_OK : move_state(t, 0);
    if (v->mode == PT_STATE_LOAD) t->reload = 1;
    return PT_OK;
}

static void split_stats(void *self, pt_sync_stats *s) {
    tied_split *t = self;
    s->pp_bytes += pt_comm_sent_since(t->c, &t->sent_seen);
}

static void split_counts(void *self, pt_comm_counts *k) {
    pt_comm_counts_add(k, PT_GROUP_PP, ((tied_split *)self)->c);
}

static void split_free(void *self) {
    tied_split *t = self;
    split_end(t, NULL);
    pt_adamw_free(t->own);
    pt_mem_free(t->recv);
    pt_comm_free(t->c);
    free(t);
}

static const pt_strategy_ops TIED_SPLIT = {.name = "tied",
                                           .begin = split_begin,
                                           .grads = split_grads,
                                           .end = split_end,
                                           .sync = split_sync,
                                           .norm = split_norm,
                                           .update = split_update,
                                           .state = split_state,
                                           .stats = split_stats,
                                           .counts = split_counts,
                                           .free = split_free};

size_t pt_tied_split_rows(int rows) {
    return (size_t)(rows + 1) / 2;
}

pt_status pt_tied_split_new(pt_strategy *out, pt_model *m, pt_comm *c, int emb_here, int peer,
                            pt_adamw *opt, const pt_adamw_hparams *hp) {
    *out = (pt_strategy){0};
    tied_split *t = calloc(1, sizeof *t);
    if (!t) {
        pt_comm_free(c);
        return pt_error_set(PT_ERR_NOMEM, "pipeline: the tied wte");
    }
    const pt_model_config *cfg = pt_model_config_of(m);
    /* wte: module 0's first tensor, or the head's copy (the table lists
     * held modules only; wte decays: model.c's table) */
    const pt_param_info *w = emb_here ? pt_model_tensor(m, 0) : NULL;
    float *cp, *cg;
    size_t n;
    if (emb_here)
        n = w->numel;
    else
        pt_model_tied_wte(m, &cp, &cg, &n);
    size_t C = (size_t)cfg->n_embd, h = pt_tied_split_rows((int)(n / C)) * C;
    int tp, tp_rank;
    pt_model_tp(m, &tp, &tp_rank);
    *t = (tied_split){.m = m,
                      .c = c,
                      .opt = opt,
                      .emb_here = emb_here,
                      .peer = peer,
                      .L = cfg->n_layer,
                      .part = tp > 1 ? 0 : 1, /* wte is split over tp (vocabulary) */
                      .lo = h,
                      .hi = n - h,
                      .wte_off = w ? w->offset : 0};
    pt_status st = PT_OK;
    t->recv = pt_mem_alloc(PT_MEM_COMM, (emb_here ? h : n - h) * sizeof(float));
    if (!t->recv) st = pt_error_set(PT_ERR_NOMEM, "pipeline: the tied wte's gradient");
    if (st == PT_OK && emb_here) pt_adamw_set_skip(opt, w->offset + h, n - h);
    if (st == PT_OK && !emb_here) {
        pt_optim_segment seg = {0, n - h, 1};
        st = pt_adamw_new(&t->own, n - h, &seg, 1, hp);
    }
    if (st != PT_OK) {
        split_free(t);
        return st;
    }
    *out = (pt_strategy){&TIED_SPLIT, t};
    return PT_OK;
}
