/* zbv: ZB-V of "Zero Bubble Pipeline Parallelism" (Qi et al., ICLR 2024,
 * section 6). Two chunks per rank in a V: chunk 0 of rank r is virtual
 * stage r, chunk 1 is 2p-1-r, so rank 0 holds both the embedding and the
 * head and a micro-batch goes down the ranks and back up. Each backward is
 * split into B and W.
 *
 * The list is built the paper's way, by a greedy list scheduler over all p
 * ranks at unit times (tf = tb = tw): a rank that is free runs, in order of
 * preference, a ready B (smallest micro-batch, then chunk 1), a ready F
 * (chunk 1 first) if its activations fit, else a pending W. Activations are
 * capped at 2p chunks per rank (half a stage each: the bytes of 1F1B's p
 * stages at rank 0), one of them kept for chunk 1 so that a micro-batch
 * coming back up can always enter (no deadlock). Deterministic: every rank
 * runs the same simulation and keeps its own list, a function of (m, p, r);
 * the planner, which wants every rank's, keeps them all from one
 * (pt_sched_zbv_all).
 *
 * The simulation steps through unit time slots t = 0, 1, ...; a pass
 * started at t ends at t+1, so what a rank chooses at t reads only passes
 * that ended by t and no choice made at t sees another: the ranks of one
 * slot may choose in any order. A rank idle at t chooses again only when
 * something it reads may have changed: its own pass ended, or a neighbour
 * (r-1, r+1: the only ranks whose F and B its chunks wait on, both arms of
 * the V) ended an F or a B. Every other rank would idle again, so it is
 * skipped, and the cost is O(passes): every list at p 256, m 256 in 0.01 s
 * of CPU and at p 1024, m 1024 in 0.16 s, where picking the next rank by a
 * scan of all p per pass (and another to wake the idle ones), O(m p^2),
 * took 0.56 s and 34 s.
 *
 * Not here: the general-time simulator (simulate.c); the lists are then run
 * in order at any times. */
#include <limits.h>

#include "pipeline_impl.h"

enum { ZBV_F, ZBV_B, ZBV_W };

typedef struct {
    int next[2][3]; /* per chunk: next micro-batch to F, B, W */
    int queued;     /* the slot it will next choose in; -1: none */
    int done;
} zbv_rank;

typedef struct {
    int m, p, G;
    int *fin; /* end slot of F and B per (mb, g); INT_MAX until run */
    zbv_rank *rk;
} zbv_sim;

int pt_sched_stage_v(int p, int r, int c) {
    return c == 0 ? r : 2 * p - 1 - r;
}

int pt_sched_rank_v(int p, int g, int *c) {
    if (c) *c = g >= p;
    return g < p ? g : 2 * p - 1 - g;
}

static int *fin_at(const zbv_sim *z, int kind, int mb, int g) {
    return &z->fin[((size_t)kind * z->m + mb) * z->G + g];
}

/* What rank q runs at slot t: *kind and *chunk, or 0 when it idles. */
static int zbv_choose(const zbv_sim *z, int q, int t, int *kind, int *chunk) {
    const zbv_rank *R = &z->rk[q];
    int m = z->m, p = z->p, G = z->G, cap = 2 * p, held = 0, k = -1, ch = -1;
    for (int c = 0; c < 2; c++) held += R->next[c][ZBV_F] - R->next[c][ZBV_W];
    for (int c = 1; c >= 0; c--) { /* B: smallest mb, then chunk 1 */
        int mb = R->next[c][ZBV_B], g = pt_sched_stage_v(p, q, c);
        if (mb < m && *fin_at(z, ZBV_F, mb, g) <= t &&
            (g == G - 1 || *fin_at(z, ZBV_B, mb, g + 1) <= t) && (k < 0 || mb < R->next[ch][ZBV_B]))
            k = ZBV_B, ch = c;
    }
    for (int c = 1; k < 0 && c >= 0; c--) {
        int mb = R->next[c][ZBV_F], g = pt_sched_stage_v(p, q, c);
        if (mb < m && (g == 0 || *fin_at(z, ZBV_F, mb, g - 1) <= t) && held < cap - (c == 0))
            k = ZBV_F, ch = c;
    }
    for (int c = 1; k < 0 && c >= 0; c--)
        if (R->next[c][ZBV_W] < R->next[c][ZBV_B]) k = ZBV_W, ch = c;
    *kind = k, *chunk = ch;
    return k >= 0;
}

