/* Vocabulary-parallel embedding and cross-entropy (vocab_parallel.c): t
 * tensor-parallel ranks simulated in one process, each holding its Vl rows
 * of the vocabulary padded to t*Vl (padding planted with NaN, inf and huge
 * values), the all-reduces between the phases done here by hand (max, and
 * sums in rank order). Oracles:
 *   - the unsplit kernels (pt_encoder_forward/backward,
 *     pt_softmax_xent_forward_backward): at t = 1 bit for bit; at t > 1 the
 *     embedding bit for bit and the cross-entropy within the bound of two
 *     summation orders of the same exponentials (xent_tol below);
 *   - central differences of a double-precision forward written here (as
 *     test_kernels_grad.c, same h and tolerance) for the phases composed and
 *     for the masked embedding;
 *   - padded dlogits exactly +0, padded gradient rows untouched, and results
 *     that do not change with what the padding holds; bitwise the same at 1
 *     and 3 threads.
 * V 37 and 5 (no t divides them; V 5 at t 4 leaves rank 3 only padding),
 * 64, 2500 (several of exp's 1024-element chunks) and 70,001 (targets and
 * ids past a uint16, on the last rank), t = 1..4. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "partrain/kernels.h"
#include "../../src/kernels/fastmath.h"
#include "pt_test.h"
#define KT_SEED 4242
#include "kernel_test.h"

static float *rnd(long n, double scale) {
    float *x = malloc(sizeof(float) * (n > 0 ? n : 1));
    for (long i = 0; i < n; i++) x[i] = (float)(urand() * scale);
    return x;
}
static size_t bit_diffs(const char *what, const float *a, const float *b, long n) {
    size_t d = 0;
    for (long i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            if (d < 4) fprintf(stderr, "  %s[%ld]: %.9g vs %.9g\n", what, i, a[i], b[i]);
            d++;
        }
    if (d) fprintf(stderr, "  %s: %zu of %ld differ\n", what, d, n);
    return d;
}

/* The split of model.h: rank r holds rows [r*Vl, (r+1)*Vl), the real ones
 * below V. */
static int vl_of(int V, int t) {
    return (V + t - 1) / t;
}
static int nreal_of(int V, int t, int r) {
    int Vl = vl_of(V, t), n = V - r * Vl;
    return n < 0 ? 0 : n > Vl ? Vl : n;
}

/* What padding holds, by plant: 0 zeros, 1 NaN / inf / huge */
static float pad_value(int plant, long i) {
    static const float junk[] = {NAN, INFINITY, 3e38f, -INFINITY, -3e38f, 1e30f};
    return plant ? junk[i % 6] : 0.0f;
}

/* ---- cross-entropy: the three phases on t simulated ranks ---------------- */

/* Losses (N) and gathered dlogits (N,V) (grad 0: none) of the phases on t
 * ranks, from global logits (N,V). Checks on the way: every rank computes
 * the same losses, padded dlogits are +0. */
