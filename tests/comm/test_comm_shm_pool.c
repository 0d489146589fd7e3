/* The shm backend's sub-communicator pool: regions of freed
 * sub-communicators are reused, so that repeated trainers or many groups
 * never run out of arena. 3 ranks make and free 300 rounds of groups (a
 * pair and a single by color, and the whole world again): about 900
 * regions, 20 times what the arena holds at once (512 MiB of address
 * space, about 40 regions of 3 ranks). Each group's all-reduce is checked,
 * so a reused region that was not clean (its sync flags) shows as a wrong
 * sum or a hang. Then groups of mixed sizes held at once and freed out of
 * order (the free extents merge), and a last round at full size. */
#include "partrain/comm.h"
#include "pt_test.h"

#include <sys/mman.h>

#define NPROC  3
#define ROUNDS 300

static int *fails; /* MAP_SHARED: per rank, the first failing round + 1 */

static int check_sum(pt_comm *c, float v, float want) {
    float x = v;
    if (pt_comm_allreduce(c, &x, 1, PT_REDUCE_SUM) != PT_OK) return 0;
    return x == want;
}

static int rank_main(void *arg) {
    (void)arg;
    pt_comm *w = NULL;
    if (pt_comm_new(&w, NULL) != PT_OK) return 2;
    int me = pt_comm_rank(w);
    for (int round = 0; round < ROUNDS; round++) {
        pt_comm *byc = NULL, *all = NULL;
        int ok =
            pt_comm_split(w, me % 2, me, &byc) == PT_OK && pt_comm_split(w, 0, me, &all) == PT_OK;
        /* ranks 0 and 2 form a pair (sum 2), rank 1 is alone */
        float want_pair = me % 2 == 0 ? (float)(0 + 2) : 1.0f;
        ok = ok && check_sum(byc, (float)me, want_pair) && check_sum(all, 1.0f, (float)NPROC);
        pt_comm_free(byc); /* out of creation order */
        pt_comm_free(all);
        if (!ok) {
            fails[me] = round + 1;
            fprintf(stderr, "rank %d, round %d: %s\n", me, round, pt_error_message());
            break;
        }
    }
    /* Mixed sizes held at once, freed out of order: extents merge again. */
    for (int round = 0; round < 20 && !fails[me]; round++) {
        pt_comm *g[4] = {NULL};
        int ok = 1;
        for (int i = 0; i < 4 && ok; i++)
            ok = pt_comm_split(w, i % 2 ? me : 0, me, &g[i]) == PT_OK &&
                 check_sum(g[i], 1.0f, i % 2 ? 1.0f : (float)NPROC);
        int order[4] = {1, 3, 0, 2};
        for (int i = 0; i < 4; i++) pt_comm_free(g[order[i]]);
        if (!ok) {
            fails[me] = ROUNDS + round + 1;
            fprintf(stderr, "rank %d, mixed round %d: %s\n", me, round, pt_error_message());
        }
    }
    pt_comm_free(w);
    return fails[me] ? 1 : 0;
}

static void test_pool_reuse(void) {
    int code = -1;
    CHECK_OK(pt_launch(NPROC, rank_main, NULL, NULL, &code));
    CHECK_EQ(code, 0);
    for (int r = 0; r < NPROC; r++) CHECK_EQ(fails[r], 0);
}

int main(void) {
    fails = mmap(NULL, NPROC * sizeof *fails, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                 -1, 0);
    PT_ASSERT(fails != MAP_FAILED);
    RUN(test_pool_reuse);
    munmap(fails, NPROC * sizeof *fails);
    return TEST_DONE();
}