int pt_sched_zbv(pt_pass *out, int m, int p, int r, int v) {
    pt_pass **outs = pt_mem_alloc(PT_MEM_SCRATCH, sizeof *outs * (size_t)p);
    int *n = pt_mem_alloc(PT_MEM_SCRATCH, sizeof *n * (size_t)p);
    int got = -1;
    if (outs && n) {
        for (int k = 0; k < p; k++) outs[k] = k == r ? out : NULL;
        got = pt_sched_zbv_all(outs, n, m, p, v) < 0 ? -1 : n[r];
    }
    pt_mem_free(n);
    pt_mem_free(outs);
    return got;
}

/* Rank q, if there is one and it still has passes, chooses at slot t. */
static void zbv_queue(zbv_sim *z, int *list, int *len, int q, int t) {
    if (q < 0 || q >= z->p || z->rk[q].done || z->rk[q].queued == t) return;
    z->rk[q].queued = t;
    list[(*len)++] = q;
}

int pt_sched_zbv_all(pt_pass *const *out, int *n, int m, int p, int v) {
    (void)v; /* 2: the V */
    static const pt_pass_kind PK[3] = {PT_PASS_FORWARD, PT_PASS_BACKWARD_INPUT,
                                       PT_PASS_BACKWARD_WEIGHT};
    zbv_sim z = {m, p, 2 * p, NULL, NULL};
    z.fin = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(int) * 2 * (size_t)m * z.G);
    z.rk = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(zbv_rank) * (size_t)p);
    /* the ranks choosing in this slot and in the next */
    int *now = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(int) * (size_t)p);
    int *next = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(int) * (size_t)p);
    int ok = z.fin && z.rk && now && next, nnow = 0, left = p;
    for (size_t i = 0; ok && i < 2 * (size_t)m * z.G; i++) z.fin[i] = INT_MAX;
    for (int k = 0; ok && k < p; k++) n[k] = 0, z.rk[k].queued = -1;
    for (int k = 0; ok && k < p; k++) zbv_queue(&z, now, &nnow, k, 0);
    for (int t = 0; ok && left > 0; t++) {
        PT_ASSERT(nnow > 0); /* nothing ran in the last slot: a deadlock */
        int nnext = 0;
        for (int i = 0; i < nnow; i++) {
            int q = now[i], kind, chunk;
            zbv_rank *R = &z.rk[q];
            if (!zbv_choose(&z, q, t, &kind, &chunk)) continue; /* idle */
            int mb = R->next[chunk][kind]++;
            if (kind != ZBV_W) { /* the neighbours may wait on it */
                *fin_at(&z, kind, mb, pt_sched_stage_v(p, q, chunk)) = t + 1;
                zbv_queue(&z, next, &nnext, q - 1, t + 1);
                zbv_queue(&z, next, &nnext, q + 1, t + 1);
            }
            if (out[q]) out[q][n[q]] = (pt_pass){PK[kind], mb, chunk};
            n[q]++;
            if (R->next[0][ZBV_W] == m && R->next[1][ZBV_W] == m)
                R->done = 1, left--;
            else
                zbv_queue(&z, next, &nnext, q, t + 1);
        }
        int *tmp = now;
        now = next, next = tmp, nnow = nnext;
    }
    pt_mem_free(next);
    pt_mem_free(now);
    pt_mem_free(z.rk);
    pt_mem_free(z.fin);
    return ok ? 0 : -1; /* the last error says out of memory */
}
