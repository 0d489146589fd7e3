/* The mpi backend: the communicator interface on Open MPI, for jobs started
 * by `mpirun -np N partrain ... --backend mpi` (one process per rank, on one
 * or many hosts).
 *
 * What it does:
 *  - maps every collective onto the MPI collective of the same meaning
 *    (allreduce SUM, then a local scale for AVG; reduce-scatter with uneven
 *    per-rank counts from pt_comm_shard; in-place all-gather through
 *    MPI_Allgatherv; bcast; tagged send/recv) and sub-communicators onto
 *    MPI_Comm_split;
 *  - never waits forever: MPI itself blocks indefinitely when a peer dies or
 *    its host becomes unreachable (TCP just retransmits), so every blocking
 *    operation is the non-blocking MPI call plus an MPI_Test loop with a
 *    deadline (or, opt-in, the blocking collective under a watchdog: see
 *    "watchdog" below) (pt_comm_options.timeout_s, else env PT_COMM_TIMEOUT, else
 *    10 s). On expiry it returns PT_ERR_TIMEOUT naming the operation (and the
 *    peer for point-to-point); the caller exits non-zero and mpirun tears the
 *    job down. The communicator is then unusable (the MPI request cannot be
 *    cancelled) and MPI_Finalize is skipped, as it could wait for the dead
 *    peer;
 *  - turns MPI errors into values: MPI_ERRORS_RETURN on every communicator,
 *    and MPI_Error_string in the message.
 *
 * Threads: the comm.c wrappers run queued non-blocking operations on a
 * per-process progress thread while the main thread may issue blocking ones
 * (on other communicators). We ask for MPI_THREAD_MULTIPLE; when the library
 * provides less, every MPI call of this file goes through one process-wide
 * mutex. That is safe because no MPI call here blocks: waits are MPI_Test
 * loops that release the mutex between tests, so two threads waiting on
 * different communicators interleave instead of deadlocking.
 *
 * Waiting: the loop spins on MPI_Test for a short while (latency of small
 * messages), then yields the core after every test (ranks may outnumber
 * cores; Open MPI's ob1/vader progress only moves inside MPI calls, so
 * sleeping would throttle large transfers), and after a second of waiting
 * sleeps 100 us between tests: such a wait is a straggler or a fault.
 *
 * Memory: nothing is allocated per call; the count/displacement arrays of
 * the uneven collectives are allocated once per communicator.
 *
 * Not here: the non-blocking queue and counters (comm.c), the generic
 * collectives, launching processes (mpirun does it). */
#include "comm_impl.h"
#include "mpi_impl.h"
#include "ticker.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PT_MPI_DEFAULT_TIMEOUT_S 10.0

typedef struct {
    MPI_Comm comm;
    int rank, size;
    int *world;       /* size entries: each member's rank in the world (for verdicts) */
    int is_world;     /* the world context: its free finalizes MPI */
    double timeout_s; /* deadline of every wait */
    int *counts;      /* size entries: per-rank element counts (reduce-scatter, all-gather) */
    int *displs;      /* size entries: per-rank offsets (all-gather) */
    int failed;       /* an operation failed: only free is allowed */
    int tag_ub;       /* largest tag (MPI_TAG_UB, at least 32767) */
    float *ring_tmp;  /* ring reduce-scatter: one shard received, ring_cap floats */
    size_t ring_cap;
} mpi_ctx;

pt_mpi_state pt_mpi_g;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

void pt_mpi_lock(void) {
    if (pt_mpi_g.serialize) pthread_mutex_lock(&g_lock);
}
void pt_mpi_unlock(void) {
    if (pt_mpi_g.serialize) pthread_mutex_unlock(&g_lock);
}

/* 1 when this process was started by an MPI launcher (mpirun, or PMIx). */
int pt_mpi_under_mpirun(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

/* Initialize MPI once per process (thread level as described at the top). */
pt_status pt_mpi_start(void) {
    int inited = 0, fin = 0;
    MPI_Finalized(&fin);
    if (fin || pt_mpi_g.finalized)
        return pt_error_set(PT_ERR_UNSUPPORTED,
                            "mpi: MPI was already finalized in this process (the world was freed)");
    MPI_Initialized(&inited);
    if (inited) {
        MPI_Query_thread(&pt_mpi_g.thread_level);
    } else {
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &pt_mpi_g.thread_level);
        if (rc != MPI_SUCCESS)
            return pt_error_set(PT_ERR_COMM, "mpi: MPI_Init_thread failed (error %d)", rc);
        pt_mpi_g.initialized_here = 1;
    }
    pt_mpi_g.serialize = pt_mpi_g.thread_level < MPI_THREAD_MULTIPLE;
    /* Testing: PT_MPI_SERIALIZE=1 takes the mutex path even under
     * MPI_THREAD_MULTIPLE, so that it is exercised where MULTIPLE exists. */
    const char *ser = getenv("PT_MPI_SERIALIZE");
    if (ser && !strcmp(ser, "1")) pt_mpi_g.serialize = 1;
    if (pt_mpi_g.thread_level < MPI_THREAD_SERIALIZED)
        /* SINGLE or FUNNELED: even serialized, calls from the progress
         * thread are outside what the library promises. */
        PT_WARN("mpi: the MPI library provides only %s; serializing calls from all threads",
                pt_mpi_g.thread_level == MPI_THREAD_SINGLE ? "MPI_THREAD_SINGLE"
                                                           : "MPI_THREAD_FUNNELED");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    return PT_OK;
}

/* An MPI error code as a status with a message naming the operation. */
static pt_status mpi_fail(mpi_ctx *c, int rc, const char *op, int peer) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
    if (c) c->failed = 1;
    pt_mpi_g.failed = 1;
    if (peer >= 0)
        return pt_error_set(PT_ERR_COMM, "mpi %s with peer rank %d failed on rank %d of %d: %s", op,
                            peer, c ? c->rank : -1, c ? c->size : -1, s);
    return pt_error_set(PT_ERR_COMM, "mpi %s failed on rank %d of %d: %s", op, c ? c->rank : -1,
                        c ? c->size : -1, s);
}

static int hb_has_verdict(void);
static pt_status verdict_error(mpi_ctx *c, const char *op);

/* After a failure anywhere in this process nothing enters MPI again: a
 * request left pending by a timeout cannot be cancelled, and MPI's progress
 * engine would go on moving its (by then maybe freed) buffer. */
static pt_status check_usable(mpi_ctx *c, const char *op) {
    if (hb_has_verdict()) return verdict_error(c, op);
    if (c->failed || pt_mpi_g.failed)
        return pt_error_set(PT_ERR_COMM,
                            "mpi %s on rank %d: an operation failed earlier in this process; only "
                            "free is allowed",
                            op, c->rank);
    return PT_OK;
}

