/* The schedule simulator (pipeline.h, pt_sched_simulate): every rank's
 * pass list run against the dependencies, each pass starting when its
 * rank is free and the passes it waits on have ended and their transfers
 * landed. The one simulator of the project: it proves the generators'
 * lists (no deadlock, every pass once: test_schedule.c), gives the
 * schedules' bubbles and makespans (pt_schedule_simulate, bench schedule),
 * weighs the stage cuts (stages.c), and is the pipeline half of the
 * planner's time model (plan/time.c hands it each pass's time on its
 * cluster, the transfers between ranks and the tied embedding's). A
 * step's end adds each rank's update after the passes (pt_sched_step_end:
 * the cut and the planner weigh a stage's whole step by the same rule).
 *
 * Two ways to run the same passes, sharing the dependencies (next_ready)
 * and the bookkeeping (pass_done):
 *   free    a pass's time is fixed: each rank runs its list until a pass
 *           waits on another rank's that has not run, and that rank queues
 *           it again when it runs the pass. Every pass ends at max(its
 *           rank's clock, its dependencies' ends) + its time, whatever
 *           order the ranks run in: O(passes).
 *   shared  the ranks share devices (pt_sched_times.f_alone): a pass's
 *           speed depends on how many ranks compute at once, so time moves
 *           from event to event (the next pass to end, the next input to
 *           land) and every running pass advances by its share: O(passes
 *           x p).
 *
 * Not here: the lists themselves (the generators, schedule.c's table),
 * the pass times (the planner's model, or the caller's constants). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pipeline_impl.h"

typedef struct {
    const pt_schedule *s;
    const pt_sched_times *t;
    int m, p, v, G;
    int *g_of;    /* virtual stage of chunk c of rank r: [r * v + c] */
    int *rank_of; /* the rank holding virtual stage g */
    double *fin;  /* end of the F (slot 0) and the BW or B (slot 1) of (mb, g); -1 until run */
    double *clock;
    int *pos; /* per rank: its next pass */
    int *work, nwork, shared;
    unsigned char *queued;
    /* the tied wte: the embedding's first forward ran; weight passes done
     * of the first and the last virtual stage; the head's last one's end
     * (-1: not yet) */
    int sent, wemb, whead;
    double head_final;
    pt_sched_result *out;
} sim;

/* pass lengths: with every rank computing, with the devices just full,
 * with the rank alone */
enum { LEN_ALL, LEN_FULL, LEN_ALONE };

