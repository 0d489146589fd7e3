/* Per-part runtime choices (issue 14, item 5) through the parity harness
 * against one worker, under AdamW with clipping and SGD without:
 *   model.stage_recompute  one recompute mode per pipeline rank: pp 2
 *                          (1f1b, zb1), pp 4 with an uneven stage_layers cut;
 *   parallel.zero_whole    ZeRO-3 modules kept whole (run as stage 2): dp 2,
 *                          keep_params, HSDP, dp 2 x pp 2.
 * And what each choice is for, memory:
 *   - a rank's activation peak is its own mode's: each stage of a mixed run
 *     equals, to the byte, the same stage of the run with that mode on
 *     every rank (and the modes do differ, so the test can fail);
 *   - zero_whole changes a rank's parameter peak by the whole copy minus
 *     the slice it replaces, less the unit buffers no longer needed
 *     (pt_zero's pool: the embedding's and the head's one each, the blocks'
 *     two while at least two blocks are still gathered);
 * and exactness: zero_whole computes what plain ZeRO-3 computes, bitwise
 * (the same reduce-scatter, the same slice update; the forward reads a
 * copy equal to the gathered one), and a checkpoint saved with zero_whole
 * resumes under plain ZeRO-3 on that run, bitwise.
 *
 * shm only: pt_launch forks the ranks. */
#include "parallel/parity_harness.h"

#include "partrain/model.h"

#define L3 "model.n_layer=3 "
#define L4 "model.n_layer=4 "
#define L5 "model.n_layer=5 "

static void test_stage_recompute_parity(void) {
    static const char *const layouts[] = {
        L3 "parallel.pp=2 parallel.microbatches=4 model.stage_recompute=full,none",
        L3 "parallel.pp=2 parallel.microbatches=4 model.stage_recompute=none,selective",
        L3 "parallel.pp=2 parallel.microbatches=4 parallel.schedule=zb1 "
           "model.stage_recompute=full,none",
        L3 "parallel.pp=2 parallel.microbatches=4 parallel.schedule=zb1 "
           "model.stage_recompute=none,selective",
        /* uneven: the embedding's and the head's stages hold fewer blocks */
        L5 "parallel.pp=4 parallel.microbatches=4 parallel.stage_layers=1,2,1,1 "
           "model.stage_recompute=full,selective,none,full",
    };
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) parity_check(layouts[k]);
}

static void test_zero_whole_parity(void) {
    static const char *const layouts[] = {
        "parallel.dp=2 parallel.zero=3 parallel.zero_whole=embedding,head",
        "parallel.dp=2 parallel.zero=3 parallel.zero_whole=h.0",
        "parallel.dp=2 parallel.zero=3 parallel.microbatches=2 parallel.zero_keep_params=true "
        "parallel.zero_whole=h.1,head",
        "parallel.dp=4 parallel.zero=3 parallel.zero_group=2 parallel.zero_whole=embedding,h.0",
        /* embedding and h.0 on stage 0, h.2 and the head on stage 1 */
        L3 "parallel.pp=2 parallel.dp=2 parallel.microbatches=2 parallel.zero=3 "
           "parallel.zero_whole=embedding,h.2",
        L3 "parallel.pp=2 parallel.dp=2 parallel.microbatches=4 parallel.zero=3 "
           "parallel.schedule=zb1 parallel.zero_whole=h.0,head",
    };
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) parity_check(layouts[k]);
}

/* A short run of the base config with `layout` (2 steps: the peaks are
 * reached in the first). */
static pt_status short_run(const char *layout, result *r) {
    job j;
    memset(&j, 0, sizeof j);
    parity_base(&j.cfg, PARITY_ADAMW);
    j.cfg.train.steps = 2;
    PT_CHECK(parity_apply(&j.cfg, layout));
    return run_dp(&j, r);
}

