/* Full tensors from model-parallel pieces: rank 0 of a model-parallel
 * group (tp x pp: every tp slice of every pipeline stage) assembles the
 * whole model's flat layout from every member's buffer, placing each
 * member's runs (pt_shard_run) where the whole tensor has them. The
 * trainer uses it for checkpoints (full tensors with GPT-2's names and
 * shapes whatever t is) and for gathering parameters; padding rows of wte
 * are in no run, so they never reach a full buffer.
 *
 * Not here: reading a rank's slice back (pt_safetensors_load_slice). */
#include "trainer_impl.h"

#include <stdlib.h>
#include <string.h>

/* Member buffer `local` (laid out like its model s) into full (laid out
 * like the whole model w), tensor by tensor: s's tensors are a subsequence
 * of w's (a stage's modules), found by name in one forward scan. */
static void place(const pt_model *w, const pt_model *s, const float *local, float *full) {
    int j = 0, nw = pt_model_num_tensors(w);
    for (int k = 0; k < pt_model_num_tensors(s); k++) {
        const pt_param_info *ps = pt_model_tensor(s, k);
        while (j < nw && strcmp(pt_model_tensor(w, j)->name, ps->name) != 0) j++;
        PT_ASSERT(j < nw);
        const pt_param_info *pw = pt_model_tensor(w, j);
        for (size_t q = 0; q < pt_shard_num_runs(&ps->shard); q++) {
            size_t g, l, len;
            pt_shard_run(&ps->shard, q, &g, &l, &len);
            memcpy(full + pw->offset + g, local + ps->offset + l, len * sizeof(float));
        }
    }
}

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

/* Rank 0's side: every member's table and one receive buffer are made
 * first, and the group agrees on that before any transfer, so that a rank
 * 0 out of memory leaves no rank blocked in its send (for as long as a
 * checkpoint's relaxed timeout). */
static pt_status gather_root(const pt_trainer *t, const float *local, float *full) {
    int n = pt_comm_size(t->mp);
    pt_model **s = calloc((size_t)n, sizeof *s);
    float *buf = NULL;
    size_t most = 0;
    pt_status st = s ? PT_OK : pt_error_set(PT_ERR_NOMEM, "model-parallel gather");
    for (int r = 1; r < n && st == PT_OK; r++) {
        st = member_table(t, r, &s[r]);
        if (st == PT_OK && pt_model_num_params(s[r]) > most) most = pt_model_num_params(s[r]);
    }
    if (st == PT_OK && n > 1 && !(buf = pt_mem_alloc(PT_MEM_SCRATCH, most * sizeof(float))))
        st = pt_error_set(PT_ERR_NOMEM, "model-parallel gather");
    st = pt_comm_agree(t->mp, st);
    if (st == PT_OK) place(t->full, t->model, local, full);
    for (int r = 1; r < n && st == PT_OK; r++) {
        st = pt_comm_recv(t->mp, buf, pt_model_num_params(s[r]) * sizeof(float), r, 31);
        if (st == PT_OK) place(t->full, s[r], buf, full);
    }
    pt_mem_free(buf);
    for (int r = n - 1; s && r >= 1; r--) pt_model_free(s[r]);
    free(s);
    return st;
}

pt_status pt_mp_gather_full(const pt_trainer *t, const float *local, float *full) {
    if (pt_comm_rank(t->mp) == 0) return gather_root(t, local, full);
    PT_CHECK(pt_comm_agree(t->mp, PT_OK)); /* rank 0 is ready to receive */
    return pt_comm_send(t->mp, local, pt_model_num_params(t->model) * sizeof(float), 0, 31);
}
