/* Model tests: the tensor table (GPT-2 names, shapes, contiguous module
 * regions), layout-independent init, loss at init ~ ln(V), a model-level
 * gradient check against central finite differences, module-by-module passes
 * equal to the whole-model pass, the split backward (B then W) equal to the
 * fused one, and no allocation in forward/backward. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../../src/kernels/kernels_impl.h" /* pt_sgemm_set_path: both GEMM paths */
#include "partrain/model.h"
#include "pt_test.h"

static const pt_model_config tiny = {2, 16, 4, 11, 6}; /* L, C, NH, V, T */

/* The whole model's backward: the range of every module in its own slot. */
static pt_status backward(pt_model *m) {
    int L = pt_model_config_of(m)->n_layer;
    return pt_model_backward_range(m, pt_model_own_slot(m), 0, L + 1, NULL, NULL, 0);
}

static void fill_tokens(int *x, int n, int V, uint64_t seed) {
    pt_rng r;
    pt_rng_init(&r, seed, "tokens");
    for (int i = 0; i < n; i++) x[i] = (int)pt_rng_below(&r, (uint64_t)V);
}

static void test_table(void) {
    pt_model *m = NULL;
    CHECK_OK(pt_model_new(&m, &tiny, 2));
    if (!m) return;
    CHECK_EQ(pt_model_num_tensors(m), 2 + 12 * 2 + 2);
    CHECK_EQ(pt_model_num_params(m), pt_model_config_num_params(&tiny));
    CHECK_EQ(pt_model_num_modules(m), 4);
    const pt_param_info *p = pt_model_find(m, "h.1.attn.c_attn.weight");
    CHECK(p != NULL);
    if (p) {
        CHECK_EQ(p->ndim, 2);
        CHECK_EQ(p->shape[0], 16);
        CHECK_EQ(p->shape[1], 48);
        CHECK_EQ(p->module, 2);
    }
    p = pt_model_find(m, "h.0.mlp.c_proj.weight");
    CHECK(p && p->shape[0] == 64 && p->shape[1] == 16 && p->decay == 1);
    p = pt_model_find(m, "wte.weight");
    CHECK(p && p->shape[0] == 11 && p->shape[1] == 16 && p->offset == 0);
    p = pt_model_find(m, "wpe.weight");
    CHECK(p && p->shape[0] == 6 && p->shape[1] == 16);
    p = pt_model_find(m, "ln_f.bias");
    CHECK(p && p->ndim == 1 && p->decay == 0 && p->offset + p->numel == pt_model_num_params(m));
    CHECK(pt_model_find(m, "h.2.ln_1.weight") == NULL);
    /* module regions tile the flat buffer; each tensor lies in its module's */
    size_t at = 0;
    for (int i = 0; i < pt_model_num_modules(m); i++) {
        size_t off, cnt;
        pt_model_module_region(m, i, &off, &cnt);
        CHECK_EQ(off, at);
        at += cnt;
    }
    CHECK_EQ(at, pt_model_num_params(m));
    for (int i = 0; i < pt_model_num_tensors(m); i++) {
        const pt_param_info *t = pt_model_tensor(m, i);
        size_t off, cnt;
        pt_model_module_region(m, t->module, &off, &cnt);
        CHECK(t->offset >= off && t->offset + t->numel <= off + cnt);
    }
    CHECK(pt_model_module_kind(m, 0) == PT_MODULE_EMBEDDING);
    CHECK(pt_model_module_kind(m, 2) == PT_MODULE_BLOCK);
    CHECK(pt_model_module_kind(m, 3) == PT_MODULE_HEAD);
    pt_model_free(m);
}

