/* Schedules: the order in which one rank runs the forward and backward
 * passes of a step's micro-batches. The trainer's step is a driver over
 * such a list (trainer_step.c), so that a schedule is data, not code: the
 * data-parallel modes run `none` (each micro-batch's backward right after
 * its forward, one micro-batch in flight) or `gpipe` (every forward, then
 * every backward: M in flight); the pipeline schedules give each rank its
 * own list (pipeline/, one generator per schedule).
 *
 * This file holds the schedules' one table of descriptors (pt_sched:
 * generator, stage map, split or not, virtual stages, bubble formula,
 * activations in flight), so that no caller compares names; the
 * validation, the builders and the counts read off a list (in_flight,
 * last_pass). The simulator that runs every rank's list against the
 * dependencies, proving the lists right (no deadlock, every pass once) and
 * measuring their bubble, is pipeline/simulate.c.
 *
 * Not here: running the passes (the executor, pipeline/runtime.c), the
 * stages' communication. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "partrain/pipeline.h"
#include "pipeline/pipeline_impl.h"

/* ---- the descriptors ---- */

static int imin(int a, int b) {
    return a < b ? a : b;
}

/* gpipe and 1f1b (PipeDream-Flush): the flush's bubble at any times. */
static double bubble_flush(int m, int p, int v, double tf, double tb, double tw) {
    (void)v, (void)tf, (void)tb, (void)tw;
    return (double)(p - 1) / (m + p - 1);
}

static double bubble_interleaved(int m, int p, int v, double tf, double tb, double tw) {
    (void)tf, (void)tb, (void)tw;
    return (double)(p - 1) / ((double)v * m + p - 1);
}

/* zb1's W's fill the whole cool-down once there are p micro-batches and a
 * W fits in the gaps (tw <= tf, tb); otherwise the simulator. */
static double bubble_zb1(int m, int p, int v, double tf, double tb, double tw) {
    (void)v;
    if (m < p || tw > tf || tw > tb) return -1;
    double idle = (p - 1) * (tf + tb - tw);
    return idle > 0 ? idle / (m * (tf + tb + tw) + idle) : 0;
}

/* Activations in flight (Narayanan et al. 2021 for 1F1B and interleaving,
 * Qi et al. 2024 for the zero-bubble ones). */
static int held_none(int m, int p, int r, int v) {
    (void)m, (void)p, (void)r, (void)v;
    return 1;
}
static int held_gpipe(int m, int p, int r, int v) {
    (void)p, (void)r, (void)v;
    return m;
}
static int held_1f1b(int m, int p, int r, int v) {
    (void)v;
    return imin(p - r, m);
}
/* warm-up forwards, then one more before the first backward */
static int held_interleaved(int m, int p, int r, int v) {
    return imin(2 * (p - r - 1) + (v - 1) * p + 1, m * v);
}
/* rank r defers its W's by r micro-batches: p - r + r = p, rank 0's 1F1B */
static int held_zb1(int m, int p, int r, int v) {
    (void)r, (void)v;
    return imin(p, m);
}
/* 2p chunks at most (p stages' bytes), which the greedy fills */
static int held_zbv(int m, int p, int r, int v) {
    (void)r, (void)v;
    return imin(2 * p, 2 * m);
}

#define SEQ pt_sched_stage_seq, pt_sched_rank_seq
static const pt_sched SCHEDS[] = {
    /* name, split, whole, pipeline, as_pipeline, v_min, v_max, v_default, m_per_p, list,
     * lists, stage, rank, bubble, in_flight */
    {"none", 0, 1, 0, "1f1b", 1, 1, 1, 0, pt_sched_none, NULL, SEQ, bubble_flush, held_none},
    {"gpipe", 0, 1, 1, "gpipe", 1, 1, 1, 0, pt_sched_gpipe, NULL, SEQ, bubble_flush, held_gpipe},
    {"1f1b", 0, 0, 1, "1f1b", 1, 1, 1, 0, pt_sched_1f1b, NULL, SEQ, bubble_flush, held_1f1b},
    {"interleaved", 0, 0, 1, "interleaved", 2, PT_SCHEDULE_MAX_VIRTUAL, 2, 1, pt_sched_interleaved,
     NULL, SEQ, bubble_interleaved, held_interleaved},
    {"zb1", 1, 0, 1, "zb1", 1, 1, 1, 0, pt_sched_zb1, NULL, SEQ, bubble_zb1, held_zb1},
    {"zbv", 1, 0, 1, "zbv", 2, 2, 2, 0, pt_sched_zbv, pt_sched_zbv_all, pt_sched_stage_v,
     pt_sched_rank_v, NULL, held_zbv},
};
#undef SEQ
#define NSCHED ((int)(sizeof SCHEDS / sizeof SCHEDS[0]))

