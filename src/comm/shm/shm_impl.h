/* Private to the shm backend: the arena's layout, the types every file of
 * the backend shares, and the functions that cross its files (prefix shm_).
 *
 * Arena (one mapping per job: anonymous MAP_SHARED made by the launcher
 * before fork, or a named 0600 segment for pt_comm_shm_attach):
 *
 *   [job header: per-rank state, pid, current op, step, heartbeat, whom it
 *    waits for, first error; abort word and verdict; futex word; bump
 *    pointer and free extents] [world region] [regions of sub-communicators ...]
 *
 * A region (one per communicator, made by the lowest member at split time
 * from the pool: a freed extent that fits, else the bump pointer; when the
 * last member frees it, its pages go back with MADV_REMOVE and its range to
 * the pool) holds, for its n members:
 *   ctl[n]          384 bytes per member: its sync flag (an epoch
 *                   counter), the pipelined all-reduce's counters, the
 *                   split fields, the single-copy buffer address
 *   stage[n][2]     two halves of PT_SHM_STAGE_KB per member: the
 *                   staging buffers of the collectives (double buffered)
 *   ring[n][n]      a byte ring per ordered pair (ring_bytes_for(n))
 *                   (send/recv), head and tail on their own cache lines
 *
 * The backend's files, one job each:
 *   shm_region.c     the arena: layout, jobs (anonymous or named), the
 *                    launcher's view of a job, the sub-communicator pool
 *   shm_wait.c       waking and waiting: futex, liveness, verdicts, sync
 *   shm_coll.c       reductions, the staged collectives, the backend's
 *                    collective entry points (which algorithm runs)
 *   shm_pipe.c       the pipelined all-reduce
 *   shm_cma.c        single-copy (cross-memory attach) collectives
 *   shm_p2p.c        send/recv through the byte rings
 *   shm_heartbeat.c  the rank's heartbeat thread
 *   shm.c            contexts, split, free, world constructors, the
 *                    backend's function table
 *   shm_launch.c     the launcher (uses shm.h only)
 *
 * Not here: the interface to the rest of the comm layer (shm.h). */
#ifndef PT_COMM_SHM_IMPL_H
#define PT_COMM_SHM_IMPL_H

#include "shm.h"

#include <stdatomic.h>
#include <stdint.h>

/* Bytes of each send/recv ring: a send that fits completes without the
 * receiver (eager), a larger one waits for it. 1 MiB covers pipeline
 * activations of small models; address space is n^2 rings per region, so
 * large jobs get smaller rings (pages are touched only when used). */
static inline size_t ring_bytes_for(int n) {
    return n <= 16 ? (size_t)1 << 20 : (size_t)128 << 10;
}
#define OP_SPLIT PT_OP_COUNT /* op code of split, for messages */

enum { RANK_NONE = 0, RANK_RUNNING, RANK_EXITED, RANK_FAILED };
enum { ABORT_NONE = 0, ABORT_DIED, ABORT_INTERRUPTED, ABORT_FAULT };
/* shm_rank_info.beat of a rank that has no heartbeat any more (its world was
 * freed): never stale. 0: not started yet, not checked either. */
#define BEAT_OFF UINT64_MAX
/* Free extents of the sub-communicator pool (reused by later splits). */
#define PT_SHM_FREE_MAX 256

/* All-reduce at or below this many bytes uses the one-sync algorithm
 * (shm_coll.c). */
#define PT_SHM_SMALL (16u << 10)

typedef struct {
    _Atomic int state;
    _Atomic int wstatus;
    _Atomic int pid;
    _Atomic int cur_op;
    _Atomic int last_op;
    _Atomic long step;
    /* Liveness, separate from progress: the rank's heartbeat thread stores
     * pt_time_ns() here every beat period, whatever its main thread does
     * (a slow disk write is alive, a SIGSTOPped process is not). */
    _Atomic uint64_t beat;
    _Atomic int waiting_on; /* world rank one of its threads waits for, -1 none */
    char err[224];          /* the rank's first comm error, for the launcher's summary */
} shm_rank_info;

