/* Failure handling of the shm backend and launcher. Each case launches 4
 * ranks with a 2 s timeout that loop over 1 MiB all-reduces, breaks one rank,
 * and asserts:
 *   - every other rank gets the expected error (PT_ERR_COMM, _TIMEOUT or
 *     _INTERRUPTED) within the timeout, naming the broken rank;
 *   - pt_launch reports a non-zero exit code and prints one summary line
 *     naming the rank;
 *   - no process of the job is left and no new /dev/shm entry remains.
 * Cases: a rank SIGKILLed mid all-reduce, a rank that exits early (code 0,
 * never reaches the collective), a rank that exits non-zero, a rank that
 * hangs outside any collective (timeout), SIGINT to the launcher. Also: a
 * clean job launched from a process whose progress thread already runs;
 * ranks blocked for 1 s use little CPU; ranks die with a SIGKILLed
 * launcher; a failed communicator refuses further operations. */
#include "partrain/comm.h"
#include "pt_test.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NPROC     4
#define TIMEOUT_S 2.0
#define COUNT     (256 * 1024)

enum { KILL, EARLY, NONZERO, HANG, SIGINT_LAUNCHER, STOP_STEP, STOP_SAVE, CHAIN, OFFSTAGE };
static const char *case_names[] = {"kill",      "early",     "nonzero", "hang",    "sigint",
                                   "stop-step", "stop-save", "chain",   "offstage"};
/* The rank each case breaks (-1: none) and the operation the others are in. */
static const int case_broken[] = {2, 3, 1, 1, -1, 2, 0, 3, 1};
static const char *case_op[] = {"allreduce", "allreduce", "allreduce", "allreduce", "allreduce",
                                "allreduce", "barrier",   "recv",      "allreduce"};

typedef struct {
    int pid;
    _Atomic int status; /* first error, 0 if none; stored last (below) */
    int again;          /* status of a barrier after that error */
    int slow_ok;        /* stop-save: the slow (alive) save passed */
    double t_err;
    char msg[256];
} rank_result;

typedef struct {
    _Atomic double t_break; /* when the rank was broken */
    rank_result r[NPROC];
} shared_area;

static shared_area *sh; /* MAP_SHARED before pt_launch: the ranks write here */

