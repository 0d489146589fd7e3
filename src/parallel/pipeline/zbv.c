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
 * (pt_pipe_zbv_all: the simulation is O(m p^2), so p of them were 65% of
 * planning GPT-3 on 64 GPUs).
 *
 * Not here: the general-time simulator (schedule.c); the lists are then run
 * in order at any times. */
#include <math.h>
#include <stdlib.h>

#include "pipeline_impl.h"

enum { ZBV_F, ZBV_B, ZBV_W };

typedef struct {
    int next[2][3]; /* per chunk: next micro-batch to F, B, W */
    double free_at; /* busy until; or the wake-up time while asleep */
    int asleep, done;
} zbv_rank;

static int zbv_g(int p, int r, int c) {
    return c == 0 ? r : 2 * p - 1 - r;
}

int pt_pipe_zbv(pt_pass *out, int m, int p, int r) {
    pt_pass **outs = pt_mem_alloc(PT_MEM_SCRATCH, sizeof *outs * (size_t)p);
    int *n = pt_mem_alloc(PT_MEM_SCRATCH, sizeof *n * (size_t)p);
    int got = -1;
    if (outs && n) {
        for (int k = 0; k < p; k++) outs[k] = k == r ? out : NULL;
        got = pt_pipe_zbv_all(outs, n, m, p) < 0 ? -1 : n[r];
    }
    pt_mem_free(n);
    pt_mem_free(outs);
    return got;
}

int pt_pipe_zbv_all(pt_pass *const *out, int *n, int m, int p) {
    int G = 2 * p, cap = 2 * p;
    /* finish times of F and B per (mb, g); INFINITY until scheduled */
    double *fin = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(double) * 2 * (size_t)m * G);
    zbv_rank *rk = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(zbv_rank) * (size_t)p);
    if (!fin || !rk) {
        pt_mem_free(rk);
        pt_mem_free(fin);
        return -1; /* the last error says out of memory */
    }
    for (size_t i = 0; i < 2 * (size_t)m * G; i++) fin[i] = INFINITY;
    for (int k = 0; k < p; k++) n[k] = 0;
#define FIN(kind, mb, g) fin[((size_t)(kind)*m + (mb)) * G + (g)]
    for (int left = p; left > 0;) {
        int q = -1;
        for (int k = 0; k < p; k++)
            if (!rk[k].done && (q < 0 || rk[k].free_at < rk[q].free_at)) q = k;
        zbv_rank *R = &rk[q];
        PT_ASSERT(isfinite(R->free_at)); /* every rank asleep: a deadlock */
        double t = R->free_at;
        int held = 0;
        for (int c = 0; c < 2; c++) held += R->next[c][ZBV_F] - R->next[c][ZBV_W];
        int kind = -1, chunk = -1;
        for (int c = 1; c >= 0; c--) { /* B: smallest mb, then chunk 1 */
            int mb = R->next[c][ZBV_B], g = zbv_g(p, q, c);
            if (mb < m && FIN(ZBV_F, mb, g) <= t && (g == G - 1 || FIN(ZBV_B, mb, g + 1) <= t) &&
                (kind < 0 || mb < R->next[chunk][ZBV_B]))
                kind = ZBV_B, chunk = c;
        }
        for (int c = 1; kind < 0 && c >= 0; c--) {
            int mb = R->next[c][ZBV_F], g = zbv_g(p, q, c);
            if (mb < m && (g == 0 || FIN(ZBV_F, mb, g - 1) <= t) && held < cap - (c == 0))
                kind = ZBV_F, chunk = c;
        }
        for (int c = 1; kind < 0 && c >= 0; c--)
            if (R->next[c][ZBV_W] < R->next[c][ZBV_B]) kind = ZBV_W, chunk = c;
        if (kind < 0) { /* nothing ready: sleep until the next pass ends */
            double wake = INFINITY;
            for (int k = 0; k < p; k++)
                if (rk[k].free_at > t && rk[k].free_at < wake) wake = rk[k].free_at;
            R->free_at = wake, R->asleep = 1;
            continue;
        }
        int mb = R->next[chunk][kind]++, g = zbv_g(p, q, chunk);
        double end = t + 1;
        if (kind != ZBV_W) FIN(kind, mb, g) = end;
        R->free_at = end, R->asleep = 0;
        for (int k = 0; k < p; k++) /* a sleeper may be able to start when this ends */
            if (rk[k].asleep && rk[k].free_at > end) rk[k].free_at = end;
        if (out[q]) {
            pt_pass_kind pk = kind == ZBV_F   ? PT_PASS_FORWARD
                              : kind == ZBV_B ? PT_PASS_BACKWARD_INPUT
                                              : PT_PASS_BACKWARD_WEIGHT;
            out[q][n[q]] = (pt_pass){pk, mb, chunk};
        }
        n[q]++;
        if (R->next[0][ZBV_W] == m && R->next[1][ZBV_W] == m) R->done = 1, left--;
    }
#undef FIN
    pt_mem_free(rk);
    pt_mem_free(fin);
    return 0;
}
