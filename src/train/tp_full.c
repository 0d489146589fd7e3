/* Full tensors from model-parallel pieces, for the test seam's gather of
 * the parameters (pt_trainer_gather_params, the parity harness's oracle
 * comparison): rank 0 of a model-parallel group (tp x pp: every tp slice
 * of every pipeline stage) receives every member's tensors one at a time
 * and assembles each whole tensor, placing the members' runs
 * (pt_shard_run) where it has them, into a flat buffer of the whole model.
 * Padding rows of wte are in no run, so they never reach a full tensor.
 *
 * Not here: checkpoints, which every rank writes and reads by slice
 * (ckpt_impl.h). */
#include "trainer_impl.h"
#include "trainer_test.h"

#include <stdlib.h>
#include <string.h>

/* The table of model-parallel member r: tp slice r % tp of stage r / tp. */
static pt_status member_table(const pt_trainer *t, int r, pt_model **out) {
    const pt_config *c = &t->cfg;
    int tp = c->parallel.tp, nmod = c->model.n_layer + 2;
    pt_model_options o = {
        .tp = tp,
        .tp_rank = r % tp,
        .owned = t->owned ? t->owned + (size_t)(r / tp) * (size_t)nmod : NULL,
    };
    return pt_model_new_opts(out, &c->model, 0, &o);
}

/* The whole model's tensors one at a time for a sink on the group's rank
 * 0 (it pulls them from src in order); the others send theirs, each
 * member's own from own(own_arg, k, ..), every one of them even when the
 * sink stops early. */
typedef pt_status (*pt_mp_sink)(void *arg, pt_st_tensor_source src, void *src_arg);

/* ---- streaming: the whole model's tensors one at a time ----
 * The writer pulls t->full's tensors in order; each member sends its own
 * tensors in order (a subsequence of t->full's), so rank 0 holds one
 * receive buffer (a member's largest tensor) and, under tp, one tensor that
 * tp splits (the largest), instead of the whole model: for GPT-2 the
 * embedding, not the model. A tensor some member holds whole (a pipeline
 * stage's; a LayerNorm's, alike on every tp rank) goes to the file from
 * where it is or arrived. */

typedef struct {
    const pt_trainer *t;
    pt_st_tensor_source own; /* this member's tensors, in order */
    void *own_arg;
    int n;        /* members */
    pt_model **s; /* member tables; s[0] is t->model, lent */
    int *at;      /* each member's next tensor */
    float *rbuf;  /* a member's tensor as received */
    float *tbuf;  /* a split tensor, assembled */
    int next;     /* the next tensor of t->full */
    pt_status st; /* the first failed receive */
} pt_mp_stream;

/* Whether member r's next tensor is tensor `name`: it sends it now. */
static const pt_param_info *holds(const pt_mp_stream *q, int r, const char *name) {
    if (q->at[r] >= pt_model_num_tensors(q->s[r])) return NULL;
    const pt_param_info *p = pt_model_tensor(q->s[r], q->at[r]);
    return strcmp(p->name, name) == 0 ? p : NULL;
}

/* The next tensor of t->full from its holders; *data NULL when only
 * draining (a writer that stopped early). */
static pt_status pull(pt_mp_stream *q, const float **data) {
    const pt_param_info *pw = pt_model_tensor(q->t->full, q->next++);
    int split = 0;
    for (int r = 0; r < q->n; r++) {
        const pt_param_info *p = holds(q, r, pw->name);
        if (p && !pt_shard_whole(&p->shard)) split = 1;
    }
    const float *got = NULL;
    for (int r = 0; r < q->n && q->st == PT_OK; r++) {
        const pt_param_info *p = holds(q, r, pw->name);
        if (!p) continue;
        const float *src = q->rbuf;
        if (r == 0) /* a source that gathers (ZeRO's shards) is pulled even when draining */
            q->st = q->own(q->own_arg, q->at[r], &src);
        else
            q->st = pt_comm_recv(q->t->mp, q->rbuf, p->numel * sizeof(float), r, 31);
        q->at[r]++;
        if (q->st != PT_OK || !data) continue;
        got = src;
        if (!split) continue;
        for (size_t k = 0; k < pt_shard_num_runs(&p->shard); k++) {
            size_t g, l, len;
            pt_shard_run(&p->shard, k, &g, &l, &len);
            memcpy(q->tbuf + g, src + l, len * sizeof(float));
        }
        got = q->tbuf;
    }
    if (q->st == PT_OK && data) {
        PT_ASSERT(got != NULL); /* every tensor has a holder */
        *data = got;
    }
    return q->st;
}

static pt_status stream_source(void *arg, int i, const float **data) {
    pt_mp_stream *q = arg;
    PT_ASSERT(i == q->next);
    return pull(q, data);
}

static void stream_free(pt_mp_stream *q) {
    pt_mem_free(q->tbuf);
    pt_mem_free(q->rbuf);
    for (int r = q->n - 1; q->s && r >= 1; r--) pt_model_free(q->s[r]);
    free(q->s);
    free(q->at);
}

/* Rank 0's side: tables and buffers first, then the group agrees (a rank
 * 0 out of memory leaves no member blocked in its send); then the sink
 * pulls, and whatever it did not pull is received and dropped. */