static pt_status check_count(mpi_ctx *c, size_t n, const char *op) {
    if (n > INT_MAX)
        return pt_error_set(PT_ERR_INVALID,
                            "mpi %s on rank %d: %zu elements exceed MPI's int count", op, c->rank,
                            n);
    return PT_OK;
}

static void sleep_us(long us) {
    struct timespec ts = {0, us * 1000L};
    nanosleep(&ts, NULL);
}

/* ---- liveness: heartbeats between the world's processes --------------------------------
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
 * Cost: 2 (n - 1) messages of 192 bytes per period per process. */
enum { HB_IDLE = -1, HB_COLL = -2, HB_LEFT = -3 };
#define HB_REASON 176

typedef struct {
    int32_t waiting_on; /* world rank the sender waits for, or HB_IDLE / HB_COLL / HB_LEFT */
    int32_t culprit;    /* the verdict: world rank at fault, -1 none */
    int32_t noticed_by;
    int32_t st;
    char reason[HB_REASON];
} hb_msg;

static struct {
    int on;
    MPI_Comm comm;
    int rank, size;
    double live_s;
    uint64_t period_ns;
    pt_ticker tick;                  /* the heartbeat thread (ticker.h): hb_round every period */
    int final_sent;                  /* after a failure: the verdict went out; from here on only
                                        MPI_Test of its sends (hb_stop), nothing that waits */
    MPI_Request *sreq, *rreq, *freq; /* freq: the verdict's last sends, apart from the beats */
    hb_msg *sbuf, *rbuf, *fbuf;
    _Atomic uint64_t *heard; /* per peer: pt_time_ns of its last beat; UINT64_MAX: it left */
    _Atomic int *peer_wait;  /* per peer: the waiting_on of its last beat */
    _Atomic int my_wait;
    _Atomic uint64_t last_round; /* pt_time_ns of the heartbeat thread's last round */
    _Atomic uint64_t thawed_at;  /* when it last found this process back from a freeze */
    _Atomic int verdict;         /* 0 none, 1 being written, 2 set */
    int culprit, noticed_by;
    pt_status vst;
    char reason[HB_REASON];
} hb;

/* Record the job's verdict unless there is one; the noticer (this process)
 * prints the job's one line. */
static void hb_set_verdict(int culprit, int noticed_by, pt_status st, const char *reason) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&hb.verdict, &expected, 1)) return;
    hb.culprit = culprit;
    hb.noticed_by = noticed_by;
    hb.vst = st;
    snprintf(hb.reason, sizeof hb.reason, "%s", reason);
    atomic_store(&hb.verdict, 2);
    pt_mpi_g.failed = 1; /* MPI_Finalize would wait for the culprit */
    if (noticed_by == hb.rank) {
        fprintf(stderr, "partrain: %s (noticed by rank %d); job stopped\n", reason, noticed_by);
        fflush(stderr);
    }
    pt_ticker_kick(&hb.tick); /* send it now, not at the next beat */
}

static int hb_has_verdict(void) {
    return atomic_load_explicit(&hb.verdict, memory_order_acquire) == 2;
}

static void hb_fill(hb_msg *m, int left) {
    memset(m, 0, sizeof *m);
    m->waiting_on = left ? HB_LEFT : atomic_load(&hb.my_wait);
    m->culprit = -1;
    if (hb_has_verdict()) {
        m->culprit = hb.culprit;
        m->noticed_by = hb.noticed_by;
        m->st = hb.vst;
        snprintf(m->reason, sizeof m->reason, "%s", hb.reason);
    }
}

static double hb_silence(int p, uint64_t now) {
    uint64_t h = atomic_load_explicit(&hb.heard[p], memory_order_acquire);
    return h == UINT64_MAX || now <= h ? 0 : (double)(now - h) * 1e-9;
}

/* The verdict's words for `who`, the rank the others wait on: silent (its
 * heartbeat is old: stopped or dead) or alive but not taking part. */
static void stall_reason(char reason[HB_REASON], int who, uint64_t now, double timeout_s) {
    double age = hb_silence(who, now);
    if (age > hb.live_s / 2)
        snprintf(reason, HB_REASON,
                 "rank %d stopped responding: no heartbeat for %.1f s (stopped, frozen, "
                 "unreachable or dead; comm.timeout %.3g s)",
                 who, age, hb.live_s);
    else
        snprintf(reason, HB_REASON, "rank %d did not take part within %.3g s", who, timeout_s);
}

/* A peer whose beats stopped for more than live_s (+ slack, when a lower
 * healthy rank is there to notice first); -1 if none. */
static int hb_stale(uint64_t now, double *age) {
    for (int p = 0; p < hb.size; p++) {
        if (p == hb.rank) continue;
        double a = hb_silence(p, now);
        if (a <= hb.live_s) continue;
        int lower = 0; /* a healthy rank below me notices it */
        for (int q = 0; q < hb.rank && !lower; q++)
            lower = q != p && hb_silence(q, now) < hb.live_s / 2;
        double slack = 1.0 + 4.0 * (double)hb.period_ns * 1e-9;
        if (lower && a <= hb.live_s + slack) continue;
        *age = a;
        return p;
    }
    return -1;
}

static void hb_check_stale(void) {
    double age = 0;
    uint64_t now = pt_time_ns();
    /* This process was itself frozen (SIGSTOP then SIGCONT) or starved: the
     * silence is its own; the next rounds bring the peers' beats in. */
    if ((double)(now - atomic_load(&hb.last_round)) * 1e-9 > hb.live_s / 4) return;
    int p = hb_stale(now, &age);
    if (p < 0) return;
    char reason[HB_REASON];
    snprintf(reason, sizeof reason,
             "rank %d stopped responding: no heartbeat for %.1f s (stopped, frozen, unreachable "
             "or dead; comm.timeout %.3g s)",
             p, age, hb.live_s);
    hb_set_verdict(p, hb.rank, PT_ERR_TIMEOUT, reason);
}

/* Send every peer the verdict, if there is one, from buffers of its own:
 * the last beat's send is nearly always still pending (under a blocking
 * collective it stayed so for 200 ms), and a verdict that waited for it
 * went nowhere: the others then printed lines of their own when mpirun was
 * slow to end them. MPI keeps the order of the two messages. */
static void hb_send_verdict(void) {
    if (!hb_has_verdict()) return;
    for (int p = 0; p < hb.size; p++) {
        if (p == hb.rank || hb.freq[p] != MPI_REQUEST_NULL) continue;
        hb_fill(&hb.fbuf[p], 0);
        pt_mpi_lock();
        MPI_Isend(&hb.fbuf[p], sizeof(hb_msg), MPI_BYTE, p, 0, hb.comm, &hb.freq[p]);
        pt_mpi_unlock();
    }
}