static int rank_main(void *arg) {
    int which = *(const int *)arg;
    pt_comm *w = NULL;
    pt_comm_options opt = {"shm", TIMEOUT_S};
    if (pt_comm_new(&w, &opt) != PT_OK) return 2;
    int me = pt_comm_rank(w);
    sh->r[me].pid = (int)getpid();
    if (pt_comm_barrier(w) != PT_OK) return 3;
    float *buf = pt_mem_alloc(PT_MEM_SCRATCH, COUNT * sizeof(float));
    pt_status st = PT_OK;
    int rc = -1; /* an exit code chosen by the case */
    for (long it = 0; it < 100000 && st == PT_OK && rc < 0; it++) {
        pt_comm_note_step(w, it);
        if (which == KILL && me == 1 && it == 20) {
            sh->t_break = pt_time_s();
            kill(sh->r[2].pid, SIGKILL);
        }
        if (which == EARLY && me == 3) {
            sh->t_break = pt_time_s();
            rc = 0;
            break;
        }
        if (which == NONZERO && me == 1 && it == 5) {
            sh->t_break = pt_time_s();
            rc = 7;
            break;
        }
        if (which == HANG && me == 1 && it == 3) {
            sh->t_break = pt_time_s();
            sleep(60);
        }
        if (which == SIGINT_LAUNCHER && me == 0 && it == 10) {
            sh->t_break = pt_time_s();
            kill(getppid(), SIGINT);
        }
        if (which == STOP_STEP && me == 2 && it == 5) { /* frozen mid-step: no heartbeat */
            sh->t_break = pt_time_s();
            raise(SIGSTOP);
        }
        if (which == STOP_SAVE && it == 3) {
            /* A save as the trainer does it: a long deadline while rank 0
             * writes. First a slow but alive write (3 timeouts long: must
             * not fail), then rank 0 frozen in the next save: found within
             * the timeout all the same. */
            double old = 0;
            for (int save = 0; save < 2 && st == PT_OK; save++) {
                st = pt_comm_set_timeout(w, 600, &old);
                if (st == PT_OK && me == 0 && save == 0) usleep((useconds_t)(3 * TIMEOUT_S * 1e6));
                if (st == PT_OK && me == 0 && save == 1) {
                    sh->t_break = pt_time_s();
                    raise(SIGSTOP);
                }
                if (st == PT_OK) st = pt_comm_barrier(w);
                if (st == PT_OK) st = pt_comm_set_timeout(w, old, NULL);
                if (st == PT_OK && save == 0) sh->r[me].slow_ok = 1;
            }
            break;
        }
        if (which == CHAIN && it == 3) {
            /* 0 waits for 1, 1 for 2, 2 for 3, and 3 is frozen: every rank
             * must blame 3, not the peer it happens to wait for. */
            char byte = 0;
            if (me == 3) {
                sh->t_break = pt_time_s();
                raise(SIGSTOP);
            }
            if (me < 3) st = pt_comm_recv(w, &byte, 1, me + 1, 0);
            break;
        }
        if (which == OFFSTAGE && it == 3) {
            /* Rank 0 waits for rank 1 outside the communicator (as for a
             * file rank 1 writes), alive, and publishes no wait; rank 1 is
             * frozen after the others entered the all-reduce. The chain of
             * waits ends at rank 0, but the silent rank 1 explains the stall
             * (seen: a frozen rank 1, a verdict naming rank 0). Rank 0 goes
             * on once another rank has failed, and fails with the verdict. */
            if (me == 1) {
                usleep(300000);
                sh->t_break = pt_time_s();
                raise(SIGSTOP);
            }
            if (me == 0)
                for (int i = 0; i < 20000 && !sh->r[2].status && !sh->r[3].status; i++)
                    usleep(1000);
        }
        st = pt_comm_allreduce(w, buf, COUNT, PT_REDUCE_SUM);
    }
    if (st != PT_OK) {
        /* The status last: the launcher's SIGTERM (sigint case) may end this
         * rank between two stores, and a status without its message read as
         * a message that names no operation. */
        sh->r[me].t_err = pt_time_s();
        snprintf(sh->r[me].msg, sizeof sh->r[me].msg, "%s", pt_error_message());
        atomic_store_explicit(&sh->r[me].status, st, memory_order_release);
        sh->r[me].again = pt_comm_barrier(w); /* refused at once: the comm failed */
    }
    pt_mem_free(buf);
    pt_comm_free(w);
    if (rc >= 0) return rc; /* freed first: the sanitizer's leak check must not fail it */
    return st == PT_OK ? 0 : 1;
}

/* Names in /dev/shm, newline-separated. */
static void list_shm(char *out, size_t len) {
    out[0] = '\0';
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    struct dirent *e;
    size_t k = 0;
    while ((e = readdir(d)) && k + 260 < len)
        k += (size_t)snprintf(out + k, len - k, "%s\n", e->d_name);
    closedir(d);
}

