/* The planner's time model, one micro-batch's passes (plan_time_impl.h):
 * per module, the F, B and W seconds of one micro-batch of b = batch /
 * (dp m) sequences (N = b T rows; shapes in llm.c's letters: C n_embd, NH
 * n_head, T seq_len, V vocab_size, t tp), and the profile's collectives:
 *   measured  the cluster's profile, when it has the module at this shape
 *             (interpolated log-log in tokens, the nearest thread count
 *             scaled linearly). A tp shard's own entry was timed in a
 *             real group of t ranks (calibrate) and holds the collectives
 *             and the ranks' waiting for one another, so nothing is added
 *             for them; without one, a shard is the tp = 1 time / t,
 *             scaled by the gemm table's rate at the full over the shard
 *             shape, plus the modelled collectives below;
 *   modelled  matrix flops / (peak(precision) x efficiency.matmul) plus
 *             elementwise bytes / (memory_bw x efficiency.elementwise).
 *             A block's forward is 24 N C^2 / t + 4 N T C / t flops (the
 *             B pass 24 N C^2 / t + 8 N T C / t, W 24 N C^2 / t); its
 *             elementwise traffic per row is Megatron's kernel list
 *             (LayerNorms, bias-dropout-adds, bias-GELU: 11 C whole, or
 *             / t under sequence parallelism, + 8 C / t; the fused
 *             scale-mask-softmax and attention dropout: 4.5 NH T / t),
 *             elements of 2 bytes (bf16) or 4 (fp32), backward twice the
 *             forward's. The head: 2 N C V / t flops a pass and the loss
 *             over fp32 logits; the embedding: its gather and scatter-add.
 *   recompute FULL adds the block's whole forward (collectives included)
 *             to B; SELECTIVE the attention scores (2 N T C / t flops)
 *             and the softmax and GELU traffic.
 *   tp        per block 2 all-reduces of (N, C) in F and 2 in B (sequence
 *             parallelism: an all-gather and a reduce-scatter for each,
 *             the same ring time), on the critical path; the embedding's
 *             forward and the head's backward one each.
 *
 * Not here: the pipeline and the step (time.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan_time_impl.h"

double pt_plan_link_bw(const pt_cluster *cl, const pt_link *k) {
    return k->bw * cl->efficiency.comm;
}

/* ---- the profile's tables ---- */

/* Log-log interpolation of y(x) through (x0, y0), (x1, y1); linear (y
 * proportional to x) outside them, as plan.h says. */
static double interp(double x, double x0, double y0, double x1, double y1) {
    if (x0 == x1 || y0 <= 0 || y1 <= 0) return y0 * x / x0;
    if (x > x1) return y1 * x / x1;
    if (x < x0) return y0 * x / x0;
    double a = (log(x) - log(x0)) / (log(x1) - log(x0));
    return exp(log(y0) + a * (log(y1) - log(y0)));
}

/* A dp or ZeRO group's collective (op: PT_PROFILE_ALLREDUCE, _ALLGATHER or
 * _REDUCE_SCATTER, in place on `bytes`) over n ranks linked by k, or a
 * point-to-point (PT_PROFILE_P2P, n 2). On a measured machine (one node),
 * the profile's own table for (op, n) where it has one: interpolated log-log in bytes,
 * bandwidth-bound (linear) beyond its largest size and latency-bound below its smallest, and scaled
 * from the oversubscription it was timed at (n ranks on the cores) to the layout's (`slow`: every
 * group runs its collective at once). The link's ring says less than the shm backend does: gpt2's
 * 4-rank all-reduce on the 2-core machine, 16 MiB timed 3.2 ms where the ring over the
 * point-to-point's bandwidth says 1.4. Elsewhere, the ring. */
double pt_plan_coll_s(const pt_cluster *cl, double slow, int op, int n, double bytes,
                      const pt_link *k) {
    if (n <= 1 || bytes <= 0) return 0;
    const pt_profile *pr = cl->profile;
    const pt_profile_comm *lo = NULL, *hi = NULL;
    for (int i = 0; pr && cl->nodes == 1 && i < pr->n_comm; i++) {
        const pt_profile_comm *e = &pr->comm[i];
        if (e->op != op || e->ranks != n || !(e->seconds > 0) || !(e->bytes > 0)) continue;
        if (e->bytes <= bytes && (!lo || e->bytes > lo->bytes)) lo = e;
        if (e->bytes >= bytes && (!hi || e->bytes < hi->bytes)) hi = e;
    }
    if (lo || hi) {
        double s = !hi   ? lo->seconds * bytes / lo->bytes
                   : !lo ? hi->seconds
                         : interp(bytes, lo->bytes, lo->seconds, hi->bytes, hi->seconds);
        double own = pr->cores > 0 && n > pr->cores ? (double)n / pr->cores : 1;
        return s * fmax(1, slow / own);
    }
    double bw = pt_plan_link_bw(cl, k), lat = k->latency;
    return op == PT_PROFILE_P2P         ? bytes / bw + lat
           : op == PT_PROFILE_ALLREDUCE ? pt_plan_allreduce_s(n, bytes, bw, lat)
                                        : pt_plan_allgather_s(n, bytes, bw, lat);
}