static void test_config_errors(void) {
    pt_model_config c = tiny;
    c.n_head = 5;
    CHECK(pt_model_config_validate(&c) == PT_ERR_INVALID);
    CHECK(strstr(pt_error_message(), "model.n_embd") != NULL);
    c = tiny;
    c.n_layer = 0;
    CHECK(pt_model_config_validate(&c) == PT_ERR_INVALID);
    CHECK(strstr(pt_error_message(), "model.n_layer") != NULL);
    c = tiny;
    c.seq_len = -3;
    pt_model *m = NULL;
    CHECK(pt_model_new(&m, &c, 1) == PT_ERR_INVALID && m == NULL);
}

static void test_init(void) {
    pt_model *m = NULL;
    CHECK_OK(pt_model_new(&m, &tiny, 1));
    if (!m) return;
    pt_model_draw_weights(m, 42);
    const float *w = pt_model_params(m);
    const pt_param_info *p = pt_model_find(m, "h.1.mlp.c_fc.weight");
    uint64_t key = pt_rng_key(42, "h.1.mlp.c_fc.weight");
    int same = 1;
    for (size_t j = 0; j < p->numel; j++)
        if (w[p->offset + j] != 0.02f * pt_rng_normal_at(key, j)) same = 0;
    CHECK(same);
    p = pt_model_find(m, "h.0.attn.c_proj.weight");
    key = pt_rng_key(42, "h.0.attn.c_proj.weight");
    CHECK_NEAR(w[p->offset + 7], 0.02f / sqrtf(4.0f) * pt_rng_normal_at(key, 7), 1e-9, 0);
    p = pt_model_find(m, "h.0.ln_2.weight");
    CHECK(w[p->offset] == 1.0f && w[p->offset + p->numel - 1] == 1.0f);
    p = pt_model_find(m, "h.0.ln_2.bias");
    CHECK(w[p->offset] == 0.0f);
    p = pt_model_find(m, "h.0.attn.c_attn.bias");
    CHECK(w[p->offset + 3] == 0.0f);
    p = pt_model_find(m, "ln_f.weight");
    CHECK(w[p->offset + 2] == 1.0f);
    /* std of a big matrix ~ 0.02 */
    p = pt_model_find(m, "h.0.mlp.c_fc.weight");
    double s = 0;
    for (size_t j = 0; j < p->numel; j++) s += (double)w[p->offset + j] * w[p->offset + j];
    CHECK_NEAR(sqrt(s / (double)p->numel), 0.02, 0.003, 0);
    pt_model_free(m);
}

static void test_init_loss(void) {
    pt_model_config c = {2, 32, 4, 256, 16};
    pt_model *m = NULL;
    CHECK_OK(pt_model_new(&m, &c, 4));
    if (!m) return;
    pt_model_draw_weights(m, 1);
    int x[64], y[64];
    fill_tokens(x, 64, 256, 1);
    fill_tokens(y, 64, 256, 2);
    pt_batch b = {x, y, 1.0f / 64, 4, 16, 0, 0};
    float loss = 0;
    CHECK_OK(pt_model_forward(m, &b, &loss));
    CHECK_NEAR(loss, log(256.0), 0.05, 0);
    pt_model_free(m);
}

/* Perturb parameters so that every gradient is sizeable. */
static void randomize(pt_model *m, float scale) {
    float *w = pt_model_params(m);
    for (int i = 0; i < pt_model_num_tensors(m); i++) {
        const pt_param_info *t = pt_model_tensor(m, i);
        uint64_t key = pt_rng_key(7, t->name);
        int lnw = strstr(t->name, "ln_") && strstr(t->name, "weight");
        for (size_t j = 0; j < t->numel; j++)
            w[t->offset + j] = (lnw ? 1.0f : 0.0f) + scale * pt_rng_normal_at(key, j);
    }
}

static double loss_at(pt_model *m, const pt_batch *b) {
    float loss = 0;
    CHECK_OK(pt_model_forward(m, b, &loss));
    return loss;
}

