/* Gradient checks for every backward kernel: the oracle is a finite
 * difference of a DOUBLE-precision forward written here, independently of
 * the kernels (STYLE rule 13).
 *
 * For an op y = f(x...), we take a fixed random R shaped like y and the scalar
 * L = sum(y * R). Its gradient with respect to each input is what the
 * backward kernel returns when called with dout = R. We compare the float
 * analytic gradient against central differences (L(x+h) - L(x-h)) / 2h of
 * the double forward with h = 1e-5.
 *
 * Tolerance |analytic - numeric| <= 1e-4 + 1e-3 |numeric|: in double the
 * difference quotient's truncation error is O(h^2 |f'''|) ~ 1e-10 and its
 * rounding error ~ 1e-16 |L| / h ~ 1e-11, both negligible; what remains is the
 * float rounding of the analytic backward (relative ~1e-6 times the number
 * of accumulated terms, here < 100, and the conditioning of layernorm and
 * softmax), comfortably below 1e-3. A wrong or missing term shows up as an
 * O(1) relative error.
 *
 * Each test also checks the += contract: starting from non-zero gradients G0,
 * two backward calls must give G0 + 2 g -- for the gradients a kernel
 * accumulates; those it OVERWRITES (the linear's input pass, attention's
 * dqkv) start as NaN instead.
 *
 * Both the optimized kernels (kernels.h) and the reference kernels (the
 * oracle of the equality tests) are checked. */
#include <math.h>
#include <string.h>

#include "partrain/kernels.h"
#include "../../src/kernels/kernels_impl.h"
#include "pt_test.h"
#define KT_SEED 12345
#include "kernel_test.h"

static void fill(float *x, long n, double scale) {
    for (long i = 0; i < n; i++) x[i] = (float)(urand() * scale);
}
static void to_double(double *d, const float *f, long n) {
    for (long i = 0; i < n; i++) d[i] = f[i];
}
static double dot_r(const double *y, const float *R, long n) {
    double s = 0.0;
    for (long i = 0; i < n; i++) s += y[i] * R[i];
    return s;
}

/* g2 must equal g0 + 2 * (g1 - g0): the second call added the same again. */
static void accum_check(const char *what, const float *g0, const float *g1, const float *g2,
                        long n) {
    int bad = 0;
    for (long i = 0; i < n; i++) {
        double want = g0[i] + 2.0 * ((double)g1[i] - g0[i]);
        if (!(fabs(g2[i] - want) <= 1e-5 + 1e-5 * fabs(want))) {
            if (bad < 3)
                fprintf(stderr, "  %s accumulate [%ld]: %.8g want %.8g\n", what, i, g2[i], want);
            bad++;
        }
    }
    CHECK(bad == 0);
}

/* One gradient buffer of a backward call: buf is what the kernel writes
 * into, g0 its starting value, g receives the per-call gradient. */
typedef struct {
    const char *name;
    float *buf;
    const float *g0;
    float *g;
    long n;
} gslot;
typedef void (*bwd_fn)(void *ctx);

/* Start every buffer at G0, call bwd twice, check that the second call added
 * the same again (the += contract), and leave g = (after one call) - G0. */
static void run_twice(gslot *s, int ns, bwd_fn bwd, void *ctx) {
    for (int j = 0; j < ns; j++) memcpy(s[j].buf, s[j].g0, sizeof(float) * s[j].n);
    bwd(ctx);
    for (int j = 0; j < ns; j++) memcpy(s[j].g, s[j].buf, sizeof(float) * s[j].n);
    bwd(ctx);
    for (int j = 0; j < ns; j++) {
        accum_check(s[j].name, s[j].g0, s[j].g, s[j].buf, s[j].n);
        for (long i = 0; i < s[j].n; i++) s[j].g[i] -= s[j].g0[i];
    }
}

static int g_ref;   /* 1: check the reference kernels, 0: the optimized ones */
static int g_split; /* optimized: the split backward's kernels (B then W) */

