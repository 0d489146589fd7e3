/* The mpi backend's deadlines: every wait is an MPI_Test loop with the
 * communicator's deadline (MPI itself waits forever for a dead peer); at
 * the deadline the wait blames the rank that holds the others up, from
 * what the heartbeats say (mpi_heartbeat.c), and sets the job's verdict.
 * Opt-in, blocking collectives are watched from the heartbeat thread
 * instead (the watchdog, below).
 *
 * Waiting: the loop spins on MPI_Test for a short while (latency of small
 * messages), then yields the core after every test (ranks may outnumber
 * cores; Open MPI's ob1/vader progress only moves inside MPI calls, so
 * sleeping would throttle large transfers), and after a second of waiting
 * sleeps 100 us between tests: such a wait is a straggler or a fault.
 *
 * Not here: the beats and the verdict's messages (mpi_heartbeat.c), the
 * operations that wait (mpi_ops.c, mpi_ring.c). */
#include "mpi_impl.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const pt_flight_table *get_table(void *arg, int w) {
    (void)arg;
    return pt_mpi_hb_table(w);
}

/* Whom to blame when a wait on c timed out: for point-to-point, follow
 * what each rank waits for from the peer on; for a collective, the first
 * member that waits for nothing (it has not arrived), else the end of the
 * chain from the first member that waits for a particular rank; when every
 * member waits in a collective (a deadlock across groups: a rank skipped
 * one, or issued two in the other order), the flight recorder's laggard:
 * the first rank that never entered the collective the most ranks wait in.
 * -1: none found. */
static int blame(mpi_ctx *c, int peer) {
    if (!pt_mpi_hb.on) return peer >= 0 ? c->world[peer] : -1;
    int me = c->world[c->rank], w = -1;
    uint64_t now = pt_time_ns();
    for (int m = 0; m < c->size && w < 0; m++) /* a member gone silent explains it all */
        if (m != c->rank && pt_mpi_hb_silence(c->world[m], now) > pt_mpi_hb.live_s / 2)
            w = c->world[m];
    if (w >= 0) return w;
    if (peer >= 0) {
        w = c->world[peer];
    } else {
        for (int m = 0; m < c->size && w < 0; m++)
            if (m != c->rank && atomic_load(&pt_mpi_hb.peer_wait[c->world[m]]) == HB_IDLE)
                w = c->world[m];
        for (int m = 0; m < c->size && w < 0; m++)
            if (m != c->rank && atomic_load(&pt_mpi_hb.peer_wait[c->world[m]]) >= 0)
                w = c->world[m];
        if (w < 0) return pt_flight_culprit(get_table, NULL, pt_mpi_hb.size);
    }
    for (int hops = 0; hops < pt_mpi_hb.size; hops++) {
        int next = atomic_load(&pt_mpi_hb.peer_wait[w]);
        if (next < 0 || next == me || next == w) break;
        w = next;
    }
    return w;
}

/* At a wait's deadline, with `who` from blame(): how much longer this
 * member waits before it decides (0: decide now). Two extensions at most,
 * each once per wait (bits of *deferred):
 *  - who < 0: every member waits in the collective and none has been silent
 *    for half the timeout. One that joined late and stopped inside it (its
 *    last beat said "in a collective") has not been silent for long yet;
 *    wait until it would show, rather than print a line of one's own
 *    beside the verdict (seen under load in CI: rank 2's own timeout line
 *    next to rank 0's verdict). Operations out of order end the same way,
 *    later.
 *  - who >= 0: the lowest healthy rank of the world notices; the others
 *    give its verdict a moment to arrive, so that the job shows one line.
 *    Of the world, not of c: with groups, ranks wait on different
 *    communicators for the same culprit (a dp partner in the group, the
 *    rest in a world barrier), and two noticers printed two lines. */