typedef struct {
    uint64_t off, bytes;
} shm_extent;

struct pt_shm_job {
    uint32_t magic;
    int nranks;
    uint64_t total;
    double timeout_s;
    uint64_t stage_bytes; /* staging half of every region */
    uint64_t world_off;
    _Atomic uint64_t next_off; /* bump pointer for sub-communicator regions */
    _Atomic int pool_lock;     /* spin lock of the free extents below */
    int nfree;
    shm_extent free_ext[PT_SHM_FREE_MAX]; /* freed regions, reused by split */
    _Atomic int aborted;
    _Atomic int dead_rank;
    /* The job's verdict on a fault a rank noticed (a stalled or silent
     * rank): the first to notice writes it (verdict_lock) and then sets
     * aborted = ABORT_FAULT, so that every wait of every rank returns it. */
    _Atomic int verdict_lock;
    int culprit, noticed_by, verdict_st;
    int verdict_named; /* the verdict names the operation itself (comm.check_order) */
    char verdict[320];
    /* The world rank that prints the job's error line (the first to claim
     * it, pt_comm_claim_error_line), -1 while none has. */
    _Atomic int error_line;
    char pad1[64];
    _Atomic uint32_t futex; /* bumped and woken when a sleeper may care */
    _Atomic int sleepers;
    char pad2[64];
    shm_rank_info ranks[PT_SHM_MAX_RANKS];
    /* Every rank's flight recorder progress table (flight_impl.h): the
     * launcher names the laggards from them after the job. */
    pt_flight_table flight[PT_SHM_MAX_RANKS];
};

typedef struct {
    int n;
    _Atomic int refs;
    uint64_t stage_bytes, ring_bytes;
    int world_rank[PT_SHM_MAX_RANKS];
} shm_region;

/* The member's counters, each on its own line: the owner writes, the others
 * poll, and a poll of one counter must not stall the owner's next post. */
typedef struct {
    _Atomic uint64_t flag; /* syncs done (epoch) */
    char pad[56];
    _Atomic uint64_t staged; /* pipelined all-reduce: chunks staged, */
    char pad3[56];
    _Atomic uint64_t reduced; /* chunks reduced (my result slice is in my slot), */
    char pad4[56];
    _Atomic uint64_t done; /* chunks copied out (I no longer read others' slots) */
    char pad5[56];
    int split_color, split_key;
    uint64_t split_off;
    char pad2[48];
    void *cma_addr; /* single-copy collectives: my buffer (my address space), */
    int cma_ok;     /* and whether I can reach every member's memory */
    char pad6[52];
} shm_ctl;

typedef struct {
    _Atomic uint64_t head;
    char pad[56];
    _Atomic uint64_t tail;
    char pad2[56];
} shm_ring;

/* This process's mapping of the arena, shared by its communicators. */
typedef struct {
    pt_shm_job *job;
    size_t total;
    _Atomic int refs;
} shm_map;

typedef struct shm_unexpected shm_unexpected;

typedef struct {
    shm_map *map;
    pt_shm_job *job;
    shm_region *reg;
    uint64_t reg_off;
    shm_ctl *ctl;
    char *stage;
    char *rings;
    int rank, n, wrank;
    double timeout_s; /* progress: a live peer that does not take part (pt_comm_set_timeout) */
    double live_s;    /* liveness: a peer without a heartbeat (the job's comm timeout) */
    uint64_t spin_ns; /* most spinning per wait */
    _Atomic uint64_t spin_cur; /* current spin budget (adaptive) */
    uint64_t epoch;            /* syncs done */
    uint64_t round;            /* rounds done: selects the staging half */
    uint64_t chunks;           /* chunks of pipelined all-reduces done */
    size_t pipe_c, pipe_q;     /* floats per slice and slots of a pipelined chunk */
    uint64_t want;             /* epoch being waited for */
    int scan;                  /* first member not yet seen at `want` */
    int is_world;
    int launched;   /* under pt_launch: its summary line reports job faults */
    int cma;        /* single-copy collectives: 0 not probed yet, 1 on, -1 off */
    size_t cma_min; /* bytes from which collectives go single-copy */
    size_t cma_c;   /* floats per chunk */
    float *cma_tmp; /* n-1 chunks: the peers' slices being reduced */
    int cma_pid[PT_SHM_MAX_RANKS];
    void *cma_buf[PT_SHM_MAX_RANKS];              /* this op's buffer of each member */
    shm_unexpected *unexpected[PT_SHM_MAX_RANKS]; /* per peer, in arrival order */
} shm_ctx;