/* Wait until `until` (pt_time_ns) at most for the verdict's sends to leave. */
static void hb_verdict_sent(uint64_t until) {
    for (int p = 0; p < hb.size; p++) {
        int done = hb.freq[p] == MPI_REQUEST_NULL;
        while (!done && pt_time_ns() < until) {
            pt_mpi_lock();
            MPI_Test(&hb.freq[p], &done, MPI_STATUS_IGNORE);
            pt_mpi_unlock();
            if (!done) sleep_us(1000);
        }
    }
}

static void hb_round(void) {
    if (pt_mpi_g.failed) {
        /* One last round that carries the verdict out, then no MPI call
         * (check_usable says why). */
        if (hb.final_sent) return;
        hb.final_sent = 1;
        hb_send_verdict();
        return;
    }
    uint64_t now = pt_time_ns();
    if ((double)(now - atomic_load(&hb.last_round)) * 1e-9 > hb.live_s / 4) {
        atomic_store(&hb.thawed_at, now);
        for (int p = 0; p < hb.size; p++) /* back from a freeze of its own: start afresh */
            if (atomic_load(&hb.heard[p]) != UINT64_MAX) atomic_store(&hb.heard[p], now);
    }
    atomic_store(&hb.last_round, now);
    for (int p = 0; p < hb.size; p++) {
        if (p == hb.rank) continue;
        for (int k = 0; k < 64 && hb.rreq[p] != MPI_REQUEST_NULL; k++) {
            int flag = 0;
            pt_mpi_lock();
            MPI_Test(&hb.rreq[p], &flag, MPI_STATUS_IGNORE);
            pt_mpi_unlock();
            if (!flag) break;
            const hb_msg *m = &hb.rbuf[p];
            atomic_store(&hb.peer_wait[p], m->waiting_on);
            atomic_store(&hb.heard[p], m->waiting_on == HB_LEFT ? UINT64_MAX : now);
            if (m->culprit >= 0 && m->culprit < hb.size) {
                char r[HB_REASON];
                memcpy(r, m->reason, sizeof r);
                r[sizeof r - 1] = '\0';
                hb_set_verdict(m->culprit, m->noticed_by, m->st, r);
            }
            if (m->waiting_on == HB_LEFT) break; /* nothing more comes */
            pt_mpi_lock();
            MPI_Irecv(&hb.rbuf[p], sizeof(hb_msg), MPI_BYTE, p, 0, hb.comm, &hb.rreq[p]);
            pt_mpi_unlock();
        }
        int done = 1;
        if (hb.sreq[p] != MPI_REQUEST_NULL) {
            pt_mpi_lock();
            MPI_Test(&hb.sreq[p], &done, MPI_STATUS_IGNORE);
            pt_mpi_unlock();
        }
        if (!done) continue; /* the peer does not take them: it may be stopped */
        hb_fill(&hb.sbuf[p], 0);
        pt_mpi_lock();
        MPI_Isend(&hb.sbuf[p], sizeof(hb_msg), MPI_BYTE, p, 0, hb.comm, &hb.sreq[p]);
        pt_mpi_unlock();
    }
    hb_check_stale();
}

static void watch_check(void);

static void hb_tick(void *arg) {
    (void)arg;
    hb_round();
    watch_check();
}

/* Start the heartbeat of a world of `size` (collective: dups the world). */
static pt_status hb_start(MPI_Comm world, int rank, int size, double live_s) {
    if (size < 2 || hb.on || pt_mpi_g.thread_level < MPI_THREAD_SERIALIZED) return PT_OK;
    size_t n = (size_t)size;
    hb.sreq = malloc(n * sizeof *hb.sreq);
    hb.rreq = malloc(n * sizeof *hb.rreq);
    hb.sbuf = calloc(n, sizeof *hb.sbuf);
    hb.rbuf = calloc(n, sizeof *hb.rbuf);
    hb.freq = malloc(n * sizeof *hb.freq);
    hb.fbuf = calloc(n, sizeof *hb.fbuf);
    hb.heard = calloc(n, sizeof *hb.heard);
    hb.peer_wait = calloc(n, sizeof *hb.peer_wait);
    if (!hb.sreq || !hb.rreq || !hb.sbuf || !hb.rbuf || !hb.freq || !hb.fbuf || !hb.heard ||
        !hb.peer_wait)
        return pt_error_set(PT_ERR_NOMEM, "mpi: heartbeat state for %d ranks", size);
    pt_mpi_lock();
    int rc = MPI_Comm_dup(world, &hb.comm);
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return pt_error_set(PT_ERR_COMM, "mpi: heartbeat communicator (%d)", rc);
    hb.rank = rank;
    hb.size = size;
    hb.live_s = live_s;
    double p = live_s / 20;
    p = p < 0.005 ? 0.005 : p > 0.2 ? 0.2 : p;
    hb.period_ns = (uint64_t)(p * 1e9);
    atomic_store(&hb.my_wait, HB_IDLE);
    uint64_t now = pt_time_ns();
    atomic_store(&hb.last_round, now);
    for (int q = 0; q < size; q++) {
        hb.sreq[q] = hb.rreq[q] = hb.freq[q] = MPI_REQUEST_NULL;
        atomic_store(&hb.heard[q], now);
        atomic_store(&hb.peer_wait[q], HB_IDLE);
        if (q == rank) continue;
        pt_mpi_lock();
        MPI_Irecv(&hb.rbuf[q], sizeof(hb_msg), MPI_BYTE, q, 0, hb.comm, &hb.rreq[q]);
        pt_mpi_unlock();
    }
    PT_CHECK(pt_ticker_start(&hb.tick, hb.period_ns, hb_tick, NULL, "mpi heartbeat"));
    hb.on = 1;
    return PT_OK;
}

/* Stop beating; tell the peers this process left (so that its silence is
 * not taken for a stall) and release the requests. */