static uint64_t deadline_grace(const mpi_ctx *c, int who, uint64_t now, int *deferred) {
    if (!pt_mpi_hb.on) return 0;
    uint64_t slack = 1000000000ull + 4 * pt_mpi_hb.period_ns;
    if (who < 0) {
        if (*deferred & 1) return 0;
        *deferred |= 1;
        return (uint64_t)(pt_mpi_hb.live_s / 2 * 1e9) + slack;
    }
    if (*deferred & 2) return 0;
    *deferred |= 2;
    int first = -1, me = c->world[c->rank];
    for (int q = 0; q < pt_mpi_hb.size && first < 0; q++)
        if (q != who && (q == me || pt_mpi_hb_silence(q, now) < pt_mpi_hb.live_s / 2)) first = q;
    return first != me ? slack : 0;
}

/* Wait for *req with the context's deadline. peer < 0 for collectives. */
pt_status pt_mpi_wait_req(mpi_ctx *c, MPI_Request *req, const char *op, int peer, size_t bytes,
                          MPI_Status *st_out) {
    uint64_t t0 = pt_time_ns();
    uint64_t limit = (uint64_t)(c->timeout_s * 1e9);
    uint64_t next_check = 0;
    MPI_Status st;
    int published = 0; /* this wait set pt_mpi_hb.my_wait */
    int deferred = 0;  /* deadline_grace's extensions so far */
    for (unsigned spin = 0;; spin++) {
        int flag = 0;
        pt_mpi_lock();
        int rc = MPI_Test(req, &flag, &st);
        pt_mpi_unlock();
        if (rc != MPI_SUCCESS) return pt_mpi_fail(c, rc, op, peer);
        if (flag) {
            if (published) atomic_store(&pt_mpi_hb.my_wait, HB_IDLE);
            if (st_out) *st_out = st;
            return PT_OK;
        }
        if (spin < 256) continue;
        uint64_t now = pt_time_ns(), waited = now - t0;
        if (pt_mpi_hb.on && now >= next_check) { /* every 20 ms: the job's verdict, stalled peers */
            next_check = now + 20000000ull;
            if (!published) {
                atomic_store(&pt_mpi_hb.my_wait, peer >= 0 ? c->world[peer] : HB_COLL);
                published = 1;
            }
            pt_mpi_hb_check_stale();
            if (pt_mpi_hb_has_verdict()) {
                atomic_store(&pt_mpi_hb.my_wait, HB_IDLE);
                return pt_mpi_verdict_error(c, op);
            }
        }
        if (waited > limit && pt_mpi_hb.on &&
            ((double)(now - atomic_load(&pt_mpi_hb.last_round)) * 1e-9 > pt_mpi_hb.live_s / 4 ||
             atomic_load(&pt_mpi_hb.thawed_at) > t0)) {
            /* This process was itself stopped (the deadline passed while it
             * was frozen) or starved: not the peers' fault. The deadline
             * counts again from the thaw, and meanwhile its heartbeat thread
             * catches up (and brings in the verdict about it, if any). */
            uint64_t thaw = atomic_load(&pt_mpi_hb.thawed_at);
            limit = (thaw > t0 ? thaw - t0 : waited) + (uint64_t)(c->timeout_s * 1e9);
            if (limit > waited) continue;
        }
        if (waited > limit) {
            int who = blame(c, peer);
            uint64_t more = deadline_grace(c, who, now, &deferred);
            if (more) {
                limit += more;
                continue;
            }
            c->failed = 1;
            pt_mpi_g.failed = 1;
            if (published) atomic_store(&pt_mpi_hb.my_wait, HB_IDLE);
            if (pt_mpi_hb.on && who >= 0) {
                char reason[HB_REASON];
                pt_mpi_stall_reason(reason, who, pt_time_ns(), c->timeout_s);
                pt_mpi_hb_set_verdict(who, pt_mpi_hb.rank, PT_ERR_TIMEOUT, reason, 0);
                return pt_mpi_verdict_error(c, op);
            }
            if (peer >= 0)
                return pt_error_set(PT_ERR_TIMEOUT,
                                    "mpi %s of %zu bytes with peer rank %d timed out after %.1f s "
                                    "on rank %d of %d (peer dead or unreachable)",
                                    op, bytes, peer, c->timeout_s, c->rank, c->size);
            return pt_error_set(PT_ERR_TIMEOUT,
                                "mpi %s of %zu bytes timed out after %.1f s on rank %d of %d "
                                "(a rank died, is unreachable or never joined)",
                                op, bytes, c->timeout_s, c->rank, c->size);
        }
        if (waited < 1000000000ull)
            sched_yield();
        else
            pt_mpi_sleep_us(100);
    }
}

