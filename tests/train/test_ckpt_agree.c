/* A rank that fails inside a checkpoint's collective sequence must not leave
 * its peers waiting: every rank reaches the same verdict at once (one
 * status, the failing rank's message, marked shared so that it is printed
 * once), well within the comm timeout. Allocation failures are injected
 * with the counting allocator (pt_mem_fail_after) on one rank:
 *   - ZeRO-1 at dp 2, rank 0 cannot allocate the module it receives the
 *     shards into (it alone receives them): rank 1 must not be left in its
 *     sends;
 *   - ZeRO-1 and ZeRO-3 at dp 2, rank 1 with no allocation to make: the
 *     save succeeds, since only dp rank 0 holds the full tensors (an
 *     all-gather gave every rank a full copy, dp times the memory);
 *   - ZeRO-3 at dp 2: the save's scratch is one module on rank 0 (the
 *     shards gathered and written a module at a time, not the model, nor
 *     all three tensor sets at once), none on rank 1; and when rank 0's
 *     file cannot be written past its start, rank 1 (6 layers: its slices
 *     outgrow the shm ring) must not be left in its sends;
 *   - tp 2 and pp 2: world rank 0 writes the whole model's tensors as
 *     they stream in, one at a time, its scratch one tensor and one
 *     member's slice of it, not the model; it cannot allocate them, or its
 *     file cannot be written past its start (RLIMIT_FSIZE, with a member's
 *     tensors larger than the shm ring, so that a member not drained stays
 *     in its send): the others must not be left blocked;
 *   - local_sgd at dp 2 (per-rank files), rank 0 cannot allocate the
 *     scratch it receives the rank files through: the others must not be
 *     left blocked in their sends (the model is large enough that a rank
 *     file does not fit the shm ring: a send waits for its receiver).
 * Also pt_comm_agree itself on 3 ranks: all OK, one failure (status and
 * message of the lowest failing rank, shared), two failures.
 * On 2 busy cores each case takes well under a second; the comm timeout is
 * 8 s, so a rank left waiting shows as PT_ERR_TIMEOUT (or the test's own
 * time limit), never as the expected PT_ERR_NOMEM. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "partrain/comm.h"
#include "partrain/train.h"
#include "pt_test.h"

#define TIMEOUT_S 8.0

typedef struct {
    int status[4];
    int shared[4];
    double seconds[4];
    char msg[4][256];
    size_t scratch[4]; /* the save's peak of scratch bytes */
    size_t nparams[4];
    size_t module_max[4]; /* the largest module's floats */
} results;

static results *res; /* MAP_SHARED: the ranks write here */
static char data_path[256], ckpt_dir[256];

typedef struct {
    pt_config cfg;
    int fail_rank; /* this rank's next allocation fails right before the save */
    long fsize;    /* > 0: rank 0's files cannot grow past this many bytes in the save */
} save_case;

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
        pt_mem_reset_peak();
        size_t before = pt_mem_current(PT_MEM_SCRATCH);
        if (me == sc->fail_rank) pt_mem_fail_after(1);
        struct rlimit was;
        getrlimit(RLIMIT_FSIZE, &was);
        if (me == 0 && sc->fsize > 0) {
            signal(SIGXFSZ, SIG_IGN); /* a write past the limit fails with EFBIG */
            struct rlimit lim = {(rlim_t)sc->fsize, was.rlim_max};
            setrlimit(RLIMIT_FSIZE, &lim);
        }
        st = pt_trainer_save(t);
        setrlimit(RLIMIT_FSIZE, &was);
        pt_mem_fail_after(0);
        res->scratch[me] = pt_mem_peak(PT_MEM_SCRATCH) - before;
        const pt_model *m = pt_trainer_model(t);
        res->nparams[me] = pt_model_num_params(m);
        for (int i = 0; i < pt_model_num_modules(m); i++) {
            size_t off, count;
            pt_model_module_region(m, i, &off, &count);
            if (count > res->module_max[me]) res->module_max[me] = count;
        }
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
static void run_save_st(const char *name, save_case *sc, pt_status want_st, const char *want) {
    memset(res, 0, sizeof *res);
    int code = -1;
    pt_comm_options o = {"shm", TIMEOUT_S};
    CHECK_OK(pt_launch(2, rank_save, sc, &o, &code));
    CHECK_EQ(code, 0);
    for (int r = 0; r < 2; r++) {
        fprintf(stderr, "  [%s] rank %d: %s after %.2f s: %s\n", name, r,
                pt_status_name((pt_status)res->status[r]), res->seconds[r], res->msg[r]);
        CHECK(res->seconds[r] < TIMEOUT_S); /* nobody waited for a timeout */
        if (!want) {
            CHECK_EQ(res->status[r], PT_OK);
            continue;
        }
        CHECK_EQ(res->status[r], want_st);
        CHECK(strstr(res->msg[r], want) != NULL);
        CHECK_EQ(res->shared[r], 1);
    }
}