static double *fin_at(const sim *x, int slot, int mb, int g) {
    return &x->fin[((size_t)slot * x->m + mb) * x->G + g];
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

/* One line naming every stuck rank's pass (the first 8); PT_OK if none. */
static pt_status deadlock(const sim *x) {
    const pt_schedule *s = x->s;
    char why[512] = "";
    int stuck = 0;
    for (int r = 0; r < x->p; r++) {
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
                        s[0].name, x->m, x->p, x->v, why, stuck > 8 ? ", ..." : "");
}

static void queue(sim *x, int r) {
    if (!x->shared && !x->queued[r]) x->queued[r] = 1, x->work[x->nwork++] = r;
}

/* Whether rank r's next pass is the embedding's last weight pass, which
 * waits for the head's tied wte gradient. */
static int tied_last(const sim *x, int r) {
    const pt_pass *q = &x->s[r].pass[x->pos[r]];
    int wpass = q->kind == PT_PASS_BACKWARD || q->kind == PT_PASS_BACKWARD_WEIGHT;
    return wpass && x->g_of[r * x->v + q->chunk] == 0 && x->wemb == x->m - 1 && x->t->tied_add > 0;
}

/* Virtual stage g's times of one kind into len (+= with add). */
static void lens(const double *all, const double *full, const double *alone, int g, int add,
                 double len[3]) {
    double l[3] = {all[g], full ? full[g] : all[g], alone ? alone[g] : all[g]};
    for (int k = 0; k < 3; k++) len[k] = add ? len[k] + l[k] : l[k];
}

/* Rank r's next pass: 0 while a pass it waits on has not run; else 1,
 * with the time its inputs are all there (*ready) and its length with
 * every rank computing, with the devices just full and alone (len). The
 * embedding's last weight pass, in the free run, ends once the head's wte
 * gradient is in, then adds it: at max(start + len, arrival) + add, which
 * a start no earlier than arrival - len gives (the shared run cannot look
 * ahead to the arrival: it waits for it at the pass's end instead). */
static int next_ready(const sim *x, int r, double *ready, double len[3]) {
    const pt_sched_times *t = x->t;
    const pt_pass *q = &x->s[r].pass[x->pos[r]];
    int g = x->g_of[r * x->v + q->chunk], mb = q->micro;
    *ready = 0;
    if (q->kind == PT_PASS_FORWARD) {
        if (g > 0) {
            double d = *fin_at(x, 0, mb, g - 1);
            if (d < 0) return 0;
            *ready = d + (t->hop ? t->hop[g - 1] : 0);
        }
        lens(t->f, t->f_full, t->f_alone, g, 0, len);
        /* the step's first forward waits for the tied wte's send */
        double send = g == 0 && !x->sent ? t->tied_send : 0;
        for (int k = 0; k < 3; k++) len[k] += send;
    } else if (q->kind == PT_PASS_BACKWARD_WEIGHT) {
        double d = *fin_at(x, 1, mb, g);
        if (d < 0) return 0;
        *ready = d;
        lens(t->w, t->w_full, t->w_alone, g, 0, len);
    } else {
        double d = *fin_at(x, 0, mb, g);
        if (d < 0) return 0;
        *ready = d;
        if (g + 1 < x->G) {
            double e = *fin_at(x, 1, mb, g + 1);
            if (e < 0) return 0;
            e += t->hop ? t->hop[g] : 0;
            if (e > *ready) *ready = e;
        }
        lens(t->b, t->b_full, t->b_alone, g, 0, len);
        if (q->kind == PT_PASS_BACKWARD) lens(t->w, t->w_full, t->w_alone, g, 1, len);
    }
    if (!x->shared && tied_last(x, r)) {
        if (x->head_final < 0) return 0;
        double a = x->head_final + t->tied_send - len[LEN_ALL];
        if (a > *ready) *ready = a;
        for (int k = 0; k < 3; k++) len[k] += t->tied_add;
    }
    return 1;
}

/* Rank r's next pass ran from start to end: its end for the passes that
 * wait on it (whose rank is queued), the tied wte's counts, the rank's
 * busy time and the slot. */
static void pass_done(sim *x, int r, double start, double end) {
    const pt_pass *q = &x->s[r].pass[x->pos[r]];
    int g = x->g_of[r * x->v + q->chunk], waiter = -1;
    if (q->kind == PT_PASS_FORWARD) {
        *fin_at(x, 0, q->micro, g) = end;
        if (g == 0) x->sent = 1;
        if (g + 1 < x->G) waiter = x->rank_of[g + 1];
    } else if (q->kind != PT_PASS_BACKWARD_WEIGHT) {
        *fin_at(x, 1, q->micro, g) = end;
        if (g > 0) waiter = x->rank_of[g - 1];
    }
    if (q->kind == PT_PASS_BACKWARD || q->kind == PT_PASS_BACKWARD_WEIGHT) {
        if (g == 0) x->wemb++;
        if (g == x->G - 1 && ++x->whead == x->m) {
            x->head_final = end;
            if (x->t->tied_add > 0) queue(x, x->rank_of[0]);
        }
    }
    pt_sched_result *o = x->out;
    if (o->slots)
        o->slots[o->nslots++] = (pt_sched_slot){r, q->kind, q->micro, q->chunk, start, end};
    if (o->busy) o->busy[r] += end - start;
    x->clock[r] = end;
    x->pos[r]++;
    if (waiter >= 0 && waiter != r) queue(x, waiter);
}

static void run_free(sim *x) {
    for (int r = x->p - 1; r >= 0; r--) queue(x, r);
    while (x->nwork > 0) {
        int r = x->work[--x->nwork];
        x->queued[r] = 0;
        double ready, len[3];
        while (x->pos[r] < x->s[r].npass && next_ready(x, r, &ready, len)) {
            double start = ready > x->clock[r] ? ready : x->clock[r];
            pass_done(x, r, start, start + len[LEN_ALL]);
        }
    }
}

/* At load y (ranks a device), a pass runs at len[*from] + (len[*to] -
 * len[*from]) x the return value (len: next_ready's three lengths); ya:
 * one rank's load, `all` every rank's. */
static double shared_at(double y, double ya, double all, int *from, int *to) {
    if (y >= 1 || ya >= 1) {
        double lo = fmax(1, ya);
        *from = ya >= 1 ? LEN_ALONE : LEN_FULL, *to = LEN_ALL;
        return all > lo ? (fmax(lo, y) - lo) / (all - lo) : 1;
    }
    *from = LEN_ALONE, *to = LEN_FULL;
    return (y - ya) / (1 - ya);
}

/* The shared run's per-rank state. The embedding's last weight pass
 * (tied_last): its compute, then a wait for the head's gradient (the rank
 * idle), then the add. */
enum { TIED_NO, TIED_COMPUTE, TIED_WAIT, TIED_ADD };
typedef struct {
    double left, start, wait_from, len[3], now_len;
    int running, tied;
} shared_rank;

/* Rank r's next passes that can start at `now`: started (running), or
 * ended at once when they take no time; the earliest later input into
 * *wake. Returns the passes ended. */
static int shared_start(sim *x, shared_rank *k, int r, double now, double *wake) {
    int ended = 0;
    if (k->tied == TIED_WAIT && x->head_final >= 0) {
        double in = x->head_final + x->t->tied_send;
        if (in > now) {
            *wake = fmin(*wake, in);
        } else {
            k->tied = TIED_ADD, k->running = 1, k->left = 1;
            k->start += now - k->wait_from; /* its slot: compute and add */
            k->len[0] = k->len[1] = k->len[2] = x->t->tied_add;
        }
    }
    double ready;
    while (!k->running && k->tied != TIED_WAIT && x->pos[r] < x->s[r].npass &&
           next_ready(x, r, &ready, k->len)) {
        if (ready > now) {
            *wake = fmin(*wake, ready);
            break;
        }
        if (tied_last(x, r)) k->tied = TIED_COMPUTE;
        if (k->len[0] > 0 || k->len[1] > 0 || k->len[2] > 0 || k->tied) {
            k->running = 1, k->left = 1, k->start = now;
        } else { /* an empty pass ends as it starts */
            pass_done(x, r, now, now);
            ended++;
        }
    }
    return ended;
}

/* Events: every running pass advances by its share until the next ends
 * or an input lands. On 2 cores, gpt2's dp 1 x tp 2 x pp 2 (zb1, m 2,
 * full recompute): a block's backward took 12 ms while the other stage
 * waited, 24 while it computed; every pass at the latter, the planner said
 * 1026 ms a step, measured 817. */
static pt_status run_shared(sim *x, shared_rank *k, int total) {
    int p = x->p;
    double now = 0, ya = x->t->load / p;
    for (int todo = total; todo > 0;) {
        double wake = INFINITY;
        int n = 0;
        for (int r = 0; r < p; r++) {
            todo -= shared_start(x, &k[r], r, now, &wake);
            n += k[r].running;
        }
        if (todo == 0) break;
        if (n == 0 && wake == INFINITY) return deadlock(x);
        double dt = wake - now;
        int from, to;
        double at = shared_at(n * ya, ya, x->t->load, &from, &to);
        for (int r = 0; r < p; r++) {
            if (!k[r].running) continue;
            k[r].now_len = k[r].len[from] + (k[r].len[to] - k[r].len[from]) * at;
            if (k[r].left * k[r].now_len < dt) dt = k[r].left * k[r].now_len;
        }
        now += dt;
        for (int r = 0; r < p; r++) {
            shared_rank *q = &k[r];
            if (!q->running) continue;
            q->left -= q->now_len > 0 ? dt / q->now_len : 1;
            if (q->left > 1e-12) continue;
            q->running = 0;
            if (q->tied == TIED_COMPUTE) {
                q->tied = TIED_WAIT, q->wait_from = now;
                continue;
            }
            pass_done(x, r, q->start, now);
            q->tied = TIED_NO;
            todo--;
        }
    }
    return PT_OK;
}

double pt_sched_step_end(double makespan, const double *update, int p) {
    double most = 0;
    for (int r = 0; update && r < p; r++) most = fmax(most, update[r]);
    return makespan + most;
}

pt_status pt_sched_simulate(const pt_schedule *s, const pt_sched_times *t, pt_sched_result *out) {
    int m = s[0].microbatches, p = s[0].stages, v = s[0].virtual_stages, G = p * v, total = 0;
    sim x = {.s = s, .t = t, .m = m, .p = p, .v = v, .G = G, .head_final = -1, .out = out};
    x.shared = t->f_alone != NULL;
    out->makespan = 0, out->nslots = 0;
    pt_status st = PT_OK;
    x.fin = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(double) * (2 * (size_t)m * G + (size_t)p));
    x.pos = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(int) * (2 * (size_t)p + 2 * (size_t)G));
    x.queued = pt_mem_alloc(PT_MEM_SCRATCH, (size_t)p);
    int *cnt = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(int) * 3 * (size_t)m * v);
    shared_rank *k = x.shared ? pt_mem_alloc(PT_MEM_SCRATCH, sizeof *k * (size_t)p) : NULL;
    if (!x.fin || !x.pos || !x.queued || !cnt || (x.shared && !k)) {
        st = PT_ERR_NOMEM; /* the last error set by pt_mem_alloc */
        goto done;
    }
    x.clock = x.fin + 2 * (size_t)m * G;
    x.work = x.pos + p, x.g_of = x.pos + 2 * p, x.rank_of = x.g_of + G;
    for (int r = 0; r < p; r++) PT_CHECK_GOTO(st, check_list(&s[r], cnt), done);
    for (size_t i = 0; i < 2 * (size_t)m * G; i++) x.fin[i] = -1;
    for (int r = 0; r < p; r++) {
        x.clock[r] = 0, x.pos[r] = 0, x.queued[r] = 0, total += s[r].npass;
        if (out->busy) out->busy[r] = 0;
        for (int c = 0; c < v; c++)
            x.rank_of[x.g_of[r * v + c] = pt_schedule_virtual_stage(&s[r], c)] = r;
    }
    if (x.shared) {
        memset(k, 0, sizeof *k * (size_t)p);
        PT_CHECK_GOTO(st, run_shared(&x, k, total), done);
    } else {
        run_free(&x);
        PT_CHECK_GOTO(st, deadlock(&x), done);
    }
    for (int r = 0; r < p; r++) out->makespan = fmax(out->makespan, x.clock[r]);
    out->step = pt_sched_step_end(out->makespan, t->update, p);
done:
    pt_mem_free(k);
    pt_mem_free(cnt);
    pt_mem_free(x.queued);
    pt_mem_free(x.pos);
    pt_mem_free(x.fin);
    return st;
}