static inline size_t round_up(size_t x, size_t a) {
    return (x + a - 1) / a * a;
}

/* ---- region layout (the staging half per member: shm_region.c) ---- */

static inline size_t ctl_off(void) {
    return round_up(sizeof(shm_region), 64);
}
static inline size_t stage_off(int n) {
    return round_up(ctl_off() + (size_t)n * sizeof(shm_ctl), 4096);
}
static inline size_t ring_stride(int n) {
    return sizeof(shm_ring) + ring_bytes_for(n);
}
static inline size_t ring_off(int n, size_t stage) {
    return stage_off(n) + (size_t)n * 2 * stage;
}
static inline size_t region_size(int n, size_t stage) {
    return round_up(ring_off(n, stage) + (size_t)n * n * ring_stride(n), 4096);
}

static inline char *stage_of(const shm_ctx *x, int member, int half) {
    return x->stage + ((size_t)member * 2 + (size_t)half) * x->reg->stage_bytes;
}
static inline shm_ring *ring_of(const shm_ctx *x, int src, int dst) {
    return (shm_ring *)(x->rings + ((size_t)src * x->n + (size_t)dst) * ring_stride(x->n));
}

/* ---- shm_region.c: jobs and the pool ---- */

/* PT_ERR_INVALID unless 1 <= nranks <= PT_SHM_MAX_RANKS. */
pt_status shm_check_nranks(int nranks);
/* Map the named segment of a job of `size` ranks (pt_comm_shm_attach);
 * *job is unmapped again on failure. */
pt_status shm_job_map_named(const char *name, int size, pt_shm_job **job);
/* Publish rank's pid and mark it running (its peers check on it). */
void shm_job_mark_running(pt_shm_job *job, int rank, int pid);
/* Offset of `need` bytes for a new region, 0 when the arena is full. */
uint64_t shm_pool_take(pt_shm_job *job, uint64_t need);
/* Give a freed region's range back to the pool. */
void shm_pool_give(pt_shm_job *job, uint64_t off, uint64_t bytes);

/* ---- shm_wait.c: waking, waiting, verdicts, sync ---- */

/* Bump the job's futex word and wake every sleeper. */
void shm_wake_all(pt_shm_job *job);
/* After publishing a flag or a ring pointer: wake sleepers, if any. The
 * fence pairs with the one in shm_wait_until (a sleeper either sees the new
 * value or is seen here). Inline: every post of every collective runs it. */
static inline void shm_wake(shm_ctx *x) {
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&x->job->sleepers, memory_order_relaxed) > 0) shm_wake_all(x->job);
}
/* The operation's name for messages (split included). */
const char *shm_op_name(int op);
/* "rank 2" or "rank 1 (world rank 5)". */
void shm_name_member(const shm_ctx *x, int m, char *out, size_t len);
/* Error for a job the launcher (or a verdict) stopped, or PT_OK. op < 0:
 * none to name. */
pt_status shm_check_abort(shm_ctx *x, int op);
/* Make `reason` (about world rank culprit) the job's verdict unless a fault
 * was decided first, and return the job's verdict as this rank's error.
 * named: the reason names the operation itself (no flight analysis is
 * added to the launcher's line). */
pt_status shm_verdict(shm_ctx *x, int culprit, pt_status st, int op, const char *reason, int named);
/* Error when member m is gone (exited, or its pid vanished), else PT_OK. */
pt_status shm_check_peer(shm_ctx *x, int m, int op);
/* -1 when the wait is over, else the member being waited for. */
typedef int (*shm_pending_fn)(shm_ctx *x, const void *arg);
/* Wait (spin, yield, sleep) until pending() returns -1, watching for
 * aborts, dead or silent peers and the progress timeout. */