static void hb_stop(void) {
    if (!hb.on) return;
    pt_ticker_stop(&hb.tick);
    hb.on = 0;
    if (pt_mpi_g.failed) {
        /* The verdict's last round, if the thread had not run it yet, and
         * a moment (200 ms at most) for it to leave before the process
         * does; a stopped peer never takes it. */
        hb_round();
        hb_verdict_sent(pt_time_ns() + 200000000ull);
        return;
    }
    uint64_t t0 = pt_time_ns();
    for (int p = 0; p < hb.size; p++) {
        if (p == hb.rank) continue;
        int done = hb.sreq[p] == MPI_REQUEST_NULL;
        while (!done && pt_time_ns() - t0 < 200000000ull) {
            pt_mpi_lock();
            MPI_Test(&hb.sreq[p], &done, MPI_STATUS_IGNORE);
            pt_mpi_unlock();
        }
        pt_mpi_lock();
        if (!done) MPI_Request_free(&hb.sreq[p]);
        hb_fill(&hb.sbuf[p], 1);
        MPI_Isend(&hb.sbuf[p], sizeof(hb_msg), MPI_BYTE, p, 0, hb.comm, &hb.sreq[p]);
        if (hb.rreq[p] != MPI_REQUEST_NULL) {
            MPI_Cancel(&hb.rreq[p]);
            MPI_Wait(&hb.rreq[p], MPI_STATUS_IGNORE);
        }
        pt_mpi_unlock();
    }
    for (int p = 0; p < hb.size; p++) {
        int done = hb.sreq[p] == MPI_REQUEST_NULL;
        while (!done && pt_time_ns() - t0 < 400000000ull) {
            pt_mpi_lock();
            MPI_Test(&hb.sreq[p], &done, MPI_STATUS_IGNORE);
            pt_mpi_unlock();
        }
        pt_mpi_lock();
        if (!done) MPI_Request_free(&hb.sreq[p]);
        pt_mpi_unlock();
    }
    if (!pt_mpi_g.failed) {
        pt_mpi_lock();
        MPI_Comm_free(&hb.comm);
        pt_mpi_unlock();
    }
    /* The buffers stay: a request freed above may still read its buffer. */
}

/* The verdict as this process's error, naming the operation. */
static pt_status verdict_error(mpi_ctx *c, const char *op) {
    c->failed = 1;
    return pt_error_set(hb.vst, "mpi %s: %s (noticed by rank %d); job stopped", op, hb.reason,
                        hb.noticed_by);
}

/* Whom to blame when a wait on c timed out: for point-to-point, follow
 * what each rank waits for from the peer on; for a collective, the first
 * member that waits for nothing (it has not arrived), else the end of the
 * chain from the first member that waits for a particular rank. -1: none
 * found (every member waits in a collective: operations out of order?). */
static int blame(mpi_ctx *c, int peer) {
    if (!hb.on) return peer >= 0 ? c->world[peer] : -1;
    int me = c->world[c->rank], w = -1;
    uint64_t now = pt_time_ns();
    for (int m = 0; m < c->size && w < 0; m++) /* a member gone silent explains it all */
        if (m != c->rank && hb_silence(c->world[m], now) > hb.live_s / 2) w = c->world[m];
    if (w >= 0) return w;
    if (peer >= 0) {
        w = c->world[peer];
    } else {
        for (int m = 0; m < c->size && w < 0; m++)
            if (m != c->rank && atomic_load(&hb.peer_wait[c->world[m]]) == HB_IDLE) w = c->world[m];
        for (int m = 0; m < c->size && w < 0; m++)
            if (m != c->rank && atomic_load(&hb.peer_wait[c->world[m]]) >= 0) w = c->world[m];
        if (w < 0) return -1;
    }
    for (int hops = 0; hops < hb.size; hops++) {
        int next = atomic_load(&hb.peer_wait[w]);
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
 *  - who >= 0: the lowest healthy member notices; the others give its
 *    verdict a moment to arrive, so that the job shows one line. */
static uint64_t deadline_grace(const mpi_ctx *c, int who, uint64_t now, int *deferred) {
    if (!hb.on) return 0;
    uint64_t slack = 1000000000ull + 4 * hb.period_ns;
    if (who < 0) {
        if (*deferred & 1) return 0;
        *deferred |= 1;
        return (uint64_t)(hb.live_s / 2 * 1e9) + slack;
    }
    if (*deferred & 2) return 0;
    *deferred |= 2;
    int first = -1;
    for (int m = 0; m < c->size && first < 0; m++)
        if (c->world[m] != who && (m == c->rank || hb_silence(c->world[m], now) < hb.live_s / 2))
            first = m;
    return first != c->rank ? slack : 0;
}

/* Wait for *req with the context's deadline. peer < 0 for collectives. */
static pt_status wait_req(mpi_ctx *c, MPI_Request *req, const char *op, int peer, size_t bytes,
                          MPI_Status *st_out) {
    uint64_t t0 = pt_time_ns();
    uint64_t limit = (uint64_t)(c->timeout_s * 1e9);
    uint64_t next_check = 0;
    MPI_Status st;
    int published = 0; /* this wait set hb.my_wait */
    int deferred = 0;  /* deadline_grace's extensions so far */
    for (unsigned spin = 0;; spin++) {
        int flag = 0;
        pt_mpi_lock();
        int rc = MPI_Test(req, &flag, &st);
        pt_mpi_unlock();
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, op, peer);
        if (flag) {
            if (published) atomic_store(&hb.my_wait, HB_IDLE);
            if (st_out) *st_out = st;
            return PT_OK;
        }
        if (spin < 256) continue;
        uint64_t now = pt_time_ns(), waited = now - t0;
        if (hb.on && now >= next_check) { /* every 20 ms: the job's verdict, stalled peers */
            next_check = now + 20000000ull;
            if (!published) {
                atomic_store(&hb.my_wait, peer >= 0 ? c->world[peer] : HB_COLL);
                published = 1;
            }
            hb_check_stale();
            if (hb_has_verdict()) {
                atomic_store(&hb.my_wait, HB_IDLE);
                return verdict_error(c, op);
            }
        }
        if (waited > limit && hb.on &&
            ((double)(now - atomic_load(&hb.last_round)) * 1e-9 > hb.live_s / 4 ||
             atomic_load(&hb.thawed_at) > t0)) {
            /* This process was itself stopped (the deadline passed while it
             * was frozen) or starved: not the peers' fault. The deadline
             * counts again from the thaw, and meanwhile its heartbeat thread
             * catches up (and brings in the verdict about it, if any). */
            uint64_t thaw = atomic_load(&hb.thawed_at);
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
            if (published) atomic_store(&hb.my_wait, HB_IDLE);
            if (hb.on && who >= 0) {
                char reason[HB_REASON];
                stall_reason(reason, who, pt_time_ns(), c->timeout_s);
                hb_set_verdict(who, hb.rank, PT_ERR_TIMEOUT, reason);
                return verdict_error(c, op);
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
            sleep_us(100);
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
 * in flight the rules of wait_req (the job's verdict; a stalled peer; the
 * progress deadline with the thaw and the lowest-healthy-rank-notices
 * rules). A call that can no longer complete ends the process: the noticer
 * prints the job's one line (hb_set_verdict), sends every peer the verdict,
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
static int watch_enabled(const mpi_ctx *c) {
    static int mode = -1; /* 0 none, 1 world, 2 all */
    if (mode < 0) {
        const char *e = getenv("PT_MPI_BLOCKING");
        mode = !e ? 0 : !strcmp(e, "world") ? 1 : !strcmp(e, "all") ? 2 : 0;
    }
    return hb.on && !pt_mpi_g.serialize && (mode == 2 || (mode == 1 && c->is_world));
}

/* Claim a slot for a blocking collective on c. With more collectives in
 * flight than slots (not possible with fewer than WATCH_SLOTS communicators
 * in use at once), wait for one: the choice of path must be the same on
 * every rank. */
static int watch_begin(mpi_ctx *c, const char *op, size_t bytes) {
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
            atomic_store(&hb.my_wait, HB_COLL);
            return i;
        }
        sleep_us(100);
    }
}

static void watch_end(int i) {
    atomic_store(&hb.my_wait, HB_IDLE);
    atomic_fetch_add_explicit(&watch[i].gen, 1, memory_order_release);
    atomic_store_explicit(&watch[i].claimed, 0, memory_order_release);
}

/* The process cannot go on (a collective of it will never return): send
 * every peer the verdict (hb_stop's messages would have carried it), give
 * them a moment to leave, and exit. On the heartbeat thread only. */
static _Noreturn void watch_end_job(void) {
    fflush(stdout);
    fflush(stderr);
    pt_mpi_g.failed = 1;
    hb.final_sent = 1; /* no more rounds: this is the last message */
    hb_send_verdict();
    hb_verdict_sent(pt_time_ns() + 200000000ull);
    _exit(3);
}

/* One collective in flight: 1 when the process must end. */
static int watch_slot_check(watch_slot *w, uint64_t now) {
    mpi_ctx *c = w->c;
    uint64_t waited = now - w->t0;
    if (hb_has_verdict()) return 1;
    if (waited <= w->limit) return 0;
    uint64_t thaw = atomic_load(&hb.thawed_at);
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
        stall_reason(reason, who, now, c->timeout_s);
        hb_set_verdict(who, hb.rank, PT_ERR_TIMEOUT, reason);
    } else {
        fprintf(stderr,
                "partrain: mpi %s of %zu bytes timed out after %.1f s on rank %d of %d (a rank "
                "died, is unreachable or never joined); job stopped\n",
                w->op, w->bytes, c->timeout_s, c->rank, c->size);
    }
    return 1;
}

/* On the heartbeat thread, after each round. */
static void watch_check(void) {
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

static void scale(float *p, size_t n, float s) {
    for (size_t i = 0; i < n; i++) p[i] *= s;
}

/* ---- point-to-point ------------------------------------------------------------------ */

/* Tags: callers get 0..tag_ub - RESERVED_TAGS; the generic collectives'
 * negative tags (comm_generic.c, -RESERVED_TAGS..-1) map to the top of
 * MPI's range, so they never meet a caller's. */
#define RESERVED_TAGS 16

static pt_status check_p2p(mpi_ctx *c, size_t bytes, int peer, int tag, const char *op,
                           int *mpi_tag) {
    PT_CHECK(check_usable(c, op));
    PT_CHECK(check_count(c, bytes, op));
    if (peer < 0 || peer >= c->size)
        return pt_error_set(PT_ERR_INVALID,
                            "mpi %s: peer %d is not a rank of this communicator (size %d)", op,
                            peer, c->size);
    if (tag < -RESERVED_TAGS || tag > c->tag_ub - RESERVED_TAGS)
        return pt_error_set(PT_ERR_INVALID, "mpi %s: tag %d outside 0..%d", op, tag,
                            c->tag_ub - RESERVED_TAGS);
    *mpi_tag = tag >= 0 ? tag : c->tag_ub + (tag + 1); /* no overflow at INT_MAX */
    return PT_OK;
}

static pt_status mpi_send(void *ctx, const void *buf, size_t bytes, int peer, int tag) {
    mpi_ctx *c = ctx;
    int mtag = 0;
    PT_CHECK(check_p2p(c, bytes, peer, tag, "send", &mtag));
    MPI_Request req;
    pt_mpi_lock();
    int rc = MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, mtag, c->comm, &req);
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "send", peer);
    return wait_req(c, &req, "send", peer, bytes, NULL);
}

static pt_status mpi_recv(void *ctx, void *buf, size_t bytes, int peer, int tag) {
    mpi_ctx *c = ctx;
    int mtag = 0;
    PT_CHECK(check_p2p(c, bytes, peer, tag, "recv", &mtag));
    MPI_Request req;
    MPI_Status st;
    pt_mpi_lock();
    int rc = MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, mtag, c->comm, &req);
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "recv", peer);
    PT_CHECK(wait_req(c, &req, "recv", peer, bytes, &st));
    int got = 0;
    MPI_Get_count(&st, MPI_BYTE, &got);
    if ((size_t)got != bytes) {
        c->failed = 1;
        return pt_error_set(PT_ERR_COMM,
                            "mpi recv from peer rank %d (tag %d): got %d bytes, expected %zu", peer,
                            tag, got, bytes);
    }
    return PT_OK;
}