/* ---- encoder ---------------------------------------------------------------- */
enum { EB = 2, ET = 3, EC = 4, EV = 5 };
typedef struct {
    double wte[EV * EC], wpe[ET * EC];
    int inp[EB * ET];
    float R[EB * ET * EC], dwte[EV * EC], dwpe[ET * EC];
} enc_t;
static double enc_loss(void *p) {
    enc_t *c = p;
    double y[EB * ET * EC];
    for (int b = 0; b < EB; b++)
        for (int t = 0; t < ET; t++)
            for (int i = 0; i < EC; i++)
                y[(b * ET + t) * EC + i] = c->wte[c->inp[b * ET + t] * EC + i] + c->wpe[t * EC + i];
    return dot_r(y, c->R, EB * ET * EC);
}
static void enc_bwd(void *p) {
    enc_t *c = p;
    if (g_ref)
        pt_ref_encoder_backward(c->dwte, c->dwpe, c->R, c->inp, EB, ET, EC);
    else
        pt_encoder_backward(c->dwte, c->dwpe, c->R, c->inp, EB, ET, EC);
}
static void test_grad_encoder(void) {
    static enc_t c;
    float wte[EV * EC], wpe[ET * EC], g0e[EV * EC], g0p[ET * EC], ge[EV * EC], gp[ET * EC];
    fill(wte, EV * EC, 1), fill(wpe, ET * EC, 1), fill(c.R, EB * ET * EC, 1);
    fill(g0e, EV * EC, 1), fill(g0p, ET * EC, 1);
    int toks[EB * ET] = {1, 4, 1, 0, 1, 3}; /* token 1 repeats: the scatter must add */
    memcpy(c.inp, toks, sizeof toks);
    to_double(c.wte, wte, EV * EC), to_double(c.wpe, wpe, ET * EC);
    gslot s[] = {{"dwte", c.dwte, g0e, ge, EV * EC}, {"dwpe", c.dwpe, g0p, gp, ET * EC}};
    run_twice(s, 2, enc_bwd, &c);
    fd_check("dwte", c.wte, EV * EC, ge, enc_loss, &c);
    fd_check("dwpe", c.wpe, ET * EC, gp, enc_loss, &c);
}

/* ---- layernorm ------------------------------------------------------------- */
enum { LN = 3, LC = 8 };
typedef struct {
    double x[LN * LC], w[LC], b[LC];
    float fx[LN * LC], fw[LC], mean[LN], rstd[LN];
    float R[LN * LC], dx[LN * LC], dw[LC], db[LC];
} ln_t;
static double ln_loss(void *p) {
    ln_t *c = p;
    double y[LN * LC];
    for (int n = 0; n < LN; n++) {
        const double *x = c->x + n * LC;
        double m = 0, v = 0;
        for (int i = 0; i < LC; i++) m += x[i];
        m /= LC;
        for (int i = 0; i < LC; i++) v += (x[i] - m) * (x[i] - m);
        v /= LC;
        double s = 1.0 / sqrt(v + 1e-5);
        for (int i = 0; i < LC; i++) y[n * LC + i] = (x[i] - m) * s * c->w[i] + c->b[i];
    }
    return dot_r(y, c->R, LN * LC);
}
static void ln_bwd(void *p) {
    ln_t *c = p;
    if (g_ref) {
        pt_ref_layernorm_backward(c->dx, c->dw, c->db, c->R, c->fx, c->fw, c->mean, c->rstd, LN,
                                  LC);
    } else if (g_split) {
        pt_layernorm_backward_input(c->dx, NULL, c->R, c->fx, c->fw, c->mean, c->rstd, LN, LC);
        pt_layernorm_backward_params(c->dw, c->db, c->R, c->fx, c->mean, c->rstd, LN, LC);
    } else
        pt_layernorm_backward(c->dx, c->dw, c->db, c->R, c->fx, c->fw, c->mean, c->rstd, LN, LC);
}
static void test_grad_layernorm(void) {
    static ln_t c;
    float fb[LC], out[LN * LC], g0x[LN * LC], g0w[LC], g0b[LC], gx[LN * LC], gw[LC], gb[LC];
    fill(c.fx, LN * LC, 2), fill(c.fw, LC, 1.5), fill(fb, LC, 1), fill(c.R, LN * LC, 1);
    fill(g0x, LN * LC, 1), fill(g0w, LC, 1), fill(g0b, LC, 1);
    to_double(c.x, c.fx, LN * LC), to_double(c.w, c.fw, LC), to_double(c.b, fb, LC);
    if (g_ref)
        pt_ref_layernorm_forward(out, c.mean, c.rstd, c.fx, c.fw, fb, LN, LC);
    else
        pt_layernorm_forward(out, c.mean, c.rstd, c.fx, c.fw, fb, LN, LC);
    gslot s[] = {{"dinp", c.dx, g0x, gx, LN * LC},
                 {"dweight", c.dw, g0w, gw, LC},
                 {"dbias", c.db, g0b, gb, LC}};
    run_twice(s, 3, ln_bwd, &c);
    fd_check("ln dinp", c.x, LN * LC, gx, ln_loss, &c);
    fd_check("ln dweight", c.w, LC, gw, ln_loss, &c);
    fd_check("ln dbias", c.b, LC, gb, ln_loss, &c);
}

