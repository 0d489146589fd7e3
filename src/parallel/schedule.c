/* Schedules: the order in which one rank runs the forward and backward
 * passes of a step's micro-batches. The trainer's step is a driver over
 * such a list (trainer_step.c), so that a schedule is data, not code: the
 * data-parallel modes run `none` (each micro-batch's backward right after
 * its forward, one micro-batch in flight) or `gpipe` (every forward, then
 * every backward: M in flight); the pipeline schedules give each rank its
 * own list (pipeline/, one generator per schedule).
 *
 * This file is the dispatcher: validation, the virtual-stage mapping, the
 * counts read off a list (in_flight, last_pass), and the simulator that
 * runs every rank's list against the dependencies and proves the lists
 * right (no deadlock, every pass once) and measures their bubble.
 *
 * Not here: running the passes (the trainer), the stages' communication. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "partrain/parallel.h"
#include "pipeline/pipeline_impl.h"

typedef struct {
    const char *name;
    int split; /* backwards are B + W */
} sched_info;

static const sched_info SCHEDS[] = {
    {"none", 0}, {"gpipe", 0}, {"1f1b", 0}, {"interleaved", 0}, {"zb1", 1}, {"zbv", 1},
};
#define NSCHED ((int)(sizeof SCHEDS / sizeof SCHEDS[0]))

static const sched_info *sched_find(const char *name) {
    for (int i = 0; name && i < NSCHED; i++)
        if (!strcmp(SCHEDS[i].name, name)) return &SCHEDS[i];
    return NULL;
}

static int is(const char *name, const char *s) {
    return !strcmp(name, s);
}

pt_status pt_schedule_check(const char *name, int microbatches, int stages, int virtual_stages,
                            int nmodules) {
    int m = microbatches, p = stages, v = virtual_stages;
    if (!sched_find(name))
        return pt_error_set(PT_ERR_INVALID,
                            "parallel.schedule = %s is unknown (none, gpipe, 1f1b, interleaved, "
                            "zb1 or zbv)",
                            name ? name : "(null)");
    if (p < 1) return pt_error_set(PT_ERR_INVALID, "parallel.pp must be >= 1 (got %d)", p);
    if (m < 1 || m > PT_SCHEDULE_MAX_MICRO)
        return pt_error_set(PT_ERR_INVALID, "parallel.microbatches must be in [1, %d] (got %d)",
                            PT_SCHEDULE_MAX_MICRO, m);
    if (v < 1 || v > PT_SCHEDULE_MAX_VIRTUAL)
        return pt_error_set(PT_ERR_INVALID, "parallel.virtual_stages must be in [1, %d] (got %d)",
                            PT_SCHEDULE_MAX_VIRTUAL, v);
    if (is(name, "none") && p > 1)
        return pt_error_set(PT_ERR_INVALID,
                            "parallel.schedule = none runs the whole model on one rank (got "
                            "parallel.pp = %d): use gpipe, 1f1b, interleaved, zb1 or zbv",
                            p);
    if (is(name, "interleaved") && v < 2)
        return pt_error_set(PT_ERR_INVALID,
                            "parallel.schedule = interleaved needs parallel.virtual_stages >= 2 "
                            "(got %d)",
                            v);
    if (is(name, "zbv") && v != 2)
        return pt_error_set(PT_ERR_INVALID,
                            "parallel.schedule = zbv needs parallel.virtual_stages = 2 (got %d)",
                            v);
    if (v > 1 && !is(name, "interleaved") && !is(name, "zbv"))
        return pt_error_set(PT_ERR_INVALID,
                            "parallel.virtual_stages = %d needs parallel.schedule = interleaved "
                            "or zbv (got %s)",
                            v, name);
    if (is(name, "interleaved") && m % p)
        return pt_error_set(PT_ERR_INVALID,
                            "parallel.microbatches = %d must be a multiple of parallel.pp = %d "
                            "for parallel.schedule = interleaved",
                            m, p);
    if (nmodules > 0 && p * v > nmodules)
        return pt_error_set(PT_ERR_INVALID,
                            "parallel.pp x parallel.virtual_stages = %d virtual stages, more than "
                            "the model's %d modules",
                            p * v, nmodules);
    return PT_OK;
}