/* The gemm table's rate nearest (in log distance over m, n, k) to the
 * shape at `threads`; 0 without a table. */
static double gemm_rate(const pt_profile *p, double m, double n, double k, int threads) {
    double best = INFINITY, rate = 0;
    for (int i = 0; p && i < p->n_gemm; i++) {
        const pt_profile_gemm *g = &p->gemm[i];
        double d = fabs(log(g->m / m)) + fabs(log(g->n / n)) + fabs(log(g->k / k)) +
                   fabs(log((double)g->threads / threads));
        if (d < best) best = d, rate = g->flops_s;
    }
    return rate;
}

static int same_shape(const pt_profile_module *e, const pt_model_config *m, int kind) {
    return e->kind == kind && e->n_embd == m->n_embd && e->n_head == m->n_head &&
           e->seq_len == m->seq_len && (kind == PT_MODULE_BLOCK || e->vocab_size == m->vocab_size);
}

int pt_plan_profile_has_model(const pt_profile *p, const pt_model_config *m) {
    int kinds = 0;
    for (int i = 0; p && i < p->n_module; i++)
        for (int k = 0; k < 3; k++)
            if (same_shape(&p->module[i], m, k)) kinds |= 1 << k;
    return kinds == 7;
}

/* Ranks running at once when entry e was measured (0, as in a table built
 * in code: its own tp group). */
static int entry_ranks(const pt_profile_module *e) {
    return e->ranks > 0 ? e->ranks : e->tp > 0 ? e->tp : 1;
}

/* The measured passes of module `kind` at tp shard t for N rows, `threads`
 * threads a rank and `busy` cores running at once: t4 = {fwd, bgrad,
 * wgrad, recompute[rec]}, *own the oversubscription the measurement itself
 * ran under (ranks x threads over the cores, at least 1); returns 2 when
 * they were measured as a shard of a real group of t ranks (the times hold
 * the collectives and the group's skew), 1 when they are tp 1's (scaled
 * for a shard), 0 when the profile lacks the shape. Entries are taken at
 * the nearest thread count, then the nearest number of busy cores (alone,
 * or under load: calibrate times both). */
static int profile_module(const pt_profile *p, const pt_model_config *m, int kind, int t, double N,
                          int threads, int busy, int rec, double t4[4], double *own) {
    if (!p) return 0;
    int cores = p->cores > 0 ? p->cores : 1;
    for (int pass = 0; pass < 2; pass++) {
        int want_tp = pass == 0 ? t : 1;
        if (pass == 1 && t == 1) break;
        /* the thread count measured nearest to the one wanted, then the
         * ranks whose busy cores are nearest */
        int th = -1, rk = -1, rk_busy = 0; /* rk_busy: the cores rk's entries kept busy */
        for (int i = 0; i < p->n_module; i++) {
            const pt_profile_module *e = &p->module[i];
            if (!same_shape(e, m, kind) || e->tp != want_tp) continue;
            if (th < 0 || abs(e->threads - threads) < abs(th - threads)) th = e->threads;
        }
        if (th < 0) continue;
        for (int i = 0; i < p->n_module; i++) {
            const pt_profile_module *e = &p->module[i];
            if (!same_shape(e, m, kind) || e->tp != want_tp || e->threads != th) continue;
            int er = entry_ranks(e), eb = er * th < cores ? er * th : cores;
            if (rk < 0 || abs(eb - busy) < abs(rk_busy - busy)) rk = er, rk_busy = eb;
        }
        const pt_profile_module *lo = NULL, *hi = NULL;
        for (int i = 0; i < p->n_module; i++) {
            const pt_profile_module *e = &p->module[i];
            if (!same_shape(e, m, kind) || e->tp != want_tp || e->threads != th ||
                entry_ranks(e) != rk)
                continue;
            if (e->tokens <= N && (!lo || e->tokens > lo->tokens)) lo = e;
            if (e->tokens >= N && (!hi || e->tokens < hi->tokens)) hi = e;
        }
        if (!lo) lo = hi;
        if (!hi) hi = lo;
        double a[4] = {lo->fwd_s, lo->bgrad_s, lo->wgrad_s, lo->recompute_s[rec]};
        double b[4] = {hi->fwd_s, hi->bgrad_s, hi->wgrad_s, hi->recompute_s[rec]};
        /* A pass over fewer tokens never takes longer: a larger size's time
         * caps a smaller one's. A noisy host otherwise leaves a lone outlier
         * standing (small's tp 2 block, 256 tokens: a forward of 8.5 ms
         * where 512 took 5.6; the layout on it predicted 1146 ms a step and
         * ran 564). */
        for (int i = 0; i < p->n_module; i++) {
            const pt_profile_module *e = &p->module[i];
            if (!same_shape(e, m, kind) || e->tp != want_tp || e->threads != th ||
                entry_ranks(e) != rk)
                continue;
            double v[4] = {e->fwd_s, e->bgrad_s, e->wgrad_s, e->recompute_s[rec]};
            for (int j = 0; j < 4; j++) {
                if (!(v[j] > 0)) continue;
                if (e->tokens >= lo->tokens && v[j] < a[j]) a[j] = v[j];
                if (e->tokens >= hi->tokens && v[j] < b[j]) b[j] = v[j];
            }
        }
        double scale = (double)th / threads; /* threads scale linearly */
        if (want_tp != t) {
            /* a shard's products: 1/t of the work at the shard shape's rate */
            double C = m->n_embd, full = gemm_rate(p, N, 3 * C, C, threads),
                   part = gemm_rate(p, N, 3 * C / t, C, threads);
            scale *= (full > 0 && part > 0 ? full / part : 1.0) / t;
        }
        for (int j = 0; j < 4; j++)
            t4[j] = a[j] > 0 ? interp(N, lo->tokens, a[j], hi->tokens, b[j]) * scale : 0;
        *own = (double)rk * th > cores ? (double)rk * th / cores : 1.0;
        return want_tp > 1 ? 2 : 1;
    }
    return 0;
}

