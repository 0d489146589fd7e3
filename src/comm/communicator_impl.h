/* Private to the comm layer's core: the communicator object, shared by the
 * wrappers (comm.c) and the progress lanes (comm_lanes.c), and the
 * functions that cross those two files (prefix comm_). Backends never see
 * it: they get a context of their own (comm_impl.h).
 *
 * Progress lanes, per communicator: lane 0 runs the communicator's queued
 * operations in order; lane 1 runs its queued receives on backends that
 * allow a send and a receive at once on a context
 * (pt_comm_backend.concurrent_p2p), so that an isend/irecv exchange of
 * messages larger than the backend buffers cannot deadlock. Each lane is a
 * thread of its own communicator, started on its first non-blocking
 * operation and joined by pt_comm_free: operations of different
 * communicators never queue behind each other (a pipeline's activation
 * send does not wait for a 4 MiB gradient bucket of another group), and no
 * order in which two ranks queue operations of two groups can deadlock.
 *
 * Threading: the caller's thread and the communicator's lanes may all use a
 * communicator, never at the same time, except a send and a receive on a
 * backend with concurrent_p2p: a blocking call first waits until the
 * lanes it could collide with are idle (comm_drain_mask). Lanes of
 * different communicators run at the same time. */
#ifndef PT_COMM_COMMUNICATOR_IMPL_H
#define PT_COMM_COMMUNICATOR_IMPL_H

#include "comm_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

enum { LANE_MAIN, LANE_RECV, NLANES };
#define COMM_ALL_LANES ((1 << NLANES) - 1)

typedef struct {
    pt_comm *c;
    int idx;
} lane_arg;

struct pt_comm {
    const pt_comm_backend *be;
    void *ctx;
    int rank, size;
    float *scratch; /* PT_COMM_GENERIC_PIECE floats for the generic collectives */
    pthread_mutex_t mu;
    pthread_cond_t idle;      /* signalled when a lane's pending count drops to 0 */
    int pending[NLANES];      /* queued or running non-blocking operations per lane */
    pt_comm_stats stats;      /* under mu */
    int generic;              /* knob PT_COMM_GENERIC=1: collectives via comm_generic.c */
    atomic_int broken;        /* an operation failed: only pt_comm_free is allowed */
    pt_comm_backend p2p_only; /* be without its collective slots */
    /* The lanes (under mu): queue, wake-up, thread, and the process that
     * started the threads (a forked child has none of them). */
    pthread_cond_t work[NLANES];
    pt_comm_req *head[NLANES], *tail[NLANES];
    pthread_t thread[NLANES];
    int started[NLANES];
    int stop; /* pt_comm_free: lanes exit once their queue is empty */
    pid_t lane_pid;
    lane_arg lane[NLANES];
};

/* ---- comm.c ---- */

/* Run one operation now on the calling thread: the backend's slot or the
 * generic fallback; counts it, and marks c broken on a comm failure. */
pt_status comm_run_op(pt_comm *c, pt_comm_op op, void *buf, size_t n, int arg, int tag);

/* ---- comm_lanes.c ---- */

/* c's lane fields of a new communicator (no thread starts yet). */
void comm_lanes_init(pt_comm *c);
/* Let c's queues finish, stop and join its lanes, release the fields. */
void comm_lanes_deinit(pt_comm *c);
/* Queue an operation on its lane of c (starting the lane's thread on first
 * use); *req is freed by pt_comm_wait. */
pt_status comm_enqueue(pt_comm *c, pt_comm_op op, void *buf, size_t n, int arg, int tag,
                       pt_comm_req **req);
/* Wait until no non-blocking operation of c is queued or running on the
 * lanes in `mask` (bit per lane; COMM_ALL_LANES). */
void comm_drain(pt_comm *c, int mask);
/* The lanes a blocking op must wait for: all, except that with concurrent
 * send/recv a send need not wait for queued receives, nor a receive for
 * queued operations on the main lane (they use other rings). */
int comm_drain_mask(const pt_comm *c, pt_comm_op op);

#endif