/* ---- watchdog: blocking collectives ----------------------------------------------------
 * Open MPI's blocking collectives (coll/tuned) are 2-3x faster than its
 * non-blocking ones (coll/libnbc) polled with MPI_Test at 1-16 MiB on a
 * quiet machine (docs/mpi.md), but they never return when a peer dies or
 * stalls. So where it is asked for (PT_MPI_BLOCKING, below), the heartbeat
 * runs and MPI allows calls from several threads at once
 * (MPI_THREAD_MULTIPLE), a collective is the blocking call, and the
 * heartbeat thread watches it: every period it applies to each collective
 * in flight the rules of pt_mpi_wait_req (the job's verdict; a stalled peer; the
 * progress deadline with the thaw and the lowest-healthy-rank-notices
 * rules). A call that can no longer complete ends the process: the noticer
 * prints the job's one line (pt_mpi_hb_set_verdict), sends every peer the verdict,
 * and the process exits with status 3 (what a caller does with a comm
 * error), so that mpirun ends the job. Elsewhere (the default, serialized
 * MPI, a world of one) collectives keep the MPI_Test loop. */
#define WATCH_SLOTS 64

typedef struct {
    _Atomic int claimed;  /* taken by a thread (filling, in flight or ending) */
    _Atomic uint64_t gen; /* odd: a collective is in flight, the fields are set */
    mpi_ctx *c;
    const char *op;
    size_t bytes;
    uint64_t t0, limit; /* limit: ns from t0; the watchdog may extend it */
    int deferred;       /* deadline_grace's extensions so far */
} watch_slot;

/* One slot per collective in flight in this process (one per lane at most:
 * communicators run their collectives one at a time). Whether a collective
 * takes the blocking path must not depend on timing: every member of a
 * communicator has to make the same choice (a blocking collective does not
 * match a non-blocking one in MPI). */
static watch_slot watch[WATCH_SLOTS];

/* Which communicators take the blocking path (PT_MPI_BLOCKING): none by
 * default, "world" the world only, "all" every one. Opt-in because Open MPI
 * 4.1.4 hangs now and then when a thread waits in a blocking collective
 * while another thread of the process moves data of another communicator
 * (test_comm_groups: 3 runs in 20 with the 64 MiB all-reduce blocking on
 * the world beside a small one on a split; both ranks stuck in
 * mca_pml_ob1_send -> ompi_sync_wait_mt inside MPI_Allreduce; 0 in 20 with
 * the MPI_Test path; cf. open-mpi/ompi#11428). Safe for jobs whose
 * collectives run on one communicator at a time. The same on every rank,
 * as the choice must be. */
int pt_mpi_watch_enabled(const mpi_ctx *c) {
    static int mode = -1; /* 0 none, 1 world, 2 all */
    if (mode < 0) {
        const char *e = pt_knob_str("PT_MPI_BLOCKING");
        mode = !strcmp(e, "world") ? 1 : !strcmp(e, "all") ? 2 : 0;
    }
    return pt_mpi_hb.on && !pt_mpi_g.serialize && (mode == 2 || (mode == 1 && c->is_world));
}

/* Claim a slot for a blocking collective on c. With more collectives in
 * flight than slots (not possible with fewer than WATCH_SLOTS communicators
 * in use at once), wait for one: the choice of path must be the same on
 * every rank. */