static void vp_xent(int N, int V, int t, const float *logits, const int *tg, float dloss, int plant,
                    int grad, float *losses, float *dl) {
    int Vl = vl_of(V, t);
    float *loc[4], *lmax[4], *st[4], *ls[4];
    float *gmax = malloc(sizeof(float) * N), *gst = malloc(sizeof(float) * N * PT_VOCAB_XENT_STATS);
    for (int r = 0; r < t; r++) {
        int v0 = r * Vl, nr = nreal_of(V, t, r);
        loc[r] = malloc(sizeof(float) * ((long)N * Vl + 1));
        for (long n = 0; n < N; n++)
            for (int j = 0; j < Vl; j++)
                loc[r][n * Vl + j] = j < nr ? logits[n * V + v0 + j] : pad_value(plant, n + j);
        lmax[r] = malloc(sizeof(float) * N);
        st[r] = malloc(sizeof(float) * N * PT_VOCAB_XENT_STATS);
        ls[r] = malloc(sizeof(float) * N);
        pt_vocab_xent_max(lmax[r], loc[r], N, Vl, nr);
    }
    /* all-reduce MAX */
    for (int n = 0; n < N; n++) {
        gmax[n] = lmax[0][n];
        for (int r = 1; r < t; r++) gmax[n] = lmax[r][n] > gmax[n] ? lmax[r][n] : gmax[n];
    }
    for (int r = 0; r < t; r++)
        pt_vocab_xent_sumexp(st[r], grad ? loc[r] : NULL, loc[r], gmax, tg, N, Vl, r * Vl,
                             nreal_of(V, t, r));
    /* all-reduce SUM, in rank order */
    for (long i = 0; i < (long)N * PT_VOCAB_XENT_STATS; i++) {
        gst[i] = st[0][i];
        for (int r = 1; r < t; r++) gst[i] += st[r][i];
    }
    size_t bad_pad = 0, bad_same = 0;
    for (int r = 0; r < t; r++) {
        int v0 = r * Vl, nr = nreal_of(V, t, r);
        pt_vocab_xent_finish(ls[r], grad ? loc[r] : NULL, gmax, gst, tg, N, Vl, v0, nr, dloss);
        bad_same += r ? bit_diffs("losses across ranks", ls[r], ls[0], N) : 0;
        if (!grad) continue;
        const float zero = 0.0f;
        for (long n = 0; n < N; n++) {
            for (int j = nr; j < Vl; j++)
                bad_pad += memcmp(&loc[r][n * Vl + j], &zero, sizeof zero) != 0;
            for (int j = 0; j < nr; j++) dl[n * V + v0 + j] = loc[r][n * Vl + j];
        }
    }
    CHECK_EQ(bad_pad, 0);
    CHECK_EQ(bad_same, 0);
    memcpy(losses, ls[0], sizeof(float) * N);
    for (int r = 0; r < t; r++) free(loc[r]), free(lmax[r]), free(st[r]), free(ls[r]);
    free(gmax), free(gst);
}

/* Two float evaluations of the sum S of the same positive exponentials in
 * different orders are each within gamma_n S of the exact sum (Higham 3.1),
 * n the longest chain of additions: a lane's share of a 1024-element chunk,
 * the lanes, the chunks (in double) and the t-term all-reduce. The loss
 * log S + m - l moves by at most the relative error of S, plus its own
 * rounding; dlogits = e (dloss/S) - dloss [target] by that much of
 * |e dloss/S| plus the rounding of scale, product and subtraction. */
static double gamma_n(int t) {
    double u = FLT_EPSILON / 2, n = 1024.0 / PT_VW + PT_VW + t + 2;
    return n * u / (1 - n * u);
}
static void xent_close(const char *what, int N, int V, int t, float dloss, const float *loss,
                       const float *want_loss, const float *dl, const float *want_dl) {
    double g = 2 * gamma_n(t), u = FLT_EPSILON / 2;
    int bad = 0;
    for (int n = 0; n < N; n++)
        if (!(fabs((double)loss[n] - want_loss[n]) <= g + 4 * u * fabs(want_loss[n]))) {
            if (bad++ < 4)
                fprintf(stderr, "  %s loss[%d]: %.9g want %.9g\n", what, n, loss[n], want_loss[n]);
        }
    for (long i = 0; dl && i < (long)N * V; i++)
        if (!(fabs((double)dl[i] - want_dl[i]) <= (g + 6 * u) * (fabs(want_dl[i]) + dloss))) {
            if (bad++ < 4)
                fprintf(stderr, "  %s dlogits[%ld]: %.9g want %.9g\n", what, i, dl[i], want_dl[i]);
        }
    if (bad) fprintf(stderr, "  %s (V %d, t %d): %d differ\n", what, V, t, bad);
    CHECK(bad == 0);
}

/* far: in even rows, rank 0's columns lie 120 below the others (past
 * exp's range from the global max, where the fast exp clamps). */