/* Each stage of a mixed run against the same stage of the uniform runs. */
static void expect_stage_acts(const char *base, int pp, const char *modes) {
    static const char *const names[3] = {"none", "selective", "full"};
    uint64_t uniform[3][PT_STEP_MAX_STAGES];
    char layout[512];
    result r;
    for (int m = 0; m < 3; m++) {
        snprintf(layout, sizeof layout, "%s model.recompute=%s", base, names[m]);
        CHECK_OK(short_run(layout, &r));
        memcpy(uniform[m], r.stage_acts, sizeof uniform[m]);
        result_free(&r);
    }
    for (int s = 0; s < pp; s++) { /* the modes change the peak, or this proves nothing */
        CHECK(uniform[PT_RECOMPUTE_FULL][s] < uniform[PT_RECOMPUTE_SELECTIVE][s]);
        CHECK(uniform[PT_RECOMPUTE_SELECTIVE][s] < uniform[PT_RECOMPUTE_NONE][s]);
    }
    snprintf(layout, sizeof layout, "%s model.stage_recompute=%s", base, modes);
    CHECK_OK(short_run(layout, &r));
    const char *p = modes;
    for (int s = 0; s < pp; s++) {
        int m = !strncmp(p, "full", 4)  ? PT_RECOMPUTE_FULL
                : !strncmp(p, "sel", 3) ? PT_RECOMPUTE_SELECTIVE
                                        : PT_RECOMPUTE_NONE;
        CHECK_EQ(r.stage_acts[s], uniform[m][s]);
        printf("  %-40s stage %d (%-9s) acts %llu (none %llu, full %llu)\n", modes, s, names[m],
               (unsigned long long)r.stage_acts[s], (unsigned long long)uniform[0][s],
               (unsigned long long)uniform[2][s]);
        p = strchr(p, ',');
        p = p ? p + 1 : "";
    }
    result_free(&r);
}

/* gpipe: every stage holds all m micro-batches, so that every stage's peak
 * tells the modes apart (under 1f1b the last stage holds one, and a full
 * recompute's region costs what it saves there) */
static void test_stage_recompute_memory(void) {
    expect_stage_acts(L3 "parallel.pp=2 parallel.microbatches=4 parallel.schedule=gpipe", 2,
                      "full,none");
    expect_stage_acts(L3 "parallel.pp=2 parallel.microbatches=4 parallel.schedule=gpipe", 2,
                      "none,selective");
    expect_stage_acts(L5 "parallel.pp=4 parallel.microbatches=4 parallel.schedule=gpipe "
                         "parallel.stage_layers=1,2,1,1",
                      4, "full,selective,none,full");
}

/* Module i's region of the base config's model with `model` keys: its
 * floats, and rank q's slice of them out of g. */
static void region_of(const char *model, int i, int g, int q, size_t *count, size_t *sn) {
    pt_config c;
    parity_base(&c, PARITY_ADAMW);
    CHECK_OK(parity_apply(&c, model));
    pt_model *m = NULL;
    CHECK_OK(pt_model_new(&m, &c.model, 1));
    size_t off = 0, so = 0;
    *count = *sn = 0;
    if (!m) return;
    pt_model_module_region(m, i, &off, count);
    pt_comm_shard(*count, g, q, &so, sn);
    pt_model_free(m);
}

/* dp 2, 4 blocks (so that h.0 whole leaves two blocks gathered, and the
 * blocks' two unit buffers needed). */