/* ---- collectives ------------------------------------------------------------------------ */

/* Ring collectives (ring.* below) from this many bytes on (and count >=
 * size): all-reduce, reduce-scatter and all-gather. PT_MPI_RING_MIN_KB
 * overrides (0: always; a huge value: never, to compare with libnbc's);
 * every rank must see the same value. */
#define PT_MPI_RING_MIN (256u << 10)
static size_t ring_min(void) {
    static long v = -1;
    if (v < 0) {
        const char *e = getenv("PT_MPI_RING_MIN_KB");
        v = e && *e ? atol(e) * 1024 : (long)PT_MPI_RING_MIN;
        if (v < 0) v = PT_MPI_RING_MIN;
    }
    return (size_t)v;
}

static int use_ring(const mpi_ctx *c, size_t count) {
    return c->size > 1 && count >= (size_t)c->size && count * sizeof(float) >= ring_min();
}

/* pt_comm_shard's rule (comm.h), restated here so the backend stands alone:
 * the first count % size ranks hold one element more. */
static void shard(size_t count, int size, int rank, size_t *off, size_t *n) {
    size_t base = count / (size_t)size, extra = count % (size_t)size, r = (size_t)rank;
    *n = base + (r < extra);
    *off = r * base + (r < extra ? r : extra);
}

/* Per-rank counts (and displacements) of a count-element buffer. */
static void fill_shards(mpi_ctx *c, size_t count) {
    for (int r = 0; r < c->size; r++) {
        size_t off, n;
        shard(count, c->size, r, &off, &n);
        c->counts[r] = (int)n;
        c->displs[r] = (int)off;
    }
}

/* One step of a ring: send n_s floats at s to the right neighbour and
 * receive n_r floats at r from the left one, both posted before either is
 * waited for (so the ring cannot deadlock). */