static void test_gradcheck(void) {
    pt_model *m = NULL;
    CHECK_OK(pt_model_new(&m, &tiny, 2));
    if (!m) return;
    randomize(m, 0.3f);
    int B = 2, T = 6, x[12], y[12];
    fill_tokens(x, 12, tiny.vocab_size, 3);
    fill_tokens(y, 12, tiny.vocab_size, 4);
    pt_batch b = {x, y, 1.0f / (float)(B * T), B, T, 0, 0};
    pt_model_zero_grads(m);
    float loss = 0;
    CHECK_OK(pt_model_forward(m, &b, &loss));
    CHECK_OK(backward(m));
    float *w = pt_model_params(m);
    const float *g = pt_model_grads(m);
    const float h = 1e-2f;
    int bad = 0, checked = 0;
    double num = 0, den = 0;
    for (int i = 0; i < pt_model_num_tensors(m); i++) {
        const pt_param_info *t = pt_model_tensor(m, i);
        for (int k = 0; k < 6; k++) {
            size_t j = t->offset + (size_t)((k * 7919u + (unsigned)i * 31u) % t->numel);
            float old = w[j];
            w[j] = old + h;
            double lp = loss_at(m, &b);
            w[j] = old - h;
            double lm = loss_at(m, &b);
            w[j] = old;
            double fd = (lp - lm) / (2.0 * h);
            double an = g[j];
            num += (fd - an) * (fd - an);
            den += fd * fd;
            checked++;
            if (fabs(fd - an) > 2e-3 + 5e-2 * fabs(fd)) {
                if (bad < 5)
                    fprintf(stderr, "  %s[%zu]: analytic %.6g vs finite difference %.6g\n", t->name,
                            j - t->offset, an, fd);
                bad++;
            }
        }
    }
    CHECK_EQ(bad, 0);
    CHECK(sqrt(num / den) < 1e-2);
    CHECK(den > 1e-4); /* the gradients are not all ~0 */
    fprintf(stderr, "  gradcheck: %d coordinates, relative error %.2e\n", checked, sqrt(num / den));
    pt_model_free(m);
}

/* Driving the modules one by one with fresh contexts gives the whole-model
 * pass bit for bit. */
static void test_modules(void) {
    pt_model *m = NULL;
    CHECK_OK(pt_model_new(&m, &tiny, 2));
    if (!m) return;
    randomize(m, 0.2f);
    int B = 2, T = 5, x[10], y[10];
    fill_tokens(x, 10, tiny.vocab_size, 5);
    fill_tokens(y, 10, tiny.vocab_size, 6);
    pt_batch b = {x, y, 1.0f / 10, B, T, 0, 0};
    size_t n = pt_model_num_params(m);
    static float g1[20000];
    CHECK(n <= 20000);
    pt_model_zero_grads(m);
    float loss = 0;
    CHECK_OK(pt_model_forward(m, &b, &loss));
    CHECK_OK(backward(m));
    memcpy(g1, pt_model_grads(m), n * sizeof(float));

    int nmod = pt_model_num_modules(m);
    pt_module_ctx *ctx[4] = {0};
    for (int i = 0; i < nmod; i++) CHECK_OK(pt_module_ctx_new(&ctx[i], m, i, 2));
    static float acts[4][2 * 6 * 16], losses[10], d[2][2 * 6 * 16];
    pt_model_zero_grads(m);
    CHECK_OK(pt_module_forward(m, 0, ctx[0], &b, NULL, acts[0]));
    CHECK_OK(pt_module_forward(m, 1, ctx[1], &b, acts[0], acts[1]));
    CHECK_OK(pt_module_forward(m, 2, ctx[2], &b, acts[1], acts[2]));
    CHECK_OK(pt_module_forward(m, 3, ctx[3], &b, acts[2], losses));
    double s = 0;
    for (int i = 0; i < 10; i++) s += losses[i];
    CHECK((float)(s / 10) == loss);
    CHECK_OK(pt_module_backward(m, 3, ctx[3], &b, NULL, d[0]));
    CHECK_OK(pt_module_backward(m, 2, ctx[2], &b, d[0], d[1]));
    CHECK_OK(pt_module_backward(m, 1, ctx[1], &b, d[1], d[0]));
    CHECK_OK(pt_module_backward(m, 0, ctx[0], &b, d[0], NULL));
    CHECK(memcmp(g1, pt_model_grads(m), n * sizeof(float)) == 0);
    /* backward accumulates into parameter gradients: wpe (only the
     * embedding writes it) doubles */
    CHECK_OK(pt_module_backward(m, 0, ctx[0], &b, d[0], NULL));
    const pt_param_info *wpe = pt_model_find(m, "wpe.weight");
    const float *g2 = pt_model_grads(m);
    int ok = 1;
    for (size_t j = wpe->offset; j < wpe->offset + wpe->numel; j++)
        if (fabsf(g2[j] - 2 * g1[j]) > 1e-6f + 1e-5f * fabsf(g1[j])) ok = 0;
    CHECK(ok);
    for (int i = 0; i < nmod; i++) pt_module_ctx_free(ctx[i]);
    pt_model_free(m);
}

