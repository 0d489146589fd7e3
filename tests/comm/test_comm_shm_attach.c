/* The shm attach path used by `partrain bench comm` under mpirun: processes
 * not forked by pt_launch form an shm world through a named segment.
 * Here plain fork() stands in for mpirun and a pipe for MPI_Bcast. Asserts:
 * the world works (all-reduce against the double-precision reference,
 * split), the segment is mode 0600, the name is gone after
 * pt_shm_job_unlink, a peer that dies is noticed by its pid vanishing
 * (no launcher) within the timeout, and a 1 MiB all-reduce goes single-copy
 * wherever this process may read its parent's memory (and staged with
 * PT_SHM_CMA=0). */
#include "partrain/comm.h"
#include "pt_test.h"
#include "shm/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define N 3

static int probe_word = 42; /* at the same address in the parent and every fork */

/* Whether this process may read its parent's memory (what the shm backend's
 * single-copy probe needs between siblings; no Yama here means both hold). */
static int cma_allowed(void) {
    int got = 0;
    struct iovec l = {&got, sizeof got}, r = {&probe_word, sizeof got};
    return process_vm_readv(getppid(), &l, 1, &r, 1, 0) == (ssize_t)sizeof got && got == 42;
}

/* 1 MiB all-reduce against the exact sum; then single-copy must be on
 * exactly when it may be. */
static int big_allreduce(pt_comm *w, int rank) {
    enum { M = 1 << 18 };
    static float y[M];
    for (int i = 0; i < M; i++) y[i] = (float)(rank + 1) + (float)(i & 1023);
    if (pt_comm_allreduce(w, y, M, PT_REDUCE_SUM) != PT_OK) return 20;
    for (int i = 0; i < M; i++)
        if (y[i] != 6.0f + 3.0f * (float)(i & 1023)) return 21;
    const char *e = getenv("PT_SHM_CMA");
    int want = (e && !strcmp(e, "0")) || !cma_allowed() ? -1 : 1;
    if (pt_shm_single_copy(w) != want) {
        fprintf(stderr, "rank %d: single-copy %d, expected %d\n", rank, pt_shm_single_copy(w),
                want);
        return 22;
    }
    return 0;
}

/* Child: attach as `rank`, all-reduce, check, exit 0 on success. */
static int child(const char *name, int rank, int die, int ready_fd) {
    pt_comm *w = NULL;
    pt_comm_options opt = {"shm", 2.0};
    pt_status ast = pt_comm_shm_attach(name, rank, N, &opt, &w);
    char one = 1;
    if (write(ready_fd, &one, 1) != 1) return 9; /* "attached": the creator may unlink */
    if (ast != PT_OK) {
        fprintf(stderr, "attach: %s\n", pt_error_message());
        return 10;
    }
    if (pt_comm_barrier(w) != PT_OK) return 11;
    float x[1000];
    for (int i = 0; i < 1000; i++) x[i] = (float)(rank + 1) * 0.5f + (float)i;
    if (pt_comm_allreduce(w, x, 1000, PT_REDUCE_SUM) != PT_OK) return 12;
    for (int i = 0; i < 1000; i++) {
        double want = 3.0 + 3.0 * i; /* 0.5 * (1 + 2 + 3) + 3 i, exact in float */
        if (x[i] != want) return 13;
    }
    int big = big_allreduce(w, rank);
    if (big) return big;
    pt_comm *sub = NULL;
    if (pt_comm_split(w, rank == 0, rank, &sub) != PT_OK) return 14;
    if (pt_comm_size(sub) != (rank == 0 ? 1 : 2)) return 15;
    pt_comm_free(sub);
    int rc = 0;
    if (die >= 0) {
        if (rank == die) _exit(0); /* gone without a word */
        double t0 = pt_time_s();
        pt_status st = pt_comm_barrier(w);
        rc = st == PT_ERR_COMM && strstr(pt_error_message(), "is gone") ? 0 : 16;
        if (rc) fprintf(stderr, "rank %d: %d %s\n", rank, st, pt_error_message());
        if (pt_time_s() - t0 > 3.0) rc = 17;
    }
    pt_comm_free(w);
    return rc;
}

static void run(int die) {
    char name[PT_SHM_NAME_MAX];
    CHECK_OK(pt_shm_job_create(N, 0, name, sizeof name));
    struct stat sb;
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    CHECK_EQ(stat(path, &sb), 0);
    CHECK_EQ(sb.st_mode & 0777, 0600);
    pid_t pids[N];
    int fds[2];
    CHECK_EQ(pipe(fds), 0);
    for (int r = 0; r < N; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(child(name, r, die, fds[1]));
    }
    /* Stand-in for "all attached, then MPI_Barrier, then unlink". */
    char got[N];
    size_t have = 0;
    while (have < N) {
        ssize_t k = read(fds[0], got + have, N - have);
        if (k <= 0) break;
        have += (size_t)k;
    }
    close(fds[0]);
    close(fds[1]);
    CHECK_OK(pt_shm_job_unlink(name));
    /* Reap the one that dies first: a zombie still answers kill(pid, 0)
     * (mpirun's daemon reaps at once). */
    for (int i = 0; i < N; i++) {
        int r = die >= 0 ? (die + i) % N : i;
        int ws = 0;
        waitpid(pids[r], &ws, 0);
        CHECK(WIFEXITED(ws));
        CHECK_EQ(WEXITSTATUS(ws), 0);
    }
    CHECK(stat(path, &sb) != 0 && errno == ENOENT);
}

static void test_attach(void) {
    run(-1);
}
static void test_attach_dead_peer(void) {
    run(1);
}
static void test_attach_staged(void) {
    setenv("PT_SHM_CMA", "0", 1);
    pt_knobs_reread(); /* knobs are read once: see the new value */
    run(-1);
    unsetenv("PT_SHM_CMA");
    pt_knobs_reread();
}

int main(void) {
    RUN(test_attach);
    RUN(test_attach_dead_peer);
    RUN(test_attach_staged);
    return TEST_DONE();
}