static void test_zero_whole_memory(void) {
    const char *base = L4 "parallel.dp=2 parallel.zero=3";
    char layout[256];
    result plain, r;
    CHECK_OK(short_run(base, &plain));
    const int L = 4;
    /* h.0: + its whole copy - its slice */
    snprintf(layout, sizeof layout, "%s parallel.zero_whole=h.0", base);
    CHECK_OK(short_run(layout, &r));
    for (int q = 0; q < 2; q++) {
        size_t n, sn;
        region_of(L4, 1, 2, q, &n, &sn);
        CHECK_EQ((uint64_t)r.mem[q][0], (uint64_t)(plain.mem[q][0] + (n - sn) * sizeof(float)));
        CHECK_EQ((uint64_t)r.mem[q][1], (uint64_t)plain.mem[q][1]); /* grads as before */
        CHECK_EQ((uint64_t)r.mem[q][2], (uint64_t)plain.mem[q][2]); /* optim as before */
        printf("  h.0 whole, rank %d: params %zu (plain %zu, + %zu - %zu floats)\n", q, r.mem[q][0],
               plain.mem[q][0], n, sn);
    }
    result_free(&r);
    /* embedding and head: each a whole copy in place of its slice AND of its
     * unit buffer (which plain ZeRO-3 holds at the peak anyway) */
    snprintf(layout, sizeof layout, "%s parallel.zero_whole=embedding,head", base);
    CHECK_OK(short_run(layout, &r));
    for (int q = 0; q < 2; q++) {
        size_t ne, se, nh, sh;
        region_of(L4, 0, 2, q, &ne, &se);
        region_of(L4, L + 1, 2, q, &nh, &sh);
        CHECK_EQ((uint64_t)r.mem[q][0], (uint64_t)(plain.mem[q][0] - (se + sh) * sizeof(float)));
        printf("  embedding,head whole, rank %d: params %zu (plain %zu, - %zu - %zu floats)\n", q,
               r.mem[q][0], plain.mem[q][0], se, sh);
    }
    result_free(&r);
    result_free(&plain);
}

/* Steps [from, nsteps) and the final parameters of b are a's, bit for bit. */
static int same_bits(const result *a, const result *b, int from) {
    if (a->nsteps != b->nsteps || a->nparams != b->nparams || !a->params || !b->params) return 0;
    for (int s = from; s < a->nsteps; s++)
        if (memcmp(&a->loss[s], &b->loss[s], sizeof(float)) != 0 ||
            memcmp(&a->grad_norm[s], &b->grad_norm[s], sizeof(float)) != 0)
            return 0;
    return !memcmp(a->params, b->params, a->nparams * sizeof(float));
}

/* zero_whole is plain ZeRO-3, bitwise, straight and across a checkpoint. */
static void test_zero_whole_bitwise(void) {
    static const char *const wholes[] = {"embedding,head", "h.0,h.1"};
    const char *base = "parallel.dp=2 parallel.zero=3 parallel.microbatches=2";
    for (int v = 0; v < PARITY_NVARIANTS; v++) {
        job j;
        result plain, r;
        memset(&j, 0, sizeof j);
        parity_base(&j.cfg, (parity_variant)v);
        CHECK_OK(parity_apply(&j.cfg, base));
        CHECK_OK(run_dp(&j, &plain));
        for (size_t k = 0; k < sizeof wholes / sizeof wholes[0]; k++) {
            /* straight */
            job w = j;
            snprintf(w.cfg.parallel.zero_whole, sizeof w.cfg.parallel.zero_whole, "%s", wholes[k]);
            CHECK_OK(run_dp(&w, &r));
            CHECK(same_bits(&plain, &r, 0));
            result_free(&r);
            /* saved at step 10 with zero_whole, resumed without */
            char dir[64];
            snprintf(dir, sizeof dir, "ck-%d-%zu", v, k);
            snprintf(w.cfg.checkpoint.dir, sizeof w.cfg.checkpoint.dir, "%s", tmp_path(dir));
            w.stop_at = 10;
            CHECK_OK(run_dp(&w, &r));
            result_free(&r);
            job back = j;
            snprintf(back.cfg.checkpoint.dir, sizeof back.cfg.checkpoint.dir, "%s", tmp_path(dir));
            back.resume = 1;
            CHECK_OK(run_dp(&back, &r));
            int same = same_bits(&plain, &r, 10);
            CHECK(same);
            printf("  zero_whole=%-16s [%s]: straight and resumed under plain zero 3 %s\n",
                   wholes[k], parity_variant_name[v], same ? "bitwise equal" : "DIFFER");
            result_free(&r);
        }
        result_free(&plain);
    }
}

int main(int argc, char **argv) {
    if (parity_init(argc, argv, "test-perpart")) return 1;
    if (use_mpi) {
        fprintf(stderr, "test_perpart: shm only\n");
        return 1;
    }
    RUN(test_stage_recompute_parity);
    RUN(test_zero_whole_parity);
    RUN(test_stage_recompute_memory);
    RUN(test_zero_whole_memory);
    RUN(test_zero_whole_bitwise);
    return parity_done();
}