int pt_mpi_watch_begin(mpi_ctx *c, const char *op, size_t bytes) {
    for (;;) {
        for (int i = 0; i < WATCH_SLOTS; i++) {
            int idle = 0;
            if (atomic_load_explicit(&watch[i].claimed, memory_order_relaxed) ||
                !atomic_compare_exchange_strong(&watch[i].claimed, &idle, 1))
                continue;
            watch_slot *w = &watch[i];
            w->c = c;
            w->op = op;
            w->bytes = bytes;
            w->t0 = pt_time_ns();
            w->limit = (uint64_t)(c->timeout_s * 1e9);
            w->deferred = 0;
            /* odd, after the fields: the watchdog reads them only now */
            atomic_fetch_add_explicit(&w->gen, 1, memory_order_release);
            atomic_store(&pt_mpi_hb.my_wait, HB_COLL);
            return i;
        }
        pt_mpi_sleep_us(100);
    }
}

void pt_mpi_watch_end(int i) {
    atomic_store(&pt_mpi_hb.my_wait, HB_IDLE);
    atomic_fetch_add_explicit(&watch[i].gen, 1, memory_order_release);
    atomic_store_explicit(&watch[i].claimed, 0, memory_order_release);
}

/* The process cannot go on (a collective of it will never return): send
 * every peer the verdict (hb_stop's messages would have carried it), give
 * them a moment to leave, and exit. On the heartbeat thread only. */
static _Noreturn void watch_end_job(void) {
    fflush(stdout);
    fflush(stderr);
    comm_flight_dump(pt_mpi_hb_has_verdict() ? pt_mpi_hb.reason
                                             : "a blocking collective timed out");
    pt_mpi_g.failed = 1;
    pt_mpi_hb.final_sent = 1; /* no more rounds: this is the last message */
    pt_mpi_hb_send_verdict();
    pt_mpi_hb_verdict_sent(pt_time_ns() + 200000000ull);
    _exit(3);
}

/* One collective in flight: 1 when the process must end. */
static int watch_slot_check(watch_slot *w, uint64_t now) {
    mpi_ctx *c = w->c;
    uint64_t waited = now - w->t0;
    if (pt_mpi_hb_has_verdict()) return 1;
    if (waited <= w->limit) return 0;
    uint64_t thaw = atomic_load(&pt_mpi_hb.thawed_at);
    if (thaw > w->t0) {
        /* This process was itself stopped or starved: the deadline counts
         * again from the thaw (as in wait_req). */
        uint64_t l = thaw - w->t0 + (uint64_t)(c->timeout_s * 1e9);
        if (l > w->limit) w->limit = l;
        if (waited <= w->limit) return 0;
    }
    int who = blame(c, -1);
    uint64_t more = deadline_grace(c, who, now, &w->deferred);
    if (more) {
        w->limit += more;
        return 0;
    }
    char reason[HB_REASON];
    if (who >= 0) {
        pt_mpi_stall_reason(reason, who, now, c->timeout_s);
        pt_mpi_hb_set_verdict(who, pt_mpi_hb.rank, PT_ERR_TIMEOUT, reason, 0);
    } else {
        fprintf(stderr,
                "partrain: mpi %s of %zu bytes timed out after %.1f s on rank %d of %d (a rank "
                "died, is unreachable or never joined); job stopped\n",
                w->op, w->bytes, c->timeout_s, c->rank, c->size);
    }
    return 1;
}

/* On the heartbeat thread, after each round. */
void pt_mpi_watch_check(void) {
    uint64_t now = pt_time_ns();
    for (int i = 0; i < WATCH_SLOTS; i++) {
        watch_slot *w = &watch[i];
        uint64_t g = atomic_load_explicit(&w->gen, memory_order_acquire);
        if (!(g & 1)) continue;
        int end = watch_slot_check(w, now);
        /* The collective returned meanwhile: nothing to end. */
        if (atomic_load_explicit(&w->gen, memory_order_acquire) != g) continue;
        if (end) watch_end_job();
    }
}