/* ---- matmul (weight (C,OC), and transposed (OC,C)), with and without bias ---- */
enum { MN = 3, MC = 4, MO = 5 };
typedef struct {
    int wt, has_bias;
    double x[MN * MC], w[MC * MO], b[MO];
    float fx[MN * MC], fw[MC * MO];
    float R[MN * MO], dx[MN * MC], dw[MC * MO], db[MO];
} mm_t;
static double mm_loss(void *p) {
    mm_t *c = p;
    double y[MN * MO];
    for (int n = 0; n < MN; n++)
        for (int o = 0; o < MO; o++) {
            double acc = c->has_bias ? c->b[o] : 0.0;
            for (int i = 0; i < MC; i++)
                acc += c->x[n * MC + i] * (c->wt ? c->w[o * MC + i] : c->w[i * MO + o]);
            y[n * MO + o] = acc;
        }
    return dot_r(y, c->R, MN * MO);
}
/* The (C,OC) form's optimized backward is the product's two passes: the
 * input pass OVERWRITES dinp (checked outside the += contract, in
 * grad_matmul), the weight pass accumulates. */
static int mm_dinp_set(const mm_t *c) {
    return !c->wt && !g_ref;
}
static void mm_bwd(void *p) {
    mm_t *c = p;
    float *db = c->has_bias ? c->db : NULL;
    if (c->wt && g_split) {
        pt_matmul_backward_wt_input(c->dx, c->R, c->fw, MN, MC, MO);
        pt_matmul_backward_wt_weight(c->dw, db, c->R, c->fx, MN, MC, MO);
    } else if (mm_dinp_set(c)) {
        pt_matmul_backward_weight(c->dw, db, c->R, c->fx, MN, MC, MO);
    } else if (c->wt) {
        if (g_ref)
            pt_ref_matmul_backward_wt(c->dx, c->dw, db, c->R, c->fx, c->fw, MN, MC, MO);
        else
            pt_matmul_backward_wt(c->dx, c->dw, db, c->R, c->fx, c->fw, MN, MC, MO);
    } else {
        pt_ref_matmul_backward(c->dx, c->dw, db, c->R, c->fx, c->fw, MN, MC, MO);
    }
}
static void grad_matmul(void) {
    for (int wt = 0; wt < 2; wt++) {
        for (int hb = 0; hb < 2; hb++) {
            static mm_t c;
            c.wt = wt, c.has_bias = hb;
            float fb[MO], g0x[MN * MC], g0w[MC * MO], g0b[MO], gx[MN * MC], gw[MC * MO], gb[MO];
            fill(c.fx, MN * MC, 1), fill(c.fw, MC * MO, 1), fill(fb, MO, 1);
            fill(c.R, MN * MO, 1), fill(g0x, MN * MC, 1), fill(g0w, MC * MO, 1), fill(g0b, MO, 1);
            to_double(c.x, c.fx, MN * MC), to_double(c.w, c.fw, MC * MO), to_double(c.b, fb, MO);
            gslot s[] = {{"dinp", c.dx, g0x, gx, MN * MC},
                         {"dweight", c.dw, g0w, gw, MC * MO},
                         {"dbias", c.db, g0b, gb, MO}};
            if (mm_dinp_set(&c)) {
                /* B's pass overwrites dinp; W's accumulate */
                for (int i = 0; i < MN * MC; i++) c.dx[i] = NAN;
                pt_matmul_backward_input_set(c.dx, c.R, c.fw, MN, MC, MO);
                memcpy(gx, c.dx, sizeof gx);
                gslot sw[] = {{"dweight", c.dw, g0w, gw, MC * MO}, {"dbias", c.db, g0b, gb, MO}};
                run_twice(sw, hb ? 2 : 1, mm_bwd, &c);
            } else {
                run_twice(s, hb ? 3 : 2, mm_bwd, &c);
            }
            fd_check(wt ? "mm_wt dinp" : "mm dinp", c.x, MN * MC, gx, mm_loss, &c);
            fd_check(wt ? "mm_wt dweight" : "mm dweight", c.w, MC * MO, gw, mm_loss, &c);
            if (hb) fd_check(wt ? "mm_wt dbias" : "mm dbias", c.b, MO, gb, mm_loss, &c);
            /* dinp == NULL is allowed (the wt form): dweight must not change
             * because of it. */
            float dw2[MC * MO];
            memcpy(dw2, g0w, sizeof dw2);
            if (!wt) continue;
            pt_matmul_backward_wt(NULL, dw2, NULL, c.R, c.fx, c.fw, MN, MC, MO);
            for (int i = 0; i < MC * MO; i++) CHECK_NEAR(dw2[i] - g0w[i], gw[i], 1e-6, 1e-5);
        }
    }
}

