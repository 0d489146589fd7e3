/* Full tensors from tensor-parallel slices: tp rank 0 of a group assembles
 * the whole model's flat layout from every rank's slice buffer, placing
 * each rank's runs (pt_shard_run) where the whole tensor has them. The
 * trainer uses it for checkpoints (full tensors with GPT-2's names and
 * shapes whatever t is) and for gathering parameters; padding rows of wte
 * are in no run, so they never reach a full buffer.
 *
 * Not here: reading a rank's slice back (pt_safetensors_load_slice). */
#include "trainer_impl.h"

#include <stdlib.h>
#include <string.h>

/* Rank r's slice buffer `local` (laid out like its slice model s) into
 * full (laid out like the whole model w). */
static void place(const pt_model *w, const pt_model *s, const float *local, float *full) {
    for (int k = 0; k < pt_model_num_tensors(s); k++) {
        const pt_param_info *ps = pt_model_tensor(s, k), *pw = pt_model_tensor(w, k);
        for (size_t q = 0; q < pt_shard_num_runs(&ps->shard); q++) {
            size_t g, l, len;
            pt_shard_run(&ps->shard, q, &g, &l, &len);
            memcpy(full + pw->offset + g, local + ps->offset + l, len * sizeof(float));
        }
    }
}

/* tp rank 0's side: every rank's slice model and one receive buffer are
 * made first, and the group agrees on that before any transfer, so that a
 * rank 0 out of memory leaves no rank blocked in its send (for as long as a
 * checkpoint's relaxed timeout). */
static pt_status gather_root(pt_comm *tp, const pt_model *m, const float *local, float *full,
                             int t) {
    const pt_model_config *cfg = pt_model_config_of(m);
    pt_model *w = NULL, **s = calloc((size_t)t, sizeof *s);
    float *buf = NULL;
    size_t most = 0;
    pt_status st = s ? pt_model_new_slice(&w, cfg, 0, 1, 0)
                     : pt_error_set(PT_ERR_NOMEM, "tensor-parallel gather");
    for (int r = 1; r < t && st == PT_OK; r++) {
        st = pt_model_new_slice(&s[r], cfg, 0, t, r);
        if (st == PT_OK && pt_model_num_params(s[r]) > most) most = pt_model_num_params(s[r]);
    }
    if (st == PT_OK && t > 1 && !(buf = pt_mem_alloc(PT_MEM_SCRATCH, most * sizeof(float))))
        st = pt_error_set(PT_ERR_NOMEM, "tensor-parallel gather");
    st = pt_comm_agree(tp, st);
    if (st == PT_OK) place(w, m, local, full);
    for (int r = 1; r < t && st == PT_OK; r++) {
        st = pt_comm_recv(tp, buf, pt_model_num_params(s[r]) * sizeof(float), r, 31);
        if (st == PT_OK) place(w, s[r], buf, full);
    }
    pt_mem_free(buf);
    for (int r = t - 1; s && r >= 1; r--) pt_model_free(s[r]);
    free(s);
    pt_model_free(w);
    return st;
}

pt_status pt_tp_gather_full(pt_comm *tp, const pt_model *m, const float *local, float *full) {
    int t = 1, me = 0;
    pt_model_tp(m, &t, &me);
    if (me == 0) return gather_root(tp, m, local, full, t);
    PT_CHECK(pt_comm_agree(tp, PT_OK)); /* rank 0 is ready to receive */
    return pt_comm_send(tp, local, pt_model_num_params(m) * sizeof(float), 0, 31);
}
