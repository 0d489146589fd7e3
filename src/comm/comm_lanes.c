/* The progress lanes: the threads of each communicator that run its
 * non-blocking operations in order (communicator_impl.h says why per
 * communicator and why two), their queues, and the requests that
 * pt_comm_wait / pt_comm_test complete.
 *
 * Not here: what an operation does (comm_run_op in comm.c: the backend's
 * slot or the generic fallback), argument checks (comm.c). */
#include "communicator_impl.h"

#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum { REQ_QUEUED, REQ_DONE } req_state;

struct pt_comm_req {
    pt_comm *c;
    pt_comm_op op;
    void *buf;
    size_t n; /* count (floats) or bytes */
    int arg;  /* op / root / peer */
    int tag;
    int lane;
    uint64_t k;   /* the flight recorder's number of the operation */
    int held;     /* made, not queued yet (comm_enqueue_held); under c->mu */
    int detached; /* nobody waits: the lane frees it once run */
    pt_status st;
    char msg[256];
    req_state state;         /* under req_mu */
    uint64_t t_start, t_end; /* pt_time_ns when the progress thread began / ended it */
    pt_comm_req *next;
};

/* Completion of requests and their free list, process-wide (a request stays
 * valid for pt_comm_wait even if its communicator went first). Held only
 * for a few stores, never across an operation. Requests are recycled, so
 * that a training step's non-blocking operations allocate nothing after
 * warm-up (STYLE rule 10). */
static pthread_mutex_t req_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t req_done = PTHREAD_COND_INITIALIZER;
static pt_comm_req *req_free_list;

static void req_put(pt_comm_req *r);

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
        r->st = comm_run_op(c, r->op, r->buf, r->n, r->arg, r->tag, r->k);
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

        if (r->detached) {
            req_put(r);
        } else {
            pthread_mutex_lock(&req_mu);
            r->state = REQ_DONE;
            pthread_cond_broadcast(&req_done);
            pthread_mutex_unlock(&req_mu);
        }
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

void comm_lanes_init(pt_comm *c) {
    for (int l = 0; l < NLANES; l++) pthread_cond_init(&c->work[l], NULL);
}

void comm_lanes_deinit(pt_comm *c) {
    int any = 0;
    for (int l = 0; l < NLANES; l++) any |= c->started[l];
    if (!any || c->lane_pid == getpid()) {
        /* Let the queue finish, then stop and join the lanes. (In a forked
         * child the lanes are the parent's threads: nothing to join.) */
        comm_drain(c, COMM_ALL_LANES);
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        for (int l = 0; l < NLANES; l++) pthread_cond_signal(&c->work[l]);
        pthread_mutex_unlock(&c->mu);
        for (int l = 0; l < NLANES; l++)
            if (c->started[l]) pthread_join(c->thread[l], NULL);
    }
    for (int l = 0; l < NLANES; l++) pthread_cond_destroy(&c->work[l]);
}

/* A new request for operation k of c (not queued). */
static pt_status req_make(pt_comm *c, pt_comm_op op, void *buf, size_t n, int arg, int tag,
                          uint64_t k, pt_comm_req **out) {
    pt_comm_req *r = req_get();
    if (!r)
        return pt_error_set(PT_ERR_NOMEM, "out of memory for a %s request", pt_comm_op_name(op));
    *r = (pt_comm_req){.c = c,
                       .op = op,
                       .buf = buf,
                       .n = n,
                       .arg = arg,
                       .tag = tag,
                       .lane = lane_of(c, op),
                       .k = k};
    *out = r;
    return PT_OK;
}

/* Queue r on its lane (under c->mu), starting the lane's thread on first use. */
static pt_status req_queue(pt_comm_req *r) {
    pt_comm *c = r->c;
    int lane = r->lane;
    if (!c->started[lane]) PT_CHECK(lane_start(c, lane));
    c->pending[lane]++;
    if (c->tail[lane])
        c->tail[lane]->next = r;
    else
        c->head[lane] = r;
    c->tail[lane] = r;
    pthread_cond_signal(&c->work[lane]);
    return PT_OK;
}

pt_status comm_enqueue(pt_comm *c, pt_comm_op op, void *buf, size_t n, int arg, int tag, uint64_t k,
                       pt_comm_req **req) {
    pt_comm_req *r = NULL;
    PT_CHECK(req_make(c, op, buf, n, arg, tag, k, &r));
    pthread_mutex_lock(&c->mu);
    pt_status st = req_queue(r);
    pthread_mutex_unlock(&c->mu);
    if (st != PT_OK) {
        req_put(r);
        return st;
    }
    *req = r;
    return PT_OK;
}

