/* The communicator: the backend registry, the thin wrappers that every
 * strategy calls (argument checks, byte and time counters, the generic
 * fallback for NULL collective slots), and the progress lanes: threads of
 * each communicator that run its non-blocking operations in order.
 *
 * Not here: any algorithm (backends, comm_generic.c) or any knowledge of
 * which backend is which beyond the registry in pt_comm_init, the only place
 * with an #ifdef.
 *
 * Threading: the caller's thread and the communicator's lanes may all use a
 * communicator, never at the same time, except a send and a receive on a
 * backend with concurrent_p2p: a blocking call first waits until the
 * communicator's queue is empty (see comm_impl.h). Lanes of different
 * communicators run at the same time. */
#include "comm_impl.h"
#include "shm/shm.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Progress lanes, per communicator: lane 0 runs the communicator's queued
 * operations in order; lane 1 runs its queued receives on backends that
 * allow a send and a receive at once on a context
 * (pt_comm_backend.concurrent_p2p), so that an isend/irecv exchange of
 * messages larger than the backend buffers cannot deadlock. Each lane is a
 * thread of its own communicator, started on its first non-blocking
 * operation and joined by pt_comm_free: operations of different
 * communicators never queue behind each other (a pipeline's activation
 * send does not wait for a 4 MiB gradient bucket of another group), and no
 * order in which two ranks queue operations of two groups can deadlock. */
enum { LANE_MAIN, LANE_RECV, NLANES };

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
    int generic;              /* PT_COMM_GENERIC=1: collectives via comm_generic.c */
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

typedef enum { REQ_QUEUED, REQ_DONE } req_state;

struct pt_comm_req {
    pt_comm *c;
    pt_comm_op op;
    void *buf;
    size_t n; /* count (floats) or bytes */
    int arg;  /* op / root / peer */
    int tag;
    int lane;
    pt_status st;
    char msg[256];
    req_state state;         /* under req_mu */
    uint64_t t_start, t_end; /* pt_time_ns when the progress thread began / ended it */
    pt_comm_req *next;
};

/* ---- progress lanes: threads per communicator, started on first use ---- */

/* Completion of requests and their free list, process-wide (a request stays
 * valid for pt_comm_wait even if its communicator went first). Held only
 * for a few stores, never across an operation. Requests are recycled, so
 * that a training step's non-blocking operations allocate nothing after
 * warm-up (STYLE rule 10). */
static pthread_mutex_t req_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t req_done = PTHREAD_COND_INITIALIZER;
static pt_comm_req *req_free_list;

static pt_status run_op(pt_comm *c, pt_comm_op op, void *buf, size_t n, int arg, int tag);

static void *progress_main(void *p) {
    lane_arg *la = p;
    pt_comm *c = la->c;
    int lane = la->idx;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->head[lane] && !c->stop) pthread_cond_wait(&c->work[lane], &c->mu);
        pt_comm_req *r = c->head[lane];
        if (!r) break; /* stopped and drained */
        pthread_mutex_unlock(&c->mu);

        pt_error_clear();
        r->t_start = pt_time_ns();
        r->st = run_op(c, r->op, r->buf, r->n, r->arg, r->tag);
        r->t_end = pt_time_ns();
        if (r->st != PT_OK) snprintf(r->msg, sizeof r->msg, "%s", pt_error_message());

        /* The communicator first (its owner may free it once drained: the
         * free joins this thread, so c stays valid here), then the request
         * (its owner recycles it once done). */
        pthread_mutex_lock(&c->mu);
        c->head[lane] = r->next;
        if (!c->head[lane]) c->tail[lane] = NULL;
        if (--c->pending[lane] == 0) pthread_cond_broadcast(&c->idle);
        pthread_mutex_unlock(&c->mu);

        pthread_mutex_lock(&req_mu);
        r->state = REQ_DONE;
        pthread_cond_broadcast(&req_done);
        pthread_mutex_unlock(&req_mu);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* A child forked while a lane thread held req_mu would find it locked: make
 * it afresh there. (The parent's communicators are not usable in a child:
 * their lanes are threads of the parent; pt_comm_free knows by lane_pid.) */
static void prog_after_fork(void) {
    pthread_mutex_init(&req_mu, NULL);
    pthread_cond_init(&req_done, NULL);
}

static void prog_atfork_once(void) {
    pthread_atfork(NULL, NULL, prog_after_fork);
}

