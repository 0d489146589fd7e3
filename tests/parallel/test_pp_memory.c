/* Per-stage activation memory of a pipeline equals its schedule's formula:
 * the PT_MEM_ACTS peak of each stage in a step (pt_step_info.stage_acts,
 * the metrics' "stage_acts") is
 *     tokens + F(r) + k(r) x U(r) + w(r) x S(r)
 * where k(r) is how many micro-batches' activations stage r holds at once
 * (all its chunks together), w(r) how many W's its list has pending at once
 * (their B run; 0 without a split backward), and the rest is what one of
 * them costs:
 *   tokens  the trainer's global batch (inputs and targets, ints);
 *   F(r)    the stage model's own buffers (backward scratch, the gradient
 *           ping-pong), measured by building that model here;
 *   U(r)    one micro-batch of the rank's largest chunk (a rank's blocks
 *           serve any of its chunks, trainer_pipe.c): a slot of its modules
 *           (pt_model_slot_new_range: contexts and stream), its received
 *           and sent gradients (rows x C floats each, where the chunk has a
 *           neighbour), measured by allocating them here and held equal
 *           to the block the executor and the planner carve
 *           (pt_pipeline_block_floats, 64-byte aligned); where chunks
 *           differ in size and it is less, k(r) x U(r) is instead the sum
 *           over chunks c of k_c(r) x U_c(r), each chunk's own blocks (k_c
 *           its list's most at once, pt_schedule.chunk_in_flight): the
 *           rule of pt_schedule_blocks, which both use;
 *   S(r)    a set of deferred scratch, one per module of the largest chunk
 *           (what a W after its B reads and its context cannot hold: B's
 *           gradients go to the activations only B reads,
 *           pt_module_scratch_new_deferred), measured by allocating them
 *           here and checked against their closed form (deferred_floats).
 * The counts are the schedules' formulas (Narayanan et al. 2021 for 1F1B
 * and interleaving, Qi et al. 2024 for the zero-bubble ones), summed over
 * a rank's chunks:
 *   gpipe m;  1f1b min(p - r, m);  zb1 min(p, m) (its W's delayed by r);
 *   interleaved min(2 (p - r - 1) + (v - 1) p + 1, m v);  zbv min(2p, 2m),
 * the schedule descriptor's (pt_sched.in_flight), which the schedule's own
 * list must hold (pt_schedule.in_flight; test_schedule.c holds the
 * descriptor to the papers' closed forms over more shapes). Every
 * schedule at p 2 and 4, m 2, 4, 8, under every recompute mode (which
 * changes U, not k): equal to the byte (every buffer is allocated up
 * front). shm: the ranks are forked. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "partrain/comm.h"
#include "partrain/parallel.h"
#include "partrain/train.h"
#include "pt_test.h"
#include "pt_test_files.h"

typedef struct {
    pt_config cfg;
} job;

static void base_config(pt_config *c, int L, int p, int m, const char *sched, const char *rc) {
    pt_config_defaults(c);
    c->model = (pt_model_config){L, 32, 2, 64, 16};
    c->train.steps = 2;
    c->train.batch_size = 2 * m; /* micro-batches of 2 sequences */
    c->train.threads = 1;
    c->train.warmup_steps = 1;
    c->train.val_every = 0;
    c->parallel.pp = p;
    c->parallel.microbatches = m;
    snprintf(c->parallel.schedule, sizeof c->parallel.schedule, "%s", sched);
    c->parallel.virtual_stages = 0; /* the schedule's own: 2 for interleaved and zbv */
    snprintf(c->train.recompute, sizeof c->train.recompute, "%s", rc);
}

static int rank_main(void *arg) {
    const job *j = arg;
    pt_comm *world = NULL;
    pt_comm_options opt = {"shm", 20};
    if (pt_comm_new(&world, &opt) != PT_OK) return 1;
    pt_trainer *t = NULL;
    pt_status st = pt_trainer_new_dist(&t, &j->cfg, world);
    int n = j->cfg.train.batch_size * j->cfg.model.seq_len;
    int *in = calloc((size_t)n, sizeof(int)), *tg = calloc((size_t)n, sizeof(int));
    for (int i = 0; i < n; i++) {
        in[i] = (i * 7) % j->cfg.model.vocab_size;
        tg[i] = (i * 3 + 1) % j->cfg.model.vocab_size;
    }
    pt_step_info info;
    memset(&info, 0, sizeof info);
    for (int s = 0; st == PT_OK && s < j->cfg.train.steps; s++)
        st = pt_trainer_step_batch(t, in, tg, &info);
    if (st != PT_OK) fprintf(stderr, "rank %d: %s\n", pt_comm_rank(world), pt_error_message());
    if (st == PT_OK && pt_comm_rank(world) == 0)
        write_bytes(tmp_path("stage_acts"), info.stage_acts, sizeof info.stage_acts);
    free(in);
    free(tg);
    pt_trainer_free(t);
    pt_comm_free(world);
    return st == PT_OK ? 0 : 1;
}

