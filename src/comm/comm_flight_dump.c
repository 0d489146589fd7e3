/* Flight dumps: after a job fault every surviving rank writes its
 * communicators' rings (one JSON file per rank, atomically through
 * pt_out), which `partrain flight` merges. Where: pt_comm_set_flight
 * (`partrain train`'s log.flight): a directory (ending in '/', or one that
 * exists) takes DIR/flight-rankR.json, anything else is a prefix,
 * PREFIX-rankR.json.
 *
 * When: the first operation of the process that fails with a job fault
 * (comm.c), a check_order mismatch, the mpi watchdog ending the process,
 * and SIGTERM: the shm launcher sends it to a rank that did not end in its
 * grace second, mpirun to every survivor when a rank died (about a second
 * before its SIGKILL). A handler only writes a byte into a pipe; a thread
 * of the comm layer (every signal blocked) reads it, lets the backend say
 * its word (mpi: the job's line, when no rank did), writes the dump and
 * ends the process with SIGTERM's default action. Installed only when
 * there is something to do (a flight path, or a backend's word).
 *
 * Not here: the rings (comm_flight.c), the analysis (comm_flight_why.c). */
#include "communicator_impl.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static struct {
    char path[1024]; /* "" none */
    int world_rank, world_size;
    atomic_int dumped;
    pthread_mutex_t dump_mu; /* a dump in progress: the process waits for it to end */
    void (*on_term)(void);   /* the backend's word at SIGTERM */
    /* Was this process stopped until just now? The SIGTERM thread stamps
     * alive_at every 50 ms; a gap over FROZEN_NS (SIGSTOP, then mpirun's
     * SIGCONT) sets thawed_at. A thread of its own, with no MPI call that
     * a dead peer could block (the heartbeat's could, seen across hosts). */
    _Atomic uint64_t alive_at, thawed_at;
    int installed;
    int pipe[2];
    pthread_t thread;
    struct sigaction old;
} fd = {.world_rank = -1, .dump_mu = PTHREAD_MUTEX_INITIALIZER};

int comm_flight_world_rank(void) {
    return fd.world_rank;
}

void comm_flight_on_term(void (*fn)(void)) {
    fd.on_term = fn;
}

/* ---- JSON ---- */

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static const char *state_name(int s) {
    static const char *n[] = {"none", "queued", "running", "done", "failed"};
    return s >= 0 && s <= FL_FAILED ? n[s] : "none";
}

typedef struct {
    FILE *f;
    int first;
} dump_ctx;

static void dump_comm(const pt_comm *c, void *arg) {
    dump_ctx *d = arg;
    FILE *f = d->f;
    const comm_flight *fl = &c->fl;
    char name[64];
    comm_flight_name(c, name, sizeof name);
    fprintf(f, "%s\n  {\"name\": ", d->first ? "" : ",");
    d->first = 0;
    json_str(f, name);
    fprintf(f, ", \"role\": ");
    json_str(f, fl->role);
    fprintf(f,
            ", \"index\": %d, \"sub\": %d, \"id\": \"%016llx\", \"rank\": %d, \"size\": %d, "
            "\"collectives\": %llu, \"p2p\": %llu, \"failed\": %d, \"members\": [",
            fl->index, fl->sub, (unsigned long long)fl->id, c->rank, c->size,
            (unsigned long long)atomic_load(&((comm_flight *)fl)->coll),
            (unsigned long long)atomic_load(&((comm_flight *)fl)->p2p),
            atomic_load(&((pt_comm *)c)->broken));
    for (int m = 0; m < c->size; m++)
        fprintf(f, "%s%d", m ? ", " : "", c->be->world_rank ? c->be->world_rank(c->ctx, m) : m);
    fprintf(f, "],\n   \"ops\": [");
    uint64_t last = atomic_load(&((comm_flight *)fl)->issued);
    uint64_t first = last > FL_RING ? last - FL_RING + 1 : 1;
    int any = 0;
    for (uint64_t k = first; k <= last; k++) {
        fl_rec *r = (fl_rec *)&fl->ring[k & (FL_RING - 1)];
        if (atomic_load_explicit(&r->n, memory_order_acquire) != k) continue;
        int state = atomic_load(&r->state);
        fprintf(f,
                "%s\n    {\"n\": %llu, \"seq\": %llu, \"op\": \"%s\", \"bytes\": %llu, \"peer\": "
                "%d, \"tag\": %d, \"state\": \"%s\", \"queued_ns\": %llu, \"start_ns\": %llu, "
                "\"end_ns\": %llu}",
                any ? "," : "", (unsigned long long)k, (unsigned long long)r->seq,
                pt_flight_op_name(r->op), (unsigned long long)r->bytes, r->peer, r->tag,
                state_name(state), (unsigned long long)r->t_queued,
                (unsigned long long)(state >= FL_RUNNING ? atomic_load(&r->t_start) : 0),
                (unsigned long long)(state >= FL_DONE ? atomic_load(&r->t_end) : 0));
        any = 1;
    }
    fprintf(f, "]}");
}

