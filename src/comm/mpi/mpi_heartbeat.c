/* The mpi backend's liveness: a heartbeat thread per process of a world of
 * several, and the job's verdict on a fault that the beats carry.
 *
 * MPI cannot tell a SIGSTOPped or frozen peer from a slow one: its requests
 * just stay pending. So every process of a world of several runs a
 * heartbeat thread that, every period (live_s / 20, 5 to 200 ms), sends
 * each peer a small message on a communicator of its own (a dup of the
 * world) and receives theirs, independently of what the main thread does:
 * a rank busy writing a checkpoint beats, a stopped one does not. A wait
 * then tells a stalled peer (no beat for live_s: the world's timeout, not
 * raised by pt_comm_set_timeout) from a live one that has not arrived (the
 * communicator's progress timeout).
 *
 * The beat also carries what the sender waits for (whom errors blame: the
 * rank that holds the others up, not the peer one happens to wait for) and
 * the job's verdict: the first process to notice a fault decides it, prints
 * the one line naming the rank at fault, and sends it in its next beats;
 * the others adopt it (their waits return it at once) and print nothing
 * (pt_comm_fault_reported). Of the ranks that see a peer's beats stop, the
 * lowest healthy one notices; the others wait a little longer for its
 * verdict, so that the job shows one line.
 *
 * Cost: 2 (n - 1) messages of 192 bytes per period per process.
 *
 * Not here: what a wait does with the beats (deadlines, blame, the
 * watchdog: mpi_watch.c), the operations (mpi_ops.c). */
#include "mpi_impl.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

pt_mpi_hb_state pt_mpi_hb;
static pt_flight_table own_table; /* this rank's, sent with every beat */

pt_flight_table *pt_mpi_hb_table(int w) {
    if (w < 0 || w == pt_mpi_g.world_rank) return &own_table;
    return pt_mpi_hb.on && pt_mpi_hb.tables && w < pt_mpi_hb.size ? &pt_mpi_hb.tables[w] : NULL;
}

static const pt_flight_table *get_table(void *arg, int w) {
    (void)arg;
    return pt_mpi_hb_table(w);
}

/* ": dp group 0: allreduce #45 ..." from every rank's table, or "". */
static void laggards(int culprit, char *out, size_t len) {
    char why[1024];
    out[0] = '\0';
    if (pt_flight_describe(get_table, NULL, pt_mpi_hb.size, culprit, why, sizeof why))
        snprintf(out, len, ": %s", why);
}

/* Record the job's verdict unless there is one; the noticer (this process)
 * prints the job's one line. */
void pt_mpi_hb_set_verdict(int culprit, int noticed_by, pt_status st, const char *reason,
                           int named) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&pt_mpi_hb.verdict, &expected, 1)) return;
    pt_mpi_hb.culprit = culprit;
    pt_mpi_hb.noticed_by = noticed_by;
    pt_mpi_hb.vst = st;
    snprintf(pt_mpi_hb.reason, sizeof pt_mpi_hb.reason, "%s", reason);
    atomic_store(&pt_mpi_hb.verdict, 2);
    pt_mpi_g.failed = 1; /* MPI_Finalize would wait for the culprit */
    if (noticed_by == pt_mpi_hb.rank) {
        char lag[1100] = "";
        if (!named) laggards(culprit, lag, sizeof lag);
        fprintf(stderr, "partrain: %s (noticed by rank %d)%s; job stopped\n", reason, noticed_by,
                lag);
        fflush(stderr);
    }
    pt_ticker_kick(&pt_mpi_hb.tick); /* send it now, not at the next beat */
}