/* Redirected module buffers (ZeRO units): with every module reading copies
 * of its parameters and accumulating into its own gradient buffers, and the
 * flat buffers dropped, loss and gradients are bitwise those of the flat
 * model (the head reads wte through module 0's buffers). */
static void test_module_buffers(void) {
    pt_model *m = NULL;
    CHECK_OK(pt_model_new(&m, &tiny, 2));
    if (!m) return;
    randomize(m, 0.2f);
    int x[10], y[10];
    fill_tokens(x, 10, tiny.vocab_size, 7);
    fill_tokens(y, 10, tiny.vocab_size, 8);
    pt_batch b = {x, y, 1.0f / 10, 2, 5, 0, 0};
    size_t n = pt_model_num_params(m);
    static float p0[20000], g0[20000], pu[20000], gu[20000];
    CHECK(n <= 20000);
    memcpy(p0, pt_model_params(m), n * sizeof(float));
    pt_model_zero_grads(m);
    float l0 = 0, l1 = 0;
    CHECK_OK(pt_model_forward(m, &b, &l0));
    CHECK_OK(backward(m));
    memcpy(g0, pt_model_grads(m), n * sizeof(float));
    memcpy(pu, p0, n * sizeof(float));
    memset(gu, 0, sizeof gu);
    int nmod = pt_model_num_modules(m);
    for (int i = 0; i < nmod; i++) {
        size_t off, cnt;
        pt_model_module_region(m, i, &off, &cnt);
        pt_model_set_module_buffers(m, i, pu + off, gu + off);
    }
    pt_model_drop_flat(m, 1, 1);
    CHECK(pt_model_params(m) == NULL && pt_model_grads(m) == NULL);
    pt_model_zero_grads(m); /* no flat buffer: nothing */
    CHECK_OK(pt_model_forward(m, &b, &l1));
    CHECK_OK(backward(m));
    CHECK(l0 == l1);
    CHECK(memcmp(g0, gu, n * sizeof(float)) == 0);
    pt_model_free(m);
}

/* Forward and backward allocate nothing: the peak equals the current. */
static void test_no_alloc(void) {
    pt_model *m = NULL;
    CHECK_OK(pt_model_new(&m, &tiny, 2));
    if (!m) return;
    pt_model_draw_weights(m, 3);
    int x[12], y[12];
    fill_tokens(x, 12, tiny.vocab_size, 1);
    fill_tokens(y, 12, tiny.vocab_size, 2);
    pt_batch b = {x, y, 1.0f / 12, 2, 6, 0, 0};
    size_t before = pt_mem_current_total();
    pt_mem_reset_peak();
    float loss;
    CHECK_OK(pt_model_forward(m, &b, &loss));
    CHECK_OK(backward(m));
    CHECK_EQ(pt_mem_peak_total(), before);
    CHECK_EQ(pt_mem_current_total(), before);
    pt_model_free(m);
}