static size_t acts_now(void) {
    return pt_mem_current(PT_MEM_ACTS);
}

/* A deferred scratch's floats for contexts of kinds (tp 1), as
 * pt_module_scratch_new_deferred documents them: after B a block's W
 * gradients take the place of qkv, fch and att (which W never reads), the
 * embedding's and the head's need one (N,C) gradient each. */
static size_t deferred_floats(const pt_model_config *mc, int mB, pt_recompute rc, unsigned kinds) {
    size_t T = (size_t)mc->seq_len, N = (size_t)mB * T, C = (size_t)mc->n_embd;
    size_t NH = (size_t)mc->n_head, att = (size_t)mB * NH * T * T;
    size_t fit = NH * T / C < 4 ? NH * T / C : 4;
    size_t ends = kinds & (1u << PT_MODULE_EMBEDDING | 1u << PT_MODULE_HEAD) ? N * C : 0;
    if (!(kinds & 1u << PT_MODULE_BLOCK)) return ends;
    size_t over = (4 - fit) * N * C, rem = over > ends ? over : ends;
    /* the recompute region: what the context does not keep (pt_recompute) */
    size_t none = 3 * N * C + 4 * N + N * C + 3 * N * C + att + 8 * N * C;
    return rem + (rc == PT_RECOMPUTE_FULL        ? none
                  : rc == PT_RECOMPUTE_SELECTIVE ? att + 4 * N * C
                                                 : 0);
}

/* Expected PT_MEM_ACTS peak of stage r (bytes). */
static size_t expected(const pt_config *c, int r, const pt_stage *stages, const char *sched) {
    int p = c->parallel.pp, v = pt_config_virtual_stages(c), L = c->model.n_layer;
    int m = c->parallel.microbatches, mB = c->train.batch_size / m;
    pt_schedule s;
    CHECK_OK(pt_schedule_build_stage(&s, sched, m, p, r, v));
    unsigned char owned[64] = {0};
    for (int g = 0; g < p * v; g++) {
        int ch, rr = pt_schedule_locate(sched, p, v, g, &ch);
        for (int i = stages[g].first; rr == r && i <= stages[g].last; i++) owned[i] = 1;
    }
    pt_recompute rc = !strcmp(c->train.recompute, "full")        ? PT_RECOMPUTE_FULL
                      : !strcmp(c->train.recompute, "selective") ? PT_RECOMPUTE_SELECTIVE
                                                                 : PT_RECOMPUTE_NONE;
    pt_model_options o = {.owned = owned, .recompute = rc};
    size_t a0 = acts_now();
    pt_model *mdl = NULL;
    CHECK_OK(pt_model_new_opts(&mdl, &c->model, mB, &o));
    size_t total = acts_now() - a0; /* F(r) */
    size_t rows_c = (size_t)mB * (size_t)c->model.seq_len * (size_t)c->model.n_embd;
    /* U: each chunk's micro-batch (a slot measured by allocating one, its
     * gradients in and out), as the executor and the planner size a block */
    size_t fl[PT_SCHEDULE_MAX_VIRTUAL];
    int most = 0;
    for (int ch = 0; ch < v; ch++) {
        const pt_stage *st = &stages[pt_schedule_virtual_stage(&s, ch)];
        size_t b0 = acts_now();
        pt_model_slot *slot = NULL;
        CHECK_OK(pt_model_slot_new_range(&slot, mdl, st->first, st->last));
        size_t u = acts_now() - b0;
        pt_model_slot_free(slot);
        u += rows_c * sizeof(float) * (size_t)((st->last <= L) + (st->first > 0)); /* dy, dx */
        fl[ch] = pt_pipeline_block_floats(mdl, st->first, st->last, mB);
        CHECK_EQ(fl[ch] * sizeof(float), (u + 63) & ~(size_t)63); /* 64-byte blocks */
        if (st->last - st->first + 1 > most) most = st->last - st->first + 1;
    }
    size_t set = 0; /* S: module j of the rank's chunks: its kinds' deferred scratch */
    for (int j = 0; s.split && j < most; j++) {
        unsigned kinds = 0;
        for (int ch = 0; ch < v; ch++) {
            const pt_stage *st = &stages[pt_schedule_virtual_stage(&s, ch)];
            if (st->first + j <= st->last) kinds |= 1u << pt_model_module_kind(mdl, st->first + j);
        }
        size_t b0 = acts_now();
        pt_module_scratch *sc = NULL;
        CHECK_OK(pt_module_scratch_new_deferred(&sc, mdl, mB, kinds));
        size_t got = acts_now() - b0;
        pt_module_scratch_free(sc);
        CHECK_EQ(got, deferred_floats(&c->model, mB, rc, kinds) * sizeof(float));
        set += got;
    }
    /* W: the list's most W's pending at once (B run, W not yet) */
    if (s.split) total += (size_t)pt_schedule_pending_w(&s) * set;
    /* the list's holding is the schedule's formula (pt_sched.in_flight) */
    int want = pt_sched_find(sched)->in_flight(m, p, r, v);
    if (s.in_flight != want)
        printf("  %s p %d r %d m %d: the list holds %d, the formula says %d\n", sched, p, r, m,
               s.in_flight, want);
    CHECK_EQ(s.in_flight, want);
    /* k(r) blocks of the largest chunk, or each chunk's own where that is less */
    total += pt_schedule_blocks(v, want, s.chunk_in_flight, fl, NULL, NULL) * sizeof(float);
    pt_model_free(mdl);
    pt_schedule_free(&s);
    return total + 2 * (size_t)c->train.batch_size * (size_t)c->model.seq_len * sizeof(int);
}

