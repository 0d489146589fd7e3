/* Fault injection for tests: the debugging knob PT_FAULT makes one rank
 * misbehave at one collective, so that the failure paths (laggards named,
 * flight dumps, check_order, restarts) can be tested in real jobs:
 *
 *   PT_FAULT=ACTION:rank=R:group=G:seq=N   (group defaults to world)
 *
 * World rank R, at the issue of collective #N of its communicator whose
 * role is G (pt_comm_set_name: world, aux, dp, tp, pp, mp, ...):
 *   skip   never issues it (the call returns at once, its result unset);
 *   swap   issues it after its next operation, on any communicator: the
 *          call returns at once (a blocking one unfinished) and the
 *          operation is queued once the next one has been issued (a
 *          blocking next one: once it returned). The two collectives run
 *          in the other order: on one communicator a mismatch, on two a
 *          wait the others never meet;
 *   kill   SIGKILLs itself; stop: SIGSTOPs itself (before issuing it).
 * It fires once. Read once per process; pt_comm_faults_off disarms it (a
 * restarted job runs clean). A bad value is reported once and ignored.
 * Never a config key: it breaks the job on purpose.
 *
 * Not here: what the others notice (the backends' waits, the recorder). */
#include "communicator_impl.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { F_NONE, F_SKIP, F_SWAP, F_KILL, F_STOP };

static struct {
    atomic_int armed;  /* 1 until it fired or was disarmed; read first, cheaply */
    atomic_int parsed; /* the knob was read */
    int kind, rank;
    char group[FL_ROLE_MAX + 1];
    uint64_t seq;
    pthread_mutex_t mu; /* the held request */
    _Atomic(pt_comm_req *) held;
} fl = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* "skip:rank=2:group=dp:seq=5" into fl; 0 when it does not parse. */
static int parse(const char *v) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", v);
    char *save = NULL, *tok = strtok_r(buf, ":", &save);
    if (!tok) return 0;
    static const char *kinds[] = {"", "skip", "swap", "kill", "stop"};
    fl.kind = F_NONE;
    for (int k = F_SKIP; k <= F_STOP; k++)
        if (!strcmp(tok, kinds[k])) fl.kind = k;
    fl.rank = -1;
    fl.seq = 0;
    snprintf(fl.group, sizeof fl.group, "world");
    while ((tok = strtok_r(NULL, ":", &save))) {
        char *eq = strchr(tok, '='), *end = NULL;
        if (!eq) return 0;
        *eq++ = '\0';
        if (!strcmp(tok, "rank")) {
            long r = strtol(eq, &end, 10);
            if (*end || end == eq || r < 0 || r > 1 << 20) return 0;
            fl.rank = (int)r;
        } else if (!strcmp(tok, "seq")) {
            long long s = strtoll(eq, &end, 10);
            if (*end || end == eq || s < 1) return 0;
            fl.seq = (uint64_t)s;
        } else if (!strcmp(tok, "group")) {
            if (!*eq || strlen(eq) > FL_ROLE_MAX) return 0;
            snprintf(fl.group, sizeof fl.group, "%s", eq);
        } else {
            return 0;
        }
    }
    return fl.kind != F_NONE && fl.rank >= 0 && fl.seq > 0;
}

static void load(void) {
    if (atomic_load(&fl.parsed)) return;
    pthread_mutex_lock(&fl.mu);
    if (!fl.parsed) {
        const char *v = pt_knob_str("PT_FAULT");
        int set = strcmp(v, "none") != 0, ok = set && parse(v);
        if (set && !ok)
            fprintf(stderr,
                    "partrain warn: PT_FAULT=%s is not ACTION:rank=R[:group=G]:seq=N (ACTION skip, "
                    "swap, kill or stop); ignored\n",
                    v);
        atomic_store(&fl.armed, ok);
        atomic_store(&fl.parsed, 1);
    }
    pthread_mutex_unlock(&fl.mu);
}

void pt_comm_faults_off(void) {
    load();
    atomic_store(&fl.armed, 0);
}

int comm_fault_at(pt_comm *c, pt_comm_op op) {
    if (!atomic_load_explicit(&fl.parsed, memory_order_acquire)) load();
    if (!atomic_load_explicit(&fl.armed, memory_order_relaxed)) return FAULT_NONE;
    if (op == PT_OP_SEND || op == PT_OP_RECV) return FAULT_NONE;
    uint64_t next = atomic_load_explicit(&c->fl.coll, memory_order_relaxed) + 1;
    if (comm_flight_world_rank() != fl.rank || next != fl.seq || strcmp(c->fl.role, fl.group))
        return FAULT_NONE;
    int expected = 1;
    if (!atomic_compare_exchange_strong(&fl.armed, &expected, 0)) return FAULT_NONE;
    char name[64];
    comm_flight_name(c, name, sizeof name);
    struct timespec rt; /* wall time: tests measure how long the job takes to end from here */
    clock_gettime(CLOCK_REALTIME, &rt);
    PT_WARN("PT_FAULT: rank %d %s %s %s #%llu at %.3f", fl.rank,
            fl.kind == F_SKIP   ? "skips"
            : fl.kind == F_SWAP ? "defers"
            : fl.kind == F_KILL ? "is killed at"
                                : "is stopped at",
            name, pt_comm_op_name(op), (unsigned long long)fl.seq,
            (double)rt.tv_sec + 1e-9 * (double)rt.tv_nsec);
    if (fl.kind == F_KILL) raise(SIGKILL);
    if (fl.kind == F_STOP) raise(SIGSTOP);
    return fl.kind == F_SKIP ? FAULT_SKIP : fl.kind == F_SWAP ? FAULT_HOLD : FAULT_NONE;
}

void comm_fault_hold(pt_comm_req *req) {
    pthread_mutex_lock(&fl.mu);
    atomic_store(&fl.held, req);
    pthread_mutex_unlock(&fl.mu);
}

/* The held request if it matches (NULL, NULL: any), taken off. */
static pt_comm_req *take(pt_comm *c, pt_comm_req *req) {
    if (!atomic_load_explicit(&fl.held, memory_order_relaxed)) return NULL; /* usual: no lock */
    pthread_mutex_lock(&fl.mu);
    pt_comm_req *r = atomic_load(&fl.held);
    if (r && ((!c && !req) || r == req || (c && comm_req_comm(r) == c)))
        atomic_store(&fl.held, NULL);
    else
        r = NULL;
    pthread_mutex_unlock(&fl.mu);
    return r;
}

void comm_fault_after(void) {
    pt_comm_req *r = take(NULL, NULL);
    if (r) comm_release(r);
}

void comm_fault_release_for(pt_comm *c, pt_comm_req *req) {
    pt_comm_req *r = take(c, req);
    if (r) comm_release(r);
}

void comm_fault_drop_for(pt_comm *c) {
    pt_comm_req *r = take(c, NULL);
    if (r) comm_drop(r);
}
