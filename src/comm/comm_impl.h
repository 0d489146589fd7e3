/* Private to the comm layer: a backend is a static const table of functions
 * plus an opaque context (STYLE rule 3). Only the wrappers in comm.c call the
 * table: they check arguments, count bytes and time, queue non-blocking
 * operations on the communicator's progress lanes, and supply the generic fallback
 * (comm_generic.c, built on send/recv) for every NULL collective slot.
 *
 * A backend is correct as soon as send/recv are: every collective slot is
 * optional. Timeouts are the backend's job (it knows how to notice a dead
 * peer); it reports them as PT_ERR_TIMEOUT/PT_ERR_COMM with a message that
 * names the peer and the operation.
 *
 * Threading contract: a context may be used by several threads of its
 * process, the caller's thread and its communicator's progress lanes (each
 * communicator has its own, comm.c), but never by two at once on the SAME
 * communicator: the wrappers drain a communicator's queue before a blocking
 * call and run its queued operations one at a time. (Exception, opt-in: a
 * backend with concurrent_p2p = 1 also gets recv calls from the
 * communicator's second lane while send or a collective runs on the
 * context.) Different communicators (the world and any number of splits)
 * may all be in operations at the same moment from different threads, so a
 * backend must keep per-communicator state per context and make shared
 * process state thread-safe (the mpi backend asks for MPI_THREAD_MULTIPLE,
 * or serializes without ever holding its lock across a wait).
 *
 * Tags: user tags are >= 0; the generic collectives use negative tags. */
#ifndef PT_COMM_IMPL_H
#define PT_COMM_IMPL_H

#include "flight_impl.h"
#include "partrain/comm.h"

typedef struct pt_comm_backend {
    const char *name;

    /* Required. Blocking point-to-point of bytes with a peer rank of this
     * communicator; ordered per (peer, tag). */
    pt_status (*send)(void *ctx, const void *buf, size_t bytes, int peer, int tag);
    pt_status (*recv)(void *ctx, void *buf, size_t bytes, int peer, int tag);

    /* Optional collectives (NULL: generic version on send/recv). Same
     * contracts as the public functions in comm.h. */
    pt_status (*allreduce)(void *ctx, float *buf, size_t count, pt_reduce_op op);
    pt_status (*reduce_scatter)(void *ctx, float *buf, size_t count, pt_reduce_op op);
    pt_status (*allgather)(void *ctx, float *buf, size_t count);
    pt_status (*broadcast)(void *ctx, void *buf, size_t bytes, int root);
    pt_status (*barrier)(void *ctx);

    /* Required. New context for the sub-communicator of (color, key);
     * collective over the parent. Sets *rank and *size of the new one. */
    pt_status (*split)(void *ctx, int color, int key, void **out_ctx, int *rank, int *size);

    /* Required. Release the context (the communicator is idle). */
    void (*free)(void *ctx);

    /* Optional (NULL: ignored). The caller's training step, so that a
     * failure report can say at which step a rank was. */
    void (*note_step)(void *ctx, long step);

    /* Required. Seconds before a silent peer is an error, from the next
     * operation on (the communicator is idle); returns the previous value. */
    double (*set_timeout)(void *ctx, double seconds);

    /* Optional (NULL: 0). pt_comm_fault_reported's answer for status st. */
    int (*fault_reported)(void *ctx, pt_status st);

    /* Optional (NULL: 1). pt_comm_claim_error_line's answer. */
    int (*claim_error_line)(void *ctx);

    /* Optional (NULL: the core keeps this rank's progress table in process
     * memory, and failure messages know only this rank's progress). The
     * flight recorder's progress table of world rank w (flight_impl.h),
     * readable by this process, w = -1 this rank's own (where the core
     * writes): shm, every rank's in the arena; mpi, this rank's own and the
     * copies its peers' heartbeats bring. NULL when w's is unknown. */
    pt_flight_table *(*flight_table)(void *ctx, int w);

    /* Optional (NULL: member m is world rank m). The world rank of member
     * m of this communicator. */
    int (*world_rank)(void *ctx, int m);

    /* Optional (NULL: the caller's own error only). Make `reason` (about
     * world rank culprit) the job's verdict, unless a fault was decided
     * first, so that every rank stops with one line naming the culprit;
     * returns this rank's error (the job's verdict). noticer: the world
     * rank that says it (every member of a group may decide alike at once:
     * one of them speaks). The core's own findings (comm.check_order) use
     * it. */
    pt_status (*verdict)(void *ctx, int culprit, int noticer, pt_status st, const char *reason);

    /* 1: recv may run on a context while another thread runs send or a
     * collective on it (shm: separate rings per direction). The wrappers
     * then run queued receives on a second progress thread, so an
     * isend/irecv exchange of messages larger than the backend's buffers
     * progresses. 0 (default): one operation per context at a time. */
    int concurrent_p2p;
} pt_comm_backend;