static void run_case(int which) {
    static char before[1 << 16], after[1 << 16], log[1 << 16];
    memset(sh, 0, sizeof *sh);
    list_shm(before, sizeof before);

    /* Catch the launcher's (and the ranks') stderr. */
    FILE *tmp = tmpfile();
    PT_ASSERT(tmp);
    fflush(stderr);
    int saved = dup(2);
    dup2(fileno(tmp), 2);
    int code = 0;
    double t0 = pt_time_s();
    pt_comm_options opt = {"shm", TIMEOUT_S};
    pt_status st = pt_launch(NPROC, rank_main, &which, &opt, &code);
    double t_end = pt_time_s(), elapsed = t_end - t0;
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(log, 1, sizeof log - 1, tmp);
    log[n] = '\0';
    fclose(tmp);

    fprintf(stderr, "[%s] %.2f s, exit code %d\n", case_names[which], elapsed, code);
    CHECK_OK(st);
    CHECK(code != 0);
    const char *summary = strstr(log, "partrain: ");
    CHECK(summary != NULL);
    if (summary) {
        const char *end = strchr(summary, '\n');
        fprintf(stderr, "  summary: %.*s\n", end ? (int)(end - summary) : 200, summary);
        CHECK(strstr(summary + 1, "partrain: ") == NULL); /* exactly one line */
    }
    int broken = case_broken[which];
    char want[32];
    snprintf(want, sizeof want, "rank %d", broken);
    if (summary && broken >= 0) {
        /* The line is about the broken rank (not the first to notice). */
        char subject[48];
        snprintf(subject, sizeof subject, "partrain: %s ", want);
        CHECK(strncmp(summary, subject, strlen(subject)) == 0);
    }
    if (summary &&
        (which == STOP_STEP || which == STOP_SAVE || which == CHAIN || which == OFFSTAGE))
        CHECK(strstr(summary, "stopped responding") != NULL);
    if (summary && which == KILL) CHECK(strstr(summary, "SIGKILL") != NULL);
    /* "during" or, killed between two all-reduces (a slow sanitizer build),
     * "after": either way the operation and the step */
    if (summary && which == KILL) CHECK(strstr(summary, "allreduce at step") != NULL);
    if (summary && which == NONZERO) CHECK(strstr(summary, "exited with code 7") != NULL);
    if (summary && which == SIGINT_LAUNCHER) CHECK(strstr(summary, "interrupted") != NULL);
    if (which == KILL) CHECK_EQ(code, 128 + SIGKILL);
    if (which == NONZERO) CHECK_EQ(code, 7);
    if (which == SIGINT_LAUNCHER) CHECK_EQ(code, 128 + SIGINT);

    int named = 0;
    for (int r = 0; r < NPROC; r++) {
        if (r == broken) continue;
        rank_result *rr = &sh->r[r];
        if (which == SIGINT_LAUNCHER && rr->status == 0) continue; /* SIGTERM may beat it */
        int want_st = which == HANG || which >= STOP_STEP ? PT_ERR_TIMEOUT
                      : which == SIGINT_LAUNCHER          ? PT_ERR_INTERRUPTED
                                                          : PT_ERR_COMM;
        if (strstr(rr->msg, want)) named++;
        CHECK_EQ(rr->status, want_st);
        /* One verdict: every rank names the broken one, whichever rank it
         * waited for and whichever noticed first. */
        if (broken >= 0) {
            if (!strstr(rr->msg, want)) fprintf(stderr, "  rank %d: %s\n", r, rr->msg);
            CHECK(strstr(rr->msg, want) != NULL);
        }
        if (which == STOP_SAVE) CHECK_EQ(rr->slow_ok, 1);
        if (!strstr(rr->msg, case_op[which])) fprintf(stderr, "  rank %d: %s\n", r, rr->msg);
        CHECK(strstr(rr->msg, case_op[which]) != NULL);
        /* sigint: the launcher's SIGTERM may end a rank before it stores again */
        if (rr->status != 0 && !(which == SIGINT_LAUNCHER && rr->again == 0))
            CHECK_EQ(rr->again, PT_ERR_COMM);
        /* A frozen rank is found by its missing heartbeat: the timeout plus
         * a beat period (timeout / 20) and a check interval (50 ms). */
        double dt = rr->t_err - sh->t_break, limit = TIMEOUT_S + (which >= STOP_STEP ? 1.0 : 0.5);
        if (!(dt < limit)) fprintf(stderr, "  rank %d noticed after %.2f s\n", r, dt);
        CHECK(dt < limit);
    }
    if (broken >= 0) CHECK(named > 0);
    /* Nothing left behind. */
    for (int r = 0; r < NPROC; r++) {
        if (sh->r[r].pid <= 0) continue;
        int gone = kill(sh->r[r].pid, 0) != 0 && errno == ESRCH;
        if (!gone) fprintf(stderr, "  rank %d (pid %d) is still there\n", r, sh->r[r].pid);
        CHECK(gone);
    }
    /* Only ours count: other tests run at the same time (ctest -j), Open
     * MPI's segments and other partrain jobs' (CI's sanitizer tree once
     * counted test_fault_train_shm_kill-save's); this job's segment is
     * named by its launcher, this process. */
    list_shm(after, sizeof after);
    char ours[64];
    snprintf(ours, sizeof ours, "partrain-%d-", (int)getpid());
    int leftover = 0;
    for (char *line = strtok(after, "\n"); line; line = strtok(NULL, "\n")) {
        char key[300];
        snprintf(key, sizeof key, "%s\n", line);
        if (!strstr(before, key)) {
            fprintf(stderr, "  new in /dev/shm: %s\n", line);
            if (strstr(line, ours)) leftover++;
        }
    }
    CHECK_EQ(leftover, 0);
    /* The job ends within the timeout + 5 s of the fault (the acceptance
     * bound), and the whole case stays short. */
    if (broken >= 0) CHECK(t_end - sh->t_break < TIMEOUT_S + 5);
    if (which != STOP_SAVE) CHECK(elapsed < TIMEOUT_S + 4);
}

