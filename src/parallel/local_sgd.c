/* Local SGD's synchronization: every sync_every steps the ranks average
 * their parameters (one all-reduce of the whole flat buffer); with the outer
 * Nesterov optimizer (DiLoCo, Douillard et al. 2023) the average is treated
 * as a pseudo-gradient delta = anchor - average applied to the anchor (the
 * parameters after the previous synchronization) with momentum.
 *
 * Not here: when to synchronize, the inner optimizer (the trainer's AdamW). */
#include <stdlib.h>
#include <string.h>

#include "partrain/parallel.h"

struct pt_local_sgd {
    size_t n;
    int nesterov;
    float outer_lr, momentum;
    float *anchor, *u; /* n each (nesterov only) */
};

pt_status pt_local_sgd_new(pt_local_sgd **out, const float *params, size_t n, int nesterov,
                           float outer_lr, float momentum) {
    *out = NULL;
    pt_local_sgd *l = calloc(1, sizeof *l);
    if (!l) return pt_error_set(PT_ERR_NOMEM, "local_sgd");
    l->n = n;
    l->nesterov = nesterov;
    l->outer_lr = outer_lr;
    l->momentum = momentum;
    if (nesterov) {
        l->anchor = pt_mem_alloc(PT_MEM_OPTIM, n * sizeof(float));
        l->u = pt_mem_alloc(PT_MEM_OPTIM, n * sizeof(float));
        if (!l->anchor || !l->u) {
            pt_local_sgd_free(l);
            return pt_error_set(PT_ERR_NOMEM, "local_sgd outer state (%zu floats)", n);
        }
        memcpy(l->anchor, params, n * sizeof(float));
    }
    *out = l;
    return PT_OK;
}

void pt_local_sgd_free(pt_local_sgd *l) {
    if (!l) return;
    pt_mem_free(l->u);
    pt_mem_free(l->anchor);
    free(l);
}

float *pt_local_sgd_anchor(pt_local_sgd *l) {
    return l->anchor;
}
float *pt_local_sgd_momentum(pt_local_sgd *l) {
    return l->u;
}

pt_status pt_local_sgd_sync(pt_local_sgd *l, pt_comm *c, float *params) {
    PT_CHECK(pt_comm_allreduce(c, params, l->n, PT_REDUCE_AVG));
    if (!l->nesterov) return PT_OK;
    float lr = l->outer_lr, mu = l->momentum;
    for (size_t i = 0; i < l->n; i++) {
        float delta = l->anchor[i] - params[i];
        float u = mu * l->u[i] + delta;
        l->u[i] = u;
        l->anchor[i] -= lr * (delta + mu * u);
        params[i] = l->anchor[i];
    }
    return PT_OK;
}
