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

/* One operation in a communicator's flight ring (flight_impl.h). The
 * issuing thread writes it, then the running thread moves state, t_start
 * and t_end; n says which operation the slot holds now. */
typedef struct {
    _Atomic uint64_t n; /* issue number (1-based), 0: empty */
    uint64_t seq;       /* #seq among the collectives, or among this rank's point-to-point */
    uint64_t bytes;
    uint64_t t_queued; /* non-blocking: when issued; blocking: 0 (= t_start) */
    _Atomic uint64_t t_start, t_end;
    int32_t op, peer, tag; /* peer: the peer of send/recv, the root of broadcast, else -1 */
    _Atomic int32_t state;
} fl_rec;

/* A communicator's flight recorder (comm_flight.c). */
typedef struct {
    uint64_t id; /* the same on every member: the world's, or mixed from the parent's at split */
    char role[FL_ROLE_MAX + 1];
    int index, sub;             /* pt_comm_set_name's index (-1 none); split number (0 none) */
    _Atomic uint64_t issued;    /* operations issued (the ring's position) */
    _Atomic uint64_t coll, p2p; /* collectives and point-to-point operations issued */
    uint64_t splits;            /* communicators split from this one */
    uint64_t ran;               /* collectives run (check_order's position) */
    pt_flight_slot *slot;       /* this communicator's slot in the rank's table; NULL: none */
    _Alignas(64) fl_rec ring[FL_RING]; /* a record a cache line */
    pt_comm *prev, *next;              /* the process's live communicators (dumps) */
    pid_t pid; /* the process that made it (a forked child skips its parent's) */
} comm_flight;

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
    comm_flight fl;   /* the flight recorder */
    int check_order;  /* pt_comm_set_check_order (comm_order.c); splits inherit it */
    float *order_buf; /* check_order's exchange: ORDER_FLOATS per member */
};

/* ---- comm.c ---- */

/* Run operation k (comm_flight_issue's number) now on the calling thread:
 * the backend's slot or the generic fallback, recorded and counted; marks
 * c broken on a comm failure. */
pt_status comm_run_op(pt_comm *c, pt_comm_op op, void *buf, size_t n, int arg, int tag, uint64_t k);
/* 1 for operations whose failure is a job fault (a peer died, stalled, or
 * stopped taking part; the job interrupted). */
int comm_job_fault(pt_status st);

/* ---- comm_flight.c: the recorder ---- */

/* c's recorder: id, name, a slot in the rank's table, on the process's
 * list. */
void comm_flight_init(pt_comm *c, uint64_t id, const char *role, int index, int sub);
/* Off the list; the slot freed, unless c failed (the others may still
 * read it: a launcher after the job). */
void comm_flight_deinit(pt_comm *c);
/* The id of the communicator split from c with `color` (the same on every
 * member of the new one). */
uint64_t comm_flight_child_id(pt_comm *c, int color);
/* Record operation op (bytes, peer or root, tag) as issued; t_queued: now
 * for a non-blocking one, 0 for a blocking one. Returns its number. */
uint64_t comm_flight_issue(pt_comm *c, int op, uint64_t bytes, int peer, int tag,
                           uint64_t t_queued);
/* Operation k began (at t) / ended (at t, with st). */
void comm_flight_start(pt_comm *c, uint64_t k, uint64_t t);
void comm_flight_end(pt_comm *c, uint64_t k, uint64_t t, pt_status st);
/* The sequence number and op of operation k (0 when it left the ring). */
uint64_t comm_flight_seq(const pt_comm *c, uint64_t k, int *op, uint64_t *bytes);
/* "dp group 1" for c. */
void comm_flight_name(const pt_comm *c, char *out, size_t len);
/* Call fn(c, arg) for every live communicator of this process, under the
 * list's lock (dumps). */
void comm_flight_each(void (*fn)(const pt_comm *c, void *arg), void *arg);

/* ---- comm_order.c: comm.check_order ---- */

/* The words that end every check_order verdict (pt_comm_fault_restartable
 * tells operations out of order from other faults by them). */
#define COMM_ORDER_MARK "(comm.check_order)"
/* Floats of check_order's exchange per member. */
#define ORDER_FLOATS 16
/* Before collective k of c: compare (group, op, bytes, #) across the
 * members; on a mismatch the job's verdict naming both ranks and both
 * operations. */
pt_status comm_order_check(pt_comm *c, uint64_t k, int op, uint64_t bytes, int arg);

/* ---- comm_fault.c: the fault-injection knob PT_FAULT ---- */

enum { FAULT_NONE, FAULT_SKIP, FAULT_HOLD };
/* At the issue of collective op on c (before it is recorded): FAULT_SKIP
 * (do not issue it), FAULT_HOLD (issue it held: comm_fault_hold), or
 * FAULT_NONE; a kill or stop happens here. Cheap when the knob is unset. */
int comm_fault_at(pt_comm *c, pt_comm_op op);
/* The held request (comm_lanes.c's comm_enqueue_held) of a swap: it runs
 * after the next operation the rank issues. */
void comm_fault_hold(pt_comm_req *req);
/* After an operation was issued (blocking: after it returned): release a
 * held request issued before it. */
void comm_fault_after(void);
/* Release the held request if it is req or belongs to c (either may be
 * NULL): before a wait on it. */
void comm_fault_release_for(pt_comm *c, pt_comm_req *req);
/* c is freed (NULL: the job failed): its (any) held request fails
 * without running (it never ran, as the recorder says). */
void comm_fault_drop_for(pt_comm *c);

/* ---- comm_lanes.c ---- */

/* c's lane fields of a new communicator (no thread starts yet). */
void comm_lanes_init(pt_comm *c);
/* Let c's queues finish, stop and join its lanes, release the fields. */
void comm_lanes_deinit(pt_comm *c);
/* Queue operation k (comm_flight_issue's number) on its lane of c
 * (starting the lane's thread on first use); *req is freed by
 * pt_comm_wait. */
pt_status comm_enqueue(pt_comm *c, pt_comm_op op, void *buf, size_t n, int arg, int tag, uint64_t k,
                       pt_comm_req **req);
/* The same, held: made but not queued until comm_release (fault
 * injection). detached: nobody waits for it (a blocking operation the
 * caller already returned from); its lane frees it once run. */
pt_status comm_enqueue_held(pt_comm *c, pt_comm_op op, void *buf, size_t n, int arg, int tag,
                            uint64_t k, int detached, pt_comm_req **req);
void comm_release(pt_comm_req *req);
/* A held request completes with PT_ERR_COMM, never run. */
void comm_drop(pt_comm_req *req);
/* A request of op on c that is complete (PT_OK) already: an operation the
 * fault knob skipped. */
pt_status comm_req_done(pt_comm *c, pt_comm_op op, pt_comm_req **req);
/* The communicator of a request. */
pt_comm *comm_req_comm(const pt_comm_req *req);
/* Wait until no non-blocking operation of c is queued or running on the
 * lanes in `mask` (bit per lane; COMM_ALL_LANES). */
void comm_drain(pt_comm *c, int mask);
/* The lanes a blocking op must wait for: all, except that with concurrent
 * send/recv a send need not wait for queued receives, nor a receive for
 * queued operations on the main lane (they use other rings). */
int comm_drain_mask(const pt_comm *c, pt_comm_op op);

#endif