static void xent_case(int N, int V, int t, int far) {
    float dloss = 1.0f / N;
    float *l = rnd((long)N * V, 6);
    for (int n = 0; far && n < N; n += 2)
        for (int j = 0; j < vl_of(V, t) && j < V; j++) l[(long)n * V + j] -= 120.0f;
    int *tg = malloc(sizeof(int) * N);
    for (int n = 0; n < N; n++) tg[n] = n == 0 ? V - 1 : n == 1 ? 0 : (n * 7919 + 3) % V;
    /* the unsplit kernel, in place */
    float *want_loss = malloc(sizeof(float) * N), *want_dl = malloc(sizeof(float) * N * V);
    memcpy(want_dl, l, sizeof(float) * N * V);
    pt_softmax_xent_forward_backward(want_loss, want_dl, want_dl, tg, N, V, dloss);

    float *loss = malloc(sizeof(float) * N), *dl = malloc(sizeof(float) * N * V);
    float *loss2 = malloc(sizeof(float) * N), *dl2 = malloc(sizeof(float) * N * V);
    float *loss3 = malloc(sizeof(float) * N);
    vp_xent(N, V, t, l, tg, dloss, 0, 1, loss, dl);
    /* what the padding holds changes nothing */
    vp_xent(N, V, t, l, tg, dloss, 1, 1, loss2, dl2);
    CHECK_EQ(bit_diffs("losses, padding planted", loss2, loss, N), 0);
    CHECK_EQ(bit_diffs("dlogits, padding planted", dl2, dl, (long)N * V), 0);
    /* without the gradient: the same losses */
    vp_xent(N, V, t, l, tg, dloss, 1, 0, loss3, NULL);
    CHECK_EQ(bit_diffs("losses without grad", loss3, loss, N), 0);
    if (t == 1) {
        CHECK_EQ(bit_diffs("t=1 losses vs fused", loss, want_loss, N), 0);
        CHECK_EQ(bit_diffs("t=1 dlogits vs fused", dl, want_dl, (long)N * V), 0);
    } else {
        xent_close("split vs fused", N, V, t, dloss, loss, want_loss, dl, want_dl);
    }
    free(l), free(tg), free(want_loss), free(want_dl);
    free(loss), free(dl), free(loss2), free(dl2), free(loss3);
}

static void test_xent_against_fused(void) {
    static const int Vs[] = {37, 64, 5, 2500, 70001}; /* 70,001: ids past a uint16 */
    for (size_t k = 0; k < sizeof Vs / sizeof Vs[0]; k++)
        for (int t = 1; t <= 4; t++) {
            xent_case(9, Vs[k], t, 0);
            xent_case(9, Vs[k], t, 1);
        }
}

/* Above the parallel threshold (N * Vl >= 32768): the same bits at 1 and 3
 * threads, and still the fused kernel's at t = 1. */
static void test_xent_threads(void) {
    const int N = 600, V = 257;
    float *l = rnd((long)N * V, 6);
    int *tg = malloc(sizeof(int) * N);
    for (int n = 0; n < N; n++) tg[n] = (n * 131) % V;
    for (int t = 1; t <= 4; t += 3) {
        float *loss1 = malloc(sizeof(float) * N), *dl1 = malloc(sizeof(float) * N * V);
        float *loss3 = malloc(sizeof(float) * N), *dl3 = malloc(sizeof(float) * N * V);
        pt_kernels_set_threads(1);
        vp_xent(N, V, t, l, tg, 1.0f / N, 1, 1, loss1, dl1);
        pt_kernels_set_threads(3);
        vp_xent(N, V, t, l, tg, 1.0f / N, 1, 1, loss3, dl3);
        CHECK_EQ(bit_diffs("losses at 3 threads", loss3, loss1, N), 0);
        CHECK_EQ(bit_diffs("dlogits at 3 threads", dl3, dl1, (long)N * V), 0);
        if (t == 1) {
            float *wl = malloc(sizeof(float) * N), *wd = malloc(sizeof(float) * N * V);
            pt_softmax_xent_forward_backward(wl, wd, l, tg, N, V, 1.0f / N);
            CHECK_EQ(bit_diffs("t=1 losses vs fused (3 threads)", loss3, wl, N), 0);
            CHECK_EQ(bit_diffs("t=1 dlogits vs fused (3 threads)", dl3, wd, (long)N * V), 0);
            free(wl), free(wd);
        }
        pt_kernels_set_threads(1);
        free(loss1), free(dl1), free(loss3), free(dl3);
    }
    free(l), free(tg);
}