void pt_mpi_hb_on_term(void) {
    if (!pt_mpi_hb.on || pt_mpi_hb_has_verdict()) return;
    uint64_t now = pt_time_ns();
    double quiet = 3.0 * (double)pt_mpi_hb.period_ns * 1e-9, longest = 0;
    int gone = -1, lowest = -1, fresh = 0, silent = 0;
    for (int p = 0; p < pt_mpi_hb.size; p++) {
        double s = p == pt_mpi_hb.rank ? 0 : pt_mpi_hb_silence(p, now);
        if (s > quiet) {
            silent++;
            if (s > longest) longest = s, gone = p;
        } else {
            if (lowest < 0) lowest = p;
            fresh += p != pt_mpi_hb.rank;
        }
    }
    /* mpirun ends a job whose rank died (or that exited with an error of
     * its own, which said so): only a silent peer is news, and the lowest
     * rank that still beats says it. Not when no peer is heard (the
     * heartbeat itself is stuck: across hosts Open MPI's sends to the dead
     * rank's broken connection held it up, and every rank named another),
     * nor when several went silent (mpirun's own line names the rank). */
    if (gone < 0 || lowest != pt_mpi_hb.rank || !fresh || silent > 1) return;
    char lag[1100];
    laggards(gone, lag, sizeof lag);
    fprintf(stderr,
            "partrain: rank %d is gone: no heartbeat for %.1f s, and mpirun is ending the job "
            "(noticed by rank %d)%s; job stopped\n",
            gone, longest, pt_mpi_hb.rank, lag);
    fflush(stderr);
}

int pt_mpi_hb_has_verdict(void) {
    return atomic_load_explicit(&pt_mpi_hb.verdict, memory_order_acquire) == 2;
}

/* The bytes of m that go out: the header and its used flight slots. */
static int hb_bytes(const hb_msg *m) {
    return (int)(offsetof(hb_msg, flight) +
                 (size_t)(m->nflight > 0 ? m->nflight : 0) * sizeof(pt_flight_snap));
}

static void hb_fill(hb_msg *m, int left) {
    memset(m, 0, offsetof(hb_msg, flight));
    m->nflight = pt_flight_pack(&own_table, m->flight);
    m->waiting_on = left ? HB_LEFT : atomic_load(&pt_mpi_hb.my_wait);
    m->culprit = -1;
    if (pt_mpi_hb_has_verdict()) {
        m->culprit = pt_mpi_hb.culprit;
        m->noticed_by = pt_mpi_hb.noticed_by;
        m->st = pt_mpi_hb.vst;
        snprintf(m->reason, sizeof m->reason, "%s", pt_mpi_hb.reason);
    }
}

double pt_mpi_hb_silence(int p, uint64_t now) {
    uint64_t h = atomic_load_explicit(&pt_mpi_hb.heard[p], memory_order_acquire);
    return h == UINT64_MAX || now <= h ? 0 : (double)(now - h) * 1e-9;
}

/* The verdict's words for `who`, the rank the others wait on: silent (its
 * heartbeat is old: stopped or dead) or alive but not taking part. */
void pt_mpi_stall_reason(char reason[HB_REASON], int who, uint64_t now, double timeout_s) {
    double age = pt_mpi_hb_silence(who, now);
    if (age > pt_mpi_hb.live_s / 2)
        snprintf(reason, HB_REASON,
                 "rank %d stopped responding: no heartbeat for %.1f s (stopped, frozen, "
                 "unreachable or dead; comm.timeout %.3g s)",
                 who, age, pt_mpi_hb.live_s);
    else
        snprintf(reason, HB_REASON, "rank %d did not take part within %.3g s", who, timeout_s);
}

/* A peer whose beats stopped for more than live_s (+ slack, when a lower
 * healthy rank is there to notice first); -1 if none. */
static int hb_stale(uint64_t now, double *age) {
    for (int p = 0; p < pt_mpi_hb.size; p++) {
        if (p == pt_mpi_hb.rank) continue;
        double a = pt_mpi_hb_silence(p, now);
        if (a <= pt_mpi_hb.live_s) continue;
        int lower = 0; /* a healthy rank below me notices it */
        for (int q = 0; q < pt_mpi_hb.rank && !lower; q++)
            lower = q != p && pt_mpi_hb_silence(q, now) < pt_mpi_hb.live_s / 2;
        double slack = 1.0 + 4.0 * (double)pt_mpi_hb.period_ns * 1e-9;
        if (lower && a <= pt_mpi_hb.live_s + slack) continue;
        *age = a;
        return p;
    }
    return -1;
}

