/* Private to the mpi backend: the types every file of the backend shares
 * (a communicator's context, the process-wide MPI state, the heartbeat's
 * state) and the functions that cross its files (prefix pt_mpi_). Includes
 * mpi.h, so nothing outside src/comm/mpi includes this header.
 *
 * The backend's files, one job each:
 *   mpi_backend.c    MPI start-up and thread level, contexts, split, free,
 *                    the world constructor, the function table and the
 *                    registry's descriptor
 *   mpi_ops.c        each operation mapped onto its non-blocking MPI call
 *                    (or, watched, its blocking one): argument and tag
 *                    mapping, point-to-point, the collectives' entry points
 *   mpi_ring.c       the segmented ring reduce-scatter / all-gather /
 *                    all-reduce on point-to-point
 *   mpi_heartbeat.c  liveness: the heartbeat thread and the job's verdict
 *   mpi_watch.c      deadlines: the MPI_Test loop of every wait, whom a
 *                    timeout blames, the watchdog of blocking collectives
 *   mpi_native.c     Open MPI's own collectives for the benchmark
 *
 * Not here: the interface to the rest of the comm layer (comm_impl.h). */
#ifndef PT_COMM_MPI_IMPL_H
#define PT_COMM_MPI_IMPL_H

#include "comm_impl.h"
#include "ticker.h"

#include <mpi.h>
#include <stdatomic.h>
#include <stdint.h>

/* ---- mpi_backend.c: process state, start-up ---- */

typedef struct {
    int initialized_here; /* we called MPI_Init_thread, so we finalize */
    int thread_level;     /* the level MPI provided */
    int serialize;        /* 1: every MPI call under pt_mpi_lock (level < MULTIPLE) */
    int failed;           /* an operation failed: skip MPI_Finalize */
    int finalized;
    int live;       /* backend contexts not yet freed */
    int world_rank; /* this process's rank in MPI_COMM_WORLD */
} pt_mpi_state;

extern pt_mpi_state pt_mpi_g;

/* One communicator's context. */
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

/* Around every MPI call: a no-op under MPI_THREAD_MULTIPLE, else one
 * process-wide mutex (see mpi_backend.c). Never held across a wait. */
void pt_mpi_lock(void);
void pt_mpi_unlock(void);

/* 1 when this process was started by an MPI launcher (mpirun, or PMIx). */
int pt_mpi_under_mpirun(void);
/* Initialize MPI once per process (MPI_THREAD_MULTIPLE requested);
 * PT_ERR_UNSUPPORTED after MPI_Finalize. */
pt_status pt_mpi_start(void);

/* ---- mpi_ops.c: the operations ---- */

/* An MPI error code as a status with a message naming the operation (and
 * the peer, when >= 0); marks c (may be NULL) and the process failed. */
pt_status pt_mpi_fail(mpi_ctx *c, int rc, const char *op, int peer);
/* PT_ERR_COMM (or the job's verdict) once an operation failed anywhere in
 * this process: nothing enters MPI again. */
pt_status pt_mpi_check_usable(mpi_ctx *c, const char *op);
/* c->counts / c->displs := the shards of a count-element buffer. */
void pt_mpi_fill_shards(mpi_ctx *c, size_t count);
void pt_mpi_sleep_us(long us);
/* The table's slots (same contracts as comm_impl.h). */
pt_status pt_mpi_send(void *ctx, const void *buf, size_t bytes, int peer, int tag);
pt_status pt_mpi_recv(void *ctx, void *buf, size_t bytes, int peer, int tag);
pt_status pt_mpi_allreduce(void *ctx, float *buf, size_t count, pt_reduce_op op);
pt_status pt_mpi_reduce_scatter(void *ctx, float *buf, size_t count, pt_reduce_op op);
pt_status pt_mpi_allgather(void *ctx, float *buf, size_t count);
pt_status pt_mpi_broadcast(void *ctx, void *buf, size_t bytes, int root);
pt_status pt_mpi_barrier(void *ctx);

/* ---- mpi_ring.c: ring collectives on point-to-point ---- */

/* 1 when a collective of count floats on c takes the ring. */
int pt_mpi_use_ring(const mpi_ctx *c, size_t count);
/* Shard rank of buf reduced in place (the rest: partial sums); leaves
 * c->counts / c->displs filled for count. */