/* ---- finite differences ---------------------------------------------------- */

enum { XN = 4, XV = 7 };
typedef struct {
    double l[XN * XV];
    int tg[XN];
    double dloss;
} xent_fd;
static double xent_fd_loss(void *p) {
    xent_fd *c = p;
    return xent_loss_double(c->l, c->tg, XN, XV, c->dloss);
}

static void test_xent_grad(void) {
    for (int t = 1; t <= 4; t++) {
        xent_fd c = {.tg = {0, 6, 3, 4}, .dloss = 1.0 / XN};
        float logits[XN * XV], dl[XN * XV], losses[XN];
        for (int i = 0; i < XN * XV; i++) logits[i] = (float)(urand() * 3);
        for (int i = 0; i < XN * XV; i++) c.l[i] = logits[i];
        vp_xent(XN, XV, t, logits, c.tg, (float)c.dloss, 1, 1, losses, dl);
        fd_check("vocab-parallel dlogits", c.l, XN * XV, dl, xent_fd_loss, &c);
        c.dloss = 1.0;
        double sum = 0.0;
        for (int n = 0; n < XN; n++) sum += losses[n];
        CHECK_NEAR(sum, xent_fd_loss(&c), 1e-5, 1e-5);
    }
}

/* ---- masked embedding -------------------------------------------------------- */

/* Each rank's slice (Vl,C) of wte (V,C), padding rows planted. */
static float *wte_slice(const float *wte, int V, int C, int t, int r, int plant) {
    int Vl = vl_of(V, t), nr = nreal_of(V, t, r);
    float *s = malloc(sizeof(float) * ((long)Vl * C + 1));
    for (long j = 0; j < (long)Vl * C; j++)
        s[j] = j < (long)nr * C ? wte[(long)r * Vl * C + j] : pad_value(plant, j);
    return s;
}

static void embed_case(int B, int T, int C, int V, int t) {
    long N = (long)B * T;
    int Vl = vl_of(V, t);
    float *wte = rnd((long)V * C, 1), *wpe = rnd((long)T * C, 1), *dout = rnd(N * C, 1);
    int *inp = malloc(sizeof(int) * N);
    for (long i = 0; i < N; i++) inp[i] = i == 0 ? V - 1 : i == 1 ? 0 : (int)((i * 613 + 5) % V);
    float *want = malloc(sizeof(float) * N * C), *sum = malloc(sizeof(float) * N * C);
    float *out = malloc(sizeof(float) * N * C), *sum0 = malloc(sizeof(float) * N * C);
    pt_encoder_forward(want, inp, wte, wpe, B, T, C);
    /* forward: wpe on rank 0 only, all-reduce SUM in rank order; and wpe
     * nowhere, added after the reduction */
    for (int r = 0; r < t; r++) {
        float *s = wte_slice(wte, V, C, t, r, 1);
        pt_vocab_embed_forward(out, inp, s, r == 0 ? wpe : NULL, B, T, C, r * Vl, Vl);
        for (long i = 0; i < N * C; i++) sum[i] = r ? sum[i] + out[i] : out[i];
        pt_vocab_embed_forward(out, inp, s, NULL, B, T, C, r * Vl, Vl);
        for (long i = 0; i < N * C; i++) sum0[i] = r ? sum0[i] + out[i] : out[i];
        free(s);
    }
    for (long i = 0; i < N * C; i++) sum0[i] += wpe[(i / C) % T * C + i % C];
    CHECK_EQ(bit_diffs("embedding, wpe on rank 0", sum, want, N * C), 0);
    CHECK_EQ(bit_diffs("embedding, wpe after", sum0, want, N * C), 0);

    /* backward, from non-zero gradients (+=): real rows the unsplit
     * kernel's, padding rows untouched, dwpe the same on every rank */
    float *g0 = rnd((long)V * C, 1), *g0p = rnd((long)T * C, 1);
    float *dwte = malloc(sizeof(float) * V * C), *dwpe = malloc(sizeof(float) * T * C);
    memcpy(dwte, g0, sizeof(float) * V * C);
    memcpy(dwpe, g0p, sizeof(float) * T * C);
    pt_encoder_backward(dwte, dwpe, dout, inp, B, T, C);
    float *ldpe = malloc(sizeof(float) * T * C);
    for (int r = 0; r < t; r++) {
        int nr = nreal_of(V, t, r);
        float *ld = wte_slice(g0, V, C, t, r, 1);
        memcpy(ldpe, g0p, sizeof(float) * T * C);
        pt_vocab_embed_backward(ld, ldpe, dout, inp, B, T, C, r * Vl, Vl);
        CHECK_EQ(bit_diffs("dwte slice", ld, dwte + (long)r * Vl * C, (long)nr * C), 0);
        size_t bad = 0;
        for (long j = (long)nr * C; j < (long)Vl * C; j++) {
            float p = pad_value(1, j);
            bad += memcmp(&ld[j], &p, sizeof p) != 0;
        }
        CHECK_EQ(bad, 0);
        CHECK_EQ(bit_diffs("dwpe", ldpe, dwpe, (long)T * C), 0);
        /* dwpe NULL: dwte alone, the same */
        float *ld2 = wte_slice(g0, V, C, t, r, 1);
        pt_vocab_embed_backward(ld2, NULL, dout, inp, B, T, C, r * Vl, Vl);
        CHECK_EQ(bit_diffs("dwte slice (no dwpe)", ld2, ld, (long)nr * C), 0);
        free(ld2);
        free(ld);
    }
    free(wte), free(wpe), free(dout), free(inp), free(want), free(sum), free(out), free(sum0);
    free(g0), free(g0p), free(dwte), free(dwpe), free(ldpe);
}

