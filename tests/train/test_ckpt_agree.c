/* Sliced saves on two ranks (trainer_ckpt.c, ckpt_write.c): what each rank
 * holds and writes, and one verdict when a rank fails.
 *
 *   - memory: during a synchronous save no category grows on any rank (no
 *     tensor is copied: every piece is written from the live buffer, and
 *     the save's tables are a few KiB of metadata); under checkpoint.async
 *     scratch grows by the staging buffer, exactly the bytes the rank
 *     writes, and nothing else grows. The
 *     bytes written: their sum over the ranks is the files' data, each
 *     element once; at dp 2 (ZeRO or not) and tp 2 each rank writes half
 *     (to a few elements a tensor), at pp 2 each rank its own stage's.
 *     Layouts: dp 2, dp 2 ZeRO-1 and ZeRO-3, tp 2, pp 2, dp 2 local_sgd
 *     nesterov (its replica and sync files beside the main ones).
 *   - a rank that cannot allocate its staging buffer (async), or whose file
 *     cannot be written (RLIMIT_FSIZE: rank 0 creating the files, or rank
 *     1 writing its slices): every rank returns that rank's line, shared,
 *     within the comm timeout (nobody left waiting in a collective).
 * Also pt_comm_agree itself on 3 ranks: all OK, one failure (status and
 * message of the lowest failing rank, shared), two failures. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../../src/train/trainer_test.h"
#include "partrain/comm.h"
#include "partrain/train.h"
#include "pt_test.h"

#define TIMEOUT_S 8.0

typedef struct {
    int status[4];
    int shared[4];
    double seconds[4];
    char msg[4][256];
    size_t grew[4][PT_MEM_NCAT]; /* each category's peak in the save, above its level before */
    uint64_t written[4];
    size_t nparams[4]; /* this rank's model's (its stage's tp slice) */
    size_t full;       /* the whole model's */
} results;

static results *res; /* MAP_SHARED: the ranks write here */
static char data_path[256], ckpt_dir[256];

typedef struct {
    pt_config cfg;
    int fail_rank; /* this rank's next allocation fails right before the save */
    int fsize_rank;
    long fsize; /* > 0: rank fsize_rank's files cannot grow past this many bytes in the save */
} save_case;

static void limit_files(long bytes, struct rlimit *was) {
    getrlimit(RLIMIT_FSIZE, was);
    signal(SIGXFSZ, SIG_IGN); /* a write past the limit fails with EFBIG */
    struct rlimit lim = {(rlim_t)bytes, was->rlim_max};
    setrlimit(RLIMIT_FSIZE, &lim);
}

static int rank_save(void *arg) {
    const save_case *sc = arg;
    pt_comm *w = NULL;
    pt_comm_options o = {"shm", TIMEOUT_S};
    if (pt_comm_new(&w, &o) != PT_OK) return 2;
    int me = pt_comm_rank(w);
    pt_trainer *t = NULL;
    pt_status st = pt_trainer_new_dist(&t, &sc->cfg, w);
    if (st == PT_OK) st = pt_trainer_step(t, NULL);
    double t0 = pt_time_s();
    if (st == PT_OK) {
        size_t before[PT_MEM_NCAT];
        for (int c = 0; c < PT_MEM_NCAT; c++) before[c] = pt_mem_current((pt_mem_cat)c);
        pt_mem_reset_peak();
        if (me == sc->fail_rank) pt_mem_fail_after(1);
        struct rlimit was;
        if (me == sc->fsize_rank && sc->fsize > 0) limit_files(sc->fsize, &was);
        st = pt_trainer_save(t);
        pt_status e = pt_trainer_save_wait(t);
        if (st == PT_OK) st = e;
        if (me == sc->fsize_rank && sc->fsize > 0) setrlimit(RLIMIT_FSIZE, &was);
        pt_mem_fail_after(0);
        for (int c = 0; c < PT_MEM_NCAT; c++)
            res->grew[me][c] = pt_mem_peak((pt_mem_cat)c) - before[c];
        res->written[me] = pt_trainer_ckpt_written(t);
        res->nparams[me] = pt_model_num_params(pt_trainer_model(t));
        res->full = pt_trainer_num_params(t);
    }
    res->seconds[me] = pt_time_s() - t0;
    res->status[me] = st;
    res->shared[me] = pt_error_is_shared();
    snprintf(res->msg[me], sizeof res->msg[me], "%s", st == PT_OK ? "" : pt_error_message());
    pt_trainer_free(t);
    pt_comm_free(w);
    return 0;
}

