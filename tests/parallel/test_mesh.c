/* The device mesh (parallel.h, pt_mesh) over 8 ranks, for EVERY ordered
 * factorisation dp x tp x pp = 8 (all 10): each rank's coordinates against
 * Megatron's order written out as nested loops (pp outermost, tp fastest),
 * and for each of its four groups (tp, dp, pp, model-parallel) the size, this
 * rank's index, the members (an all-gather of world ranks inside the group
 * against the expected list, in index order) and that a reduction inside the
 * group sums over exactly its members (each rank contributes 2^(world rank):
 * the sum is the member set as a bit mask), small and 1 MiB (the backends'
 * large-message paths), every group of a kind at once. Then the errors (a
 * product that is not the world size), the trainer's use of the mesh (its
 * gradient traffic runs on the dp group, not on the world) and the layout
 * string naming every dimension.
 *
 * shm: the ranks are forked by pt_launch. --mpi: the executable is one rank
 * under mpirun -np 8. No model is needed except for the trainer check. */
#include <stdlib.h>
#include <string.h>

#include "partrain/comm.h"
#include "partrain/parallel.h"
#include "partrain/train.h"
#include "pt_test.h"

#define NRANKS 8
#define BIG    (1 << 18) /* floats: 1 MiB */

static int use_mpi;

/* The 10 ordered triples with product 8. */
static int triples(int (*out)[3]) {
    int n = 0;
    for (int dp = 1; dp <= NRANKS; dp *= 2)
        for (int tp = 1; dp * tp <= NRANKS; tp *= 2) {
            out[n][0] = dp;
            out[n][1] = tp;
            out[n][2] = NRANKS / (dp * tp);
            n++;
        }
    return n;
}

/* Every rank's (pp_i, dp_i, tp_i) in Megatron's order: nested loops, pp
 * outermost, tp innermost; independent of pt_mesh's formula. */
static void expected_coords(int dp, int tp, int pp, int (*xyz)[3]) {
    int r = 0;
    for (int p = 0; p < pp; p++)
        for (int d = 0; d < dp; d++)
            for (int t = 0; t < tp; t++) {
                xyz[r][0] = p;
                xyz[r][1] = d;
                xyz[r][2] = t;
                r++;
            }
}

/* The world ranks of group g of rank `me`, in index order; returns the size. */
static int expected_members(int (*xyz)[3], int dp, int tp, int pp, int me, pt_mesh_group g,
                            int *members, int *my_index) {
    int n = 0;
    *my_index = -1;
    /* walk the world in rank order: within each group the varying
     * coordinate(s) increase with world rank, which is the index order */
    for (int r = 0; r < dp * tp * pp; r++) {
        int same = g == PT_MESH_TP   ? xyz[r][0] == xyz[me][0] && xyz[r][1] == xyz[me][1]
                   : g == PT_MESH_DP ? xyz[r][0] == xyz[me][0] && xyz[r][2] == xyz[me][2]
                   : g == PT_MESH_PP ? xyz[r][1] == xyz[me][1] && xyz[r][2] == xyz[me][2]
                                     : xyz[r][1] == xyz[me][1];
        if (!same) continue;
        if (r == me) *my_index = n;
        members[n++] = r;
    }
    return n;
}

static const char *group_name[PT_MESH_NGROUPS] = {"tp", "dp", "pp", "mp"};

/* One factorisation on this rank: every check; failures printed with the
 * layout, group and both values. */