static pt_comm_req *req_get(void) {
    pthread_mutex_lock(&req_mu);
    pt_comm_req *r = req_free_list;
    if (r) req_free_list = r->next;
    pthread_mutex_unlock(&req_mu);
    return r ? r : malloc(sizeof *r);
}

static void req_put(pt_comm_req *r) {
    pthread_mutex_lock(&req_mu);
    r->next = req_free_list;
    req_free_list = r;
    pthread_mutex_unlock(&req_mu);
}

static int lane_of(const pt_comm *c, pt_comm_op op) {
    return op == PT_OP_RECV && c->be->concurrent_p2p ? LANE_RECV : LANE_MAIN;
}

/* Start c's lane thread (under c->mu). It starts with every signal blocked,
 * so that signals meant for the process (SIGINT, SIGCHLD for pt_launch)
 * reach the threads that wait for them. */
static pt_status lane_start(pt_comm *c, int lane) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, prog_atfork_once);
    c->lane[lane] = (lane_arg){c, lane};
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int e = pthread_create(&c->thread[lane], NULL, progress_main, &c->lane[lane]);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e != 0) return pt_error_set(PT_ERR_INTERNAL, "cannot start a comm progress thread (%d)", e);
    c->started[lane] = 1;
    c->lane_pid = getpid();
    return PT_OK;
}

/* Queue an operation on c's lane; the request is freed by pt_comm_wait. */
static pt_status enqueue(pt_comm *c, pt_comm_op op, void *buf, size_t n, int arg, int tag,
                         pt_comm_req **req) {
    pt_comm_req *r = req_get();
    if (!r)
        return pt_error_set(PT_ERR_NOMEM, "out of memory for a %s request", pt_comm_op_name(op));
    int lane = lane_of(c, op);
    *r = (pt_comm_req){.c = c, .op = op, .buf = buf, .n = n, .arg = arg, .tag = tag, .lane = lane};
    pthread_mutex_lock(&c->mu);
    if (!c->started[lane]) {
        pt_status st = lane_start(c, lane);
        if (st != PT_OK) {
            pthread_mutex_unlock(&c->mu);
            req_put(r);
            return st;
        }
    }
    c->pending[lane]++;
    if (c->tail[lane])
        c->tail[lane]->next = r;
    else
        c->head[lane] = r;
    c->tail[lane] = r;
    pthread_cond_signal(&c->work[lane]);
    pthread_mutex_unlock(&c->mu);
    *req = r;
    return PT_OK;
}

/* Wait until no non-blocking operation of c is queued or running on the
 * lanes in `mask` (bit per lane). */