/* Any live communicator's backend: it knows every rank's table. */
typedef struct {
    const pt_comm *c;
} any_comm;

static void pick(const pt_comm *c, void *arg) {
    any_comm *a = arg;
    if (!a->c && c->be->flight_table) a->c = c;
}

static const pt_flight_table *get_table(void *arg, int w) {
    const pt_comm *c = arg;
    return c->be->flight_table(c->ctx, w);
}

/* mkdir -p dir (dir is modified and restored). */
static int make_dirs(char *dir) {
    for (char *p = dir + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char keep = *p;
        *p = '\0';
        int r = mkdir(dir, 0777);
        *p = keep;
        if (r != 0 && errno != EEXIST) return -1;
        if (!keep) return 0;
    }
}

static void file_name(char *out, size_t len) {
    size_t n = strlen(fd.path);
    struct stat sb;
    int dir = n > 0 && (fd.path[n - 1] == '/' || (stat(fd.path, &sb) == 0 && S_ISDIR(sb.st_mode)));
    if (dir) {
        char d[1024];
        snprintf(d, sizeof d, "%s", fd.path);
        while (strlen(d) > 1 && d[strlen(d) - 1] == '/') d[strlen(d) - 1] = '\0';
        make_dirs(d);
        snprintf(out, len, "%s/flight-rank%d.json", d, fd.world_rank);
    } else {
        snprintf(out, len, "%s-rank%d.json", fd.path, fd.world_rank);
    }
}

static void dump_now(const char *reason);

/* Back from SIGSTOP a moment ago (or not running for a second): its rings
 * moved on after the others gave up on it; it is no survivor. */
#define FROZEN_NS 1000000000ull
static int thawed(void) {
    uint64_t now = pt_time_ns(), alive = atomic_load(&fd.alive_at),
             thaw = atomic_load(&fd.thawed_at);
    if (!alive) return 0; /* no stamping thread */
    return now - alive > FROZEN_NS || (thaw && now - thaw < 5 * FROZEN_NS);
}

/* One dump per process, and none cut short: a second caller (SIGTERM's
 * thread and a failed operation at once, seen under mpirun: the main
 * thread exited the process halfway through the other's dump) waits for
 * the first to end, and so does exit (atexit). */
void comm_flight_dump(const char *reason) {
    if (!fd.path[0] || atomic_load(&fd.dumped)) {
        if (fd.path[0]) { /* wait for one in progress */
            pthread_mutex_lock(&fd.dump_mu);
            pthread_mutex_unlock(&fd.dump_mu);
        }
        return;
    }
    if (thawed()) return; /* a stopped rank, thawed: no survivor */
    pthread_mutex_lock(&fd.dump_mu);
    if (atomic_exchange(&fd.dumped, 1)) {
        pthread_mutex_unlock(&fd.dump_mu);
        return;
    }
    dump_now(reason);
    pthread_mutex_unlock(&fd.dump_mu);
}