/* Out of memory anywhere in pt_model_new is an error, not a crash. */
static void test_oom(void) {
    for (long k = 1; k <= 8; k++) {
        pt_model *m = NULL;
        pt_mem_fail_after(k);
        pt_status st = pt_model_new(&m, &tiny, 1);
        pt_mem_fail_after(0);
        if (st == PT_OK) {
            pt_model_free(m);
            break;
        }
        CHECK(st == PT_ERR_NOMEM && m == NULL);
    }
    CHECK_EQ(pt_mem_current_total(), 0);
}

/* ---- plug points and slots ---- */

/* The points a hook logs: f F b B w W for pt_hook_kind's six, those of
 * `only` (all when empty); fail_at k > 0: the k-th call returns an error. */
typedef struct {
    const char *only;
    int fail_at, calls;
    int n;
    char kind[64];
    int module[64], micro[64], last[64];
    const pt_module_ctx *ctx[64];
} hook_log;

static pt_status on_hook(void *a, pt_hook_kind k, const pt_hook_point *p) {
    hook_log *l = a;
    char kind = "fFbBwW"[k];
    if (++l->calls == l->fail_at) return pt_error_set(PT_ERR_COMM, "planted hook failure");
    if ((l->only && !strchr(l->only, kind)) || l->n >= 64) return PT_OK;
    l->kind[l->n] = kind;
    l->module[l->n] = p->module;
    l->micro[l->n] = p->micro;
    l->last[l->n] = p->last;
    l->ctx[l->n] = p->ctx;
    l->n++;
    return PT_OK;
}

/* Two micro-batches, forwards first, in two slots (gpipe's order): every
 * pass fires its plug points with its module, micro-batch, last flag and
 * its slot's context, around the module's work; the gradient is bitwise the
 * one of the same micro-batches one after another in the model's own slot
 * (backward scratch is shared: backwards run one at a time). A one-module
 * range fires them too, a module pass none (pure compute); a hook's error
 * stops the range at once and is its result. */