static void test_kill(void) {
    run_case(KILL);
}
static void test_early_exit(void) {
    run_case(EARLY);
}
static void test_nonzero_exit(void) {
    run_case(NONZERO);
}
static void test_hang(void) {
    run_case(HANG);
}
static void test_sigint(void) {
    run_case(SIGINT_LAUNCHER);
}
static void test_stop_step(void) {
    run_case(STOP_STEP);
}
static void test_stop_save(void) {
    run_case(STOP_SAVE);
}
static void test_chain(void) {
    run_case(CHAIN);
}
static void test_offstage(void) {
    run_case(OFFSTAGE);
}

/* A clean job: exit code 0, no summary line. */
static int ok_main(void *arg) {
    (void)arg;
    pt_comm *w;
    if (pt_comm_new(&w, NULL) != PT_OK) return 2;
    float x = 1;
    pt_comm_req *q = NULL;
    pt_status st = pt_comm_iallreduce(w, &x, 1, PT_REDUCE_SUM, &q);
    if (st == PT_OK) st = pt_comm_wait(q);
    int ok = st == PT_OK && x == (float)pt_comm_size(w);
    pt_comm_free(w);
    return ok ? 0 : 1;
}

static void test_clean_exit(void) {
    /* The launcher's own process has used the progress thread (a world of
     * one): the forked ranks must still get theirs. */
    pt_comm *self = NULL;
    CHECK_OK(pt_comm_new(&self, NULL));
    CHECK_EQ(pt_comm_size(self), 1);
    float y = 3;
    pt_comm_req *q = NULL;
    CHECK_OK(pt_comm_iallreduce(self, &y, 1, PT_REDUCE_AVG, &q));
    CHECK_OK(pt_comm_wait(q));
    CHECK_NEAR(y, 3, 0, 0);
    pt_comm_free(self);
    int code = -1;
    CHECK_OK(pt_launch(3, ok_main, NULL, NULL, &code));
    CHECK_EQ(code, 0);
    CHECK_EQ(pt_launch(0, ok_main, NULL, NULL, &code), PT_ERR_INVALID);
}

/* Waiting does not burn a core: ranks blocked for 1 s in a barrier (rank 0
 * arrives late) use little CPU time. 4 ranks, more than this machine's
 * cores in CI. */
static int idle_main(void *arg) {
    (void)arg;
    pt_comm *w;
    if (pt_comm_new(&w, NULL) != PT_OK) return 2;
    int me = pt_comm_rank(w);
    if (pt_comm_barrier(w) != PT_OK) return 3;
    struct timespec c0, c1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    if (me == 0) usleep(1000000);
    pt_status st = pt_comm_barrier(w);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    sh->r[me].t_err = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
    pt_comm_free(w);
    return st == PT_OK ? 0 : 1;
}

static void test_idle_wait(void) {
    memset(sh, 0, sizeof *sh);
    int code = -1;
    CHECK_OK(pt_launch(NPROC, idle_main, NULL, NULL, &code));
    CHECK_EQ(code, 0);
    for (int r = 1; r < NPROC; r++) {
        fprintf(stderr, "  rank %d: %.1f ms of CPU while waiting 1 s\n", r, sh->r[r].t_err * 1e3);
        CHECK(sh->r[r].t_err < 0.1);
    }
}