pt_status comm_enqueue_held(pt_comm *c, pt_comm_op op, void *buf, size_t n, int arg, int tag,
                            uint64_t k, int detached, pt_comm_req **req) {
    pt_comm_req *r = NULL;
    PT_CHECK(req_make(c, op, buf, n, arg, tag, k, &r));
    r->held = 1;
    r->detached = detached;
    *req = r;
    return PT_OK;
}

/* r completes with st and msg without running. */
static void req_fail(pt_comm_req *r, pt_status st, const char *msg) {
    snprintf(r->msg, sizeof r->msg, "%s", msg);
    r->st = st;
    if (r->detached) {
        req_put(r);
        return;
    }
    pthread_mutex_lock(&req_mu);
    r->state = REQ_DONE;
    pthread_cond_broadcast(&req_done);
    pthread_mutex_unlock(&req_mu);
}

void comm_release(pt_comm_req *r) {
    pt_comm *c = r->c;
    pthread_mutex_lock(&c->mu);
    int was = r->held;
    r->held = 0;
    pt_status st = was ? req_queue(r) : PT_OK;
    pthread_mutex_unlock(&c->mu);
    if (st != PT_OK) req_fail(r, st, pt_error_message()); /* no lane: as it would on one */
}

void comm_drop(pt_comm_req *r) {
    r->held = 0;
    char msg[128]; /* the caller's last error stays: this is teardown */
    snprintf(msg, sizeof msg, "%s: its communicator was freed while PT_FAULT held it",
             pt_comm_op_name(r->op));
    req_fail(r, PT_ERR_COMM, msg);
}

pt_status comm_req_done(pt_comm *c, pt_comm_op op, pt_comm_req **req) {
    pt_comm_req *r = NULL;
    PT_CHECK(req_make(c, op, NULL, 0, 0, 0, 0, &r));
    r->st = PT_OK;
    r->state = REQ_DONE;
    *req = r;
    return PT_OK;
}

pt_comm *comm_req_comm(const pt_comm_req *req) {
    return req->c;
}

void comm_drain(pt_comm *c, int mask) {
    pthread_mutex_lock(&c->mu);
    for (int l = 0; l < NLANES; l++)
        while ((mask >> l & 1) && c->pending[l] > 0) pthread_cond_wait(&c->idle, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

int comm_drain_mask(const pt_comm *c, pt_comm_op op) {
    if (!c->be->concurrent_p2p) return COMM_ALL_LANES;
    if (op == PT_OP_SEND) return 1 << LANE_MAIN;
    if (op == PT_OP_RECV) return 1 << LANE_RECV;
    return COMM_ALL_LANES;
}

pt_status pt_comm_wait(pt_comm_req *req) {
    return pt_comm_wait_timed(req, NULL, NULL);
}

pt_status pt_comm_wait_once(pt_comm_req **req) {
    if (!*req) return PT_OK;
    pt_status st = pt_comm_wait(*req);
    *req = NULL;
    return st;
}

pt_status pt_comm_wait_timed(pt_comm_req *req, uint64_t *start_ns, uint64_t *end_ns) {
    if (!req) return pt_error_set(PT_ERR_INVALID, "pt_comm_wait: req is NULL");
    comm_fault_release_for(NULL, req); /* a held request runs now, or never */
    /* the time blocked counts on req's communicator, read only when this
     * thread did block: it is alive while one of its operations runs (a
     * request collected after its communicator's free was done before) */
    uint64_t t0 = pt_time_ns();
    int blocked = 0;
    pthread_mutex_lock(&req_mu);
    while (req->state != REQ_DONE) blocked = 1, pthread_cond_wait(&req_done, &req_mu);
    pthread_mutex_unlock(&req_mu);
    if (blocked) {
        pthread_mutex_lock(&req->c->mu);
        req->c->stats.blocked_ns += pt_time_ns() - t0;
        pthread_mutex_unlock(&req->c->mu);
    }
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
    comm_fault_release_for(NULL, req); /* polled: a held request runs now */
    pthread_mutex_lock(&req_mu);
    *done = req->state == REQ_DONE;
    pthread_mutex_unlock(&req_mu);
    return PT_OK;
}
