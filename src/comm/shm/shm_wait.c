/* Waking and waiting. A wait spins (an adaptive budget, see
 * shm_wait_until), then sched_yields, then sleeps on a futex word shared by
 * the job (posters wake only when someone sleeps). Every wait checks the
 * job's abort word (set by the launcher when a rank dies or on Ctrl-C, or by
 * a rank's verdict), the awaited peer's state (exited, or its pid gone when
 * there is no launcher), every rank's heartbeat (liveness: a thread per rank
 * process beats, so a busy rank is alive and a SIGSTOPped one is not), and
 * the progress timeout. The first rank to notice a fault publishes the
 * verdict naming the culprit (blame_chain: the rank the waits lead to), and
 * every wait of every rank returns it at once. sync (a barrier of the
 * members' epoch flags) is the wait every collective is built on.
 *
 * Not here: the heartbeat thread (shm_heartbeat.c), what is waited for
 * (the collectives and rings), the launcher's side (shm_launch.c). */
#include "shm_impl.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
    /* Not FUTEX_PRIVATE: the word is shared between processes. */
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

void shm_wake_all(pt_shm_job *job) {
    atomic_fetch_add(&job->futex, 1);
    futex(&job->futex, FUTEX_WAKE, INT_MAX, NULL);
}

const char *shm_op_name(int op) {
    return op == OP_SPLIT ? "split" : pt_comm_op_name((pt_comm_op)op);
}

/* "allreduce: " (op >= 0), or nothing. */
static const char *op_prefix(int op) {
    static _Thread_local char out[48];
    if (op < 0) return "";
    snprintf(out, sizeof out, "%s: ", shm_op_name(op));
    return out;
}

static void describe_status(int ws, char *out, size_t len) {
    if (WIFSIGNALED(ws)) {
        const char *abbr = sigabbrev_np(WTERMSIG(ws));
        snprintf(out, len, "killed by signal %d (SIG%s)", WTERMSIG(ws), abbr ? abbr : "?");
    } else if (WIFEXITED(ws)) {
        snprintf(out, len, "exited with code %d", WEXITSTATUS(ws));
    } else {
        snprintf(out, len, "stopped (status 0x%x)", ws);
    }
}

/* "rank 2" or "rank 1 (world rank 5)". */
void shm_name_member(const shm_ctx *x, int m, char *out, size_t len) {
    int w = x->reg->world_rank[m];
    if (x->is_world || w == m)
        snprintf(out, len, "rank %d", m);
    else
        snprintf(out, len, "rank %d (world rank %d)", m, w);
}

/* Error for a job the launcher stopped, or PT_OK. */
pt_status shm_check_abort(shm_ctx *x, int op) {
    int a = atomic_load_explicit(&x->job->aborted, memory_order_acquire);
    if (a == ABORT_NONE) return PT_OK;
    if (a == ABORT_INTERRUPTED)
        return pt_error_set(PT_ERR_INTERRUPTED, "%sjob interrupted", op_prefix(op));
    if (a == ABORT_FAULT)
        return pt_error_set(x->job->verdict_st, "%s%s (noticed by rank %d); job stopped",
                            op_prefix(op), x->job->verdict, x->job->noticed_by);
    int d = atomic_load(&x->job->dead_rank);
    char why[96];
    describe_status(atomic_load(&x->job->ranks[d].wstatus), why, sizeof why);
    return pt_error_set(PT_ERR_COMM, "%sworld rank %d %s; job stopped", op_prefix(op), d, why);
}

/* Error when member m is gone (exited, or its pid vanished), else PT_OK. */
pt_status shm_check_peer(shm_ctx *x, int m, int op) {
    int w = x->reg->world_rank[m];
    shm_rank_info *ri = &x->job->ranks[w];
    int state = atomic_load_explicit(&ri->state, memory_order_acquire);
    char who[64], why[96];
    shm_name_member(x, m, who, sizeof who);
    if (state == RANK_EXITED || state == RANK_FAILED) {
        describe_status(atomic_load(&ri->wstatus), why, sizeof why);
        return pt_error_set(PT_ERR_COMM, "%s: %s %s before taking part", shm_op_name(op), who, why);
    }
    int pid = atomic_load(&ri->pid);
    if (state == RANK_RUNNING && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH)
        return pt_error_set(PT_ERR_COMM, "%s: %s (pid %d) is gone", shm_op_name(op), who, pid);
    return PT_OK;
}

/* Make `reason` (about world rank culprit) the job's verdict unless another
 * rank was first, and return the job's verdict as this rank's error: every
 * rank then fails with the same line, and the launcher's summary names the
 * culprit (not the rank that happened to exit first). */