/* The linears through both GEMM paths (see gemm.c). */
static void test_grad_matmul(void) {
    pt_sgemm_set_path(PT_GEMM_OWN);
    grad_matmul();
    pt_sgemm_set_path(PT_GEMM_BLAS);
    grad_matmul();
    pt_sgemm_set_path(PT_GEMM_AUTO);
}

/* ---- linear after GELU, backward through both (pt_matmul_backward_gelu_set):
 * y = gelu(pre) @ w + b; dpre is overwritten, dweight and dbias accumulate. */
typedef struct {
    double pre[MN * MC], w[MC * MO], b[MO];
    float fpre[MN * MC], fin[MN * MC], fw[MC * MO];
    float R[MN * MO], dpre[MN * MC], dw[MC * MO], db[MO];
} mmg_t;
static double gelu_d(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
static double mmg_loss(void *p) {
    mmg_t *c = p;
    double y[MN * MO];
    for (int n = 0; n < MN; n++)
        for (int o = 0; o < MO; o++) {
            double acc = c->b[o];
            for (int i = 0; i < MC; i++) acc += gelu_d(c->pre[n * MC + i]) * c->w[i * MO + o];
            y[n * MO + o] = acc;
        }
    return dot_r(y, c->R, MN * MO);
}
static void mmg_bwd(void *p) {
    mmg_t *c = p;
    if (g_split) {
        pt_matmul_backward_input_gelu_set(c->dpre, c->R, c->fw, c->fpre, MN, MC, MO);
        pt_matmul_backward_weight(c->dw, c->db, c->R, c->fin, MN, MC, MO);
        return;
    }
    pt_matmul_backward_gelu_set(c->dpre, c->dw, c->db, c->R, c->fin, c->fw, c->fpre, MN, MC, MO);
}
static void test_grad_matmul_gelu(void) {
    if (g_ref) return; /* no reference counterpart: the oracle is the pair below */
    for (int path = PT_GEMM_BLAS; path <= PT_GEMM_OWN; path++) {
        pt_sgemm_set_path(path);
        static mmg_t c;
        float fb[MO], g0w[MC * MO], g0b[MO], gw[MC * MO], gb[MO], gpre[MN * MC];
        fill(c.fpre, MN * MC, 2), fill(c.fw, MC * MO, 1), fill(fb, MO, 1), fill(c.R, MN * MO, 1);
        fill(g0w, MC * MO, 1), fill(g0b, MO, 1);
        pt_ref_gelu_forward(c.fin, c.fpre, MN * MC);
        to_double(c.pre, c.fpre, MN * MC), to_double(c.w, c.fw, MC * MO), to_double(c.b, fb, MO);
        fill(c.dpre, MN * MC, 1); /* overwritten */
        gslot s[] = {{"dweight", c.dw, g0w, gw, MC * MO}, {"dbias", c.db, g0b, gb, MO}};
        run_twice(s, 2, mmg_bwd, &c);
        memcpy(gpre, c.dpre, sizeof gpre);
        fd_check("mm_gelu dpre", c.pre, MN * MC, gpre, mmg_loss, &c);
        fd_check("mm_gelu dweight", c.w, MC * MO, gw, mmg_loss, &c);
        fd_check("mm_gelu dbias", c.b, MO, gb, mmg_loss, &c);
    }
    pt_sgemm_set_path(PT_GEMM_AUTO);
}

/* ---- GELU ----------------------------------------------------------------------- */
enum { GN = 41 };
typedef struct {
    double x[GN];
    float fx[GN], R[GN], dx[GN];
} gelu_t;
static double gelu_loss(void *p) {
    gelu_t *c = p;
    double y[GN];
    for (int i = 0; i < GN; i++) {
        double x = c->x[i];
        y[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    }
    return dot_r(y, c->R, GN);
}
static void gelu_bwd(void *p) {
    gelu_t *c = p;
    pt_ref_gelu_backward(c->dx, c->fx, c->R, GN);
}
/* The reference GELU backward, the oracle of the fused GELU epilogues
 * (test_grad_matmul_gelu checks the optimized one): GELU has no kernel of
 * its own. */
static void test_grad_gelu(void) {
    if (!g_ref) return;
    static gelu_t c;
    float g0[GN], g[GN];
    for (int i = 0; i < GN; i++) c.fx[i] = -6.0f + 12.0f * i / (GN - 1) + 0.01f * (float)urand();
    fill(c.R, GN, 1), fill(g0, GN, 1);
    to_double(c.x, c.fx, GN);
    gslot s[] = {{"dinp", c.dx, g0, g, GN}};
    run_twice(s, 1, gelu_bwd, &c);
    fd_check("gelu dinp", c.x, GN, g, gelu_loss, &c);
}

/* ---- attention -------------------------------------------------------------------- */
typedef struct {
    int B, T, C, NH;
    double *x; /* qkv (B,T,3C) in double */
    float *fx, *att, *R, *dx, *scratch;
} att_t;
static double att_loss(void *p) {
    att_t *c = p;
    int B = c->B, T = c->T, C = c->C, NH = c->NH, hs = C / NH;
    double L = 0.0, scale = 1.0 / sqrt((double)hs);
    double *pr = malloc(sizeof(double) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = c->x + ((long)b * T + t) * 3 * C + h * hs;
                double mx = -INFINITY, sum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const double *k = c->x + ((long)b * T + t2) * 3 * C + C + h * hs;
                    double s = 0.0;
                    for (int i = 0; i < hs; i++) s += q[i] * k[i];
                    pr[t2] = s * scale;
                    if (pr[t2] > mx) mx = pr[t2];
                }
                for (int t2 = 0; t2 <= t; t2++) sum += (pr[t2] = exp(pr[t2] - mx));
                for (int i = 0; i < hs; i++) {
                    double o = 0.0;
                    for (int t2 = 0; t2 <= t; t2++)
                        o += pr[t2] / sum * c->x[((long)b * T + t2) * 3 * C + 2 * C + h * hs + i];
                    L += o * c->R[((long)b * T + t) * C + h * hs + i];
                }
            }
    free(pr);
    return L;
}
static void att_bwd(void *p) {
    att_t *c = p;
    pt_ref_attention_backward(c->dx, c->scratch, c->R, c->fx, c->att, c->B, c->T, c->C, c->NH);
}
static void grad_attention_case(int B, int T, int C, int NH) {
    att_t c = {.B = B, .T = T, .C = C, .NH = NH};
    long nx = (long)B * T * 3 * C, no = (long)B * T * C;
    size_t ns = pt_attention_scratch_floats(B, T, C, NH);
    if (ns < (size_t)T) ns = T;
    c.x = malloc(sizeof(double) * nx);
    c.fx = malloc(sizeof(float) * nx), c.dx = malloc(sizeof(float) * nx);
    c.att = malloc(sizeof(float) * B * NH * T * T), c.R = malloc(sizeof(float) * no);
    c.scratch = malloc(sizeof(float) * ns);
    float *out = malloc(sizeof(float) * no), *g0 = malloc(sizeof(float) * nx),
          *g = malloc(sizeof(float) * nx);
    fill(c.fx, nx, 1.5), fill(c.R, no, 1), fill(g0, nx, 1);
    to_double(c.x, c.fx, nx);
    if (g_ref)
        pt_ref_attention_forward(out, c.att, c.fx, B, T, C, NH);
    else
        pt_attention_forward(out, c.att, c.fx, B, T, C, NH);
    gslot s[] = {{"dqkv", c.dx, g0, g, nx}};
    if (g_ref) {
        run_twice(s, 1, att_bwd, &c);
    } else { /* the kernel OVERWRITES dqkv: from NaN, no += to check */
        for (long i = 0; i < nx; i++) c.dx[i] = NAN;
        pt_attention_backward_set(c.dx, c.scratch, c.R, c.fx, c.att, B, T, C, NH);
        memcpy(g, c.dx, sizeof(float) * nx);
    }
    fd_check("attention dqkv", c.x, nx, g, att_loss, &c);
    free(c.x), free(c.fx), free(c.dx), free(c.att), free(c.R), free(c.scratch), free(out);
    free(g0), free(g);
}
static void test_grad_attention(void) {
    grad_attention_case(2, 5, 8, 2);
    grad_attention_case(1, 1, 4, 1); /* T = 1: attention is the identity on v */
    grad_attention_case(1, 3, 6, 3); /* hs = 2 */
    /* hs = 64: attention64.c's tiles, partial in rows and keys */
    grad_attention_case(1, 7, 64, 1);
    grad_attention_case(2, 5, 128, 2);
}

/* ---- softmax + cross-entropy: L = dloss * sum_n loss_n ------------------------------ */
enum { XN = 4, XV = 7 };
typedef struct {
    double l[XN * XV];
    int tg[XN];
    double dloss;
} xent_t;
static double xent_loss(void *p) {
    xent_t *c = p;
    return xent_loss_double(c->l, c->tg, XN, XV, c->dloss);
}
static void test_grad_softmax_xent(void) {
    xent_t c = {.tg = {0, 6, 3, 3}, .dloss = 1.0 / XN};
    float logits[XN * XV], dl[XN * XV], losses[XN], losses2[XN];
    fill(logits, XN * XV, 3);
    to_double(c.l, logits, XN * XV);
    /* dlogits is OVERWRITTEN (head of the backward), not accumulated: prefill junk. */
    for (int i = 0; i < XN * XV; i++) dl[i] = 1e3f;
    if (g_ref)
        pt_ref_softmax_xent_forward_backward(losses, dl, logits, c.tg, XN, XV, c.dloss);
    else
        pt_softmax_xent_forward_backward(losses, dl, logits, c.tg, XN, XV, c.dloss);
    fd_check("xent dlogits", c.l, XN * XV, dl, xent_loss, &c);
    /* losses themselves against the double forward */
    double dl1 = c.dloss;
    c.dloss = 1.0;
    double L = xent_loss(&c);
    c.dloss = dl1;
    double sum = 0.0;
    for (int n = 0; n < XN; n++) sum += losses[n];
    CHECK_NEAR(sum, L, 1e-5, 1e-5);
    /* In place (dlogits aliasing logits) gives the same. */
    float inplace[XN * XV];
    memcpy(inplace, logits, sizeof inplace);
    if (g_ref)
        pt_ref_softmax_xent_forward_backward(losses2, inplace, inplace, c.tg, XN, XV, c.dloss);
    else
        pt_softmax_xent_forward_backward(losses2, inplace, inplace, c.tg, XN, XV, c.dloss);
    for (int i = 0; i < XN * XV; i++) CHECK(inplace[i] == dl[i]);
    for (int n = 0; n < XN; n++) CHECK(losses2[n] == losses[n]);
}

int main(void) {
    for (g_ref = 0; g_ref < 2; g_ref++) {
        fprintf(stderr, "-- %s kernels\n", g_ref ? "reference" : "optimized");
        RUN(test_grad_encoder);
        RUN(test_grad_layernorm);
        RUN(test_grad_matmul);
        RUN(test_grad_matmul_gelu);
        RUN(test_grad_gelu);
        RUN(test_grad_attention);
        RUN(test_grad_softmax_xent);
    }
    /* the split backward's kernels: the same checks on B's and W's passes */
    g_ref = 0, g_split = 1;
    fprintf(stderr, "-- split backward kernels\n");
    RUN(test_grad_layernorm);
    RUN(test_grad_matmul);
    RUN(test_grad_matmul_gelu);
    g_split = 0;
    return TEST_DONE();
}