static void drain_lanes(pt_comm *c, int mask) {
    pthread_mutex_lock(&c->mu);
    for (int l = 0; l < NLANES; l++)
        while ((mask >> l & 1) && c->pending[l] > 0) pthread_cond_wait(&c->idle, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

static void drain(pt_comm *c) {
    drain_lanes(c, (1 << NLANES) - 1);
}

/* What a blocking op waits for: everything, except that with concurrent
 * send/recv a send need not wait for queued receives, nor a receive for
 * queued operations on the main lane (they use other rings). */
static int drain_mask(const pt_comm *c, pt_comm_op op) {
    if (!c->be->concurrent_p2p) return (1 << NLANES) - 1;
    if (op == PT_OP_SEND) return 1 << LANE_MAIN;
    if (op == PT_OP_RECV) return 1 << LANE_RECV;
    return (1 << NLANES) - 1;
}

pt_status pt_comm_wait(pt_comm_req *req) {
    return pt_comm_wait_timed(req, NULL, NULL);
}

pt_status pt_comm_wait_timed(pt_comm_req *req, uint64_t *start_ns, uint64_t *end_ns) {
    if (!req) return pt_error_set(PT_ERR_INVALID, "pt_comm_wait: req is NULL");
    pthread_mutex_lock(&req_mu);
    while (req->state != REQ_DONE) pthread_cond_wait(&req_done, &req_mu);
    pthread_mutex_unlock(&req_mu);
    if (start_ns) *start_ns = req->t_start;
    if (end_ns) *end_ns = req->t_end;
    pt_status st = req->st;
    if (st != PT_OK) pt_error_set(st, "%s", req->msg);
    req_put(req);
    return st;
}

pt_status pt_comm_test(pt_comm_req *req, int *done) {
    if (!req) return pt_error_set(PT_ERR_INVALID, "pt_comm_test: req is NULL");
    if (!done) return pt_error_set(PT_ERR_INVALID, "pt_comm_test: done is NULL");
    pthread_mutex_lock(&req_mu);
    *done = req->state == REQ_DONE;
    pthread_mutex_unlock(&req_mu);
    return PT_OK;
}

/* ---- names, shards, stats ------------------------------------------------- */

const char *pt_comm_op_name(pt_comm_op op) {
    static const char *names[PT_OP_COUNT] = {
        "allreduce", "reduce_scatter", "allgather", "broadcast", "send", "recv", "barrier"};
    return (unsigned)op < PT_OP_COUNT ? names[op] : "unknown";
}

void pt_comm_shard(size_t count, int size, int rank, size_t *offset, size_t *n) {
    if (size <= 0 || rank < 0 || rank >= size) { /* no such shard: empty */
        *offset = *n = 0;
        return;
    }
    size_t q = count / (size_t)size, r = count % (size_t)size, k = (size_t)rank;
    *n = q + (k < r);
    *offset = k * q + (k < r ? k : r);
}

void pt_comm_get_stats(const pt_comm *c, pt_comm_stats *out) {
    if (!c) {
        memset(out, 0, sizeof *out);
        return;
    }
    pthread_mutex_lock((pthread_mutex_t *)&c->mu);
    *out = c->stats;
    pthread_mutex_unlock((pthread_mutex_t *)&c->mu);
}

void pt_comm_reset_stats(pt_comm *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    memset(&c->stats, 0, sizeof c->stats);
    pthread_mutex_unlock(&c->mu);
}

/* Bytes moved, counted as the algorithm-independent volumes that
 * nccl-tests' bus bandwidth uses: all-reduce 2(n-1)/n of the buffer each
 * way, reduce-scatter and all-gather (n-1)/n, broadcast the buffer once out
 * of the root and once into each other rank. */
static void count(pt_comm *c, pt_comm_op op, size_t bytes, int root, uint64_t ns) {
    uint64_t n = (uint64_t)c->size, b = bytes, sent = 0, recv = 0;
    switch (op) {
    case PT_OP_ALLREDUCE:
        sent = recv = 2 * (n - 1) * b / n;
        break;
    case PT_OP_REDUCE_SCATTER:
    case PT_OP_ALLGATHER:
        sent = recv = (n - 1) * b / n;
        break;
    case PT_OP_BROADCAST:
        if (n > 1 && c->rank == root) sent = b;
        if (n > 1 && c->rank != root) recv = b;
        break;
    case PT_OP_SEND:
        sent = b;
        break;
    case PT_OP_RECV:
        recv = b;
        break;
    default:
        break;
    }
    pthread_mutex_lock(&c->mu);
    c->stats.calls[op]++;
    c->stats.bytes_sent[op] += sent;
    c->stats.bytes_recv[op] += recv;
    c->stats.ns[op] += ns;
    pthread_mutex_unlock(&c->mu);
}

/* ---- dispatch: backend slot or generic fallback ---------------------------- */

static pt_status run_op(pt_comm *c, pt_comm_op op, void *buf, size_t n, int arg, int tag) {
    /* With generic set, only send/recv of the backend are used (testing). */
    const pt_comm_backend *be = c->generic ? &c->p2p_only : c->be;
    uint64_t t0 = pt_time_ns();
    pt_status st = PT_OK;
    size_t bytes = op == PT_OP_BROADCAST || op == PT_OP_SEND || op == PT_OP_RECV ? n : n * 4;
    switch (op) {
    case PT_OP_ALLREDUCE:
        st = be->allreduce ? be->allreduce(c->ctx, buf, n, (pt_reduce_op)arg)
                           : pt_comm_generic_allreduce(be, c->ctx, c->rank, c->size, c->scratch,
                                                       buf, n, (pt_reduce_op)arg);
        break;
    case PT_OP_REDUCE_SCATTER:
        st = be->reduce_scatter
                 ? be->reduce_scatter(c->ctx, buf, n, (pt_reduce_op)arg)
                 : pt_comm_generic_reduce_scatter(be, c->ctx, c->rank, c->size, c->scratch, buf, n,
                                                  (pt_reduce_op)arg);
        break;
    case PT_OP_ALLGATHER:
        st = be->allgather ? be->allgather(c->ctx, buf, n)
                           : pt_comm_generic_allgather(be, c->ctx, c->rank, c->size, buf, n);
        break;
    case PT_OP_BROADCAST:
        st = be->broadcast ? be->broadcast(c->ctx, buf, n, arg)
                           : pt_comm_generic_broadcast(be, c->ctx, c->rank, c->size, buf, n, arg);
        break;
    case PT_OP_SEND:
        st = be->send(c->ctx, buf, n, arg, tag);
        break;
    case PT_OP_RECV:
        st = be->recv(c->ctx, buf, n, arg, tag);
        break;
    case PT_OP_BARRIER:
        st = be->barrier ? be->barrier(c->ctx)
                         : pt_comm_generic_barrier(be, c->ctx, c->rank, c->size);
        break;
    default:
        return pt_error_set(PT_ERR_INTERNAL, "unknown comm op %d", (int)op);
    }
    if (st == PT_OK) count(c, op, bytes, arg, pt_time_ns() - t0);
    /* A failed operation leaves peers out of step: the communicator is
     * good only for pt_comm_free from here on (comm.h). */
    if (st == PT_ERR_COMM || st == PT_ERR_TIMEOUT || st == PT_ERR_INTERRUPTED)
        atomic_store(&c->broken, 1);
    return st;
}

/* ---- argument checks --------------------------------------------------------- */

static pt_status check_comm(const pt_comm *c, pt_comm_op op) {
    if (!c) return pt_error_set(PT_ERR_INVALID, "%s: communicator is NULL", pt_comm_op_name(op));
    if (atomic_load(&((pt_comm *)c)->broken))
        return pt_error_set(PT_ERR_COMM,
                            "%s: the communicator failed earlier; only pt_comm_free "
                            "is allowed",
                            pt_comm_op_name(op));
    return PT_OK;
}

static pt_status check_buf(const pt_comm *c, pt_comm_op op, const void *buf, size_t n,
                           const char *what) {
    PT_CHECK(check_comm(c, op));
    if (!buf && n > 0)
        return pt_error_set(PT_ERR_INVALID, "%s: buf is NULL with %s %zu", pt_comm_op_name(op),
                            what, n);
    if (n > SIZE_MAX / 8)
        return pt_error_set(PT_ERR_INVALID, "%s: %s %zu is too large", pt_comm_op_name(op), what,
                            n);
    return PT_OK;
}

static pt_status check_rop(pt_comm_op op, pt_reduce_op rop) {
    if (rop != PT_REDUCE_SUM && rop != PT_REDUCE_AVG)
        return pt_error_set(PT_ERR_INVALID, "%s: reduce op %d is neither SUM nor AVG",
                            pt_comm_op_name(op), (int)rop);
    return PT_OK;
}

static pt_status check_rank(const pt_comm *c, pt_comm_op op, int r, const char *what) {
    if (r < 0 || r >= c->size)
        return pt_error_set(PT_ERR_INVALID, "%s: %s %d is outside 0..%d", pt_comm_op_name(op), what,
                            r, c->size - 1);
    return PT_OK;
}

static pt_status check_args(const pt_comm *c, pt_comm_op op, const void *buf, size_t n, int arg,
                            int tag) {
    switch (op) {
    case PT_OP_ALLREDUCE:
    case PT_OP_REDUCE_SCATTER:
        PT_CHECK(check_buf(c, op, buf, n, "count"));
        return check_rop(op, (pt_reduce_op)arg);
    case PT_OP_ALLGATHER:
        return check_buf(c, op, buf, n, "count");
    case PT_OP_BROADCAST:
        PT_CHECK(check_buf(c, op, buf, n, "bytes"));
        return check_rank(c, op, arg, "root");
    case PT_OP_SEND:
    case PT_OP_RECV:
        PT_CHECK(check_buf(c, op, buf, n, "bytes"));
        PT_CHECK(check_rank(c, op, arg, "peer"));
        if (tag < 0)
            return pt_error_set(PT_ERR_INVALID, "%s: tag %d is negative (reserved)",
                                pt_comm_op_name(op), tag);
        return PT_OK;
    default:
        return check_comm(c, op);
    }
}

static pt_status blocking(pt_comm *c, pt_comm_op op, void *buf, size_t n, int arg, int tag) {
    PT_CHECK(check_args(c, op, buf, n, arg, tag));
    drain_lanes(c, drain_mask(c, op));
    return run_op(c, op, buf, n, arg, tag);
}

static pt_status nonblocking(pt_comm *c, pt_comm_op op, void *buf, size_t n, int arg, int tag,
                             pt_comm_req **req) {
    if (!req) return pt_error_set(PT_ERR_INVALID, "i%s: req is NULL", pt_comm_op_name(op));
    *req = NULL;
    PT_CHECK(check_args(c, op, buf, n, arg, tag));
    return enqueue(c, op, buf, n, arg, tag, req);
}

/* ---- public operations ---------------------------------------------------------- */

pt_status pt_comm_allreduce(pt_comm *c, float *buf, size_t count, pt_reduce_op op) {
    return blocking(c, PT_OP_ALLREDUCE, buf, count, (int)op, 0);
}
pt_status pt_comm_reduce_scatter(pt_comm *c, float *buf, size_t count, pt_reduce_op op) {
    return blocking(c, PT_OP_REDUCE_SCATTER, buf, count, (int)op, 0);
}
pt_status pt_comm_allgather(pt_comm *c, float *buf, size_t count) {
    return blocking(c, PT_OP_ALLGATHER, buf, count, 0, 0);
}
pt_status pt_comm_broadcast(pt_comm *c, void *buf, size_t bytes, int root) {
    return blocking(c, PT_OP_BROADCAST, buf, bytes, root, 0);
}
pt_status pt_comm_send(pt_comm *c, const void *buf, size_t bytes, int peer, int tag) {
    return blocking(c, PT_OP_SEND, (void *)buf, bytes, peer, tag);
}
pt_status pt_comm_recv(pt_comm *c, void *buf, size_t bytes, int peer, int tag) {
    return blocking(c, PT_OP_RECV, buf, bytes, peer, tag);
}
pt_status pt_comm_barrier(pt_comm *c) {
    return blocking(c, PT_OP_BARRIER, NULL, 0, 0, 0);
}

pt_status pt_comm_iallreduce(pt_comm *c, float *buf, size_t count, pt_reduce_op op,
                             pt_comm_req **req) {
    return nonblocking(c, PT_OP_ALLREDUCE, buf, count, (int)op, 0, req);
}
pt_status pt_comm_ireduce_scatter(pt_comm *c, float *buf, size_t count, pt_reduce_op op,
                                  pt_comm_req **req) {
    return nonblocking(c, PT_OP_REDUCE_SCATTER, buf, count, (int)op, 0, req);
}
pt_status pt_comm_iallgather(pt_comm *c, float *buf, size_t count, pt_comm_req **req) {
    return nonblocking(c, PT_OP_ALLGATHER, buf, count, 0, 0, req);
}
pt_status pt_comm_ibroadcast(pt_comm *c, void *buf, size_t bytes, int root, pt_comm_req **req) {
    return nonblocking(c, PT_OP_BROADCAST, buf, bytes, root, 0, req);
}
pt_status pt_comm_isend(pt_comm *c, const void *buf, size_t bytes, int peer, int tag,
                        pt_comm_req **req) {
    return nonblocking(c, PT_OP_SEND, (void *)buf, bytes, peer, tag, req);
}
pt_status pt_comm_irecv(pt_comm *c, void *buf, size_t bytes, int peer, int tag, pt_comm_req **req) {
    return nonblocking(c, PT_OP_RECV, buf, bytes, peer, tag, req);
}

/* ---- lifecycle and the registry ------------------------------------------------ */

size_t pt_comm_scratch_bytes(void) {
    return PT_COMM_GENERIC_PIECE * sizeof(float);
}

pt_status pt_comm_wrap(const pt_comm_backend *be, void *ctx, int rank, int size, pt_comm **out) {
    PT_ASSERT(be && out && rank >= 0 && rank < size);
    *out = NULL;
    pt_comm *c = calloc(1, sizeof *c);
    float *scratch = pt_mem_alloc(PT_MEM_COMM, pt_comm_scratch_bytes());
    if (!c || !scratch) {
        free(c);
        pt_mem_free(scratch);
        be->free(ctx);
        return pt_error_set(PT_ERR_NOMEM, "out of memory for a communicator");
    }
    c->be = be;
    c->ctx = ctx;
    c->rank = rank;
    c->size = size;
    c->scratch = scratch;
    /* PT_COMM_GENERIC=1: run every collective through the generic versions
     * on the backend's send/recv (so that tests cover them on any backend). */
    c->generic = pt_knob_int("PT_COMM_GENERIC") == 1;
    c->p2p_only = (pt_comm_backend){.name = be->name,
                                    .send = be->send,
                                    .recv = be->recv,
                                    .split = be->split,
                                    .free = be->free,
                                    .set_timeout = be->set_timeout,
                                    .fault_reported = be->fault_reported};
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->idle, NULL);
    for (int l = 0; l < NLANES; l++) pthread_cond_init(&c->work[l], NULL);
    *out = c;
    return PT_OK;
}

/* PT_COMM_TIMEOUT (seconds) overrides opt->timeout_s; <= 0 means 10 s. */
static pt_status resolve_options(const pt_comm_options *opt, pt_comm_options *o) {
    o->backend = opt && opt->backend ? opt->backend : "auto";
    o->timeout_s = opt && opt->timeout_s > 0 ? opt->timeout_s : 10.0;
    const char *env = getenv("PT_COMM_TIMEOUT");
    if (env && *env) {
        char *end;
        double t = strtod(env, &end);
        if (*end != '\0' || !(t > 0) || t > 1e6)
            return pt_error_set(PT_ERR_INVALID,
                                "PT_COMM_TIMEOUT=%s is not a number of seconds in (0, 1e6]", env);
        o->timeout_s = t;
    }
    const char *eb = getenv("PT_BACKEND");
    if ((!opt || !opt->backend || strcmp(opt->backend, "auto") == 0) && eb && *eb) o->backend = eb;
    return PT_OK;
}

pt_status pt_comm_init(pt_comm **out, const pt_comm_options *opt) {
    if (!out) return pt_error_set(PT_ERR_INVALID, "pt_comm_init: out is NULL");
    *out = NULL;
    pt_comm_options o;
    PT_CHECK(resolve_options(opt, &o));

    /* The registry, in preference order: shm (launched by pt_launch), mpi
     * (under mpirun), then a world of one. */
    static const struct {
        const char *name;
        pt_comm_backend_world world;
    } registry[] = {
        {"shm", pt_comm_shm_world},
#ifdef PT_HAVE_MPI
        {"mpi", pt_comm_mpi_world},
#endif
    };
    const int nreg = (int)(sizeof registry / sizeof registry[0]);
    int is_auto = strcmp(o.backend, "auto") == 0;
    int known = is_auto;
    for (int i = 0; i < nreg; i++) {
        if (!is_auto && strcmp(o.backend, registry[i].name) != 0) continue;
        known = 1;
        const pt_comm_backend *be = NULL;
        void *ctx = NULL;
        int rank = 0, size = 1;
        pt_status st = registry[i].world(&o, &be, &ctx, &rank, &size);
        if (st == PT_ERR_UNSUPPORTED && (is_auto || strcmp(o.backend, "shm") == 0)) continue;
        if (st != PT_OK) return st;
        PT_CHECK(pt_comm_wrap(be, ctx, rank, size, out));
        pt_log_set_rank(rank);
        PT_INFO("comm: backend %s, rank %d of %d, timeout %.3g s", be->name, rank, size,
                o.timeout_s);
        return PT_OK;
    }
    if (!known) {
        if (strcmp(o.backend, "mpi") == 0)
            return pt_error_set(PT_ERR_UNSUPPORTED,
                                "backend mpi: partrain was built without Open MPI");
        return pt_error_set(PT_ERR_INVALID, "backend \"%s\" is not one of auto, shm, mpi",
                            o.backend);
    }
    if (!is_auto && strcmp(o.backend, "shm") != 0) /* explicit, but not for this process */
        return pt_error_set(PT_ERR_UNSUPPORTED, "backend %s: %s", o.backend, pt_error_message());
    const pt_comm_backend *be = NULL;
    void *ctx = NULL;
    int rank = 0, size = 1;
    PT_CHECK(pt_comm_shm_self(&o, &be, &ctx, &rank, &size));
    PT_CHECK(pt_comm_wrap(be, ctx, rank, size, out));
    PT_INFO("comm: no launcher and no mpirun: a world of one (backend %s)", be->name);
    return PT_OK;
}

pt_status pt_comm_split(pt_comm *c, int color, int key, pt_comm **out) {
    if (!out) return pt_error_set(PT_ERR_INVALID, "split: out is NULL");
    *out = NULL;
    if (!c) return pt_error_set(PT_ERR_INVALID, "split: communicator is NULL");
    drain(c);
    void *ctx = NULL;
    int rank = 0, size = 0;
    PT_CHECK(c->be->split(c->ctx, color, key, &ctx, &rank, &size));
    return pt_comm_wrap(c->be, ctx, rank, size, out);
}

void pt_comm_free(pt_comm *c) {
    if (!c) return;
    int any = 0;
    for (int l = 0; l < NLANES; l++) any |= c->started[l];
    if (!any || c->lane_pid == getpid()) {
        /* Let the queue finish, then stop and join the lanes. (In a forked
         * child the lanes are the parent's threads: nothing to join.) */
        drain(c);
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        for (int l = 0; l < NLANES; l++) pthread_cond_signal(&c->work[l]);
        pthread_mutex_unlock(&c->mu);
        for (int l = 0; l < NLANES; l++)
            if (c->started[l]) pthread_join(c->thread[l], NULL);
    }
    c->be->free(c->ctx);
    for (int l = 0; l < NLANES; l++) pthread_cond_destroy(&c->work[l]);
    pthread_cond_destroy(&c->idle);
    pthread_mutex_destroy(&c->mu);
    pt_mem_free(c->scratch);
    free(c);
}

const pt_comm_backend *pt_comm_backend_of(const pt_comm *c) {
    return c->be;
}
void *pt_comm_ctx(const pt_comm *c) {
    return c->ctx;
}

int pt_comm_rank(const pt_comm *c) {
    return c ? c->rank : 0;
}
int pt_comm_size(const pt_comm *c) {
    return c ? c->size : 1;
}
const char *pt_comm_backend_name(const pt_comm *c) {
    return c ? c->be->name : "none";
}
void pt_comm_note_step(pt_comm *c, long step) {
    if (c && c->be->note_step) c->be->note_step(c->ctx, step);
}

int pt_comm_fault_reported(const pt_comm *c, pt_status st) {
    if (!c || st == PT_OK || !c->be->fault_reported) return 0;
    return c->be->fault_reported(c->ctx, st);
}

pt_status pt_comm_agree(pt_comm *c, pt_status local) {
    if (!c) return pt_error_set(PT_ERR_INVALID, "agree: communicator is NULL");
    int n = c->size, me = c->rank;
    if (n == 1) return local;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", local != PT_OK ? pt_error_message() : "");
    /* One slot per rank: the failed ranks and their statuses in one
     * all-reduce (statuses are small negative integers, exact in float). */
    float stack[64], *bad = n <= 64 ? stack : pt_mem_alloc(PT_MEM_COMM, (size_t)n * sizeof(float));
    pt_status e = bad ? PT_OK : pt_error_set(PT_ERR_NOMEM, "agree: %d statuses", n);
    if (bad) {
        memset(bad, 0, (size_t)n * sizeof(float));
        bad[me] = (float)-local;
        e = pt_comm_allreduce(c, bad, (size_t)n, PT_REDUCE_SUM);
    }
    int first = -1;
    for (int r = 0; e == PT_OK && r < n && first < 0; r++)
        if (bad[r] != 0.0f) first = r;
    pt_status code = first >= 0 ? (pt_status)(-(int)bad[first]) : PT_OK;
    if (bad != stack) pt_mem_free(bad);
    if (e == PT_OK && first >= 0) e = pt_comm_broadcast(c, msg, sizeof msg, first);
    if (e != PT_OK) {
        if (local == PT_OK) return e;
        return pt_error_set(local, "%s", msg); /* my own failure says more */
    }
    if (first < 0) return PT_OK;
    msg[sizeof msg - 1] = '\0';
    pt_error_set(code, "%s", msg);
    pt_error_mark_shared(); /* every rank returns this message */
    return code;
}

pt_status pt_comm_set_timeout(pt_comm *c, double seconds, double *old) {
    if (!c) return pt_error_set(PT_ERR_INVALID, "set_timeout: communicator is NULL");
    if (!(seconds > 0))
        return pt_error_set(PT_ERR_INVALID, "set_timeout: %g s is not positive", seconds);
    drain(c);
    double prev = c->be->set_timeout(c->ctx, seconds);
    if (old) *old = prev;
    return PT_OK;
}