static pt_status ring_step(mpi_ctx *c, const char *op, const float *s, size_t n_s, float *r,
                           size_t n_r) {
    int right = (c->rank + 1) % c->size, left = (c->rank + c->size - 1) % c->size;
    MPI_Request rq[2];
    pt_mpi_lock();
    int rc = MPI_Irecv(r, (int)n_r, MPI_FLOAT, left, c->tag_ub, c->comm, &rq[0]);
    if (rc == MPI_SUCCESS)
        rc = MPI_Isend(s, (int)n_s, MPI_FLOAT, right, c->tag_ub, c->comm, &rq[1]);
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return mpi_fail(c, rc, op, -1);
    PT_CHECK(wait_req(c, &rq[0], op, left, n_r * sizeof(float), NULL));
    return wait_req(c, &rq[1], op, right, n_s * sizeof(float), NULL);
}

/* d += t; restrict: the two never overlap (t is the scratch), so the loop
 * vectorizes without a runtime overlap check. */
static void add_into(float *restrict d, const float *restrict t, size_t m) {
    for (size_t j = 0; j < m; j++) d[j] += t[j];
}

/* A reduce-scatter step of the ring: like ring_step, but the shard travels
 * in segments (at most RING_SEGS, of at least RING_SEG floats; both sides
 * cut the same count the same way, and messages of one tag arrive in
 * order), so that summing segment i overlaps receiving the next ones and
 * reads it while it is still in cache (measured: 16 MiB all-reduce 0.86x
 * Open MPI's own unsegmented, see docs/comm.md). */
#define RING_SEG  (256u << 10) /* floats: 1 MiB */
#define RING_SEGS 64
static size_t ring_seg(size_t n) {
    return n > (size_t)RING_SEG * RING_SEGS ? (n + RING_SEGS - 1) / RING_SEGS : RING_SEG;
}

static pt_status ring_reduce_step(mpi_ctx *c, const char *op, const float *s, size_t n_s,
                                  float *dst, size_t n_r) {
    int right = (c->rank + 1) % c->size, left = (c->rank + c->size - 1) % c->size;
    MPI_Request rq[RING_SEGS], sq[RING_SEGS];
    size_t gr = ring_seg(n_r), gs = ring_seg(n_s);
    int kr = (int)((n_r + gr - 1) / gr), ks = (int)((n_s + gs - 1) / gs), rc = MPI_SUCCESS;
    float *tmp = c->ring_tmp;
    pt_mpi_lock();
    for (int i = 0; i < kr && rc == MPI_SUCCESS; i++) {
        size_t o = (size_t)i * gr, m = n_r - o < gr ? n_r - o : gr;
        rc = MPI_Irecv(tmp + o, (int)m, MPI_FLOAT, left, c->tag_ub, c->comm, &rq[i]);
    }
    for (int i = 0; i < ks && rc == MPI_SUCCESS; i++) {
        size_t o = (size_t)i * gs, m = n_s - o < gs ? n_s - o : gs;
        rc = MPI_Isend(s + o, (int)m, MPI_FLOAT, right, c->tag_ub, c->comm, &sq[i]);
    }
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return mpi_fail(c, rc, op, -1);
    for (int i = 0; i < kr; i++) {
        size_t o = (size_t)i * gr, m = n_r - o < gr ? n_r - o : gr;
        PT_CHECK(wait_req(c, &rq[i], op, left, m * sizeof(float), NULL));
        add_into(dst + o, tmp + o, m);
    }
    for (int i = 0; i < ks; i++) PT_CHECK(wait_req(c, &sq[i], op, right, gs * sizeof(float), NULL));
    return PT_OK;
}

/* Reduce-scatter as a ring on point-to-point with the MPI_Test deadline:
 * in step k rank r sends shard r-k-1 and adds shard r-k-2 from its left
 * neighbour, so that after n-1 steps it holds shard r reduced, in place
 * (the other shards hold partial sums). Each shard is summed once, by one
 * chain. Every rank sends and receives (n-1)/n of the buffer: for 2 ranks
 * 3.4-5.7x the bandwidth of Open MPI's MPI_Reduce_scatter_block and of
 * its non-blocking MPI_Ireduce_scatter (libnbc) at 1-16 MiB
 * (docs/benchmarks.md). The tag is the top
 * of the reserved range (the generic collectives' -1), never in use at the
 * same time on this communicator: its operations run one at a time. */
static pt_status ring_reduce_scatter(mpi_ctx *c, const char *op, float *buf, size_t count) {
    int n = c->size, r = c->rank;
    fill_shards(c, count);
    size_t most = (size_t)c->counts[0]; /* the first shards are the largest */
    if (most > c->ring_cap) {
        /* Grows once, then reused; pt_mem_alloc puts it on huge pages (the
         * kernel's copy into it and the sum read it: 512x fewer TLB entries). */
        pt_mem_free(c->ring_tmp);
        c->ring_cap = 0;
        c->ring_tmp = pt_mem_alloc(PT_MEM_COMM, most * sizeof(float));
        if (!c->ring_tmp)
            return pt_error_set(PT_ERR_NOMEM, "mpi %s: %zu floats of scratch", op, most);
        c->ring_cap = most;
    }
    for (int k = 0; k < n - 1; k++) {
        int si = (r - k - 1 + 2 * n) % n, ri = (r - k - 2 + 2 * n) % n;
        PT_CHECK(ring_reduce_step(c, op, buf + c->displs[si], (size_t)c->counts[si],
                                  buf + c->displs[ri], (size_t)c->counts[ri]));
    }
    return PT_OK;
}

/* All-gather as a ring (shards as fill_shards left them): in step k rank r
 * passes shard r-k on and receives shard r-k-1, straight into place. */
static pt_status ring_allgather(mpi_ctx *c, const char *op, float *buf) {
    int n = c->size, r = c->rank;
    for (int k = 0; k < n - 1; k++) {
        int si = (r - k + n) % n, ri = (r - k - 1 + n) % n;
        PT_CHECK(ring_step(c, op, buf + c->displs[si], (size_t)c->counts[si], buf + c->displs[ri],
                           (size_t)c->counts[ri]));
    }
    return PT_OK;
}

/* All-reduce as the ring reduce-scatter then the ring all-gather: every
 * rank sends and receives 2 (n-1)/n of the buffer, as Open MPI's blocking
 * MPI_Allreduce does (redscat_allgather), where its non-blocking one
 * (libnbc, in place) moves the whole buffer to one rank and back. Each
 * shard is summed once and copied to all: every rank gets the bitwise same
 * result. */
static pt_status allreduce_ring(mpi_ctx *c, float *buf, size_t count) {
    PT_CHECK(ring_reduce_scatter(c, "allreduce", buf, count));
    return ring_allgather(c, "allreduce", buf);
}

