/* The mpi backend: the communicator interface on Open MPI, for jobs started
 * by `mpirun -np N partrain ... --backend mpi` (one process per rank, on one
 * or many hosts). This file holds MPI's start-up (thread level), the
 * contexts (one per communicator: a dup or split of MPI_COMM_WORLD),
 * split, free (which finalizes MPI with the world), the world constructor,
 * the backend's function table and its descriptor for the registry.
 *
 * Never waits forever: MPI itself blocks indefinitely when a peer dies or
 * its host becomes unreachable (TCP just retransmits), so every blocking
 * operation is the non-blocking MPI call plus an MPI_Test loop with the
 * deadline pt_comm_options.timeout_s (or, opt-in, the blocking collective
 * under a watchdog). On expiry it returns PT_ERR_TIMEOUT naming the
 * operation (and the peer for point-to-point); the caller exits non-zero
 * and mpirun tears the job down. The communicator is then unusable (the
 * MPI request cannot be cancelled) and MPI_Finalize is skipped, as it
 * could wait for the dead peer.
 *
 * Threads: the comm.c wrappers run queued non-blocking operations on
 * progress lanes while the main thread may issue blocking ones (on other
 * communicators). We ask for MPI_THREAD_MULTIPLE; when the library
 * provides less, every MPI call of the backend goes through one
 * process-wide mutex. That is safe because no MPI call here blocks: waits
 * are MPI_Test loops that release the mutex between tests, so two threads
 * waiting on different communicators interleave instead of deadlocking.
 *
 * Not here: the operations (mpi_ops.c, mpi_ring.c), liveness and deadlines
 * (mpi_heartbeat.c, mpi_watch.c; mpi_impl.h lists the files), the
 * non-blocking queue and counters (comm.c), the generic collectives,
 * launching processes (mpirun does it). */
#include "mpi_impl.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    if (pt_knob_int("PT_MPI_SERIALIZE") == 1) pt_mpi_g.serialize = 1;
    if (pt_mpi_g.thread_level < MPI_THREAD_SERIALIZED)
        /* SINGLE or FUNNELED: even serialized, calls from the progress
         * thread are outside what the library promises. */
        PT_WARN("mpi: the MPI library provides only %s; serializing calls from all threads",
                pt_mpi_g.thread_level == MPI_THREAD_SINGLE ? "MPI_THREAD_SINGLE"
                                                           : "MPI_THREAD_FUNNELED");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    /* A peer that dies leaves its TCP sockets closed: Open MPI's next
     * write to one raises SIGPIPE, which (left at its default) ended the
     * surviving ranks of its peer's host at once, without their error or
     * flight recorder (seen across the simulated hosts). Ignored, the write
     * fails and the wait names the fault. A handler the program set stays. */
    struct sigaction sa;
    if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
    return PT_OK;
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
    PT_CHECK(pt_mpi_check_usable(c, "split"));
    if (color < 0) return pt_error_set(PT_ERR_INVALID, "mpi split: color %d must be >= 0", color);
    PT_CHECK(pt_mpi_barrier(c));
    MPI_Comm nc;
    pt_mpi_lock();
    int rc = MPI_Comm_split(c->comm, color, key, &nc);
    if (rc == MPI_SUCCESS) MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return pt_mpi_fail(c, rc, "split", -1);
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
    if (is_world) pt_mpi_hb_stop();
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
    return (st == PT_ERR_TIMEOUT || st == PT_ERR_COMM) && pt_mpi_hb_has_verdict();
}

static pt_flight_table *mpi_flight_table(void *ctx, int w) {
    (void)ctx;
    return pt_mpi_hb_table(w);
}

static int mpi_world_rank(void *ctx, int m) {
    mpi_ctx *c = ctx;
    return m >= 0 && m < c->size ? c->world[m] : -1;
}

static pt_status mpi_verdict(void *ctx, int culprit, int noticer, pt_status st,
                             const char *reason) {
    mpi_ctx *c = ctx;
    pt_mpi_hb_set_verdict(culprit, noticer, st, reason, 1); /* the noticer prints it */
    if (!pt_mpi_hb.on) { /* no heartbeat to carry it: this rank's own line */
        c->failed = 1;
        return pt_error_set(st, "%s", reason);
    }
    return pt_mpi_verdict_error(c, "check_order");
}

static double mpi_set_timeout(void *ctx, double seconds) {
    mpi_ctx *c = ctx;
    double old = c->timeout_s;
    c->timeout_s = seconds;
    return old;
}

static const pt_comm_backend mpi_backend = {
    .name = "mpi",
    .send = pt_mpi_send,
    .recv = pt_mpi_recv,
    .allreduce = pt_mpi_allreduce,
    .reduce_scatter = pt_mpi_reduce_scatter,
    .allgather = pt_mpi_allgather,
    .broadcast = pt_mpi_broadcast,
    .barrier = pt_mpi_barrier,
    .split = mpi_split,
    .free = mpi_free,
    .set_timeout = mpi_set_timeout,
    .fault_reported = mpi_fault_reported,
    .flight_table = mpi_flight_table,
    .world_rank = mpi_world_rank,
    .verdict = mpi_verdict,
    /* a receive may run beside a send or a collective on the same
     * communicator: MPI matches point-to-point by (source, tag), our
     * collectives use reserved tags, and every MPI call is either
     * MPI_THREAD_MULTIPLE's or serialized by the lock, never held across a
     * wait. A pipeline stage's receive must not wait behind its own send
     * (both on one communicator: their order differs between ranks). */
    .concurrent_p2p = 1,
};

static pt_status mpi_world(const pt_comm_options *opt, const pt_comm_backend **be, void **ctx,
                           int *rank, int *size) {
    *be = NULL;
    *ctx = NULL;
    if (!pt_mpi_under_mpirun())
        return pt_error_set(PT_ERR_UNSUPPORTED,
                            "mpi: not started by mpirun (no OMPI_COMM_WORLD_SIZE)");
    double timeout_s = pt_comm_options_resolve(opt).timeout_s; /* the deadline of every wait */
    PT_CHECK(pt_mpi_start());
    /* Our own duplicate of the world, so that our traffic never matches
     * anyone else's (a library or the bench's native calls). */
    mpi_ctx tmp = {.comm = MPI_COMM_WORLD, .timeout_s = timeout_s};
    MPI_Comm_rank(MPI_COMM_WORLD, &tmp.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &tmp.size);
    pt_mpi_g.world_rank = tmp.rank;
    comm_flight_on_term(pt_mpi_hb_on_term); /* when mpirun ends the job: who is gone */
    PT_CHECK(pt_mpi_barrier(&tmp));
    MPI_Comm w;
    pt_mpi_lock();
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &w);
    if (rc == MPI_SUCCESS) MPI_Comm_set_errhandler(w, MPI_ERRORS_RETURN);
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return pt_mpi_fail(&tmp, rc, "world dup", -1);
    mpi_ctx *c;
    pt_status s = ctx_new(w, 1, timeout_s, &c);
    if (s != PT_OK) return s;
    s = pt_mpi_hb_start(w, c->rank, c->size, timeout_s);
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

const pt_comm_backend_desc pt_comm_mpi_desc = {
    .name = "mpi", .available = pt_mpi_under_mpirun, .world = mpi_world,
    /* no world of one (shm makes it), no launcher (mpirun is), and nothing
     * allocated lazily: lazy_bytes 0 */
};