const pt_sched *pt_sched_find(const char *name) {
    for (int i = 0; name && i < NSCHED; i++)
        if (!strcmp(SCHEDS[i].name, name)) return &SCHEDS[i];
    return NULL;
}

const pt_sched *pt_sched_at(int i) {
    return i >= 0 && i < NSCHED ? &SCHEDS[i] : NULL;
}

/* "a, b or c": the table's names that `pick` takes (NULL: all). */
static void names_of(char *buf, size_t n, int (*pick)(const pt_sched *)) {
    const char *name[NSCHED];
    int k = 0;
    for (int i = 0; i < NSCHED; i++)
        if (!pick || pick(&SCHEDS[i])) name[k++] = SCHEDS[i].name;
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < k && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s",
                                i == 0       ? ""
                                : i == k - 1 ? " or "
                                             : ", ",
                                name[i]);
}

static int runs_pipeline(const pt_sched *d) {
    return d->pipeline;
}
static int runs_whole(const pt_sched *d) {
    return d->whole;
}
static int has_chunks(const pt_sched *d) {
    return d->v_max > 1;
}

/* ---- validation and the lists ---- */

pt_status pt_schedule_check(const char *name, int microbatches, int stages, int virtual_stages,
                            int nmodules) {
    int m = microbatches, p = stages, v = virtual_stages;
    const pt_sched *d = pt_sched_find(name);
    char names[96];
    if (!d) {
        names_of(names, sizeof names, NULL);
        return pt_error_set(PT_ERR_INVALID, "parallel.schedule = %s is unknown (%s)",
                            name ? name : "(null)", names);
    }
    if (p < 1) return pt_error_set(PT_ERR_INVALID, "parallel.pp must be >= 1 (got %d)", p);
    if (m < 1 || m > PT_SCHEDULE_MAX_MICRO)
        return pt_error_set(PT_ERR_INVALID, "parallel.microbatches must be in [1, %d] (got %d)",
                            PT_SCHEDULE_MAX_MICRO, m);
    if (v < 1 || v > PT_SCHEDULE_MAX_VIRTUAL)
        return pt_error_set(PT_ERR_INVALID, "parallel.virtual_stages must be in [1, %d] (got %d)",
                            PT_SCHEDULE_MAX_VIRTUAL, v);
    if (!d->pipeline && p > 1) {
        names_of(names, sizeof names, runs_pipeline);
        return pt_error_set(PT_ERR_INVALID,
                            "parallel.schedule = %s runs the whole model on one rank (got "
                            "parallel.pp = %d): use %s",
                            name, p, names);
    }
    if (v < d->v_min || v > d->v_max) {
        if (d->v_min == d->v_max && d->v_min > 1)
            return pt_error_set(
                PT_ERR_INVALID,
                "parallel.schedule = %s needs parallel.virtual_stages = %d (got %d)", name,
                d->v_min, v);
        if (d->v_min > 1)
            return pt_error_set(PT_ERR_INVALID,
                                "parallel.schedule = %s needs parallel.virtual_stages >= %d (got "
                                "%d)",
                                name, d->v_min, v);
        names_of(names, sizeof names, has_chunks);
        return pt_error_set(PT_ERR_INVALID,
                            "parallel.virtual_stages = %d needs parallel.schedule = %s (got %s)", v,
                            names, name);
    }
    if (d->m_per_p && m % p)
        return pt_error_set(PT_ERR_INVALID,
                            "parallel.microbatches = %d must be a multiple of parallel.pp = %d "
                            "for parallel.schedule = %s",
                            m, p, name);
    if (nmodules > 0 && p * v > nmodules)
        return pt_error_set(PT_ERR_INVALID,
                            "parallel.pp x parallel.virtual_stages = %d virtual stages, more than "
                            "the model's %d modules",
                            p * v, nmodules);
    return PT_OK;
}

int pt_schedule_virtual_stage(const pt_schedule *s, int chunk) {
    return s->sched->stage(s->stages, s->stage, chunk);
}