static pt_status mpi_allreduce(void *ctx, float *buf, size_t count, pt_reduce_op op) {
    mpi_ctx *c = ctx;
    PT_CHECK(check_usable(c, "allreduce"));
    PT_CHECK(check_count(c, count, "allreduce"));
    if (count == 0) return PT_OK;
    int w = watch_enabled(c) ? watch_begin(c, "allreduce", count * sizeof(float)) : -1;
    if (w >= 0) {
        int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, c->comm);
        watch_end(w);
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "allreduce", -1);
    } else if (use_ring(c, count)) {
        PT_CHECK(allreduce_ring(c, buf, count));
    } else {
        MPI_Request req;
        pt_mpi_lock();
        int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, c->comm, &req);
        pt_mpi_unlock();
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "allreduce", -1);
        PT_CHECK(wait_req(c, &req, "allreduce", -1, count * sizeof(float), NULL));
    }
    if (op == PT_REDUCE_AVG && c->size > 1) scale(buf, count, 1.0f / (float)c->size);
    return PT_OK;
}

static pt_status mpi_reduce_scatter(void *ctx, float *buf, size_t count, pt_reduce_op op) {
    mpi_ctx *c = ctx;
    PT_CHECK(check_usable(c, "reduce_scatter"));
    PT_CHECK(check_count(c, count, "reduce_scatter"));
    if (count == 0) return PT_OK;
    fill_shards(c, count);
    size_t off = (size_t)c->displs[c->rank], n = (size_t)c->counts[c->rank];
    int w = watch_enabled(c) ? watch_begin(c, "reduce_scatter", count * sizeof(float)) : -1;
    if (w >= 0) {
        /* In place: the input is all of buf, the result lands at buf[0..n).
         * Even shards: the _block form, as Open MPI's own benchmarks use. */
        int rc =
            count % (size_t)c->size == 0
                ? MPI_Reduce_scatter_block(MPI_IN_PLACE, buf, c->counts[0], MPI_FLOAT, MPI_SUM,
                                           c->comm)
                : MPI_Reduce_scatter(MPI_IN_PLACE, buf, c->counts, MPI_FLOAT, MPI_SUM, c->comm);
        watch_end(w);
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "reduce_scatter", -1);
        if (off != 0 && n) memmove(buf + off, buf, n * sizeof(float));
    } else if (use_ring(c, count)) {
        PT_CHECK(ring_reduce_scatter(c, "reduce_scatter", buf, count)); /* lands in place */
    } else {
        MPI_Request req;
        pt_mpi_lock();
        int rc =
            MPI_Ireduce_scatter(MPI_IN_PLACE, buf, c->counts, MPI_FLOAT, MPI_SUM, c->comm, &req);
        pt_mpi_unlock();
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "reduce_scatter", -1);
        PT_CHECK(wait_req(c, &req, "reduce_scatter", -1, count * sizeof(float), NULL));
        if (off != 0 && n) memmove(buf + off, buf, n * sizeof(float));
    }
    if (op == PT_REDUCE_AVG && c->size > 1) scale(buf + off, n, 1.0f / (float)c->size);
    return PT_OK;
}

static pt_status mpi_allgather(void *ctx, float *buf, size_t count) {
    mpi_ctx *c = ctx;
    PT_CHECK(check_usable(c, "allgather"));
    PT_CHECK(check_count(c, count, "allgather"));
    if (count == 0) return PT_OK;
    fill_shards(c, count);
    int w = watch_enabled(c) ? watch_begin(c, "allgather", count * sizeof(float)) : -1;
    if (w >= 0) {
        int rc = count % (size_t)c->size == 0
                     ? MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c->counts[0],
                                     MPI_FLOAT, c->comm)
                     : MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c->counts, c->displs,
                                      MPI_FLOAT, c->comm);
        watch_end(w);
        return rc == MPI_SUCCESS ? PT_OK : mpi_fail(c, rc, "allgather", -1);
    }
    if (use_ring(c, count)) return ring_allgather(c, "allgather", buf);
    MPI_Request req;
    pt_mpi_lock();
    int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c->counts, c->displs,
                             MPI_FLOAT, c->comm, &req);
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "allgather", -1);
    return wait_req(c, &req, "allgather", -1, count * sizeof(float), NULL);
}

static pt_status mpi_broadcast(void *ctx, void *buf, size_t bytes, int root) {
    mpi_ctx *c = ctx;
    PT_CHECK(check_usable(c, "broadcast"));
    PT_CHECK(check_count(c, bytes, "broadcast"));
    if (root < 0 || root >= c->size)
        return pt_error_set(PT_ERR_INVALID, "mpi broadcast: root %d is not a rank (size %d)", root,
                            c->size);
    if (bytes == 0) return PT_OK;
    int w = watch_enabled(c) ? watch_begin(c, "broadcast", bytes) : -1;
    if (w >= 0) {
        int rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, c->comm);
        watch_end(w);
        return rc == MPI_SUCCESS ? PT_OK : mpi_fail(c, rc, "broadcast", -1);
    }
    MPI_Request req;
    pt_mpi_lock();
    int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, c->comm, &req);
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "broadcast", -1);
    return wait_req(c, &req, "broadcast", -1, bytes, NULL);
}

static pt_status mpi_barrier(void *ctx) {
    mpi_ctx *c = ctx;
    PT_CHECK(check_usable(c, "barrier"));
    int w = watch_enabled(c) ? watch_begin(c, "barrier", 0) : -1;
    if (w >= 0) {
        int rc = MPI_Barrier(c->comm);
        watch_end(w);
        return rc == MPI_SUCCESS ? PT_OK : mpi_fail(c, rc, "barrier", -1);
    }
    MPI_Request req;
    pt_mpi_lock();
    int rc = MPI_Ibarrier(c->comm, &req);
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "barrier", -1);
    return wait_req(c, &req, "barrier", -1, 0, NULL);
}

/* ---- communicators ------------------------------------------------------------------------ */

static pt_status ctx_new(MPI_Comm comm, int is_world, double timeout_s, mpi_ctx **out) {
    *out = NULL;
    mpi_ctx *c = calloc(1, sizeof *c);
    if (!c) return pt_error_set(PT_ERR_NOMEM, "mpi: communicator context");
    c->comm = comm;
    c->is_world = is_world;
    c->timeout_s = timeout_s;
    pt_mpi_lock();
    MPI_Comm_rank(comm, &c->rank);
    MPI_Comm_size(comm, &c->size);
    int *ub = NULL, found = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found);
    c->tag_ub = found && ub ? *ub : 32767;
    pt_mpi_unlock();
    c->counts = calloc((size_t)c->size, sizeof(int));
    c->displs = calloc((size_t)c->size, sizeof(int));
    c->world = calloc((size_t)c->size, sizeof(int));
    if (c->counts && c->displs && c->world) {
        /* members' world ranks: counts serves as the list 0..size-1 here */
        for (int i = 0; i < c->size; i++) c->counts[i] = i;
        MPI_Group g, wg;
        pt_mpi_lock();
        MPI_Comm_group(comm, &g);
        MPI_Comm_group(MPI_COMM_WORLD, &wg);
        MPI_Group_translate_ranks(g, c->size, c->counts, wg, c->world);
        MPI_Group_free(&g);
        MPI_Group_free(&wg);
        pt_mpi_unlock();
    }
    if (!c->counts || !c->displs || !c->world) {
        int n = c->size;
        free(c->counts);
        free(c->displs);
        free(c->world);
        free(c);
        return pt_error_set(PT_ERR_NOMEM, "mpi: communicator context of size %d", n);
    }
    pt_mpi_g.live++;
    *out = c;
    return PT_OK;
}