static void check_layout(pt_comm *world, int dp, int tp, int pp, float *big) {
    int me = pt_comm_rank(world);
    int xyz[NRANKS][3];
    expected_coords(dp, tp, pp, xyz);
    int p, d, t;
    pt_mesh_coords_of(me, dp, tp, pp, &p, &d, &t);
    if (p != xyz[me][0] || d != xyz[me][1] || t != xyz[me][2])
        fprintf(stderr, "dp%d-tp%d-pp%d rank %d: coords (%d, %d, %d), want (%d, %d, %d)\n", dp, tp,
                pp, me, p, d, t, xyz[me][0], xyz[me][1], xyz[me][2]);
    CHECK(p == xyz[me][0] && d == xyz[me][1] && t == xyz[me][2]);
    CHECK_EQ(pt_mesh_rank_at(dp, tp, pp, p, d, t), me);

    pt_mesh *m = NULL;
    CHECK_OK(pt_mesh_new(&m, world, dp, tp, pp));
    if (!m) return;
    CHECK_EQ(pt_mesh_world_rank(m), me);
    CHECK_EQ(pt_mesh_world_size(m), NRANKS);
    CHECK_EQ(pt_mesh_index(m, PT_MESH_TP), t);
    CHECK_EQ(pt_mesh_index(m, PT_MESH_DP), d);
    CHECK_EQ(pt_mesh_index(m, PT_MESH_PP), p);
    for (int g = 0; g < PT_MESH_NGROUPS; g++) {
        int members[NRANKS], idx;
        int n = expected_members(xyz, dp, tp, pp, me, (pt_mesh_group)g, members, &idx);
        int want_n = g == PT_MESH_TP ? tp : g == PT_MESH_DP ? dp : g == PT_MESH_PP ? pp : tp * pp;
        CHECK_EQ(n, want_n);
        CHECK_EQ(pt_mesh_size(m, (pt_mesh_group)g), n);
        CHECK_EQ(pt_mesh_index(m, (pt_mesh_group)g), idx);
        pt_comm *c = pt_mesh_comm(m, (pt_mesh_group)g);
        if (n == 1) { /* documented: a group of one has no communicator */
            CHECK(c == NULL);
            continue;
        }
        CHECK(c != NULL);
        if (!c) continue;
        CHECK_EQ(pt_comm_size(c), n);
        CHECK_EQ(pt_comm_rank(c), idx);
        /* members: each holds its world rank at its index */
        float who[NRANKS];
        for (int i = 0; i < n; i++) who[i] = -1.0f;
        who[idx] = (float)me;
        CHECK_OK(pt_comm_allgather(c, who, (size_t)n));
        int same = 1;
        for (int i = 0; i < n; i++) same &= who[i] == (float)members[i];
        if (!same) {
            fprintf(stderr, "dp%d-tp%d-pp%d rank %d group %s: members", dp, tp, pp, me,
                    group_name[g]);
            for (int i = 0; i < n; i++)
                fprintf(stderr, " %g (want %d)", (double)who[i], members[i]);
            fputc('\n', stderr);
        }
        CHECK(same);
        /* a sum over exactly the members: 2^(world rank) each, the mask */
        float mask_want = 0;
        for (int i = 0; i < n; i++) mask_want += (float)(1 << members[i]);
        float mine = (float)(1 << me);
        CHECK_OK(pt_comm_allreduce(c, &mine, 1, PT_REDUCE_SUM));
        if (mine != mask_want)
            fprintf(stderr, "dp%d-tp%d-pp%d rank %d group %s: sum %g, want %g\n", dp, tp, pp, me,
                    group_name[g], (double)mine, (double)mask_want);
        CHECK(mine == mask_want);
        /* 1 MiB: mask + (k mod 7) on each member, exact in float */
        for (size_t k = 0; k < BIG; k++) big[k] = (float)(1 << me) + (float)(k % 7);
        CHECK_OK(pt_comm_allreduce(c, big, BIG, PT_REDUCE_SUM));
        size_t bad = 0;
        for (size_t k = 0; k < BIG; k++) bad += big[k] != mask_want + (float)n * (float)(k % 7);
        if (bad)
            fprintf(stderr, "dp%d-tp%d-pp%d rank %d group %s: %zu of %d wrong in the 1 MiB sum\n",
                    dp, tp, pp, me, group_name[g], bad, BIG);
        CHECK_EQ(bad, 0);
    }
    pt_mesh_free(m);
}

/* The trainer at dp = the world's size, tiny model: after one step the
 * world's own counters show no operation at all (the gradients travel on
 * the mesh's dp group, the statistics on the trainer's aux split): the
 * world is left to job-level things. */
static void check_trainer_uses_dp_group(pt_comm *world) {
    pt_config c;
    pt_config_defaults(&c);
    c.model = (pt_model_config){2, 32, 2, 64, 16};
    c.train.steps = 2;
    c.train.batch_size = NRANKS;
    c.train.threads = 1;
    c.train.val_every = 0;
    c.parallel.dp = pt_comm_size(world);
    int ntok = c.train.batch_size * c.model.seq_len;
    int *in = malloc((size_t)ntok * sizeof *in), *tg = malloc((size_t)ntok * sizeof *tg);
    for (int i = 0; i < ntok; i++) {
        in[i] = (i * 7 + 3) % c.model.vocab_size;
        tg[i] = (i * 5 + 1) % c.model.vocab_size;
    }
    pt_comm_reset_stats(world);
    pt_trainer *t = NULL;
    CHECK_OK(pt_trainer_new_dist(&t, &c, world));
    pt_step_info info;
    if (t) CHECK_OK(pt_trainer_step_batch(t, in, tg, &info));
    if (t) CHECK(info.comm_bytes > 0); /* the gradients did travel, on the dp group */
    pt_comm_stats s;
    pt_comm_get_stats(world, &s);
    uint64_t calls = 0;
    for (int k = 0; k < PT_OP_COUNT; k++) calls += s.calls[k];
    if (calls)
        fprintf(stderr, "rank %d: %llu operations on the world itself\n", pt_comm_rank(world),
                (unsigned long long)calls);
    CHECK_EQ(calls, 0);
    pt_trainer_free(t);
    free(in);
    free(tg);
}

static int rank_main(pt_comm *world) {
    int tri[16][3];
    int n = triples(tri);
    CHECK_EQ(n, 10);
    float *big = malloc(BIG * sizeof *big);
    if (!big) return 1;
    for (int i = 0; i < n; i++) check_layout(world, tri[i][0], tri[i][1], tri[i][2], big);
    free(big);
    /* a product that is not the world: refused before any collective,
     * naming the three values and the world size */
    pt_mesh *m = NULL;
    CHECK(pt_mesh_new(&m, world, 2, 2, 1) == PT_ERR_INVALID && m == NULL);
    CHECK(strstr(pt_error_message(), "2 x 2 x 1") && strstr(pt_error_message(), "8 ranks"));
    CHECK(pt_mesh_new(&m, world, 0, 8, 1) == PT_ERR_INVALID && m == NULL);
    check_trainer_uses_dp_group(world);
    return pt_test_failures_ ? 1 : 0;
}

