/* The shm launcher: pt_launch (comm.h; the registry calls shm_launch) forks
 * the ranks of a job on this machine and supervises them.
 *
 * The arena is an anonymous MAP_SHARED mapping made before fork: no name in
 * /dev/shm, no other process can open it, and the kernel frees it when the
 * last rank and the launcher have exited, however they exit.
 *
 * Supervision: SIGCHLD, SIGINT and SIGTERM are blocked in the launcher and
 * taken with sigtimedwait, so none is lost between checks. When a rank is
 * killed or exits non-zero the launcher marks the job aborted in the arena
 * (every waiting rank returns PT_ERR_COMM at once, naming the dead rank),
 * gives the ranks PT_LAUNCH_GRACE_S to return their errors and exit, then
 * SIGTERM, then SIGKILL after another grace, and prints one summary line,
 * naming the rank and where it was. Not when that rank exited with a code
 * after a rank of the job printed the job's error line
 * (pt_comm_claim_error_line): that line says what went wrong, and a
 * second one in the launcher's words would only repeat it. A rank killed
 * by a signal (a crash, the OOM killer) printed nothing: it is named.
 * A fault a rank noticed (a rank stalled: no heartbeat; or one that did
 * not take part in time) comes as the job's verdict in the arena: the
 * launcher SIGKILLs the culprit at once (a stopped process ignores
 * SIGTERM) and its summary names the culprit, not the rank that noticed
 * and exited first.
 * SIGINT/SIGTERM to the launcher: same, with PT_ERR_INTERRUPTED in the
 * ranks and SIGTERM at once. Ranks ask for SIGKILL when the launcher dies
 * (PR_SET_PDEATHSIG), so there are never orphans.
 *
 * Not here: the backend (shm.c and the files shm_impl.h lists). */
#include "shm.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define PT_LAUNCH_GRACE_S 1.0

static void signal_all(const pid_t *pids, int n, int sig) {
    for (int r = 0; r < n; r++)
        if (pids[r] > 0) kill(pids[r], sig);
}

static void describe(int ws, char *out, size_t len) {
    if (WIFSIGNALED(ws)) {
        const char *abbr = sigabbrev_np(WTERMSIG(ws));
        snprintf(out, len, "killed by signal %d (SIG%s)", WTERMSIG(ws), abbr ? abbr : "?");
    } else {
        snprintf(out, len, "exited with code %d", WEXITSTATUS(ws));
    }
}

static int exit_code_of(int ws) {
    if (WIFSIGNALED(ws)) return 128 + WTERMSIG(ws);
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 1;
}

/* " during allreduce at step 14" / " after barrier" / "". */
static void where(const pt_shm_job *job, int r, char *out, size_t len) {
    int cur, last;
    long step;
    const char *err;
    pt_shm_job_rank_info(job, r, &cur, &last, &step, &err);
    size_t k = 0;
    out[0] = '\0';
    if (cur >= 0 && cur <= PT_OP_COUNT)
        k = (size_t)snprintf(out, len, " during %s",
                             cur == PT_OP_COUNT ? "split" : pt_comm_op_name((pt_comm_op)cur));
    else if (last >= 0 && last <= PT_OP_COUNT)
        k = (size_t)snprintf(out, len, " after %s",
                             last == PT_OP_COUNT ? "split" : pt_comm_op_name((pt_comm_op)last));
    if (step >= 0 && k < len) k += (size_t)snprintf(out + k, len - k, " at step %ld", step);
    /* its own error, unless it is the job's verdict or abort echoed back */
    if (err[0] && !strstr(err, "job stopped") && k < len) snprintf(out + k, len - k, " (%s)", err);
}

/* Block SIGCHLD, SIGINT and SIGTERM (*set; the mask before: *old), taken
 * with sigtimedwait. SIGCHLD ignored by the caller would auto-reap the
 * ranks and hide their exit status: default it (*old_chld: as it was)
 * while the job runs. */
static void block_signals(sigset_t *set, sigset_t *old, struct sigaction *old_chld) {
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGCHLD, &dfl, old_chld);
    sigemptyset(set);
    sigaddset(set, SIGCHLD);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    sigprocmask(SIG_BLOCK, set, old);
}

/* Fork the ranks: each runs fn(arg) as its rank of job, with the signal
 * mask `old` (the caller's) and SIGKILL when the launcher dies. pids[r]
 * and *alive count the ones started; an error once a fork fails. */
static pt_status fork_ranks(int nproc, pt_rank_main fn, void *arg, pt_shm_job *job,
                            const sigset_t *old, pid_t *pids, int *alive) {
    pid_t parent = getpid();
    for (int r = 0; r < nproc; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(1); /* launcher already gone */
            sigprocmask(SIG_SETMASK, old, NULL);
            pt_shm_job_adopt(job, r, (int)getpid());
            int rc = fn(arg);
            exit(rc & 0xff);
        }
        if (pid < 0)
            return pt_error_set(PT_ERR_INTERNAL, "pt_launch: fork of rank %d: %s", r,
                                strerror(errno));
        pids[r] = pid;
        (*alive)++;
    }
    return PT_OK;
}