static void test_hooks_and_slots(void) {
    pt_model *m = NULL;
    CHECK_OK(pt_model_new(&m, &tiny, 2));
    if (!m) return;
    randomize(m, 0.2f);
    int x[2][10], y[2][10];
    for (int k = 0; k < 2; k++) {
        fill_tokens(x[k], 10, tiny.vocab_size, 11 + (uint32_t)k);
        fill_tokens(y[k], 10, tiny.vocab_size, 21 + (uint32_t)k);
    }
    pt_batch b[2] = {{x[0], y[0], 1.0f / 20, 2, 5, 0, 0}, {x[1], y[1], 1.0f / 20, 2, 5, 1, 1}};
    size_t n = pt_model_num_params(m);
    static float g1[20000];
    CHECK(n <= 20000);
    pt_model_zero_grads(m);
    for (int k = 0; k < 2; k++) {
        CHECK_OK(pt_model_forward(m, &b[k], NULL));
        CHECK_OK(backward(m));
    }
    memcpy(g1, pt_model_grads(m), n * sizeof(float));

    pt_model_slot *second = NULL;
    CHECK_OK(pt_model_slot_new(&second, m));
    if (!second) return;
    pt_model_slot *slot[2] = {pt_model_own_slot(m), second};
    hook_log lg;
    memset(&lg, 0, sizeof lg);
    pt_model_set_hook(m, on_hook, &lg);
    pt_model_zero_grads(m);
    int L = tiny.n_layer;
    for (int k = 0; k < 2; k++) CHECK_OK(pt_model_forward_range(m, slot[k], &b[k], 0, L + 1, NULL));
    for (int k = 0; k < 2; k++)
        CHECK_OK(pt_model_backward_range(m, slot[k], 0, L + 1, NULL, NULL, 0));
    CHECK(memcmp(g1, pt_model_grads(m), n * sizeof(float)) == 0);
    int nmod = pt_model_num_modules(m); /* 4 */
    CHECK_EQ(lg.n, 4 * 2 * nmod);
    int ok = 1;
    for (int e = 0; e < lg.n && e < 64; e++) {
        int pass = e / (2 * nmod), in = e % (2 * nmod); /* F0 F1 B0 B1 */
        int fwd = pass < 2, mb = pass % 2, mod = fwd ? in / 2 : nmod - 1 - in / 2;
        char want = fwd ? (in % 2 ? 'F' : 'f') : (in % 2 ? 'B' : 'b');
        if (lg.kind[e] != want || lg.module[e] != mod || lg.micro[e] != mb ||
            lg.last[e] != (mb == 1) || lg.ctx[e] != pt_model_slot_ctx(slot[mb], mod))
            ok = 0;
    }
    CHECK(ok);
    /* a one-module range fires them too; a module pass none */
    lg.n = 0;
    CHECK_OK(pt_model_forward_range(m, second, &b[1], 0, 0, NULL));
    CHECK_EQ(lg.n, 2);
    CHECK(lg.kind[0] == 'f' && lg.kind[1] == 'F' && lg.module[1] == 0 && lg.micro[1] == 1);
    static float out[2 * 5 * 16];
    CHECK_OK(pt_module_forward(m, 0, pt_model_slot_ctx(second, 0), &b[1], NULL, out));
    CHECK_EQ(lg.n, 2);
    /* the third call (module 1's before_forward) fails: module 0 ran, the
     * range returns the hook's error, nothing after it runs */
    memset(&lg, 0, sizeof lg);
    lg.fail_at = 3;
    CHECK(pt_model_forward_range(m, second, &b[1], 0, L + 1, NULL) == PT_ERR_COMM);
    CHECK(strstr(pt_error_message(), "planted hook failure") != NULL);
    CHECK_EQ(lg.calls, 3);
    CHECK(lg.n == 2 && lg.kind[1] == 'F' && lg.module[1] == 0);
    pt_model_set_hook(m, NULL, NULL);
    pt_model_slot_free(second);
    pt_model_free(m);
}

/* ---- the split backward (B: input gradients, W: weight gradients) ---- */
#define CHAIN_NC (2 * 6 * 16)
#define CHAIN_N  12
#include "split_chain.h"

typedef struct {
    pt_module_ctx *ctx[NMOD];
    pt_module_scratch *scr[NMOD];
} ctx_set;
static void ctx_set_new(ctx_set *c, pt_model *m, int own_scratch) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < NMOD; i++) {
        CHECK_OK(pt_module_ctx_new(&c->ctx[i], m, i, 2));
        if (!own_scratch) continue;
        CHECK_OK(pt_module_scratch_new(&c->scr[i], m, 2));
        pt_module_ctx_set_scratch(c->ctx[i], c->scr[i]);
    }
}
static void ctx_set_free(ctx_set *c) {
    for (int i = 0; i < NMOD; i++) {
        pt_module_ctx_free(c->ctx[i]);
        pt_module_scratch_free(c->scr[i]);
    }
}

static int all_nonzero_somewhere(const float *g, size_t n) {
    size_t nz = 0;
    for (size_t j = 0; j < n; j++) nz += g[j] != 0.0f;
    return nz > n / 2;
}

/* B then W gives pt_module_backward's input gradients and parameter
 * gradients BIT FOR BIT, for every module kind, on both GEMM paths: the
 * split kernels are the fused ones' halves (the same products; LayerNorm's
 * row and column passes are the fused kernel's). So does the whole-model
 * split (every B, then every W), equal to the whole-model backward. */