static pt_status stream_root(const pt_trainer *t, pt_st_tensor_source own, void *own_arg,
                             pt_mp_sink sink, void *arg) {
    pt_mp_stream q = {.t = t, .own = own, .own_arg = own_arg, .n = pt_comm_size(t->mp)};
    q.s = calloc((size_t)q.n, sizeof *q.s);
    q.at = calloc((size_t)q.n, sizeof *q.at);
    pt_status st = q.s && q.at ? PT_OK : pt_error_set(PT_ERR_NOMEM, "model-parallel save");
    if (st == PT_OK) q.s[0] = t->model;
    for (int r = 1; r < q.n && st == PT_OK; r++) st = member_table(t, r, &q.s[r]);
    size_t most = 0, split = 0;
    for (int r = 0; r < q.n && st == PT_OK; r++)
        for (int k = 0; k < pt_model_num_tensors(q.s[r]); k++) {
            const pt_param_info *p = pt_model_tensor(q.s[r], k);
            if (r > 0 && p->numel > most) most = p->numel;
            if (!pt_shard_whole(&p->shard) && pt_shard_numel(&p->shard) > split)
                split = pt_shard_numel(&p->shard);
        }
    if (st == PT_OK && most && !(q.rbuf = pt_mem_alloc(PT_MEM_SCRATCH, most * sizeof(float))))
        st = pt_error_set(PT_ERR_NOMEM, "model-parallel save: a member's tensor");
    if (st == PT_OK && split && !(q.tbuf = pt_mem_alloc(PT_MEM_SCRATCH, split * sizeof(float))))
        st = pt_error_set(PT_ERR_NOMEM, "model-parallel save: a split tensor");
    st = pt_comm_agree(t->mp, st);
    if (st == PT_OK) {
        st = sink(arg, stream_source, &q);
        while (q.st == PT_OK && q.next < pt_model_num_tensors(t->full)) pull(&q, NULL);
        if (st == PT_OK) st = q.st;
    }
    stream_free(&q);
    return st;
}

static pt_status stream_full(const pt_trainer *t, pt_st_tensor_source own, void *own_arg,
                             pt_mp_sink sink, void *arg) {
    if (pt_comm_rank(t->mp) == 0) return stream_root(t, own, own_arg, sink, arg);
    PT_CHECK(pt_comm_agree(t->mp, PT_OK)); /* rank 0 is ready to receive */
    for (int k = 0; k < pt_model_num_tensors(t->model); k++) {
        const pt_param_info *p = pt_model_tensor(t->model, k);
        const float *data;
        PT_CHECK(own(own_arg, k, &data));
        PT_CHECK(pt_comm_send(t->mp, data, p->numel * sizeof(float), 0, 31));
    }
    return PT_OK;
}

typedef struct {
    const pt_model *m;
    const float *buf;
} flat;

static pt_status flat_tensor(void *arg, int i, const float **data) {
    const flat *f = arg;
    *data = f->buf + pt_model_tensor(f->m, i)->offset;
    return PT_OK;
}

static pt_status stream_flat(const pt_trainer *t, const float *local, pt_mp_sink sink, void *arg) {
    flat f = {t->model, local};
    return stream_full(t, flat_tensor, &f, sink, arg);
}

/* pt_mp_gather_full's sink: each tensor to its place in the full buffer. */
static pt_status copy_full(void *arg, pt_st_tensor_source src, void *src_arg) {
    const pt_mp_stream *q = src_arg;
    float *full = arg;
    for (int i = 0; i < pt_model_num_tensors(q->t->full); i++) {
        const pt_param_info *p = pt_model_tensor(q->t->full, i);
        const float *data;
        PT_CHECK(src(src_arg, i, &data));
        memcpy(full + p->offset, data, p->numel * sizeof(float));
    }
    return PT_OK;
}

pt_status pt_mp_gather_full(const pt_trainer *t, const float *local, float *full) {
    return stream_flat(t, local, copy_full, full);
}

/* The test seam's (trainer_test.h): every rank's parameters, full, on
 * world rank 0. */
pt_status pt_trainer_gather_params(pt_trainer *t, float *out) {
    if (!t->mp) {
        if (t->zero) return pt_zero_gather_params(t->zero, out);
        memcpy(out, pt_model_params(t->model), pt_model_num_params(t->model) * sizeof(float));
        return PT_OK;
    }
    /* this rank's slices (ZeRO: from the dp group's shards), then every
     * model-parallel member's to its rank 0 */
    size_t n = pt_model_num_params(t->model);
    float *local =
        t->zero ? pt_mem_alloc(PT_MEM_SCRATCH, n * sizeof(float)) : pt_model_params(t->model);
    pt_status st = local ? PT_OK : pt_error_set(PT_ERR_NOMEM, "gather: parameters");
    if (t->aux) st = pt_comm_agree(t->aux, st);
    if (st == PT_OK && t->zero) st = pt_zero_gather_params(t->zero, local);
    if (st == PT_OK) st = pt_mp_gather_full(t, local, out);
    if (t->zero) pt_mem_free(local);
    return st;
}