pt_status shm_wait_until(shm_ctx *x, shm_pending_fn pending, const void *arg, int op);
/* Barrier of the communicator's members (one epoch). */
pt_status shm_sync_all(shm_ctx *x, int op);

/* The rank's current operation, for the launcher's summary line. */
static inline void shm_op_begin(shm_ctx *x, int op) {
    atomic_store_explicit(&x->job->ranks[x->wrank].cur_op, op, memory_order_relaxed);
}
/* End of an operation with status st (returned); keeps the first error. */
static inline pt_status shm_op_end(shm_ctx *x, int op, pt_status st) {
    shm_rank_info *ri = &x->job->ranks[x->wrank];
    if (st != PT_OK && ri->err[0] == '\0')
        snprintf(ri->err, sizeof ri->err, "%s", pt_error_message());
    atomic_store_explicit(&x->job->ranks[x->wrank].last_op, op, memory_order_relaxed);
    atomic_store_explicit(&x->job->ranks[x->wrank].cur_op, -1, memory_order_relaxed);
    return st;
}

/* ---- shm_coll.c: reductions and the collective entry points ---- */

/* dst[0:k] = sum over j of src[j][0:k] in order j = 0..n-1 (divided by n
 * for AVG); dst may be one of the sources (element-wise in place). */
void shm_reduce_into(float *dst, const float *const *src, int n, size_t k, int avg);
pt_status shm_allreduce(void *ctx, float *buf, size_t count, pt_reduce_op op);
pt_status shm_reduce_scatter(void *ctx, float *buf, size_t count, pt_reduce_op op);
pt_status shm_allgather(void *ctx, float *buf, size_t count);
pt_status shm_broadcast(void *ctx, void *buf, size_t bytes, int root);
pt_status shm_barrier(void *ctx);

/* ---- shm_pipe.c: the pipelined all-reduce ---- */

/* Slice and slots of x's pipelined chunks (x->pipe_c, x->pipe_q). */
void shm_pipe_shape(shm_ctx *x);
pt_status shm_pipe_allreduce(shm_ctx *x, float *buf, size_t count, int avg);

/* ---- shm_cma.c: single-copy collectives ---- */

/* Threshold and chunk of x's single-copy collectives (x->cma_min, cma_c). */
void shm_cma_shape(shm_ctx *x);
/* `want` (the same on every member): this call would go single-copy. Post
 * my buffer and learn the others'; *use: go single-copy (else the staged
 * algorithm, on every member alike). */
pt_status shm_cma_enter(shm_ctx *x, void *buf, int want, int op, int *use);
/* After shm_cma_enter said *use: reduce-scatter (gather 0) or all-reduce. */
pt_status shm_cma_reduce(shm_ctx *x, float *buf, size_t count, int avg, int gather, int op);
pt_status shm_cma_allgather(shm_ctx *x, float *buf, size_t count);
pt_status shm_cma_broadcast(shm_ctx *x, char *buf, size_t bytes, int root);
/* The descriptor's lazy_bytes: the chunk scratch a communicator of `size`
 * allocates at its first single-copy collective (0 when op of `bytes`
 * takes the staged path). */
size_t shm_lazy_bytes(int size, pt_comm_op op, size_t bytes);

/* ---- shm_p2p.c: send/recv ---- */

pt_status shm_send(void *ctx, const void *buf, size_t bytes, int peer, int tag);
pt_status shm_recv(void *ctx, void *buf, size_t bytes, int peer, int tag);
/* Free the messages x set aside for later recvs. */
void shm_p2p_free(shm_ctx *x);

/* ---- shm_heartbeat.c ---- */

/* Start beating for world rank wrank of job (jobs of 2+ ranks; once per
 * process). */
pt_status shm_hb_start(pt_shm_job *job, int wrank, double live_s);
/* Stop the heartbeat if it beats for ri (its world is freed). */
void shm_hb_stop(const shm_rank_info *ri);

#endif