/* want: the message every rank must share, with status want_st; NULL:
 * every rank succeeds */
static void run_save(const char *name, save_case *sc, pt_status want_st, const char *want) {
    memset(res, 0, sizeof *res);
    int code = -1;
    pt_comm_options o = {"shm", TIMEOUT_S};
    CHECK_OK(pt_launch(2, rank_save, sc, &o, &code));
    CHECK_EQ(code, 0);
    for (int r = 0; r < 2; r++) {
        fprintf(stderr, "  [%s] rank %d: %s after %.2f s%s%s\n", name, r,
                pt_status_name((pt_status)res->status[r]), res->seconds[r],
                res->msg[r][0] ? ": " : "", res->msg[r]);
        CHECK(res->seconds[r] < TIMEOUT_S); /* nobody waited for a timeout */
        if (!want) {
            CHECK_EQ(res->status[r], PT_OK);
            continue;
        }
        CHECK_EQ(res->status[r], want_st);
        CHECK(strstr(res->msg[r], want) != NULL);
        CHECK_EQ(res->shared[r], 1);
    }
    if (want) CHECK(!strcmp(res->msg[0], res->msg[1]));
}

static void base_config(pt_config *c) {
    pt_config_defaults(c);
    /* C 128: a rank's slices (MBs) larger than the 1 MiB shm ring */
    c->model = (pt_model_config){2, 128, 2, 256, 16};
    c->train.steps = 4;
    c->train.batch_size = 4;
    c->train.threads = 1;
    c->train.warmup_steps = 1;
    c->train.val_every = 0;
    c->parallel.dp = 2;
    snprintf(c->data.train, sizeof c->data.train, "%s", data_path);
    snprintf(c->checkpoint.dir, sizeof c->checkpoint.dir, "%s", ckpt_dir);
}

typedef struct {
    const char *name, *set[4];
    int groups; /* the files' groups: model, m, v, and the rank-state files' */
    int stage;  /* 1: each rank writes its own stage's state, else half of everything */
} layout;

static const layout layouts[] = {
    {"dp2", {NULL}, 3, 0},
    {"dp2 zero1", {"parallel.zero=1", NULL}, 3, 0},
    {"dp2 zero3", {"parallel.zero=3", NULL}, 3, 0},
    {"tp2", {"parallel.dp=1", "parallel.tp=2", NULL}, 3, 0},
    {"pp2", {"parallel.dp=1", "parallel.pp=2", NULL}, 3, 1},
    /* params, m, v of dp index 0 (main) and 1 (replica1), anchor and momentum (sync) */
    {"dp2 local_sgd nesterov", {"parallel.sync=local_sgd", "parallel.outer=nesterov", NULL}, 8, 0},
};

static void apply(save_case *sc, const layout *l) {
    base_config(&sc->cfg);
    for (int k = 0; l->set[k]; k++) CHECK_OK(pt_config_set(&sc->cfg, l->set[k]));
}

/* Every layout, synchronous and asynchronous: the bytes each rank writes
 * and what the save held beside the live buffers. */
static void test_save_memory(void) {
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        for (int async = 0; async <= 1; async++) {
            save_case sc = {.fail_rank = -1, .fsize_rank = -1};
            apply(&sc, &layouts[i]);
            sc.cfg.checkpoint.async = async;
            char name[64];
            snprintf(name, sizeof name, "%s%s", layouts[i].name, async ? " async" : "");
            run_save(name, &sc, PT_OK, NULL);
            uint64_t total = (uint64_t)layouts[i].groups * res->full * 4;
            CHECK_EQ(res->written[0] + res->written[1], total);
            for (int r = 0; r < 2; r++) {
                uint64_t w = res->written[r];
                if (layouts[i].stage) /* its own stage: params, m, v */
                    CHECK_EQ(w, (uint64_t)res->nparams[r] * 12);
                else /* half, to a few elements a tensor */
                    CHECK(w > total / 2 - total / 100 && w < total / 2 + total / 100);
                size_t scratch = res->grew[r][PT_MEM_SCRATCH];
                CHECK_EQ(scratch, async ? w : 0);
                for (int c = 0; c < PT_MEM_NCAT; c++)
                    if (c != PT_MEM_SCRATCH) CHECK_EQ(res->grew[r][c], 0);
                fprintf(stderr, "    rank %d wrote %.2f of %.2f MB, held %zu B of scratch\n", r,
                        w / 1e6, total / 1e6, scratch);
            }
        }
}