pt_status shm_verdict(shm_ctx *x, int culprit, pt_status st, int op, const char *reason,
                      int named) {
    pt_shm_job *job = x->job;
    int expected = 0;
    if (atomic_compare_exchange_strong(&job->verdict_lock, &expected, 1)) {
        job->culprit = culprit;
        job->noticed_by = x->wrank;
        job->verdict_st = st;
        job->verdict_named = named;
        snprintf(job->verdict, sizeof job->verdict, "%s", reason);
        expected = ABORT_NONE;
        atomic_compare_exchange_strong(&job->aborted, &expected, ABORT_FAULT);
        shm_wake_all(job);
    } else {
        /* Another rank holds the lock and is about to set the abort word:
         * wait for it, or this rank's own error would not read as the job's
         * fault, and the job would show two lines (seen in CI: rank 1
         * SIGKILLed, rank 2's "rank 1 (pid ...) is gone" beside the
         * launcher's line; the winner had been descheduled between the
         * two stores). Bounded, should the winner die right there: the
         * launcher then sets the word. */
        uint64_t until = pt_time_ns() + 1000000000ull;
        while (atomic_load(&job->aborted) == ABORT_NONE && pt_time_ns() < until) sched_yield();
    }
    pt_status e = shm_check_abort(x, op);
    /* Another abort (a death the launcher saw, Ctrl-C) came first: that one. */
    return e != PT_OK ? e : pt_error_set(st, "%s%s", op_prefix(op), reason);
}

static pt_status publish_verdict(shm_ctx *x, int culprit, pt_status st, int op,
                                 const char *reason) {
    return shm_verdict(x, culprit, st, op, reason, 0);
}

/* The rank (not this one) whose heartbeat has been silent longest, if
 * longer than min_s (SIGSTOP, a frozen host process): -1 if none. *age_s
 * gets its silence. */
static int silent_rank(shm_ctx *x, uint64_t now, double min_s, double *age_s) {
    uint64_t min_ns = (uint64_t)(min_s * 1e9), worst = 0;
    int found = -1;
    for (int r = 0; r < x->job->nranks; r++) {
        if (r == x->wrank) continue;
        shm_rank_info *ri = &x->job->ranks[r];
        if (atomic_load_explicit(&ri->state, memory_order_acquire) != RANK_RUNNING) continue;
        uint64_t b = atomic_load_explicit(&ri->beat, memory_order_acquire);
        if (b == 0 || b == BEAT_OFF || now <= b + min_ns || now - b <= worst) continue;
        worst = now - b;
        found = r;
    }
    if (found >= 0) *age_s = (double)worst * 1e-9;
    return found;
}

/* The verdict's words for world rank w, silent for age_s. */
static const char *silent_reason(shm_ctx *x, int w, double age_s) {
    static _Thread_local char out[200];
    snprintf(out, sizeof out,
             "rank %d stopped responding: no heartbeat for %.1f s (stopped, frozen or "
             "overloaded; comm.timeout %.3g s)",
             w, age_s, x->live_s);
    return out;
}

/* Whom to blame when world rank w did not take part in time: follow what
 * each rank waits for (w may itself wait for another) to a rank that waits
 * for nobody, the one holding everyone up. */
static int blame_chain(shm_ctx *x, int w) {
    for (int hops = 0; hops < x->job->nranks; hops++) {
        int next = atomic_load_explicit(&x->job->ranks[w].waiting_on, memory_order_acquire);
        if (next < 0 || next == x->wrank || next == w) break;
        w = next;
    }
    return w;
}

/* shm_check_peer's finding about world rank w, as a verdict names it (world
 * ranks, so that the launcher's line names the process). */
static const char *gone_reason(shm_ctx *x, int w) {
    static _Thread_local char out[160];
    shm_rank_info *ri = &x->job->ranks[w];
    int state = atomic_load_explicit(&ri->state, memory_order_acquire);
    if (state == RANK_EXITED || state == RANK_FAILED) {
        char why[96];
        describe_status(atomic_load(&ri->wstatus), why, sizeof why);
        snprintf(out, sizeof out, "rank %d %s before taking part", w, why);
    } else {
        snprintf(out, sizeof out, "rank %d (pid %d) is gone", w, atomic_load(&ri->pid));
    }
    return out;
}

/* Wait until pending() returns -1; it otherwise returns the member being
 * waited for, whom errors name. */
