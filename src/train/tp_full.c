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

pt_status pt_tp_gather_full(pt_comm *tp, const pt_model *m, const float *local, float *full) {
    int t = 1, me = 0;
    pt_model_tp(m, &t, &me);
    size_t n = pt_model_num_params(m);
    if (me != 0) return pt_comm_send(tp, local, n * sizeof(float), 0, 31);
    const pt_model_config *cfg = pt_model_config_of(m);
    pt_model *w = NULL, *s = NULL;
    float *buf = NULL;
    pt_status st = pt_model_new_slice(&w, cfg, 0, 1, 0);
    if (st == PT_OK) place(w, m, local, full);
    for (int r = 1; r < t && st == PT_OK; r++) {
        st = pt_model_new_slice(&s, cfg, 0, t, r);
        size_t nr = s ? pt_model_num_params(s) : 0;
        if (st == PT_OK && !(buf = pt_mem_alloc(PT_MEM_SCRATCH, nr * sizeof(float))))
            st = pt_error_set(PT_ERR_NOMEM, "tensor-parallel gather");
        if (st == PT_OK) st = pt_comm_recv(tp, buf, nr * sizeof(float), r, 31);
        if (st == PT_OK) place(w, s, buf, full);
        pt_mem_free(buf);
        buf = NULL;
        pt_model_free(s);
        s = NULL;
    }
    pt_model_free(w);
    return st;
}