/* The staging buffer of an asynchronous save (its one counted
 * allocation) fails on one rank: every rank returns its line, from the
 * wait. */
static void test_save_alloc_fails(void) {
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        for (int r = 0; r < 2; r++) {
            save_case sc = {.fail_rank = r, .fsize_rank = -1};
            apply(&sc, &layouts[i]);
            sc.cfg.checkpoint.async = 1;
            char name[64];
            snprintf(name, sizeof name, "%s, rank %d out of memory", layouts[i].name, r);
            run_save(name, &sc, PT_ERR_NOMEM, "checkpoint.async: staging buffer");
        }
}

/* A file that cannot grow: rank 0's when it creates the files, rank 1's
 * when it writes its slices (past its first 100 kB). */
static void test_save_write_fails(void) {
    for (size_t i = 1; i < 5; i++)
        for (int r = 0; r < 2; r++) {
            save_case sc = {.fail_rank = -1, .fsize_rank = r, .fsize = 100000};
            apply(&sc, &layouts[i]);
            sc.cfg.checkpoint.async = r;
            char name[80];
            snprintf(name, sizeof name, "%s, rank %d's files limited%s", layouts[i].name, r,
                     r ? " (async)" : "");
            run_save(name, &sc, PT_ERR_IO, ".safetensors: write failed: File too large");
        }
}

/* pt_comm_agree: ranks in `failing` fail with PT_ERR_IO + a message naming
 * them; every rank must return the lowest one's. */
static int failing_mask;

static int rank_agree(void *arg) {
    (void)arg;
    pt_comm *w = NULL;
    pt_comm_options o = {"shm", TIMEOUT_S};
    if (pt_comm_new(&w, &o) != PT_OK) return 2;
    int me = pt_comm_rank(w);
    pt_status local = PT_OK;
    if (failing_mask >> me & 1)
        local = pt_error_set(me == 2 ? PT_ERR_FORMAT : PT_ERR_IO, "failure on rank %d", me);
    pt_status st = pt_comm_agree(w, local);
    res->status[me] = st;
    res->shared[me] = st != PT_OK && pt_error_is_shared();
    snprintf(res->msg[me], sizeof res->msg[me], "%s", st == PT_OK ? "" : pt_error_message());
    /* the communicator stays usable after an agreed failure */
    pt_status again = pt_comm_barrier(w);
    pt_comm_free(w);
    return again == PT_OK ? 0 : 1;
}

static void test_agree(void) {
    const struct {
        int mask, want_st;
        const char *want_msg;
    } cases[] = {{0, PT_OK, ""},
                 {1 << 2, PT_ERR_FORMAT, "failure on rank 2"},
                 {(1 << 1) | (1 << 2), PT_ERR_IO, "failure on rank 1"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(res, 0, sizeof *res);
        failing_mask = cases[i].mask;
        int code = -1;
        CHECK_OK(pt_launch(3, rank_agree, NULL, NULL, &code));
        CHECK_EQ(code, 0);
        for (int r = 0; r < 3; r++) {
            CHECK_EQ(res->status[r], cases[i].want_st);
            CHECK(strcmp(res->msg[r], cases[i].want_msg) == 0);
            CHECK_EQ(res->shared[r], cases[i].want_st != PT_OK);
        }
    }
}

int main(void) {
    res = mmap(NULL, sizeof *res, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    PT_ASSERT(res != MAP_FAILED);
    char tmpl[] = "/tmp/pt-test-ckpt-agree-XXXXXX";
    PT_ASSERT(mkdtemp(tmpl) != NULL);
    snprintf(data_path, sizeof data_path, "%s/train.txt", tmpl);
    snprintf(ckpt_dir, sizeof ckpt_dir, "%s/ck", tmpl);
    FILE *f = fopen(data_path, "w");
    PT_ASSERT(f != NULL);
    for (int i = 0; i < 400; i++) fprintf(f, "the quick brown fox %d jumps over the lazy dog\n", i);
    fclose(f);
    RUN(test_agree);
    RUN(test_save_memory);
    RUN(test_save_alloc_fails);
    RUN(test_save_write_fails);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpl);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpl);
    munmap(res, sizeof *res);
    return TEST_DONE();
}