/* MPI_Comm_split and MPI_Comm_dup block until every rank arrives and have no
 * non-blocking form we can put a deadline on (MPI_Comm_idup exists, split
 * does not). So first meet in an MPI_Ibarrier with the deadline: once it
 * completes every rank has reached this call, and the split itself cannot
 * wait for a dead or missing rank. */
static pt_status mpi_split(void *ctx, int color, int key, void **out_ctx, int *rank, int *size) {
    mpi_ctx *c = ctx;
    *out_ctx = NULL;
    PT_CHECK(check_usable(c, "split"));
    if (color < 0) return pt_error_set(PT_ERR_INVALID, "mpi split: color %d must be >= 0", color);
    PT_CHECK(mpi_barrier(c));
    MPI_Comm nc;
    pt_mpi_lock();
    int rc = MPI_Comm_split(c->comm, color, key, &nc);
    if (rc == MPI_SUCCESS) MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "split", -1);
    mpi_ctx *n;
    pt_status s = ctx_new(nc, 0, c->timeout_s, &n);
    if (s != PT_OK) {
        pt_mpi_lock();
        MPI_Comm_free(&nc);
        pt_mpi_unlock();
        return s;
    }
    *out_ctx = n;
    *rank = n->rank;
    *size = n->size;
    return PT_OK;
}

static void mpi_free(void *ctx) {
    mpi_ctx *c = ctx;
    if (!c) return;
    /* A failed communicator may still have a request in flight that MPI
     * cannot cancel: leave its MPI_Comm alone rather than free it under the
     * request (and after a failure anywhere in the process, every one:
     * check_usable). */
    if (!c->failed && !pt_mpi_g.failed) {
        pt_mpi_lock();
        MPI_Comm_free(&c->comm);
        pt_mpi_unlock();
    }
    int is_world = c->is_world;
    if (is_world) hb_stop();
    free(c->counts);
    free(c->displs);
    free(c->world);
    pt_mem_free(c->ring_tmp);
    free(c);
    pt_mpi_g.live--;
    if (!is_world) return;
    pt_mpi_native_release(); /* its communicator goes before MPI */
    if (!pt_mpi_g.initialized_here || pt_mpi_g.finalized) return;
    if (pt_mpi_g.failed) {
        /* MPI_Finalize synchronizes with the other processes and would wait
         * for the dead one; exiting without it makes mpirun end the job. */
        PT_WARN("mpi: an operation failed; skipping MPI_Finalize (mpirun will end the job)");
        return;
    }
    MPI_Finalize();
    pt_mpi_g.finalized = 1;
}

/* The noticer printed the verdict (hb_set_verdict); everyone else is quiet. */
static int mpi_fault_reported(void *ctx, pt_status st) {
    (void)ctx;
    return (st == PT_ERR_TIMEOUT || st == PT_ERR_COMM) && hb_has_verdict();
}

static double mpi_set_timeout(void *ctx, double seconds) {
    mpi_ctx *c = ctx;
    double old = c->timeout_s;
    c->timeout_s = seconds;
    return old;
}

static const pt_comm_backend mpi_backend = {
    .name = "mpi",
    .send = mpi_send,
    .recv = mpi_recv,
    .allreduce = mpi_allreduce,
    .reduce_scatter = mpi_reduce_scatter,
    .allgather = mpi_allgather,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .split = mpi_split,
    .free = mpi_free,
    .set_timeout = mpi_set_timeout,
    .fault_reported = mpi_fault_reported,
    /* a receive may run beside a send or a collective on the same
     * communicator: MPI matches point-to-point by (source, tag), our
     * collectives use reserved tags, and every MPI call is either
     * MPI_THREAD_MULTIPLE's or serialized by the lock, never held across a
     * wait. A pipeline stage's receive must not wait behind its own send
     * (both on one communicator: their order differs between ranks). */
    .concurrent_p2p = 1,
};

/* Seconds of the deadline: the option, else PT_COMM_TIMEOUT, else 10. */
static pt_status timeout_of(const pt_comm_options *opt, double *out) {
    *out = PT_MPI_DEFAULT_TIMEOUT_S;
    if (opt && opt->timeout_s > 0) {
        *out = opt->timeout_s;
        return PT_OK;
    }
    const char *e = getenv("PT_COMM_TIMEOUT");
    if (e && *e) {
        char *end;
        double v = strtod(e, &end);
        if (*end || !(v > 0))
            return pt_error_set(PT_ERR_INVALID, "PT_COMM_TIMEOUT='%s': expected seconds > 0", e);
        *out = v;
    }
    return PT_OK;
}

pt_status pt_comm_mpi_world(const pt_comm_options *opt, const pt_comm_backend **be, void **ctx,
                            int *rank, int *size) {
    *be = NULL;
    *ctx = NULL;
    if (!pt_mpi_under_mpirun())
        return pt_error_set(PT_ERR_UNSUPPORTED,
                            "mpi: not started by mpirun (no OMPI_COMM_WORLD_SIZE)");
    double timeout_s;
    PT_CHECK(timeout_of(opt, &timeout_s));
    PT_CHECK(pt_mpi_start());
    /* Our own duplicate of the world, so that our traffic never matches
     * anyone else's (a library or the bench's native calls). */
    mpi_ctx tmp = {.comm = MPI_COMM_WORLD, .timeout_s = timeout_s};
    MPI_Comm_rank(MPI_COMM_WORLD, &tmp.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &tmp.size);
    PT_CHECK(mpi_barrier(&tmp));
    MPI_Comm w;
    pt_mpi_lock();
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &w);
    if (rc == MPI_SUCCESS) MPI_Comm_set_errhandler(w, MPI_ERRORS_RETURN);
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return mpi_fail(&tmp, rc, "world dup", -1);
    mpi_ctx *c;
    pt_status s = ctx_new(w, 1, timeout_s, &c);
    if (s != PT_OK) return s;
    s = hb_start(w, c->rank, c->size, timeout_s);
    if (s != PT_OK) {
        mpi_free(c);
        return s;
    }
    PT_INFO("mpi: rank %d of %d, thread level %s, timeout %.1f s", c->rank, c->size,
            pt_mpi_g.serialize ? "serialized (mutex)" : "MPI_THREAD_MULTIPLE", timeout_s);
    *be = &mpi_backend;
    *ctx = c;
    *rank = c->rank;
    *size = c->size;
    return PT_OK;
}