void pt_mpi_hb_check_stale(void) {
    double age = 0;
    uint64_t now = pt_time_ns();
    /* This process was itself frozen (SIGSTOP then SIGCONT) or starved: the
     * silence is its own; the next rounds bring the peers' beats in. */
    if ((double)(now - atomic_load(&pt_mpi_hb.last_round)) * 1e-9 > pt_mpi_hb.live_s / 4) return;
    int p = hb_stale(now, &age);
    if (p < 0) return;
    char reason[HB_REASON];
    snprintf(reason, sizeof reason,
             "rank %d stopped responding: no heartbeat for %.1f s (stopped, frozen, unreachable "
             "or dead; comm.timeout %.3g s)",
             p, age, pt_mpi_hb.live_s);
    pt_mpi_hb_set_verdict(p, pt_mpi_hb.rank, PT_ERR_TIMEOUT, reason, 0);
}

/* Send every peer the verdict, if there is one, from buffers of its own:
 * the last beat's send is nearly always still pending (under a blocking
 * collective it stayed so for 200 ms), and a verdict that waited for it
 * went nowhere: the others then printed lines of their own when mpirun was
 * slow to end them. MPI keeps the order of the two messages. */
void pt_mpi_hb_send_verdict(void) {
    if (!pt_mpi_hb_has_verdict()) return;
    for (int p = 0; p < pt_mpi_hb.size; p++) {
        if (p == pt_mpi_hb.rank || pt_mpi_hb.freq[p] != MPI_REQUEST_NULL) continue;
        hb_fill(&pt_mpi_hb.fbuf[p], 0);
        pt_mpi_lock();
        MPI_Isend(&pt_mpi_hb.fbuf[p], hb_bytes(&pt_mpi_hb.fbuf[p]), MPI_BYTE, p, 0, pt_mpi_hb.comm,
                  &pt_mpi_hb.freq[p]);
        pt_mpi_unlock();
    }
}

/* Wait until `until` (pt_time_ns) at most for the verdict's sends to leave. */
void pt_mpi_hb_verdict_sent(uint64_t until) {
    for (int p = 0; p < pt_mpi_hb.size; p++) {
        int done = pt_mpi_hb.freq[p] == MPI_REQUEST_NULL;
        while (!done && pt_time_ns() < until) {
            pt_mpi_lock();
            MPI_Test(&pt_mpi_hb.freq[p], &done, MPI_STATUS_IGNORE);
            pt_mpi_unlock();
            if (!done) pt_mpi_sleep_us(1000);
        }
    }
}

static void hb_round(void) {
    if (pt_mpi_g.failed) {
        /* One last round that carries the verdict out, then no MPI call
         * (check_usable says why). */
        if (pt_mpi_hb.final_sent) return;
        pt_mpi_hb.final_sent = 1;
        pt_mpi_hb_send_verdict();
        return;
    }
    uint64_t now = pt_time_ns();
    if ((double)(now - atomic_load(&pt_mpi_hb.last_round)) * 1e-9 > pt_mpi_hb.live_s / 4) {
        atomic_store(&pt_mpi_hb.thawed_at, now);
        for (int p = 0; p < pt_mpi_hb.size; p++) /* back from a freeze of its own: start afresh */
            if (atomic_load(&pt_mpi_hb.heard[p]) != UINT64_MAX)
                atomic_store(&pt_mpi_hb.heard[p], now);
    }
    atomic_store(&pt_mpi_hb.last_round, now);
    for (int p = 0; p < pt_mpi_hb.size; p++) {
        if (p == pt_mpi_hb.rank) continue;
        for (int k = 0; k < 64 && pt_mpi_hb.rreq[p] != MPI_REQUEST_NULL; k++) {
            int flag = 0;
            pt_mpi_lock();
            int rc = MPI_Test(&pt_mpi_hb.rreq[p], &flag, MPI_STATUS_IGNORE);
            pt_mpi_unlock();
            if (rc != MPI_SUCCESS) {
                /* the peer's connection broke (it died, its host went): no
                 * message came, and its silence must show */
                pt_mpi_hb.rreq[p] = MPI_REQUEST_NULL;
                break;
            }
            if (!flag) break;
            const hb_msg *m = &pt_mpi_hb.rbuf[p];
            if (m->nflight >= 0 && m->nflight <= PT_FLIGHT_SLOTS)
                pt_flight_unpack(&pt_mpi_hb.tables[p], m->flight, m->nflight);
            atomic_store(&pt_mpi_hb.peer_wait[p], m->waiting_on);
            atomic_store(&pt_mpi_hb.heard[p], m->waiting_on == HB_LEFT ? UINT64_MAX : now);
            if (m->culprit >= 0 && m->culprit < pt_mpi_hb.size) {
                char r[HB_REASON];
                memcpy(r, m->reason, sizeof r);
                r[sizeof r - 1] = '\0';
                pt_mpi_hb_set_verdict(m->culprit, m->noticed_by, m->st, r, 1);
            }
            if (m->waiting_on == HB_LEFT) break; /* nothing more comes */
            pt_mpi_lock();
            MPI_Irecv(&pt_mpi_hb.rbuf[p], sizeof(hb_msg), MPI_BYTE, p, 0, pt_mpi_hb.comm,
                      &pt_mpi_hb.rreq[p]);
            pt_mpi_unlock();
        }
        int done = 1;
        if (pt_mpi_hb.sreq[p] != MPI_REQUEST_NULL) {
            pt_mpi_lock();
            MPI_Test(&pt_mpi_hb.sreq[p], &done, MPI_STATUS_IGNORE);
            pt_mpi_unlock();
        }
        if (!done) continue; /* the peer does not take them: it may be stopped */
        hb_fill(&pt_mpi_hb.sbuf[p], 0);
        pt_mpi_lock();
        MPI_Isend(&pt_mpi_hb.sbuf[p], hb_bytes(&pt_mpi_hb.sbuf[p]), MPI_BYTE, p, 0, pt_mpi_hb.comm,
                  &pt_mpi_hb.sreq[p]);
        pt_mpi_unlock();
    }
    pt_mpi_hb_check_stale();
}