pt_status pt_mpi_ring_reduce_scatter(mpi_ctx *c, const char *op, float *buf, size_t count);
/* All of buf from every rank's shard (shards as c->counts / c->displs). */
pt_status pt_mpi_ring_allgather(mpi_ctx *c, const char *op, float *buf);
pt_status pt_mpi_ring_allreduce(mpi_ctx *c, float *buf, size_t count);

/* ---- mpi_heartbeat.c: liveness and the job's verdict ---- */

/* What a beat says its sender waits for, besides a world rank. */
enum { HB_IDLE = -1, HB_COLL = -2, HB_LEFT = -3 };
#define HB_REASON 176

typedef struct {
    int32_t waiting_on; /* world rank the sender waits for, or HB_IDLE / HB_COLL / HB_LEFT */
    int32_t culprit;    /* the verdict: world rank at fault, -1 none */
    int32_t noticed_by;
    int32_t st;
    char reason[HB_REASON];
    /* the sender's flight recorder progress table (its used slots): every
     * rank holds the others' as of their last beat */
    int32_t nflight, pad;
    pt_flight_snap flight[PT_FLIGHT_SLOTS];
} hb_msg;

typedef struct {
    int on;
    MPI_Comm comm;
    int rank, size;
    double live_s;
    uint64_t period_ns;
    pt_ticker tick;                  /* the heartbeat thread (ticker.h): a round every period */
    pt_flight_table *tables;         /* per peer: its progress table as of its last beat */
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
} pt_mpi_hb_state;

/* The process's heartbeat (one world per process). */
extern pt_mpi_hb_state pt_mpi_hb;

/* Start the heartbeat of a world of `size` (collective: dups the world). */
pt_status pt_mpi_hb_start(MPI_Comm world, int rank, int size, double live_s);
/* Stop beating and tell the peers this process left. */
void pt_mpi_hb_stop(void);
/* Record the job's verdict unless there is one (the noticer prints it,
 * with the laggards from the flight tables unless named: the reason names
 * the operation itself). */
void pt_mpi_hb_set_verdict(int culprit, int noticed_by, pt_status st, const char *reason,
                           int named);
/* World rank w's flight recorder table as this process knows it: its own
 * (w < 0, or this rank), a peer's as of its last beat; NULL: unknown. */
pt_flight_table *pt_mpi_hb_table(int w);
/* At SIGTERM (comm_flight_on_term): when a peer went silent (mpirun ends
 * the job because a rank died) and no verdict was printed, the lowest
 * rank still beating prints the job's line with the laggards. */
void pt_mpi_hb_on_term(void);
int pt_mpi_hb_has_verdict(void);
/* Seconds since world rank p's last beat (0 when it left). */
double pt_mpi_hb_silence(int p, uint64_t now);
/* Set a verdict when a peer's beats stopped for longer than live_s. */
void pt_mpi_hb_check_stale(void);
/* Send every peer the verdict from buffers of its own; wait until `until`
 * (pt_time_ns) at most for those sends to leave. */
void pt_mpi_hb_send_verdict(void);
void pt_mpi_hb_verdict_sent(uint64_t until);
/* The verdict's words for `who`: silent (stopped or dead) or alive but not
 * taking part within timeout_s. */
void pt_mpi_stall_reason(char reason[HB_REASON], int who, uint64_t now, double timeout_s);
/* The verdict as this process's error, naming the operation. */
pt_status pt_mpi_verdict_error(mpi_ctx *c, const char *op);

/* ---- mpi_watch.c: deadlines ---- */

/* Wait for *req with c's deadline (peer < 0 for collectives); a timeout
 * blames the rank that holds the others up. */
pt_status pt_mpi_wait_req(mpi_ctx *c, MPI_Request *req, const char *op, int peer, size_t bytes,
                          MPI_Status *st_out);
/* 1 when c's collectives take the blocking path under the watchdog. */
int pt_mpi_watch_enabled(const mpi_ctx *c);
/* Around a blocking collective: a slot the watchdog checks. */
int pt_mpi_watch_begin(mpi_ctx *c, const char *op, size_t bytes);
void pt_mpi_watch_end(int slot);
/* On the heartbeat thread after each round: end the process when a
 * watched collective can no longer complete. */
void pt_mpi_watch_check(void);

/* mpi_native.c: free its communicator; called before MPI_Finalize. */
void pt_mpi_native_release(void);

#endif
