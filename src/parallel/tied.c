/* The tied embedding across a pipeline, as a stack entry "tied"
 * (parallel.h). GPT-2's LM head reads wte, which the embedding owns. When
 * the two are on different stages, the head's stage keeps a copy of wte
 * (pt_model_tied_wte), refreshed from the embedding's stage at the first
 * forward of every step (and of every validation pass), and sends the
 * head's wte gradient back after the head's last backward of the step,
 * which the embedding's stage adds into its own before the module's
 * gradient is final (before data parallelism's bucket launches, before
 * ZeRO's reduce-scatter: the stack's order puts this entry after theirs,
 * and an AFTER point runs in reverse). Only the embedding's stage
 * optimizes wte; the copy follows it (Megatron's shared embedding). This
 * is the entry where data parallelism or ZeRO own the update; elsewhere
 * the two stages split wte's update (tied_split.c).
 *
 * Not here: the activations between stages (pipeline/runtime.c). */
#include <stdio.h>
#include <stdlib.h>

#include "partrain/parallel.h"

typedef struct {
    pt_model *m;
    pt_comm *c; /* first <-> last stage (owned split of pp) */
    int emb_here, head_here, peer, L;
    float *wte_grad; /* the embedding's stage: the head's gradient received */
    size_t n;
    pt_comm_req *wte_send, *wte_recv, *grad_send, *grad_recv;
    int want_wte; /* the embedding's stage: send wte at the next module-0 forward */
    uint64_t sent_seen;
} tied;

static pt_status named(pt_status st, const char *what) {
    return pt_error_wrap(st, "pipeline %s", what);
}

static pt_status wait(pt_comm_req **r, const char *what) {
    return named(pt_comm_wait_once(r), what);
}

/* The head's stage posts the receive of wte (and in a step the embedding's
 * stage that of the head's gradient) before the passes, so that neither
 * send ever waits for its receiver's main thread. */
static pt_status tied_begin(void *self, pt_step_begin *b) {
    tied *t = self;
    if (t->head_here) {
        float *p, *g;
        size_t n;
        pt_model_tied_wte(t->m, &p, &g, &n);
        return named(pt_comm_irecv(t->c, p, n * sizeof(float), t->peer, 1, &t->wte_recv),
                     "receive of the tied wte");
    }
    t->want_wte = 1;
    if (b->eval) return PT_OK;
    return named(pt_comm_irecv(t->c, t->wte_grad, t->n * sizeof(float), t->peer, 2, &t->grad_recv),
                 "receive of the tied wte's gradient");
}

static pt_status tied_before_forward(void *self, const pt_hook_point *p) {
    tied *t = self;
    if (p->module == 0 && t->emb_here && t->want_wte) { /* gathered (ZeRO-3) by now */
        t->want_wte = 0;
        return named(pt_comm_isend(t->c, pt_model_module_params(t->m, 0), t->n * sizeof(float),
                                   t->peer, 1, &t->wte_send),
                     "send of the tied wte");
    }
    if (p->module == t->L + 1 && t->head_here) return wait(&t->wte_recv, "receive of wte");
    return PT_OK;
}

/* before ZeRO-3 releases the unit the send reads */
static pt_status tied_after_forward(void *self, const pt_hook_point *p) {
    tied *t = self;
    return p->module == 0 ? wait(&t->wte_send, "send of the tied wte") : PT_OK;
}

static pt_status tied_grads(void *self, const pt_hook_point *p) {
    tied *t = self;
    if (!p->last) return PT_OK;
    if (p->module == t->L + 1 && t->head_here) {
        float *w, *g;
        size_t n;
        pt_model_tied_wte(t->m, &w, &g, &n);
        return named(pt_comm_isend(t->c, g, n * sizeof(float), t->peer, 2, &t->grad_send),
                     "send of the tied wte's gradient");
    }
    if (p->module != 0 || !t->emb_here || !t->grad_recv) return PT_OK;
    PT_CHECK(wait(&t->grad_recv, "receive of the tied wte's gradient"));
    float *g = pt_model_module_grads(t->m, 0);
    for (size_t k = 0; k < t->n; k++) g[k] += t->wte_grad[k];
    return PT_OK;
}

/* Every transfer complete (a failed step's receives too). */
static pt_status tied_end(void *self, const pt_step_begin *b) {
    (void)b;
    tied *t = self;
    pt_status st = wait(&t->wte_send, "send of the tied wte");
    pt_status e[] = {wait(&t->grad_send, "send of the tied wte's gradient"),
                     wait(&t->wte_recv, "receive of the tied wte"),
                     wait(&t->grad_recv, "receive of the tied wte's gradient")};
    for (int i = 0; i < 3 && st == PT_OK; i++) st = e[i];
    return st;
}

static void tied_stats(void *self, pt_sync_stats *s) {
    tied *t = self;
    s->pp_bytes += pt_comm_sent_since(t->c, &t->sent_seen);
}

static void tied_counts(void *self, pt_comm_counts *k) {
    pt_comm_counts_add(k, PT_GROUP_PP, ((tied *)self)->c);
}

static void tied_free(void *self) {
    tied *t = self;
    tied_end(t, NULL);
    pt_mem_free(t->wte_grad);
    pt_comm_free(t->c);
    free(t);
}

static const pt_strategy_ops TIED = {.name = "tied",
                                     .begin = tied_begin,
                                     .before_forward = tied_before_forward,
                                     .after_forward = tied_after_forward,
                                     .grads = tied_grads,
                                     .end = tied_end,
                                     .stats = tied_stats,
                                     .counts = tied_counts,
                                     .free = tied_free};

pt_status pt_tied_strategy(pt_strategy *out, pt_model *m, pt_comm *pp, int emb_stage,
                           int head_stage, pt_adamw *opt, const pt_adamw_hparams *hp) {
    *out = (pt_strategy){0};
    if (!pp) return PT_OK;
    /* collective over pp: every rank splits, those without a part free it */
    int r = pt_comm_rank(pp);
    pt_comm *c = NULL;
    PT_CHECK(pt_comm_split(pp, 0, r, &c));
    if (emb_stage == head_stage || (r != emb_stage && r != head_stage)) {
        pt_comm_free(c);
        return PT_OK;
    }
    if (opt)
        return pt_tied_split_new(out, m, c, r == emb_stage, r == emb_stage ? head_stage : emb_stage,
                                 opt, hp);
    tied *t = calloc(1, sizeof *t);
    if (!t) {
        pt_comm_free(c);
        return pt_error_set(PT_ERR_NOMEM, "pipeline: the tied wte");
    }
    t->m = m;
    t->c = c;
    t->L = pt_model_config_of(m)->n_layer;
    t->emb_here = r == emb_stage;
    t->head_here = r == head_stage;
    t->peer = t->emb_here ? head_stage : emb_stage;
    if (t->emb_here) {
        t->n = pt_model_tensor(m, 0)->numel; /* wte is module 0's first tensor */
        t->wte_grad = pt_mem_alloc(PT_MEM_COMM, t->n * sizeof(float));
        if (!t->wte_grad) {
            tied_free(t);
            return pt_error_set(PT_ERR_NOMEM, "pipeline: the tied wte's gradient");
        }
    } else {
        float *p, *g;
        pt_model_tied_wte(m, &p, &g, &t->n);
    }
    *out = (pt_strategy){&TIED, t};
    return PT_OK;
}