static void hb_tick(void *arg) {
    (void)arg;
    hb_round();
    pt_mpi_watch_check();
}

/* Start the heartbeat of a world of `size` (collective: dups the world). */
pt_status pt_mpi_hb_start(MPI_Comm world, int rank, int size, double live_s) {
    if (size < 2 || pt_mpi_hb.on || pt_mpi_g.thread_level < MPI_THREAD_SERIALIZED) return PT_OK;
    size_t n = (size_t)size;
    pt_mpi_hb.sreq = malloc(n * sizeof *pt_mpi_hb.sreq);
    pt_mpi_hb.rreq = malloc(n * sizeof *pt_mpi_hb.rreq);
    pt_mpi_hb.sbuf = calloc(n, sizeof *pt_mpi_hb.sbuf);
    pt_mpi_hb.rbuf = calloc(n, sizeof *pt_mpi_hb.rbuf);
    pt_mpi_hb.freq = malloc(n * sizeof *pt_mpi_hb.freq);
    pt_mpi_hb.fbuf = calloc(n, sizeof *pt_mpi_hb.fbuf);
    pt_mpi_hb.heard = calloc(n, sizeof *pt_mpi_hb.heard);
    pt_mpi_hb.peer_wait = calloc(n, sizeof *pt_mpi_hb.peer_wait);
    pt_mpi_hb.tables = calloc(n, sizeof *pt_mpi_hb.tables);
    if (!pt_mpi_hb.sreq || !pt_mpi_hb.rreq || !pt_mpi_hb.sbuf || !pt_mpi_hb.rbuf ||
        !pt_mpi_hb.freq || !pt_mpi_hb.fbuf || !pt_mpi_hb.heard || !pt_mpi_hb.peer_wait ||
        !pt_mpi_hb.tables)
        return pt_error_set(PT_ERR_NOMEM, "mpi: heartbeat state for %d ranks", size);
    pt_mpi_lock();
    int rc = MPI_Comm_dup(world, &pt_mpi_hb.comm);
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return pt_error_set(PT_ERR_COMM, "mpi: heartbeat communicator (%d)", rc);
    pt_mpi_hb.rank = rank;
    pt_mpi_hb.size = size;
    pt_mpi_hb.live_s = live_s;
    double p = live_s / 20;
    p = p < 0.005 ? 0.005 : p > 0.2 ? 0.2 : p;
    pt_mpi_hb.period_ns = (uint64_t)(p * 1e9);
    atomic_store(&pt_mpi_hb.my_wait, HB_IDLE);
    uint64_t now = pt_time_ns();
    atomic_store(&pt_mpi_hb.last_round, now);
    for (int q = 0; q < size; q++) {
        pt_mpi_hb.sreq[q] = pt_mpi_hb.rreq[q] = pt_mpi_hb.freq[q] = MPI_REQUEST_NULL;
        atomic_store(&pt_mpi_hb.heard[q], now);
        atomic_store(&pt_mpi_hb.peer_wait[q], HB_IDLE);
        if (q == rank) continue;
        pt_mpi_lock();
        MPI_Irecv(&pt_mpi_hb.rbuf[q], sizeof(hb_msg), MPI_BYTE, q, 0, pt_mpi_hb.comm,
                  &pt_mpi_hb.rreq[q]);
        pt_mpi_unlock();
    }
    PT_CHECK(pt_ticker_start(&pt_mpi_hb.tick, pt_mpi_hb.period_ns, hb_tick, NULL, "mpi heartbeat"));
    pt_mpi_hb.on = 1;
    return PT_OK;
}