static int vstage(const char *name, int p, int r, int c) {
    if (is(name, "zbv")) return c == 0 ? r : 2 * p - 1 - r;
    return c * p + r; /* interleaved; c = 0 for the others */
}

int pt_schedule_virtual_stage(const pt_schedule *s, int chunk) {
    return vstage(s->name, s->stages, s->stage, chunk);
}

int pt_schedule_locate(const char *name, int stages, int virtual_stages, int g, int *chunk) {
    int p = stages, G = stages * virtual_stages, r, c;
    if (g < 0 || g >= G) return -1;
    if (is(name, "zbv"))
        r = g < p ? g : 2 * p - 1 - g, c = g < p ? 0 : 1;
    else
        r = g % p, c = g / p;
    if (chunk) *chunk = c;
    return r;
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

size_t pt_schedule_bytes(const pt_schedule *s) {
    return sizeof(pt_pass) * (size_t)(s->split ? 3 : 2) * (size_t)s->microbatches *
           (size_t)s->virtual_stages;
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
static void finish_list(pt_schedule *s, const sched_info *info, int n, int m, int p, int r, int v) {
    snprintf(s->name, sizeof s->name, "%s", info->name);
    s->npass = n;
    s->microbatches = m, s->stages = p, s->stage = r, s->virtual_stages = v;
    s->split = info->split;
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
    const sched_info *info = sched_find(name);
    s->pass = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(pt_pass) * (size_t)(info->split ? 3 : 2) * m * v);
    if (!s->pass) return PT_ERR_NOMEM; /* the last error set by pt_mem_alloc */
    int n;
    if (is(name, "none"))
        n = pt_pipe_none(s->pass, m);
    else if (is(name, "gpipe"))
        n = pt_pipe_gpipe(s->pass, m, p, r);
    else if (is(name, "1f1b"))
        n = pt_pipe_1f1b(s->pass, m, p, r);
    else if (is(name, "interleaved"))
        n = pt_pipe_interleaved(s->pass, m, p, r, v);
    else if (is(name, "zb1"))
        n = pt_pipe_zb1(s->pass, m, p, r);
    else
        n = pt_pipe_zbv(s->pass, m, p, r);
    if (n < 0) {
        pt_schedule_free(s);
        return PT_ERR_NOMEM;
    }
    finish_list(s, info, n, m, p, r, v);
    return PT_OK;
}

pt_status pt_schedule_build_all(pt_schedule *s, const char *name, int microbatches, int stages,
                                int virtual_stages) {
    int m = microbatches, p = stages, v = virtual_stages;
    memset(s, 0, sizeof *s * (size_t)(p > 0 ? p : 0));
    if (!name || !is(name, "zbv") || p < 2) {
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
    const sched_info *info = sched_find(name);
    pt_pass **out = pt_mem_alloc(PT_MEM_SCRATCH, sizeof *out * (size_t)p);
    int *n = pt_mem_alloc(PT_MEM_SCRATCH, sizeof *n * (size_t)p);
    int ok = out && n;
    for (int r = 0; ok && r < p; r++)
        ok = (out[r] = s[r].pass =
                  pt_mem_alloc(PT_MEM_SCRATCH, sizeof(pt_pass) * 3 * (size_t)m * v)) != NULL;
    ok = ok && pt_pipe_zbv_all(out, n, m, p) == 0;
    for (int r = 0; r < p; r++) {
        if (ok)
            finish_list(&s[r], info, n[r], m, p, r, v);
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
    if (!name || (!is(name, "none") && !is(name, "gpipe")))
        return pt_error_set(PT_ERR_UNSUPPORTED,
                            "parallel.schedule = %s is not supported yet (no pipeline "
                            "parallelism: none or gpipe)",
                            name ? name : "(null)");
    return pt_schedule_build_stage(s, name, microbatches, 1, 0, 1);
}

void pt_schedule_free(pt_schedule *s) {
    if (!s) return;
    pt_mem_free(s->pass);
    memset(s, 0, sizeof *s);
}

static const char *kind_name(pt_pass_kind k) {
    static const char *names[] = {"F", "BW", "B", "W"};
    return names[k];
}

/* Every pass rank r owns exactly once, of the kinds its schedule uses.
 * cnt: 3 * m * v scratch (F, BW or B, W per micro-batch and chunk). */
static pt_status check_list(const pt_schedule *s, int *cnt) {
    int m = s->microbatches, v = s->virtual_stages;
    memset(cnt, 0, sizeof(int) * 3 * (size_t)m * v);
    for (int k = 0; k < s->npass; k++) {
        const pt_pass *q = &s->pass[k];
        int bad =
            q->micro < 0 || q->micro >= m || q->chunk < 0 || q->chunk >= v || (int)q->kind < 0 ||
            q->kind > PT_PASS_BACKWARD_WEIGHT ||
            (s->split ? q->kind == PT_PASS_BACKWARD
                      : q->kind == PT_PASS_BACKWARD_INPUT || q->kind == PT_PASS_BACKWARD_WEIGHT);
        if (bad)
            return pt_error_set(PT_ERR_INTERNAL,
                                "schedule %s rank %d: pass %d (kind %d, micro-batch %d, chunk %d) "
                                "does not belong in its list",
                                s->name, s->stage, k, (int)q->kind, q->micro, q->chunk);
        int slot = q->kind == PT_PASS_FORWARD ? 0 : q->kind == PT_PASS_BACKWARD_WEIGHT ? 2 : 1;
        cnt[((size_t)slot * m + q->micro) * v + q->chunk]++;
    }
    for (int slot = 0; slot < (s->split ? 3 : 2); slot++)
        for (int mb = 0; mb < m; mb++)
            for (int c = 0; c < v; c++) {
                int n = cnt[((size_t)slot * m + mb) * v + c];
                if (n != 1)
                    return pt_error_set(PT_ERR_INTERNAL,
                                        "schedule %s rank %d: %s of micro-batch %d chunk %d "
                                        "appears %d times (want 1)",
                                        s->name, s->stage,
                                        slot == 0   ? "F"
                                        : slot == 2 ? "W"
                                        : s->split  ? "B"
                                                    : "BW",
                                        mb, c, n);
            }
    return PT_OK;
}

/* The simulator's state. fin: the end of every F and BW/B by (mb, g), -1
 * until it has run (a W ends no other pass's wait: not kept); work: the
 * ranks to run on, each at most once (queued). */
typedef struct {
    const pt_schedule *s;
    int m, v, G;
    double dur[4]; /* by pt_pass_kind: tf, tb + tw, tb, tw */
    const double *scale;
    int *g_of;    /* virtual stage of chunk c of rank r: [r * v + c] */
    int *rank_of; /* the rank holding virtual stage g */
    double *fin, *t;
    int *pos, *work, nwork;
    unsigned char *queued;
} pipe_sim;

static void sim_queue(pipe_sim *x, int r) {
    if (x->queued[r]) return;
    x->queued[r] = 1;
    x->work[x->nwork++] = r;
}

/* Runs rank r's list from where it stopped until a pass waits on one that
 * has not run, queueing the rank that may wait on each pass it ends: an
 * F's downstream (g+1), a B's upstream (g-1). */
static void sim_rank(pipe_sim *x, int r) {
    const pt_schedule *s = &x->s[r];
    int m = x->m, G = x->G;
#define FIN(slot, mb, g) x->fin[((size_t)(slot)*m + (mb)) * G + (g)]
    for (; x->pos[r] < s->npass; x->pos[r]++) {
        const pt_pass *q = &s->pass[x->pos[r]];
        int g = x->g_of[r * x->v + q->chunk], mb = q->micro, slot, waiter = -1;
        double dep[2] = {0, 0};
        if (q->kind == PT_PASS_FORWARD) {
            slot = 0;
            dep[0] = g > 0 ? FIN(0, mb, g - 1) : 0;
            if (g < G - 1) waiter = x->rank_of[g + 1];
        } else if (q->kind == PT_PASS_BACKWARD_WEIGHT) {
            slot = 2;
            dep[0] = FIN(1, mb, g);
        } else {
            slot = 1;
            dep[0] = FIN(0, mb, g);
            dep[1] = g < G - 1 ? FIN(1, mb, g + 1) : 0;
            if (g > 0) waiter = x->rank_of[g - 1];
        }
        if (dep[0] < 0 || dep[1] < 0) return; /* the pass it waits on queues it */
        double dur = x->dur[q->kind];
        if (x->scale) dur *= x->scale[g];
        x->t[r] = fmax(x->t[r], fmax(dep[0], dep[1])) + dur;
        if (slot < 2) FIN(slot, mb, g) = x->t[r];
        if (waiter >= 0 && waiter != r) sim_queue(x, waiter);
    }
#undef FIN
}

/* One line naming every stuck rank's pass (the first 8); PT_OK if none. */
static pt_status sim_deadlock(const pipe_sim *x) {
    const pt_schedule *s = x->s;
    char why[512] = "";
    int stuck = 0, p = s[0].stages;
    for (int r = 0; r < p; r++) {
        if (x->pos[r] == s[r].npass) continue;
        const pt_pass *q = &s[r].pass[x->pos[r]];
        size_t len = strlen(why);
        if (stuck++ < 8)
            snprintf(why + len, sizeof why - len,
                     "%srank %d waits at pass %d (%s of micro-batch %d chunk %d)", len ? ", " : "",
                     r, x->pos[r], kind_name(q->kind), q->micro, q->chunk);
    }
    if (!stuck) return PT_OK;
    return pt_error_set(PT_ERR_INTERNAL, "schedule %s (m %d, p %d, v %d) deadlocks: %s%s",
                        s[0].name, x->m, p, x->v, why, stuck > 8 ? ", ..." : "");
}

pt_status pt_pipe_simulate(const pt_schedule *s, double tf, double tb, double tw,
                           const double *scale, double *makespan, double *busy) {
    const char *name = s[0].name;
    int m = s[0].microbatches, p = s[0].stages, v = s[0].virtual_stages, G = p * v;
    pipe_sim x = {.s = s, .m = m, .v = v, .G = G, .dur = {tf, tb + tw, tb, tw}, .scale = scale};
    pt_status st = PT_OK;
    x.fin = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(double) * 2 * (size_t)m * G);
    x.t = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(double) * (size_t)p);
    x.pos = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(int) * (size_t)p);
    x.work = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(int) * (size_t)p);
    x.queued = pt_mem_alloc(PT_MEM_SCRATCH, (size_t)p);
    x.g_of = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(int) * (size_t)G);
    x.rank_of = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(int) * (size_t)G);
    int *cnt = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(int) * 3 * (size_t)m * v);
    if (!x.fin || !x.t || !x.pos || !x.work || !x.queued || !x.g_of || !x.rank_of || !cnt) {
        st = PT_ERR_NOMEM;
        goto done;
    }
    for (int r = 0; r < p; r++) PT_CHECK_GOTO(st, check_list(&s[r], cnt), done);
    for (size_t i = 0; i < 2 * (size_t)m * G; i++) x.fin[i] = -1;
    for (int r = 0; r < p; r++)
        for (int c = 0; c < v; c++) x.rank_of[x.g_of[r * v + c] = vstage(name, p, r, c)] = r;
    /* Each rank runs its list in order until a pass waits on another rank's
     * that has not run; that rank queues it again when it runs the pass.
     * Every pass's end is max(its rank's clock, its dependencies' ends) +
     * its time, whatever the order the ranks run in: O(passes), where
     * sweeping all ranks until none moved cost p per sweep. */
    for (int r = p - 1; r >= 0; r--) sim_queue(&x, r);
    while (x.nwork > 0) {
        int r = x.work[--x.nwork];
        x.queued[r] = 0;
        sim_rank(&x, r);
    }
    PT_CHECK_GOTO(st, sim_deadlock(&x), done);
    double end = 0;
    for (int r = 0; r < p; r++) end = fmax(end, x.t[r]);
    if (makespan) *makespan = end;
    for (int r = 0; busy && r < p; r++) {
        double b = 0;
        for (int k = 0; k < s[r].npass; k++) {
            pt_pass_kind kd = s[r].pass[k].kind;
            b += (kd == PT_PASS_FORWARD          ? tf
                  : kd == PT_PASS_BACKWARD       ? tb + tw
                  : kd == PT_PASS_BACKWARD_INPUT ? tb
                                                 : tw) *
                 (scale ? scale[x.g_of[r * v + s[r].pass[k].chunk]] : 1);
        }
        busy[r] = b;
    }