static void split_modules_path(void) {
    pt_model *m = NULL;
    CHECK_OK(pt_model_new(&m, &tiny, 2));
    if (!m) return;
    CHECK_EQ(pt_model_num_modules(m), NMOD);
    randomize(m, 0.2f);
    int x[10], y[10];
    fill_tokens(x, 10, tiny.vocab_size, 11);
    fill_tokens(y, 10, tiny.vocab_size, 12);
    pt_batch b = {x, y, 1.0f / 10, 2, 5, 0, 1};
    size_t n = pt_model_num_params(m);
    static float gw[20000], gf[20000];
    CHECK(n <= 20000);
    pt_model_zero_grads(m);
    CHECK_OK(pt_model_forward(m, &b, NULL));
    CHECK_OK(backward(m));
    memcpy(gw, pt_model_grads(m), n * sizeof(float));
    CHECK(all_nonzero_somewhere(gw, n));

    ctx_set fused, split;
    ctx_set_new(&fused, m, 0);
    ctx_set_new(&split, m, 1);
    static chain_bufs cf, cs;
    pt_model_zero_grads(m);
    CHECK(!chain_forward(m, fused.ctx, &b, &cf));
    CHECK(!chain_input(m, fused.ctx, &b, &cf, CH_FUSED));
    memcpy(gf, pt_model_grads(m), n * sizeof(float));
    CHECK(memcmp(gf, gw, n * sizeof(float)) == 0);
    for (int mode = CH_BW; mode <= CH_ALLB_ALLW; mode++) {
        memset(&cs, 0, sizeof cs);
        pt_model_zero_grads(m);
        CHECK(!chain_forward(m, split.ctx, &b, &cs));
        CHECK(!chain_input(m, split.ctx, &b, &cs, mode));
        /* B alone writes no parameter gradient */
        if (mode == CH_ALLB_ALLW) {
            const float *g = pt_model_grads(m);
            size_t nz = 0;
            for (size_t j = 0; j < n; j++) nz += g[j] != 0.0f;
            CHECK_EQ(nz, 0);
            CHECK(!chain_weight(m, split.ctx, &b));
        }
        for (int i = 1; i < NMOD; i++) CHECK(memcmp(cs.din[i], cf.din[i], sizeof cf.din[i]) == 0);
        CHECK(memcmp(pt_model_grads(m), gf, n * sizeof(float)) == 0);
    }
    ctx_set_free(&fused);
    ctx_set_free(&split);
    pt_model_free(m);
}

static void test_split_modules(void) {
    pt_sgemm_set_path(PT_GEMM_BLAS);
    split_modules_path();
    if (pt_sgemm_has_own()) {
        pt_sgemm_set_path(PT_GEMM_OWN);
        split_modules_path();
    }
    pt_sgemm_set_path(PT_GEMM_AUTO);
}

/* The zero-bubble use: forwards of micro-batches 0 and 1 in two sets of
 * contexts with scratch of their own, B of both, then W of both. W in
 * micro-batch order gives the sequential fused backward's gradients bit
 * for bit (the same additions in the same order); in the other order
 * within float rounding: only the order in which the two micro-batches'
 * terms are added into each gradient differs (row by row in the bias and
 * LayerNorm column sums and wte's scatter), so an element differs by at
 * most a few roundings of the largest partial sum: 1e-5 of the tensor's
 * largest gradient (the sums have at most 2*10 terms: 20 * 2^-24 < 2e-6).
 * Through the range passes in two slots whose contexts have scratch of
 * their own: AFTER_BACKWARD fires after each B, AFTER_WEIGHT after each W,
 * with the micro-batch, last flag and context. */