static void check(int L, int p, int m, const char *sched, const char *rc) {
    job j;
    base_config(&j.cfg, L, p, m, sched, rc);
    CHECK_OK(pt_config_validate(&j.cfg));
    int code = -1;
    pt_comm_options o = {"shm", 20};
    CHECK_OK(pt_launch(p, rank_main, &j, &o, &code));
    CHECK_EQ(code, 0);
    uint64_t got[PT_STEP_MAX_STAGES] = {0};
    FILE *f = fopen(tmp_path("stage_acts"), "rb");
    CHECK(f && fread(got, 1, sizeof got, f) == sizeof got);
    if (f) fclose(f);
    remove(tmp_path("stage_acts"));
    int v = pt_config_virtual_stages(&j.cfg);
    pt_stage stages[64];
    pt_stage_step step = pt_config_stage_step(&j.cfg, j.cfg.parallel.dp); /* the trainer's cut */
    CHECK_OK(pt_stage_split_step(&j.cfg.model, &step, sched, p, v, m, "", stages));
    for (int r = 0; r < p; r++) {
        size_t want = expected(&j.cfg, r, stages, sched);
        if (got[r] != want || r == 0)
            printf("  %-11s %-9s p %d m %d stage %d: measured %llu B, formula %zu B (%+lld)\n",
                   sched, rc, p, m, r, (unsigned long long)got[r], want,
                   (long long)got[r] - (long long)want);
        CHECK_EQ(got[r], (uint64_t)want);
    }
}

static void test_every_schedule(void) {
    static const char *const modes[] = {"none", "selective", "full"};
    static const int ms[] = {2, 4, 8};
    const pt_sched *d;
    for (int s = 0; (d = pt_sched_at(s)); s++) {
        if (!d->pipeline) continue;
        for (size_t k = 0; k < 3; k++)
            for (size_t r = 0; r < 3; r++) {
                check(3, 2, ms[k], d->name, modes[r]);
                int two = d->v_default > 1;
                /* 8 virtual stages at p 4 with two chunks: 6 blocks */
                if (!two || ms[k] >= 4) check(two ? 6 : 5, 4, ms[k], d->name, modes[r]);
            }
    }
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    pt_log_set_level(PT_LOG_WARN);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pt-test-pp-memory-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_every_schedule);
    rmdir(tmpdir);
    return TEST_DONE();
}