pt_status shm_wait_until(shm_ctx *x, shm_pending_fn pending, const void *arg, int op) {
    int who = pending(x, arg);
    if (who < 0) return PT_OK;
    uint64_t t0 = pt_time_ns(), now = t0;
    uint64_t timeout_ns = (uint64_t)(x->timeout_s * 1e9);
    uint64_t next_peer_check = t0 + 50000000ull;
    _Atomic int *my_wait = &x->job->ranks[x->wrank].waiting_on;
    int waiting_on = -1; /* what this wait published in my_wait */
    /* Adaptive spin: a wait that ends within the spin budget grows it (up to
     * spin_ns), one that has to yield halves it. On a loaded machine the
     * peer often needs the very core we would spin on (measured, 2 ranks on
     * 2 busy cores: 8-byte all-reduce median 1 ms with a fixed 1 ms spin,
     * 1.6 us with none; on free cores 0.35 us with 50 us of spin). */
    uint64_t spin = atomic_load_explicit(&x->spin_cur, memory_order_relaxed);
    for (unsigned i = 1;; i++) {
        who = pending(x, arg);
        if (who < 0) {
            if (waiting_on >= 0) atomic_compare_exchange_strong(my_wait, &waiting_on, -1);
            uint64_t grown = spin + spin / 4 + 500, halved = spin / 2 > 500 ? spin / 2 : 500;
            if (now - t0 < spin)
                atomic_store_explicit(&x->spin_cur, grown < x->spin_ns ? grown : x->spin_ns,
                                      memory_order_relaxed);
            else
                atomic_store_explicit(&x->spin_cur, halved, memory_order_relaxed);
            return PT_OK;
        }
        if ((i & 63) == 0 || now - t0 >= spin) {
            pt_status a = shm_check_abort(x, op);
            if (a != PT_OK) {
                if (waiting_on >= 0) atomic_compare_exchange_strong(my_wait, &waiting_on, -1);
                return a;
            }
            now = pt_time_ns();
        }
        if (now - t0 < spin) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
            continue;
        }
        int ww = x->reg->world_rank[who];
        if (ww != waiting_on) { /* for blame_chain in the other ranks */
            atomic_store_explicit(my_wait, ww, memory_order_release);
            waiting_on = ww;
        }
        pt_status fault = PT_OK;
        if (now >= next_peer_check) {
            next_peer_check = now + 50000000ull;
            if (shm_check_peer(x, who, op) != PT_OK) {
                /* It may have finished its part and then exited. */
                if (pending(x, arg) < 0) continue;
                fault = shm_check_peer(x, who, op);
                fault = publish_verdict(x, ww, fault, op, gone_reason(x, ww));
            }
            double age = 0;
            int st = fault == PT_OK ? silent_rank(x, now, x->live_s, &age) : -1;
            if (st >= 0)
                fault = publish_verdict(x, st, PT_ERR_TIMEOUT, op, silent_reason(x, st, age));
        }
        if (fault == PT_OK && now - t0 > timeout_ns) {
            /* A rank silent for over half the liveness timeout (ten beat
             * periods) is frozen, not merely elsewhere, and explains the
             * stall wherever the chain of waits ends: a chain can end at a
             * live rank that waits for the frozen one outside a published
             * wait, or for this one (seen: rank 1 SIGSTOPped, the verdict
             * named rank 0). Otherwise, the end of the chain. */
            double age = 0;
            int c = silent_rank(x, now, x->live_s / 2, &age);
            if (c >= 0) {
                fault = publish_verdict(x, c, PT_ERR_TIMEOUT, op, silent_reason(x, c, age));
            } else {
                c = blame_chain(x, ww);
                char reason[160];
                snprintf(reason, sizeof reason, "rank %d did not take part within %.3g s", c,
                         x->timeout_s);
                fault = publish_verdict(x, c, PT_ERR_TIMEOUT, op, reason);
            }
        }
        if (fault != PT_OK) {
            if (waiting_on >= 0) atomic_compare_exchange_strong(my_wait, &waiting_on, -1);
            return fault;
        }
        if (now - t0 < spin + 1000000ull) {
            sched_yield();
            continue;
        }
        /* Sleep until someone posts (or 10 ms, to re-check peers). */
        atomic_fetch_add(&x->job->sleepers, 1);
        uint32_t gen = atomic_load(&x->job->futex);
        atomic_thread_fence(memory_order_seq_cst);
        if (pending(x, arg) >= 0 && atomic_load(&x->job->aborted) == ABORT_NONE) {
            struct timespec ts = {0, 10000000};
            futex(&x->job->futex, FUTEX_WAIT, gen, &ts);
        }
        atomic_fetch_sub(&x->job->sleepers, 1);
    }
}

/* ---- sync: a barrier of the members' epoch flags ---- */

static int pending_flags(shm_ctx *x, const void *arg) {
    (void)arg;
    for (; x->scan < x->n; x->scan++)
        if (atomic_load_explicit(&x->ctl[x->scan].flag, memory_order_acquire) < x->want)
            return x->scan;
    return -1;
}

pt_status shm_sync_all(shm_ctx *x, int op) {
    uint64_t e = ++x->epoch;
    atomic_store_explicit(&x->ctl[x->rank].flag, e, memory_order_release);
    shm_wake(x);
    x->want = e;
    x->scan = 0;
    return shm_wait_until(x, pending_flags, NULL, op);
}