/* The job's timeout: the launcher's option, else 0 (the ranks' decide). */
static double timeout_of(const pt_comm_options *opt) {
    return opt && opt->timeout_s > 0 ? opt->timeout_s : 0;
}

/* The launcher's view of a running job. */
typedef struct {
    pt_shm_job *job;
    int nproc, alive;
    pid_t pids[PT_SHM_MAX_RANKS];
    pt_status st; /* the ranks could not all be started */
    int first_fail, fail_ws, interrupted, early_exit;
    char fail_where[512];
    /* A fault a rank noticed (stalled or silent rank): its verdict names the
     * culprit, which the launcher kills at once (a stopped process ignores
     * SIGTERM), so that the job ends within the timeout plus the grace. */
    int culprit, noticed_by, culprit_killed;
    char verdict[400], culprit_where[512];
    double stop_at, term_at;
    double timeout_s; /* the job's (0: the ranks decide) */
} supervisor;

/* Reap the ranks that exited. */
static void reap(supervisor *v) {
    for (int r = 0; r < v->nproc; r++) {
        int ws = 0;
        if (v->pids[r] <= 0) continue;
        pid_t got = waitpid(v->pids[r], &ws, WNOHANG);
        if (got == 0 || (got < 0 && errno == EINTR)) continue;
        if (got < 0) ws = 0x7f00; /* reaped by someone else: exit code 127 */
        v->pids[r] = 0;
        v->alive--;
        int failed = !(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
        int first = failed && v->first_fail < 0 && !v->interrupted && v->st == PT_OK &&
                    !(r == v->culprit && v->culprit_killed);
        if (first) {
            v->first_fail = r;
            v->fail_ws = ws;
            where(v->job, r, v->fail_where, sizeof v->fail_where);
            v->stop_at = pt_time_s();
        }
        if (!failed && v->first_fail < 0 && v->early_exit < 0) v->early_exit = r;
        pt_shm_job_mark_exit(v->job, r, ws, first);
    }
}

/* A verdict published by a rank: a silent culprit (stopped: it ignores
 * SIGTERM, and would never end) is killed at once; a live one (it waits
 * for the others in a deadlock, or is busy outside the communicator)
 * takes the verdict, writes its flight recorder and exits like the
 * others, or gets SIGTERM after the grace. */
static void take_verdict(supervisor *v) {
    const char *reason = NULL;
    if (v->culprit >= 0 || v->interrupted || v->st != PT_OK ||
        !pt_shm_job_verdict(v->job, &v->culprit, &v->noticed_by, &reason))
        return;
    snprintf(v->verdict, sizeof v->verdict, "%s", reason);
    if (v->culprit >= 0 && v->culprit < v->nproc) {
        where(v->job, v->culprit, v->culprit_where, sizeof v->culprit_where);
        double quiet = v->timeout_s > 0 ? v->timeout_s / 4 : 0.5;
        if (v->pids[v->culprit] > 0 && v->first_fail != v->culprit &&
            pt_shm_job_silence(v->job, v->culprit) > quiet) {
            kill(v->pids[v->culprit], SIGKILL);
            v->culprit_killed = 1;
        }
    }
    if (v->first_fail < 0) v->stop_at = pt_time_s();
}

/* Until every rank exited: reap, take verdicts and signals, stop the rest
 * after a fault (SIGTERM after the grace, SIGKILL after another). */
static void supervise(supervisor *v, const sigset_t *set) {
    while (v->alive > 0) {
        struct timespec ts = {0, 20000000};
        int sig = sigtimedwait(set, NULL, &ts);
        if ((sig == SIGINT || sig == SIGTERM) && !v->interrupted) {
            v->interrupted = sig;
            pt_shm_job_interrupt(v->job);
            signal_all(v->pids, v->nproc, SIGTERM);
            v->stop_at = v->term_at = pt_time_s();
        }
        reap(v);
        take_verdict(v);
        if (v->alive == 0) break;
        if (!(v->first_fail >= 0 || v->interrupted || v->st != PT_OK || v->culprit >= 0)) continue;
        double now = pt_time_s();
        if (v->term_at == 0 && now > v->stop_at + PT_LAUNCH_GRACE_S) {
            signal_all(v->pids, v->nproc, SIGTERM);
            v->term_at = now;
        }
        if (v->term_at > 0 && now > v->term_at + PT_LAUNCH_GRACE_S)
            signal_all(v->pids, v->nproc, SIGKILL);
    }
}

static const pt_flight_table *arena_table(void *arg, int w) {
    return pt_shm_job_flight(arg, w);
}

/* ": dp group 0: allreduce #45 (1 MiB): rank 2 never arrived; ..." from the
 * ranks' flight tables, or "". */
static void laggards(const supervisor *v, int culprit, char *out, size_t len) {
    char why[1024];
    out[0] = '\0';
    if (pt_flight_describe(arena_table, v->job, v->nproc, culprit, why, sizeof why))
        snprintf(out, len, ": %s", why);
}

/* The job's one summary line (or none), and how it ended. */
static void summarize(const supervisor *v, int error_line, int named, const char *lag,
                      pt_launch_result *res) {
    *res = (pt_launch_result){0, 0, -1};
    if (v->interrupted) {
        const char *abbr = sigabbrev_np(v->interrupted);
        fprintf(stderr, "partrain: interrupted by SIG%s; stopped %d ranks\n", abbr ? abbr : "?",
                v->nproc);
        res->exit_code = 128 + v->interrupted;
    } else if (v->culprit >= 0 && !(v->first_fail == v->culprit && WIFSIGNALED(v->fail_ws))) {
        /* The culprit, not whichever rank noticed first and exited (the
         * culprit itself, when it took the verdict and exited: the verdict
         * says more; killed by a signal of its own, that says more). */
        fprintf(stderr, "partrain: %s%s (noticed by rank %d)%s; job stopped\n", v->verdict,
                named ? "" : v->culprit_where, v->noticed_by, named ? "" : lag);
        res->exit_code = v->first_fail >= 0 ? exit_code_of(v->fail_ws) : 1;
        res->fault = !named; /* a stall or a silence, not operations out of order */
        res->culprit = v->culprit;
    } else if (v->first_fail >= 0 && error_line >= 0 && WIFEXITED(v->fail_ws)) {
        res->exit_code = exit_code_of(v->fail_ws); /* the rank's own line said it */
        res->culprit = v->first_fail;
    } else if (v->first_fail >= 0) {
        char why[96], extra[96] = "";
        describe(v->fail_ws, why, sizeof why);
        if (v->early_exit >= 0 && v->early_exit != v->first_fail && !strchr(v->fail_where, '('))
            snprintf(extra, sizeof extra, " (rank %d had already exited with code 0)",
                     v->early_exit);
        fprintf(stderr, "partrain: rank %d %s%s%s%s; job stopped\n", v->first_fail, why,
                v->fail_where, extra, lag);
        res->exit_code = exit_code_of(v->fail_ws);
        res->fault = 1;
        res->culprit = v->first_fail;
    }
}

pt_status shm_launch(int nproc, pt_rank_main fn, void *arg, const pt_comm_options *opt,
                     pt_launch_result *res) {
    *res = (pt_launch_result){1, 0, -1};
    if (!fn) return pt_error_set(PT_ERR_INVALID, "pt_launch: fn is NULL");
    if (nproc < 1 || nproc > PT_SHM_MAX_RANKS)
        return pt_error_set(PT_ERR_INVALID, "pt_launch: nproc %d is outside 1..%d", nproc,
                            PT_SHM_MAX_RANKS);
    pt_shm_job *job;
    PT_CHECK(pt_shm_job_map_anon(nproc, timeout_of(opt), &job));

    struct sigaction old_chld;
    sigset_t set, old;
    block_signals(&set, &old, &old_chld);
    fflush(NULL); /* or buffered output would be written once per rank */

    static supervisor v; /* one job at a time (a single-threaded parent) */
    memset(&v, 0, sizeof v);
    v.job = job;
    v.nproc = nproc;
    v.timeout_s = timeout_of(opt);
    v.first_fail = v.early_exit = v.culprit = v.noticed_by = -1;
    v.st = fork_ranks(nproc, fn, arg, job, &old, v.pids, &v.alive);
    if (v.st != PT_OK) { /* could not start them all: stop the ones we have */
        pt_shm_job_interrupt(job);
        signal_all(v.pids, nproc, SIGTERM);
        v.stop_at = v.term_at = pt_time_s();
    }
    supervise(&v, &set);
    /* Drain what the ranks' exits left pending, then restore the mask. */
    struct timespec zero = {0, 0};
    while (sigtimedwait(&set, NULL, &zero) > 0) {
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    sigaction(SIGCHLD, &old_chld, NULL);
    int error_line = pt_shm_job_error_line(job), named = pt_shm_job_verdict_named(job);
    char lag[1100] = "";
    if (v.st == PT_OK && !v.interrupted && (v.culprit >= 0 || v.first_fail >= 0))
        laggards(&v, v.culprit >= 0 ? v.culprit : v.first_fail, lag, sizeof lag);
    pt_shm_job_unmap(job);
    if (v.st != PT_OK) return v.st;
    summarize(&v, error_line, named, lag, res);
    return PT_OK;
}