int pt_schedule_locate(const char *name, int stages, int virtual_stages, int g, int *chunk) {
    const pt_sched *d = pt_sched_find(name);
    if (!d || g < 0 || g >= stages * virtual_stages) return -1;
    return d->rank(stages, g, chunk);
}

/* in_flight, chunk_in_flight and last_pass, read off the list:
 * a (mb, chunk)'s activations are held from its F to its BW or W. */
static void count_list(pt_schedule *s) {
    int held[PT_SCHEDULE_MAX_VIRTUAL] = {0}, total = 0;
    for (int k = 0; k < s->npass; k++) {
        const pt_pass *q = &s->pass[k];
        if (q->kind == PT_PASS_FORWARD) {
            total++, held[q->chunk]++;
            if (held[q->chunk] > s->chunk_in_flight[q->chunk])
                s->chunk_in_flight[q->chunk] = held[q->chunk];
            if (total > s->in_flight) s->in_flight = total;
        } else if (q->kind == PT_PASS_BACKWARD || q->kind == PT_PASS_BACKWARD_WEIGHT) {
            total--, held[q->chunk]--;
            s->last_pass[q->chunk] = k;
        }
    }
}

size_t pt_schedule_blocks(int v, int in_flight, const int *chunk_in_flight, const size_t *fl,
                          int *per_chunk, int *nblocks) {
    size_t most = 0, own = 0;
    int n_own = 0;
    for (int c = 0; c < v; c++) {
        if (fl[c] > most) most = fl[c];
        own += (size_t)chunk_in_flight[c] * fl[c];
        n_own += chunk_in_flight[c];
    }
    size_t shared = (size_t)in_flight * most;
    int mine = v > 1 && own < shared;
    if (per_chunk) *per_chunk = mine;
    if (nblocks) *nblocks = mine ? n_own : in_flight;
    return mine ? own : shared;
}

/* Room for a list's passes: F, then BW or B and W, per micro-batch and chunk. */
static size_t list_room(const pt_sched *d, int m, int v) {
    return (size_t)(d->split ? 3 : 2) * (size_t)m * (size_t)v;
}

size_t pt_schedule_bytes(const pt_schedule *s) {
    return sizeof(pt_pass) * list_room(s->sched, s->microbatches, s->virtual_stages);
}

int pt_schedule_pending_w(const pt_schedule *s) {
    int n = 0, most = 1;
    for (int k = 0; k < s->npass; k++) {
        n += s->pass[k].kind == PT_PASS_BACKWARD_INPUT;
        n -= s->pass[k].kind == PT_PASS_BACKWARD_WEIGHT;
        if (n > most) most = n;
    }
    return most;
}

/* A built list's fields besides pass. */
static void finish_list(pt_schedule *s, const pt_sched *d, int n, int m, int p, int r, int v) {
    snprintf(s->name, sizeof s->name, "%s", d->name);
    s->sched = d;
    s->npass = n;
    s->microbatches = m, s->stages = p, s->stage = r, s->virtual_stages = v;
    s->split = d->split;
    count_list(s);
}

pt_status pt_schedule_build_stage(pt_schedule *s, const char *name, int microbatches, int stages,
                                  int stage, int virtual_stages) {
    memset(s, 0, sizeof *s);
    PT_CHECK(pt_schedule_check(name, microbatches, stages, virtual_stages, 0));
    int m = microbatches, p = stages, r = stage, v = virtual_stages;
    if (r < 0 || r >= p)
        return pt_error_set(PT_ERR_INVALID, "pipeline stage %d outside [0, parallel.pp = %d)", r,
                            p);
    const pt_sched *d = pt_sched_find(name);
    s->pass = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(pt_pass) * list_room(d, m, v));
    if (!s->pass) return PT_ERR_NOMEM; /* the last error set by pt_mem_alloc */
    int n = d->list(s->pass, m, p, r, v);
    if (n < 0) {
        pt_schedule_free(s);
        return PT_ERR_NOMEM;
    }
    finish_list(s, d, n, m, p, r, v);
    return PT_OK;
}