static void test_embed_against_unsplit(void) {
    static const int Vs[] = {37, 64, 5, 70001};
    for (size_t k = 0; k < sizeof Vs / sizeof Vs[0]; k++)
        for (int t = 1; t <= 4; t++) embed_case(2, 5, 12, Vs[k], t);
    /* above the parallel threshold, at 3 threads */
    pt_kernels_set_threads(3);
    embed_case(4, 64, 160, 37, 3);
    pt_kernels_set_threads(1);
}

enum { EB = 2, ET = 3, EC = 4, EV = 7 };
typedef struct {
    double wte[EV * EC], wpe[ET * EC];
    int inp[EB * ET];
    float R[EB * ET * EC];
} emb_fd;
static double emb_fd_loss(void *p) { /* sum R * (wte[tok] + wpe[t]) */
    emb_fd *c = p;
    double L = 0.0;
    for (int i = 0; i < EB * ET; i++)
        for (int j = 0; j < EC; j++)
            L += c->R[i * EC + j] * (c->wte[c->inp[i] * EC + j] + c->wpe[(i % ET) * EC + j]);
    return L;
}

static void test_embed_grad(void) {
    for (int t = 1; t <= 4; t++) {
        emb_fd c = {.inp = {6, 0, 3, 3, 5, 1}};
        int Vl = vl_of(EV, t);
        for (int i = 0; i < EV * EC; i++) c.wte[i] = urand();
        for (int i = 0; i < ET * EC; i++) c.wpe[i] = urand();
        for (int i = 0; i < EB * ET * EC; i++) c.R[i] = (float)urand();
        float dwte[EV * EC], dwpe[ET * EC] = {0};
        for (int r = 0; r < t; r++) {
            float *ld = calloc((size_t)Vl * EC, sizeof(float));
            pt_vocab_embed_backward(ld, r == 0 ? dwpe : NULL, c.R, c.inp, EB, ET, EC, r * Vl, Vl);
            memcpy(dwte + (long)r * Vl * EC, ld, sizeof(float) * nreal_of(EV, t, r) * EC);
            free(ld);
        }
        fd_check("vocab-parallel dwte", c.wte, EV * EC, dwte, emb_fd_loss, &c);
        fd_check("vocab-parallel dwpe", c.wpe, ET * EC, dwpe, emb_fd_loss, &c);
    }
}

int main(void) {
    RUN(test_xent_against_fused);
    RUN(test_xent_threads);
    RUN(test_xent_grad);
    RUN(test_embed_against_unsplit);
    RUN(test_embed_grad);
    return TEST_DONE();
}
