/* partrain calibrate: the shm backend's collectives and point-to-point
 * (calibrate_impl.h), each op at sizes 4 KiB and up in groups of 2 and 4
 * forked ranks (pt_launch), through the comm layer's own timer
 * (pt_comm_time): the fastest of a few rounds, unscaled (copies do not move
 * with a product's rate).
 *
 * Not here: the mpi backend. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "calibrate_impl.h"

typedef struct {
    const effort *e;
    int ranks;
    pt_profile_comm *out; /* shared with the parent (MAP_SHARED) */
    int *n_out;
    int max_out;
} comm_job;

static const struct {
    pt_comm_op op;
    int profile_op;
} comm_ops[] = {{PT_OP_ALLREDUCE, PT_PROFILE_ALLREDUCE},
                {PT_OP_ALLGATHER, PT_PROFILE_ALLGATHER},
                {PT_OP_REDUCE_SCATTER, PT_PROFILE_REDUCE_SCATTER},
                {PT_OP_BROADCAST, PT_PROFILE_BROADCAST},
                {PT_OP_SEND, PT_PROFILE_P2P}};
#define N_COMM_OPS (int)(sizeof comm_ops / sizeof comm_ops[0])

static size_t comm_buf_bytes(const effort *e) {
    return e->p2p_max_bytes > e->comm_max_bytes ? e->p2p_max_bytes : e->comm_max_bytes;
}

static pt_status comm_measure(const comm_job *j, pt_comm *c, float *buf) {
    int rank = pt_comm_rank(c);
    for (int oi = 0; oi < N_COMM_OPS; oi++) {
        if (comm_ops[oi].op == PT_OP_SEND && j->ranks != 2) continue; /* p2p: a pair */
        /* the point-to-point up to a tied embedding's size (gpt2's wte: 154
         * MB), which moves from beyond the caches: in a pipeline step it
         * took 22 ms, 16 MiB's rate said 8.7 */
        size_t max = comm_ops[oi].op == PT_OP_SEND ? j->e->p2p_max_bytes : j->e->comm_max_bytes;
        for (size_t bytes = 4096; bytes <= max; bytes *= j->e->comm_step) {
            /* about 4 MiB moved per measurement (1 MiB quick), 3..100 operations */
            size_t budget = j->e->quick ? (1u << 20) : (4u << 20);
            size_t it = budget / bytes;
            int iters = it < 3 ? 3 : it > 100 ? 100 : (int)it;
            double r[8];
            for (int k = 0; k < j->e->comm_rounds; k++)
                PT_CHECK(pt_comm_time(c, comm_ops[oi].op, buf, bytes, iters, &r[k]));
            double best = r[0];
            for (int q = 1; q < j->e->comm_rounds; q++)
                if (r[q] < best) best = r[q];
            if (rank != 0) continue;
            if (*j->n_out >= j->max_out)
                return pt_error_set(PT_ERR_INTERNAL, "calibrate: comm table full");
            pt_profile_comm *pc = &j->out[(*j->n_out)++];
            memset(pc, 0, sizeof *pc);
            snprintf(pc->backend, sizeof pc->backend, "shm");
            pc->op = comm_ops[oi].profile_op;
            pc->ranks = j->ranks;
            pc->bytes = (double)bytes;
            pc->seconds = best;
        }
    }
    return PT_OK;
}

static int comm_rank_main(void *arg) {
    const comm_job *j = arg;
    pt_comm_options co = {.backend = "shm"};
    pt_comm *c = NULL;
    pt_status s = pt_comm_new(&c, &co);
    float *buf = NULL;
    if (s == PT_OK) {
        buf = pt_mem_alloc(PT_MEM_COMM, comm_buf_bytes(j->e));
        s = buf ? PT_OK : pt_error_set(PT_ERR_NOMEM, "calibrate: comm buffer");
    }
    if (s == PT_OK) {
        memset(buf, 0, comm_buf_bytes(j->e)); /* zeros: sums stay 0; pages faulted in */
        s = comm_measure(j, c, buf);
    }
    if (s != PT_OK)
        fprintf(stderr, "partrain calibrate: rank %d of %d: %s\n", c ? pt_comm_rank(c) : -1,
                j->ranks, pt_error_message());
    pt_mem_free(buf);
    pt_comm_free(c);
    return s == PT_OK ? 0 : 1;
}

pt_status pt_calib_measure_comm(calib *k) {
    const int max_out = 256;
    size_t bytes = sizeof(int) * 16 + sizeof(pt_profile_comm) * max_out;
    void *shared = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED)
        return pt_error_set(PT_ERR_NOMEM, "calibrate: shared results: %s", strerror(errno));
    pt_status st = PT_OK;
    static const int group[] = {2, 4};
    for (int g = 0; g < 2 && st == PT_OK; g++) {
        int *n_out = shared;
        *n_out = 0;
        comm_job j = {.e = k->e,
                      .ranks = group[g],
                      .out = (pt_profile_comm *)((char *)shared + sizeof(int) * 16),
                      .n_out = n_out,
                      .max_out = max_out};
        pt_comm_options co = {.backend = "shm"};
        int exit_code = 1;
        st = pt_launch(group[g], comm_rank_main, &j, &co, &exit_code);
        if (st == PT_OK && exit_code != 0)
            st =
                pt_error_set(PT_ERR_COMM, "calibrate: the %d-rank shm measurement failed (exit %d)",
                             group[g], exit_code);
        for (int i = 0; st == PT_OK && i < *n_out; i++)
            st = pt_calib_push((void **)&k->p->comm, &k->p->n_comm, &k->cap_comm, sizeof j.out[i],
                               &j.out[i]);
    }
    munmap(shared, bytes);
    return st;
}