pt_status pt_schedule_build_all(pt_schedule *s, const char *name, int microbatches, int stages,
                                int virtual_stages) {
    int m = microbatches, p = stages, v = virtual_stages;
    memset(s, 0, sizeof *s * (size_t)(p > 0 ? p : 0));
    const pt_sched *d = pt_sched_find(name);
    if (!d || !d->lists || p < 2) {
        for (int r = 0; r < p; r++) {
            pt_status st = pt_schedule_build_stage(&s[r], name, m, p, r, v);
            if (st != PT_OK) {
                for (int k = 0; k < r; k++) pt_schedule_free(&s[k]);
                return st;
            }
        }
        return PT_OK;
    }
    PT_CHECK(pt_schedule_check(name, m, p, v, 0));
    pt_pass **out = pt_mem_alloc(PT_MEM_SCRATCH, sizeof *out * (size_t)p);
    int *n = pt_mem_alloc(PT_MEM_SCRATCH, sizeof *n * (size_t)p);
    int ok = out && n;
    for (int r = 0; ok && r < p; r++)
        ok = (out[r] = s[r].pass =
                  pt_mem_alloc(PT_MEM_SCRATCH, sizeof(pt_pass) * list_room(d, m, v))) != NULL;
    ok = ok && d->lists(out, n, m, p, v) == 0;
    for (int r = 0; r < p; r++) {
        if (ok)
            finish_list(&s[r], d, n[r], m, p, r, v);
        else
            pt_schedule_free(&s[r]);
    }
    pt_mem_free(n);
    pt_mem_free(out);
    return ok ? PT_OK : PT_ERR_NOMEM; /* the last error set by pt_mem_alloc */
}

pt_status pt_schedule_build(pt_schedule *s, const char *name, int microbatches) {
    memset(s, 0, sizeof *s);
    if (microbatches < 1 || microbatches > PT_SCHEDULE_MAX_MICRO)
        return pt_error_set(PT_ERR_INVALID, "parallel.microbatches must be in [1, %d] (got %d)",
                            PT_SCHEDULE_MAX_MICRO, microbatches);
    const pt_sched *d = pt_sched_find(name);
    if (!d || !d->whole) {
        char names[96];
        names_of(names, sizeof names, runs_whole);
        return pt_error_set(PT_ERR_UNSUPPORTED,
                            "parallel.schedule = %s is not supported yet (no pipeline "
                            "parallelism: %s)",
                            name ? name : "(null)", names);
    }
    return pt_schedule_build_stage(s, name, microbatches, 1, 0, 1);
}

void pt_schedule_free(pt_schedule *s) {
    if (!s) return;
    pt_mem_free(s->pass);
    memset(s, 0, sizeof *s);
}

/* ---- at given pass times ---- */

pt_status pt_schedule_simulate(const char *name, int m, int p, int v, double tf, double tb,
                               double tw, double *makespan, double *busy) {
    PT_CHECK(pt_schedule_check(name, m, p, v, 0));
    if (!(tf >= 0 && tb >= 0 && tw >= 0) || !isfinite(tf + tb + tw))
        return pt_error_set(PT_ERR_INVALID, "schedule times must be finite and >= 0 (got %g %g %g)",
                            tf, tb, tw);
    int G = p * v;
    pt_schedule *s = pt_mem_alloc(PT_MEM_SCRATCH, sizeof *s * (size_t)p);
    double *t = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(double) * 3 * (size_t)G);
    pt_status st = s && t ? pt_schedule_build_all(s, name, m, p, v) : PT_ERR_NOMEM;
    if (st == PT_OK) {
        for (int g = 0; g < G; g++) t[g] = tf, t[G + g] = tb, t[2 * G + g] = tw;
        pt_sched_times times = {.f = t, .b = t + G, .w = t + 2 * G};
        pt_sched_result out = {.busy = busy};
        st = pt_sched_simulate(s, &times, &out);
        if (st == PT_OK && makespan) *makespan = out.makespan;
        for (int r = 0; r < p; r++) pt_schedule_free(&s[r]);
    }
    pt_mem_free(t);
    pt_mem_free(s);
    return st;
}

double pt_schedule_bubble(const char *name, int m, int p, int v, double tf, double tb, double tw) {
    if (pt_schedule_check(name, m, p, v, 0)) return -1;
    const pt_sched *d = pt_sched_find(name);
    double closed = d->bubble ? d->bubble(m, p, v, tf, tb, tw) : -1;
    if (closed >= 0) return closed;
    double end, busy[64], *b = busy;
    if (p > 64 && !(b = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(double) * (size_t)p))) return -1;
    double sum = 0;
    pt_status st = pt_schedule_simulate(name, m, p, v, tf, tb, tw, &end, b);
    for (int r = 0; !st && r < p; r++) sum += b[r];
    if (b != busy) pt_mem_free(b);
    if (st) return -1;
    return end > 0 ? 1 - sum / ((double)p * end) : 0;
}