/* pt_comm_set_timeout: with a 0.5 s timeout, rank 0 late by 0.8 s is fine
 * after raising it to 5 s, and a timeout again once it is back to 0.5 s. */
static int slow_main(void *arg) {
    (void)arg;
    pt_comm *w;
    if (pt_comm_new(&w, NULL) != PT_OK) return 2;
    int me = pt_comm_rank(w);
    double old = 0;
    if (pt_comm_set_timeout(w, 0, &old) != PT_ERR_INVALID) return 3;
    if (pt_comm_set_timeout(w, 5, &old) != PT_OK || old != 0.5) return 4;
    if (me == 0) usleep(800000);
    if (pt_comm_barrier(w) != PT_OK) return 5;
    if (pt_comm_set_timeout(w, old, NULL) != PT_OK) return 6;
    sh->r[me].slow_ok = 1; /* the late rank within 5 s passed */
    if (me == 0) usleep(800000);
    pt_status st = pt_comm_barrier(w);
    sh->r[me].status = st;
    pt_comm_free(w);
    return st == PT_OK ? 0 : 1;
}

static void test_set_timeout(void) {
    memset(sh, 0, sizeof *sh);
    pt_comm_options opt = {.backend = "shm", .timeout_s = 0.5};
    int code = -1;
    CHECK_OK(pt_launch(2, slow_main, NULL, &opt, &code));
    /* The second lateness is a timeout: rank 1 fails, the launcher ends the
     * job (rank 0, the culprit, is killed while it sleeps). */
    CHECK(code != 0);
    CHECK_EQ(sh->r[0].slow_ok, 1);
    CHECK_EQ(sh->r[1].slow_ok, 1);
    CHECK_EQ(sh->r[1].status, PT_ERR_TIMEOUT);
}

/* The launcher itself SIGKILLed: its ranks die with it (PR_SET_PDEATHSIG). */
static int loop_main(void *arg) {
    (void)arg;
    pt_comm *w;
    if (pt_comm_new(&w, NULL) != PT_OK) return 2;
    sh->r[pt_comm_rank(w)].pid = (int)getpid();
    while (pt_comm_barrier(w) == PT_OK) usleep(1000);
    pt_comm_free(w);
    return 1;
}

/* Gone, or a zombie nobody reaps yet (the container's init may be slow). */
static int process_gone(int pid) {
    if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] == 'Z';
}

static void test_launcher_killed(void) {
    memset(sh, 0, sizeof *sh);
    pid_t l = fork();
    if (l == 0) {
        int code = 1;
        pt_launch(NPROC, loop_main, NULL, NULL, &code);
        _exit(code);
    }
    double t0 = pt_time_s();
    int ready = 0;
    while (!ready && pt_time_s() - t0 < 10) {
        ready = 1;
        for (int r = 0; r < NPROC; r++) ready &= sh->r[r].pid > 0;
        usleep(10000);
    }
    CHECK(ready);
    kill(l, SIGKILL);
    waitpid(l, NULL, 0);
    for (int r = 0; r < NPROC; r++) {
        int gone = 0;
        for (int tries = 0; tries < 200 && !gone; tries++) {
            gone = sh->r[r].pid <= 0 || process_gone(sh->r[r].pid);
            if (!gone) usleep(10000);
        }
        if (!gone) fprintf(stderr, "  rank %d (pid %d) outlived its launcher\n", r, sh->r[r].pid);
        CHECK(gone);
    }
}

int main(void) {
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    PT_ASSERT(sh != MAP_FAILED);
    RUN(test_clean_exit);
    RUN(test_idle_wait);
    RUN(test_kill);
    RUN(test_early_exit);
    RUN(test_nonzero_exit);
    RUN(test_hang);
    RUN(test_sigint);
    RUN(test_stop_step);
    RUN(test_stop_save);
    RUN(test_chain);
    RUN(test_offstage);
    RUN(test_set_timeout);
    RUN(test_launcher_killed);
    munmap(sh, sizeof *sh);
    return TEST_DONE();
}
