/* Passes over a contiguous range of modules in a slot -- forward, backward
 * (fused, or its input-gradient passes B), the weight-gradient passes W,
 * the recompute alone -- and the plug points around each module's pass
 * (pt_model_set_hook): the one place the strategies' hooks are called, so
 * that pt_module_* stay pure compute (calibrate times them alone). A range
 * stops at the first error, a hook's or a tensor-parallel collective's,
 * and returns it. The whole-model passes are the range of every module.
 *
 * Not here: the modules (modules.c), the slots (activations.c). */
#include "model_impl.h"

void pt_model_set_hook(pt_model *m, pt_model_hook fn, void *arg) {
    m->hook = fn;
    m->hook_arg = fn ? arg : NULL;
}

static pt_status hook(pt_model *m, pt_hook_kind k, int i, const pt_batch *b, pt_module_ctx *ctx) {
    if (!m->hook) return PT_OK;
    pt_hook_point p = {i, b->micro, b->last, ctx};
    return m->hook(m->hook_arg, k, &p);
}

pt_status pt_model_forward_range(pt_model *m, pt_model_slot *s, const pt_batch *b, int first,
                                 int last, float *loss) {
    PT_ASSERT(b->B > 0 && b->B <= m->max_B && b->T > 0 && b->T <= m->cfg.seq_len);
    int L = m->cfg.n_layer;
    s->last = *b;
    s->have_targets = b->targets != NULL;
    for (int i = first; i <= last; i++) {
        const float *in = i == 0 ? NULL : s->resid[i - 1];
        float *out = i <= L ? s->resid[i] : b->targets ? s->losses : NULL;
        /* before the module runs: ZeRO-3's hook gathers its parameters */
        PT_CHECK(hook(m, PT_HOOK_BEFORE_FORWARD, i, b, s->ctx[i]));
        PT_CHECK(pt_module_forward(m, i, s->ctx[i], b, in, out));
        PT_CHECK(hook(m, PT_HOOK_AFTER_FORWARD, i, b, s->ctx[i]));
    }
    if (last == L + 1 && b->targets && loss) {
        size_t N = (size_t)b->B * (size_t)b->T;
        double sum = 0;
        for (size_t i = 0; i < N; i++) sum += s->losses[i];
        *loss = (float)(sum / (double)N);
    }
    return PT_OK;
}

pt_status pt_model_backward_range(pt_model *m, pt_model_slot *s, int first, int last,
                                  const float *dy, float *dx, int split) {
    PT_ASSERT(s->have_targets);
    int L = m->cfg.n_layer;
    const pt_batch *b = &s->last;
    const float *d = dy;
    int k = 0; /* between modules: the model's gradient ping-pong */
    for (int i = last; i >= first; i--) {
        float *din = i == 0 ? NULL : i == first ? dx : m->dstream[k];
        const float *dout = i == L + 1 ? NULL : d;
        PT_CHECK(hook(m, PT_HOOK_BEFORE_BACKWARD, i, b, s->ctx[i]));
        if (split)
            PT_CHECK(pt_module_backward_input(m, i, s->ctx[i], b, dout, din));
        else
            PT_CHECK(pt_module_backward(m, i, s->ctx[i], b, dout, din));
        PT_CHECK(hook(m, PT_HOOK_AFTER_BACKWARD, i, b, s->ctx[i]));
        d = din;
        k ^= 1;
    }
    return PT_OK;
}

pt_status pt_model_backward_weight_range(pt_model *m, pt_model_slot *s, int first, int last) {
    for (int i = last; i >= first; i--) {
        PT_CHECK(hook(m, PT_HOOK_BEFORE_WEIGHT, i, &s->last, s->ctx[i]));
        PT_CHECK(pt_module_backward_weight(m, i, s->ctx[i], &s->last));
        PT_CHECK(hook(m, PT_HOOK_AFTER_WEIGHT, i, &s->last, s->ctx[i]));
    }
    return PT_OK;
}

pt_status pt_model_recompute_range(pt_model *m, pt_model_slot *s, int first, int last) {
    for (int i = last; i >= first; i--) PT_CHECK(pt_module_recompute(m, i, s->ctx[i], &s->last));
    return PT_OK;
}

pt_status pt_model_forward_in(pt_model *m, pt_model_slot *s, const pt_batch *b, float *loss) {
    return pt_model_forward_range(m, s, b, 0, m->cfg.n_layer + 1, loss);
}

pt_status pt_model_backward_in(pt_model *m, pt_model_slot *s) {
    return pt_model_backward_range(m, s, 0, m->cfg.n_layer + 1, NULL, NULL, 0);
}

pt_status pt_model_forward(pt_model *m, const pt_batch *b, float *loss) {
    PT_ASSERT(m->own); /* not a model of pt_model_options.no_slot */
    return pt_model_forward_in(m, m->own, b, loss);
}

const float *pt_model_logits(const pt_model *m) {
    PT_ASSERT(!m->bf16); /* a bf16 head keeps no fp32 logits */
    return m->own->ctx[m->cfg.n_layer + 1]->logits.f;
}
