/* A save that runs out of memory, for the checkpoint tests under model
 * parallelism (test_tp_ckpt.c, test_pp_ckpt.c): each forked rank builds
 * the trainer of oc->cfg, takes one step, and saves with its fail_rank-th
 * rank's fail_after-th allocation failing; every rank writes its status,
 * whether the error is shared, and its message to the MAP_SHARED results,
 * which the test compares (every rank must return the same, shared, and
 * none may hang). Include after parallel/parity_harness.h (step_tokens). */
#ifndef PT_TEST_CKPT_OOM_H
#define PT_TEST_CKPT_OOM_H

#define OOM_RANKS 4

typedef struct {
    int status[OOM_RANKS], shared[OOM_RANKS];
    char msg[OOM_RANKS][256];
} oom_results;

static oom_results *oom; /* MAP_SHARED: the ranks write here */

typedef struct {
    pt_config cfg;
    int fail_rank;
    long fail_after; /* that rank's n-th allocation in the save fails */
} oom_case;

static int rank_oom_save(void *arg) {
    const oom_case *oc = arg;
    pt_comm *w = NULL;
    pt_comm_options o = {"shm", 20};
    if (pt_comm_init(&w, &o) != PT_OK) return 2;
    int me = pt_comm_rank(w), n = oc->cfg.train.batch_size * oc->cfg.model.seq_len;
    int *in = malloc((size_t)n * sizeof(int)), *tg = malloc((size_t)n * sizeof(int));
    step_tokens(&oc->cfg, 0, in, tg);
    pt_trainer *t = NULL;
    pt_status st = pt_trainer_new_dist(&t, &oc->cfg, w);
    if (st == PT_OK) st = pt_trainer_step_batch(t, in, tg, NULL);
    if (st == PT_OK) {
        if (me == oc->fail_rank) pt_mem_fail_after(oc->fail_after);
        st = pt_trainer_save(t);
        pt_mem_fail_after(0);
    }
    oom->status[me] = st;
    oom->shared[me] = st != PT_OK && pt_error_is_shared();
    snprintf(oom->msg[me], sizeof oom->msg[me], "%s", st == PT_OK ? "" : pt_error_message());
    pt_trainer_free(t);
    free(in);
    free(tg);
    pt_comm_free(w);
    return 0;
}

#endif