static void test_split_micro_batches(void) {
    pt_model *m = NULL;
    CHECK_OK(pt_model_new(&m, &tiny, 2));
    if (!m) return;
    randomize(m, 0.2f);
    int x[2][10], y[2][10];
    pt_batch b[2];
    for (int k = 0; k < 2; k++) {
        fill_tokens(x[k], 10, tiny.vocab_size, 21 + k);
        fill_tokens(y[k], 10, tiny.vocab_size, 31 + k);
        b[k] = (pt_batch){x[k], y[k], 1.0f / 20, 2, 5, k, k == 1};
    }
    size_t n = pt_model_num_params(m);
    static float g1[20000];
    CHECK(n <= 20000);
    pt_model_zero_grads(m);
    for (int k = 0; k < 2; k++) {
        CHECK_OK(pt_model_forward(m, &b[k], NULL));
        CHECK_OK(backward(m));
    }
    memcpy(g1, pt_model_grads(m), n * sizeof(float));

    int L = tiny.n_layer;
    pt_model_slot *slot[2] = {NULL, NULL};
    pt_module_scratch *scr[2][NMOD] = {{NULL}};
    for (int k = 0; k < 2; k++) {
        CHECK_OK(pt_model_slot_new(&slot[k], m));
        if (!slot[k]) return;
        for (int i = 0; i < NMOD; i++) {
            CHECK_OK(pt_module_scratch_new(&scr[k][i], m, 2));
            pt_module_ctx_set_scratch(pt_model_slot_ctx(slot[k], i), scr[k][i]);
        }
    }
    hook_log lg;
    for (int order = 0; order < 2; order++) {
        memset(&lg, 0, sizeof lg);
        lg.only = "BW";
        pt_model_zero_grads(m);
        for (int k = 0; k < 2; k++)
            CHECK_OK(pt_model_forward_range(m, slot[k], &b[k], 0, L + 1, NULL));
        pt_model_set_hook(m, on_hook, &lg);
        for (int k = 0; k < 2; k++)
            CHECK_OK(pt_model_backward_range(m, slot[k], 0, L + 1, NULL, NULL, 1));
        for (int k = 0; k < 2; k++) {
            int mb = order ? 1 - k : k;
            CHECK_OK(pt_model_backward_weight_range(m, slot[mb], 0, L + 1));
        }
        pt_model_set_hook(m, NULL, NULL);
        const float *g = pt_model_grads(m);
        if (order == 0) {
            CHECK(memcmp(g, g1, n * sizeof(float)) == 0);
        } else {
            for (int t = 0; t < pt_model_num_tensors(m); t++) {
                const pt_param_info *p = pt_model_tensor(m, t);
                float big = 0;
                for (size_t j = 0; j < p->numel; j++)
                    if (fabsf(g1[p->offset + j]) > big) big = fabsf(g1[p->offset + j]);
                int bad = 0;
                for (size_t j = 0; j < p->numel; j++)
                    bad += !(fabsf(g[p->offset + j] - g1[p->offset + j]) <= 1e-5f * big);
                if (bad) fprintf(stderr, "  %s: %d elements off\n", p->name, bad);
                CHECK_EQ(bad, 0);
            }
        }
        /* B0 (modules 3..0), B1, then W of both in the order run */
        CHECK_EQ(lg.n, 4 * NMOD);
        int ok = 1;
        for (int e = 0; e < lg.n; e++) {
            int wpass = e >= 2 * NMOD, k = (e % (2 * NMOD)) / NMOD, mod = NMOD - 1 - e % NMOD;
            int mb = wpass && order ? 1 - k : k;
            if (lg.kind[e] != (wpass ? 'W' : 'B') || lg.module[e] != mod || lg.micro[e] != mb ||
                lg.last[e] != (mb == 1) || lg.ctx[e] != pt_model_slot_ctx(slot[mb], mod))
                ok = 0;
        }
        CHECK(ok);
    }
    for (int k = 0; k < 2; k++) {
        pt_model_slot_free(slot[k]);
        for (int i = 0; i < NMOD; i++) pt_module_scratch_free(scr[k][i]);
    }
    pt_model_free(m);
}

int main(void) {
    RUN(test_table);
    RUN(test_config_errors);
    RUN(test_init);
    RUN(test_init_loss);
    RUN(test_gradcheck);
    RUN(test_modules);
    RUN(test_hooks_and_slots);
    RUN(test_split_modules);
    RUN(test_split_micro_batches);
    RUN(test_module_buffers);
    RUN(test_no_alloc);
    RUN(test_oom);
    return TEST_DONE();
}