/* ---- the modelled passes ---- */

/* Module `kind`'s F, B, W seconds of one micro-batch (N rows) under
 * recompute mode rec, and the tp collectives among them (*tpc). */
void pt_plan_module_times(const pt_config *c, const pt_plan_layout *l, const pt_cluster *cl,
                          const pt_plan_rates *r, int kind, double N, int rec, double *f, double *b,
                          double *w, double *tpc) {
    const pt_model_config *m = &c->model;
    double C = m->n_embd, T = m->seq_len, V = m->vocab_size, NH = m->n_head, t = l->tp;
    double ar = l->tp > 1 ? pt_plan_allreduce_s(l->tp, N * C * r->el, r->tp_bw, r->tp_lat) : 0;
    double meas[4], own = 1;
    int threads = l->threads > 0 ? l->threads : 1, cores = r->cores,
        busy = l->dp * l->tp * l->pp * threads < cores ? l->dp * l->tp * l->pp * threads : cores;
    int have = profile_module(cl->profile, m, kind, l->tp, N, threads, busy, rec, meas, &own);
    /* oversubscribed ranks share the cores, beyond what the measurement's
     * own ranks did (the modelled rates already carry it) */
    for (int j = 0; have && j < 4; j++) meas[j] *= r->slow / own;
    /* a group's measurement holds its collectives: *tpc still reports
     * them (the breakdown), but they are not added again */
    double add = have == 2 ? 0 : 1;
    *tpc = 0;
    if (kind == PT_MODULE_EMBEDDING) {
        if (have) {
            *f = meas[0], *b = meas[1], *w = meas[2];
        } else {
            *f = 3 * N * C * r->el / r->bytes_s;
            *b = 0;
            *w = 2 * N * C * r->el / r->bytes_s;
        }
        *f += add * ar, *tpc = ar;
        return;
    }
    if (kind == PT_MODULE_HEAD) {
        if (have) {
            *f = meas[0], *b = meas[1], *w = meas[2];
        } else {
            double mm = 2 * N * C * V / t / r->flops_s;
            double logits = N * V / t * 4; /* the loss is taken in fp32 */
            *f = mm + (3 * logits + 2 * N * C * r->el) / r->bytes_s;
            *b = mm + (2 * logits + 4 * N * C * r->el) / r->bytes_s;
            *w = mm;
        }
        double small = l->tp > 1 ? pt_plan_allreduce_s(l->tp, 2 * N * 4, r->tp_bw, r->tp_lat) : 0;
        *f += add * small, *b += add * ar, *tpc = small + ar;
        return;
    }
    double whole = l->sequence_parallel ? 11 * C / t : 11 * C, gelu = 8 * C / t,
           att = 4.5 * NH * T / t;
    double ff, fb, fw, fr;
    if (have) {
        ff = meas[0], fb = meas[1], fw = meas[2], fr = meas[3];
    } else {
        double e = N * (whole + gelu + att) * r->el / r->bytes_s;
        ff = (24 * N * C * C / t + 4 * N * T * C / t) / r->flops_s + e;
        fb = (24 * N * C * C / t + 8 * N * T * C / t) / r->flops_s + 2 * e;
        fw = 24 * N * C * C / t / r->flops_s;
        fr = rec == PT_RECOMPUTE_FULL ? ff
             : rec == PT_RECOMPUTE_SELECTIVE
                 ? 2 * N * T * C / t / r->flops_s + N * (gelu + att) * r->el / r->bytes_s
                 : 0;
    }
    double tpr = rec == PT_RECOMPUTE_FULL ? 2 * ar : 0;
    *f = ff + add * 2 * ar;
    *b = fb + fr + add * (2 * ar + tpr);
    *w = fw;
    *tpc = 4 * ar + tpr;
    if (have == 2 && *tpc > *f + *b) *tpc = *f + *b; /* within what was measured */
}
