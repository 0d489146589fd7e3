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

enum { KILL, EARLY, NONZERO, HANG, SIGINT_LAUNCHER };
static const char *case_names[] = {"kill", "early", "nonzero", "hang", "sigint"};

typedef struct {
    int pid;
    int status; /* first error, 0 if none */
    int again;  /* status of a barrier after that error */
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
    if (pt_comm_init(&w, &opt) != PT_OK) return 2;
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
        st = pt_comm_allreduce(w, buf, COUNT, PT_REDUCE_SUM);
    }
    if (st != PT_OK) {
        sh->r[me].status = st;
        sh->r[me].t_err = pt_time_s();
        snprintf(sh->r[me].msg, sizeof sh->r[me].msg, "%s", pt_error_message());
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
    double elapsed = pt_time_s() - t0;
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
    int broken = which == KILL      ? 2
                 : which == EARLY   ? 3
                 : which == NONZERO ? 1
                 : which == HANG    ? 1
                                    : -1;
    char want[32];
    snprintf(want, sizeof want, "rank %d", broken);
    if (summary && broken >= 0) CHECK(strstr(summary, want) != NULL);
    if (summary && which == KILL) CHECK(strstr(summary, "SIGKILL") != NULL);
    if (summary && which == KILL) CHECK(strstr(summary, "during allreduce at step") != NULL);
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
        int want_st = which == HANG              ? PT_ERR_TIMEOUT
                      : which == SIGINT_LAUNCHER ? PT_ERR_INTERRUPTED
                                                 : PT_ERR_COMM;
        /* early, hang: the first rank to notice exits 1 and the job abort
         * that follows may reach the others first (PT_ERR_COMM naming that
         * rank); at least one rank names the broken one (checked below). */
        if ((which == EARLY || which == HANG) && rr->status == PT_ERR_COMM) want_st = rr->status;
        if (which == EARLY && rr->status == PT_ERR_TIMEOUT) want_st = rr->status;
        if (strstr(rr->msg, want)) named++;
        CHECK_EQ(rr->status, want_st);
        if (broken >= 0 && which != EARLY && which != HANG) {
            if (!strstr(rr->msg, want)) fprintf(stderr, "  rank %d: %s\n", r, rr->msg);
            CHECK(strstr(rr->msg, want) != NULL);
        }
        CHECK(strstr(rr->msg, "allreduce") != NULL);
        if (rr->status != 0) CHECK_EQ(rr->again, PT_ERR_COMM);
        double dt = rr->t_err - sh->t_break;
        if (!(dt < TIMEOUT_S + 0.5)) fprintf(stderr, "  rank %d noticed after %.2f s\n", r, dt);
        CHECK(dt < TIMEOUT_S + 0.5);
    }
    if (broken >= 0) CHECK(named > 0);
    /* Nothing left behind. */
    for (int r = 0; r < NPROC; r++) {
        if (sh->r[r].pid <= 0) continue;
        int gone = kill(sh->r[r].pid, 0) != 0 && errno == ESRCH;
        if (!gone) fprintf(stderr, "  rank %d (pid %d) is still there\n", r, sh->r[r].pid);
        CHECK(gone);
    }
    /* Only ours count: tests of other backends (Open MPI's segments) may
     * run at the same time. */
    list_shm(after, sizeof after);
    int leftover = 0;
    for (char *line = strtok(after, "\n"); line; line = strtok(NULL, "\n")) {
        char key[300];
        snprintf(key, sizeof key, "%s\n", line);
        if (!strstr(before, key)) {
            fprintf(stderr, "  new in /dev/shm: %s\n", line);
            if (strstr(line, "partrain")) leftover++;
        }
    }
    CHECK_EQ(leftover, 0);
    CHECK(elapsed < TIMEOUT_S + 4);
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

/* A clean job: exit code 0, no summary line. */
static int ok_main(void *arg) {
    (void)arg;
    pt_comm *w;
    if (pt_comm_init(&w, NULL) != PT_OK) return 2;
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
    CHECK_OK(pt_comm_init(&self, NULL));
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
    if (pt_comm_init(&w, NULL) != PT_OK) return 2;
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
    if (pt_comm_init(&w, NULL) != PT_OK) return 2;
    int me = pt_comm_rank(w);
    double old = 0;
    if (pt_comm_set_timeout(w, 0, &old) != PT_ERR_INVALID) return 3;
    if (pt_comm_set_timeout(w, 5, &old) != PT_OK || old != 0.5) return 4;
    if (me == 0) usleep(800000);
    if (pt_comm_barrier(w) != PT_OK) return 5;
    if (pt_comm_set_timeout(w, old, NULL) != PT_OK) return 6;
    if (me == 0) usleep(800000);
    pt_status st = pt_comm_barrier(w);
    pt_comm_free(w);
    return me == 0 ? 0 : st == PT_ERR_TIMEOUT ? 0 : 7;
}

static void test_set_timeout(void) {
    pt_comm_options opt = {.backend = "shm", .timeout_s = 0.5};
    int code = -1;
    CHECK_OK(pt_launch(2, slow_main, NULL, &opt, &code));
    CHECK_EQ(code, 0);
}

/* The launcher itself SIGKILLed: its ranks die with it (PR_SET_PDEATHSIG). */
static int loop_main(void *arg) {
    (void)arg;
    pt_comm *w;
    if (pt_comm_init(&w, NULL) != PT_OK) return 2;
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
    RUN(test_set_timeout);
    RUN(test_launcher_killed);
    munmap(sh, sizeof *sh);
    return TEST_DONE();
}