static void run_save(const char *name, save_case *sc, const char *want) {
    run_save_st(name, sc, PT_ERR_NOMEM, want);
}

static void base_config(pt_config *c) {
    pt_config_defaults(c);
    /* C 128: a rank file (parameters, 2 moments) of about 1.7 MB per group,
     * larger than the 1 MiB shm ring */
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

static void test_zero_save_alloc_fails(void) {
    save_case sc = {.fail_rank = 0};
    base_config(&sc.cfg);
    sc.cfg.parallel.zero = 1;
    run_save("zero1", &sc, "checkpoint: a module from the shards");
}

static void test_zero_save_only_root_allocates(void) {
    for (int zero = 1; zero <= 3; zero += 2) {
        save_case sc = {.fail_rank = 1};
        base_config(&sc.cfg);
        sc.cfg.parallel.zero = zero;
        run_save(zero == 1 ? "zero1, rank 1" : "zero3, rank 1", &sc, NULL);
    }
}

/* A ZeRO-3 save's scratch: dp rank 0 receives one module at a time (a
 * block: 4 bytes a parameter of it; gathering a tensor set whole took the
 * model's), rank 1 none. Its write failing, rank 1 still sends every
 * module and both learn the error. */
static void test_zero_save_scratch(void) {
    save_case sc = {.fail_rank = -1};
    base_config(&sc.cfg);
    sc.cfg.parallel.zero = 3;
    run_save("zero3, scratch", &sc, NULL);
    fprintf(stderr,
            "  scratch: rank 0 %zu B, rank 1 %zu B (%zu parameters, a module at most %zu)\n",
            res->scratch[0], res->scratch[1], res->nparams[0], res->module_max[0]);
    CHECK_EQ(res->scratch[0], res->module_max[0] * sizeof(float));
    CHECK(res->module_max[0] < res->nparams[0] / 2);
    CHECK_EQ(res->scratch[1], 0);
    save_case w = {.fail_rank = -1, .fsize = 100000};
    base_config(&w.cfg);
    w.cfg.model.n_layer = 6;
    w.cfg.parallel.zero = 3;
    run_save_st("zero3, write fails", &w, PT_ERR_IO, "model.safetensors");
}

/* tp 2 and pp 2 of base_config's model (2 layers, C 128, vocab 256): the
 * largest tensor is an MLP matrix, 128 x 512 (65536 floats). tp 2 splits
 * it: rank 0 assembles it whole while it receives rank 1's half (32768
 * floats). pp 2 splits none: rank 0 receives stage 1's largest tensor
 * (h.1's MLP matrix) and writes it from there. Rank 1 sends from its own
 * buffers. Gathering the model first took 4 bytes a parameter. */
static void test_mp_save_scratch(void) {
    for (int pp = 1; pp <= 2; pp++) {
        save_case sc = {.fail_rank = -1};
        base_config(&sc.cfg);
        sc.cfg.parallel.dp = 1;
        sc.cfg.parallel.tp = 3 - pp;
        sc.cfg.parallel.pp = pp;
        run_save(pp == 1 ? "tp2, scratch" : "pp2, scratch", &sc, NULL);
        fprintf(stderr, "  scratch: rank 0 %zu B, rank 1 %zu B\n", res->scratch[0],
                res->scratch[1]);
        CHECK_EQ(res->scratch[0], (pp == 1 ? 65536 + 32768 : 65536) * sizeof(float));
        CHECK_EQ(res->scratch[1], 0);
    }
}

static void test_mp_save_fails(void) {
    save_case sc = {.fail_rank = 0};
    base_config(&sc.cfg);
    sc.cfg.parallel.dp = 1;
    sc.cfg.parallel.tp = 2;
    run_save("tp2, rank 0 out of memory", &sc, "model-parallel save");
    /* 6 layers: rank 1's slices (about 1.9 MB) outgrow the 1 MiB ring */
    for (int pp = 1; pp <= 2; pp++) {
        save_case w = {.fail_rank = -1, .fsize = 100000};
        base_config(&w.cfg);
        w.cfg.model.n_layer = 6;
        w.cfg.parallel.dp = 1;
        w.cfg.parallel.tp = 3 - pp;
        w.cfg.parallel.pp = pp;
        run_save_st(pp == 1 ? "tp2, write fails" : "pp2, write fails", &w, PT_ERR_IO,
                    "model.safetensors");
    }
}

static void test_rank_files_scratch_fails(void) {
    save_case sc = {.fail_rank = 0};
    base_config(&sc.cfg);
    snprintf(sc.cfg.parallel.sync, sizeof sc.cfg.parallel.sync, "local_sgd");
    run_save("local_sgd", &sc, "per-rank state buffer");
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
    RUN(test_zero_save_alloc_fails);
    RUN(test_zero_save_only_root_allocates);
    RUN(test_zero_save_scratch);
    RUN(test_mp_save_scratch);
    RUN(test_mp_save_fails);
    RUN(test_rank_files_scratch_fails);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpl);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpl);
    munmap(res, sizeof *res);
    return TEST_DONE();
}