done:
    pt_mem_free(cnt);
    pt_mem_free(x.rank_of);
    pt_mem_free(x.g_of);
    pt_mem_free(x.queued);
    pt_mem_free(x.work);
    pt_mem_free(x.pos);
    pt_mem_free(x.t);
    pt_mem_free(x.fin);
    return st;
}

pt_status pt_schedule_simulate(const char *name, int m, int p, int v, double tf, double tb,
                               double tw, double *makespan, double *busy) {
    PT_CHECK(pt_schedule_check(name, m, p, v, 0));
    if (!(tf >= 0 && tb >= 0 && tw >= 0) || !isfinite(tf + tb + tw))
        return pt_error_set(PT_ERR_INVALID, "schedule times must be finite and >= 0 (got %g %g %g)",
                            tf, tb, tw);
    pt_schedule *s = pt_mem_alloc(PT_MEM_SCRATCH, sizeof *s * (size_t)p);
    if (!s) return PT_ERR_NOMEM;
    pt_status st = pt_schedule_build_all(s, name, m, p, v);
    if (st == PT_OK) st = pt_pipe_simulate(s, tf, tb, tw, NULL, makespan, busy);
    for (int r = 0; r < p; r++) pt_schedule_free(&s[r]); /* zeroed if build_all failed */
    pt_mem_free(s);
    return st;
}

double pt_schedule_bubble(const char *name, int m, int p, int v, double tf, double tb, double tw) {
    if (pt_schedule_check(name, m, p, v, 0)) return -1;
    if (is(name, "none") || is(name, "gpipe") || is(name, "1f1b"))
        return (double)(p - 1) / (m + p - 1);
    if (is(name, "interleaved")) return (double)(p - 1) / ((double)v * m + p - 1);
    /* zb1's W's fill the whole cool-down once there are p micro-batches and
     * a W fits in the gaps (tw <= tf, tb); otherwise the simulator */
    if (is(name, "zb1") && m >= p && tw <= tf && tw <= tb) {
        double idle = (p - 1) * (tf + tb - tw);
        return idle > 0 ? idle / (m * (tf + tb + tw) + idle) : 0;
    }
    double end, busy[64], *b = busy;
    if (p > 64 && !(b = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(double) * (size_t)p))) return -1;
    double sum = 0;
    pt_status st = pt_schedule_simulate(name, m, p, v, tf, tb, tw, &end, b);
    for (int r = 0; !st && r < p; r++) sum += b[r];
    if (b != busy) pt_mem_free(b);
    if (st) return -1;
    return end > 0 ? 1 - sum / ((double)p * end) : 0;
}