static void dump_now(const char *reason) {
    char path[1200], analysis[1024] = "";
    file_name(path, sizeof path);
    any_comm a = {NULL};
    comm_flight_each(pick, &a);
    if (a.c)
        pt_flight_describe(get_table, (void *)a.c, fd.world_size, -1, analysis, sizeof analysis);
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    uint64_t mono = pt_time_ns(), real = (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec;
    char saved[512]; /* the caller's error survives a failed dump */
    snprintf(saved, sizeof saved, "%s", pt_error_message());
    pt_out *o = NULL;
    pt_status st = pt_out_open(&o, path);
    if (st == PT_OK) {
        FILE *f = pt_out_stream(o);
        fprintf(f,
                "{\"partrain_flight\": 1, \"rank\": %d, \"world\": %d, \"pid\": %d, \"reason\": ",
                fd.world_rank, fd.world_size, (int)getpid());
        json_str(f, reason ? reason : "");
        fprintf(f, ",\n \"analysis\": ");
        json_str(f, analysis);
        fprintf(f, ",\n \"mono_ns\": %llu, \"real_ns\": %llu,\n \"comms\": [",
                (unsigned long long)mono, (unsigned long long)real);
        dump_ctx d = {f, 1};
        comm_flight_each(dump_comm, &d);
        fprintf(f, "]}\n");
        st = pt_out_commit(o);
    }
    if (st != PT_OK) {
        PT_WARN("log.flight: %s", pt_error_message());
        pt_error_set(PT_OK, "%s", saved);
    }
}

/* ---- SIGTERM ---- */

static void on_sigterm(int sig) {
    (void)sig;
    int e = errno;
    char b = 1;
    ssize_t r = write(fd.pipe[1], &b, 1);
    (void)r;
    errno = e;
}

static void *term_main(void *arg) {
    (void)arg;
    for (;;) { /* stamp, until SIGTERM's byte comes */
        struct pollfd p = {.fd = fd.pipe[0], .events = POLLIN};
        int r = poll(&p, 1, 50);
        uint64_t now = pt_time_ns(), last = atomic_load(&fd.alive_at);
        if (last && now - last > FROZEN_NS) atomic_store(&fd.thawed_at, now);
        atomic_store(&fd.alive_at, now);
        if (r > 0 || (r < 0 && errno != EINTR)) break;
    }
    char b = 0;
    while (read(fd.pipe[0], &b, 1) < 0 && errno == EINTR) {
    }
    if (!thawed()) {
        if (fd.on_term) fd.on_term();
        comm_flight_dump("SIGTERM: the job was stopped from outside (a rank died, or the launcher "
                         "ended the job)");
    }
    fflush(NULL);
    /* Not at once: under mpirun a rank that dies of it right away makes
     * the daemon SIGKILL the others at once, some halfway through their
     * own dump (seen: 1 dump of 3 lost in 3 runs). Its SIGKILL comes a
     * second after the SIGTERM anyway. */
    struct timespec pause = {0, 300000000};
    nanosleep(&pause, NULL);
    sigaction(SIGTERM, &fd.old, NULL);
    if (fd.old.sa_handler == SIG_IGN) return NULL;
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGTERM, &dfl, NULL);
    kill(getpid(), SIGTERM); /* process-directed: a thread that does not block it takes it */
    return NULL;
}

/* A child forked after the install has no such thread: SIGTERM as before. */
static void term_after_fork(void) {
    if (!fd.installed) return;
    sigaction(SIGTERM, &fd.old, NULL);
    close(fd.pipe[0]);
    close(fd.pipe[1]);
    fd.installed = 0;
}

/* exit waits for a dump in progress (another thread's). */
static void dump_wait(void) {
    pthread_mutex_lock(&fd.dump_mu);
    pthread_mutex_unlock(&fd.dump_mu);
}

static void term_install(void) {
    static int atfork;
    if (fd.installed) return;
    if (!atfork) atfork = pthread_atfork(NULL, NULL, term_after_fork) == 0;
    if (pipe(fd.pipe) != 0) return;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int e = pthread_create(&fd.thread, NULL, term_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e != 0) {
        close(fd.pipe[0]);
        close(fd.pipe[1]);
        return;
    }
    pthread_detach(fd.thread);
    struct sigaction sa = {.sa_handler = on_sigterm};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &fd.old);
    fd.installed = 1;
}

void comm_flight_configure(const char *path, int world_rank, int world_size) {
    static int atexit_set;
    if (world_rank >= 0) fd.world_rank = world_rank, fd.world_size = world_size;
    if (path) snprintf(fd.path, sizeof fd.path, "%s", path);
    if (fd.path[0] && !atexit_set) atexit_set = atexit(dump_wait) == 0;
    if (fd.path[0] || (fd.on_term && fd.world_size > 1)) term_install();
}

void pt_comm_set_flight(pt_comm *world, const char *path) {
    (void)world; /* the process's, whichever communicator asks */
    comm_flight_configure(path ? path : "", -1, 0);
}