/* Wrap a backend context into a communicator (for constructors outside the
 * registry, e.g. pt_comm_shm_attach). The communicator owns ctx from here on,
 * also on failure (be->free is called). */
pt_status pt_comm_wrap(const pt_comm_backend *be, void *ctx, int rank, int size, pt_comm **out);
/* The backend and context of c (for a backend's own queries and tests). */
const pt_comm_backend *pt_comm_backend_of(const pt_comm *c);
void *pt_comm_ctx(const pt_comm *c);

/* Generic collectives on send/recv (comm_generic.c), used by the wrappers for
 * NULL slots. scratch holds PT_COMM_GENERIC_PIECE floats, owned by the
 * communicator: the generic versions allocate nothing per call. */
#define PT_COMM_GENERIC_PIECE 16384
pt_status pt_comm_generic_reduce_scatter(const pt_comm_backend *be, void *ctx, int rank, int size,
                                         float *scratch, float *buf, size_t count, pt_reduce_op op);
pt_status pt_comm_generic_allgather(const pt_comm_backend *be, void *ctx, int rank, int size,
                                    float *buf, size_t count);
pt_status pt_comm_generic_allreduce(const pt_comm_backend *be, void *ctx, int rank, int size,
                                    float *scratch, float *buf, size_t count, pt_reduce_op op);
pt_status pt_comm_generic_broadcast(const pt_comm_backend *be, void *ctx, int rank, int size,
                                    void *buf, size_t bytes, int root);
pt_status pt_comm_generic_barrier(const pt_comm_backend *be, void *ctx, int rank, int size);

/* ---- the registry (comm_registry.c) -------------------------------------------
 * A backend offers itself to the rest of partrain through one descriptor:
 * its name, whether this process belongs to one of its jobs, its world
 * constructor, and the optional launcher and planner query. The registry
 * lists the descriptors in preference order (shm before mpi); it is the
 * only place that knows which backends exist (and the only #ifdef). */
typedef struct pt_comm_backend_desc {
    const char *name;

    /* Required. 1 when this process was started as a rank of one of this
     * backend's jobs (shm: forked by pt_launch; mpi: under mpirun): the
     * `auto` choice takes the first backend for which it is 1. */
    int (*available)(void);

    /* Required. The world communicator of this process: the table, a new
     * context, this rank and the size. opt is resolved
     * (pt_comm_options_resolve). PT_ERR_UNSUPPORTED, with a message saying
     * why, when the process is not one of its ranks. */
    pt_status (*world)(const pt_comm_options *opt, const pt_comm_backend **be, void **ctx,
                       int *rank, int *size);

    /* Optional (NULL: none). A world of one in this process, for a process
     * that no launcher started; the registry uses the first backend's. */
    pt_status (*self)(const pt_comm_options *opt, const pt_comm_backend **be, void **ctx, int *rank,
                      int *size);

    /* Optional (NULL: the backend cannot start ranks itself). pt_launch_job's
     * work (comm.h), for the first backend that has it. */
    pt_status (*launch)(int nproc, pt_rank_main fn, void *arg, const pt_comm_options *opt,
                        pt_launch_result *res);

    /* Optional (NULL: 0). pt_comm_lazy_bytes' answer (comm.h): bytes of
     * PT_MEM_COMM a communicator of `size` ranks adds at its first
     * collective `op` of `bytes` bytes. */
    size_t (*lazy_bytes)(int size, pt_comm_op op, size_t bytes);
} pt_comm_backend_desc;

extern const pt_comm_backend_desc pt_comm_shm_desc; /* shm/shm.c */
extern const pt_comm_backend_desc pt_comm_mpi_desc; /* mpi/mpi_backend.c, with Open MPI only */

/* Seconds before a silent peer is an error when the options say nothing. */
#define PT_COMM_DEFAULT_TIMEOUT_S 10.0
/* opt (NULL: all defaults) with every field filled in: backend "auto" for
 * NULL, timeout_s PT_COMM_DEFAULT_TIMEOUT_S for <= 0. The one place that
 * decides them: the backends take the resolved values. */
pt_comm_options pt_comm_options_resolve(const pt_comm_options *opt);

#endif