/* Stop beating; tell the peers this process left (so that its silence is
 * not taken for a stall) and release the requests. */
void pt_mpi_hb_stop(void) {
    if (!pt_mpi_hb.on) return;
    pt_ticker_stop(&pt_mpi_hb.tick);
    pt_mpi_hb.on = 0;
    if (pt_mpi_g.failed) {
        /* The verdict's last round, if the thread had not run it yet, and
         * a moment (200 ms at most) for it to leave before the process
         * does; a stopped peer never takes it. */
        hb_round();
        pt_mpi_hb_verdict_sent(pt_time_ns() + 200000000ull);
        return;
    }
    uint64_t t0 = pt_time_ns();
    for (int p = 0; p < pt_mpi_hb.size; p++) {
        if (p == pt_mpi_hb.rank) continue;
        int done = pt_mpi_hb.sreq[p] == MPI_REQUEST_NULL;
        while (!done && pt_time_ns() - t0 < 200000000ull) {
            pt_mpi_lock();
            MPI_Test(&pt_mpi_hb.sreq[p], &done, MPI_STATUS_IGNORE);
            pt_mpi_unlock();
        }
        pt_mpi_lock();
        if (!done) MPI_Request_free(&pt_mpi_hb.sreq[p]);
        hb_fill(&pt_mpi_hb.sbuf[p], 1);
        MPI_Isend(&pt_mpi_hb.sbuf[p], hb_bytes(&pt_mpi_hb.sbuf[p]), MPI_BYTE, p, 0, pt_mpi_hb.comm,
                  &pt_mpi_hb.sreq[p]);
        if (pt_mpi_hb.rreq[p] != MPI_REQUEST_NULL) {
            MPI_Cancel(&pt_mpi_hb.rreq[p]);
            MPI_Wait(&pt_mpi_hb.rreq[p], MPI_STATUS_IGNORE);
        }
        pt_mpi_unlock();
    }
    for (int p = 0; p < pt_mpi_hb.size; p++) {
        int done = pt_mpi_hb.sreq[p] == MPI_REQUEST_NULL;
        while (!done && pt_time_ns() - t0 < 400000000ull) {
            pt_mpi_lock();
            MPI_Test(&pt_mpi_hb.sreq[p], &done, MPI_STATUS_IGNORE);
            pt_mpi_unlock();
        }
        pt_mpi_lock();
        if (!done) MPI_Request_free(&pt_mpi_hb.sreq[p]);
        pt_mpi_unlock();
    }
    if (!pt_mpi_g.failed) {
        pt_mpi_lock();
        MPI_Comm_free(&pt_mpi_hb.comm);
        pt_mpi_unlock();
    }
    /* The buffers stay: a request freed above may still read its buffer. */
}

/* The verdict as this process's error, naming the operation. */
pt_status pt_mpi_verdict_error(mpi_ctx *c, const char *op) {
    c->failed = 1;
    return pt_error_set(pt_mpi_hb.vst, "mpi %s: %s (noticed by rank %d); job stopped", op,
                        pt_mpi_hb.reason, pt_mpi_hb.noticed_by);
}