static int shm_rank(void *arg) {
    (void)arg;
    pt_comm *world = NULL;
    pt_comm_options o = {"shm", 30};
    if (pt_comm_new(&world, &o) != PT_OK) return 1;
    int rc = rank_main(world);
    pt_comm_free(world);
    return rc;
}

static void test_every_factorisation(void) {
    if (use_mpi) return; /* main runs rank_main directly */
    int code = -1;
    pt_comm_options o = {"shm", 30};
    CHECK_OK(pt_launch(NRANKS, shm_rank, NULL, &o, &code));
    CHECK_EQ(code, 0);
}

/* Single process: a world of one is the 1 x 1 x 1 mesh with no
 * communicators; a larger product without a world is refused. */
static void test_world_of_one(void) {
    pt_mesh *m = NULL;
    CHECK_OK(pt_mesh_new(&m, NULL, 1, 1, 1));
    for (int g = 0; m && g < PT_MESH_NGROUPS; g++) {
        CHECK(pt_mesh_comm(m, (pt_mesh_group)g) == NULL);
        CHECK_EQ(pt_mesh_size(m, (pt_mesh_group)g), 1);
        CHECK_EQ(pt_mesh_index(m, (pt_mesh_group)g), 0);
    }
    pt_mesh_free(m);
    pt_mesh_free(NULL);
    CHECK(pt_mesh_new(&m, NULL, 1, 2, 1) == PT_ERR_INVALID && m == NULL);
    CHECK(strstr(pt_error_message(), "1 x 2 x 1") && strstr(pt_error_message(), "1 rank"));
}

/* The metrics' layout string names every dimension (DESIGN's contract:
 * "dp2-tp2-pp2-zero1"); the metrics line carries it (test_dp_cli.sh). */
static void test_layout_string(void) {
    pt_config c;
    pt_config_defaults(&c);
    char buf[64];
    pt_config_layout(&c, buf, sizeof buf);
    CHECK(!strcmp(buf, "dp1-tp1-pp1-zero0"));
    c.parallel.dp = 2;
    c.parallel.tp = 2;
    c.parallel.pp = 2;
    c.parallel.zero = 1;
    pt_config_layout(&c, buf, sizeof buf);
    if (strcmp(buf, "dp2-tp2-pp2-zero1")) fprintf(stderr, "layout %s\n", buf);
    CHECK(!strcmp(buf, "dp2-tp2-pp2-zero1"));
    c.parallel.dp = 4;
    c.parallel.tp = 3;
    c.parallel.pp = 5;
    c.parallel.zero = 2;
    c.parallel.zero_group = 2;
    pt_config_layout(&c, buf, sizeof buf);
    CHECK(!strcmp(buf, "dp4-tp3-pp5-zero2-g2"));
}

/* tp trains when it divides the heads; pp > 1 still cannot TRAIN (no
 * pipeline-parallel compute yet): validation says so, whatever the mesh
 * could build. */
static void test_training_checks_pp(void) {
    pt_config c;
    pt_config_defaults(&c);
    c.parallel.tp = 2;
    CHECK_OK(pt_config_validate(&c));
    c.parallel.tp = 5;
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && strstr(pt_error_message(), "parallel.tp") &&
          strstr(pt_error_message(), "model.n_head"));
    c.parallel.tp = 1;
    c.parallel.pp = 2; /* pipelines exist: the default model's 6 modules cut in 2 */
    CHECK_OK(pt_config_validate(&c));
    c.parallel.pp = 7; /* more stages than modules */
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && strstr(pt_error_message(), "parallel.pp"));
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--mpi")) use_mpi = 1;
    pt_log_set_level(PT_LOG_WARN);
    if (use_mpi) {
        pt_comm *world = NULL;
        pt_comm_options o = {"mpi", 30};
        if (pt_comm_new(&world, &o) != PT_OK) {
            fprintf(stderr, "test_mesh --mpi: %s\n", pt_error_message());
            return 1;
        }
        if (pt_comm_size(world) != NRANKS) {
            fprintf(stderr, "test_mesh --mpi: needs mpirun -np %d (got %d)\n", NRANKS,
                    pt_comm_size(world));
            pt_comm_free(world);
            return 1;
        }
        int rc = rank_main(world);
        int root = pt_comm_rank(world) == 0;
        pt_comm_free(world);
        if (root) printf("test_mesh --mpi: %s\n", rc ? "FAILED" : "passed");
        return rc;
    }
    RUN(test_world_of_one);
    RUN(test_layout_string);
    RUN(test_training_checks_pp);
    RUN(test_every_factorisation);
    return TEST_DONE();
}
