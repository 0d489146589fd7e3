/* pt_calibrate and its cache: the tables hold what was asked for (every
 * module kind at every token count and thread count, positive times), the
 * kernels' thread count is left as found; pt_calibrate_cached measures
 * once, reuses a valid file, and measures again when the file is from
 * another binary or is not JSON; the options are part of the key; bad
 * options are one error; the written file loads with pt_cluster_load_file. Quick mode on a tiny
 * shape: about a second. */
#include "pt_test.h"

#include <stdlib.h>
#include <unistd.h>

#include "partrain/calibrate.h"
#include "partrain/kernels.h"

static const pt_model_config tiny = {
    .n_layer = 2, .n_embd = 64, .n_head = 2, .vocab_size = 64, .seq_len = 32};

static char dir[64];

static void test_tables(void) {
    pt_kernels_set_threads(1);
    pt_calibrate_options o = {.models = &tiny, .n_models = 1, .quick = 1};
    pt_calibration c;
    CHECK_OK(pt_calibrate(&o, &c));
    CHECK_EQ(pt_kernels_threads(), 1);
    const pt_profile *p = &c.profile;
    int nt = p->cores > 1 ? 2 : 1; /* threads 1 and cores, alone */
    int loaded = p->cores > 1;     /* tp 1 again with a rank on every core */
    /* kinds x tokens T, 2T x (threads alone + under load + the tp 2 group) */
    CHECK_EQ(p->n_module, 3 * 2 * (nt + loaded + 1));
    int seen[3][2] = {{0}}, group = 0, under_load = 0;
    for (int i = 0; i < p->n_module; i++) {
        const pt_profile_module *m = &p->module[i];
        CHECK(m->kind >= 0 && m->kind <= 2);
        CHECK(m->tokens == 32 || m->tokens == 64);
        CHECK(m->fwd_s > 0 && m->bgrad_s > 0 && m->wgrad_s > 0);
        CHECK_EQ(m->n_embd, 64);
        if (m->tp == 2) { /* a shard, timed in its group of 2 at one thread */
            CHECK_EQ(m->ranks, 2);
            CHECK_EQ(m->threads, 1);
            group++;
            continue;
        }
        CHECK_EQ(m->tp, 1);
        if (m->ranks > 1) {
            CHECK_EQ(m->ranks, p->cores);
            CHECK_EQ(m->threads, 1);
            under_load++;
            continue;
        }
        CHECK_EQ(m->ranks, 1);
        if (m->kind >= 0 && m->kind <= 2) seen[m->kind][m->tokens == 64]++;
    }
    for (int k = 0; k < 3; k++) CHECK(seen[k][0] == nt && seen[k][1] == nt);
    CHECK_EQ(group, 6);
    CHECK_EQ(under_load, 6 * loaded);
    /* every figure scaled to the probes' median, which lies in their range */
    CHECK(c.n_probes > 0);
    CHECK(c.probe_lo > 0 && c.probe_lo <= p->probe_flops_s && p->probe_flops_s <= c.probe_hi);
    CHECK(p->n_gemm > 0);
    for (int i = 0; i < p->n_gemm; i++) CHECK(p->gemm[i].flops_s > 0);
    CHECK(c.cluster.profile == p);
    for (int i = 0; i < 2; i++) /* the transposed products were timed */
        CHECK(c.transpose_lo[i] > 0 && c.transpose_hi[i] >= c.transpose_lo[i]);
    CHECK(c.cluster.device.peak_flops_fp32 > 0);
    CHECK(c.cluster.intra_node.bw > 0 && c.cluster.intra_node.latency > 0);
    /* the file is a cluster description the loader accepts, tables whole;
     * cJSON writes 15 digits when they read back within its epsilon */
    char path[128];
    snprintf(path, sizeof path, "%s/p.json", dir);
    CHECK_OK(pt_calibrate_write(&c, path));
    pt_cluster *cl = NULL;
    CHECK_OK(pt_cluster_load_file(&cl, path));
    if (cl) {
        CHECK_EQ(cl->nodes, 1);
        CHECK_EQ(cl->devices_per_node, p->cores);
        CHECK_NEAR(cl->device.peak_flops_fp32, c.cluster.device.peak_flops_fp32, 0, 1e-14);
        CHECK_NEAR(cl->intra_node.latency, c.cluster.intra_node.latency, 0, 1e-14);
        CHECK(cl->profile != NULL);
    }
    if (cl && cl->profile) {
        CHECK_EQ(cl->profile->n_gemm, p->n_gemm);
        CHECK_EQ(cl->profile->n_module, p->n_module);
        CHECK_EQ(cl->profile->n_comm, p->n_comm);
        CHECK(strcmp(cl->profile->cpu, p->cpu) == 0);
        CHECK(strcmp(cl->profile->binary, p->binary) == 0);
        CHECK_NEAR(cl->profile->module[1].fwd_s, p->module[1].fwd_s, 0, 1e-14);
        CHECK_NEAR(cl->profile->module[1].recompute_s[2], p->module[1].recompute_s[2], 0, 1e-14);
        CHECK_NEAR(cl->profile->probe_flops_s, p->probe_flops_s, 0, 1e-14);
        for (int i = 0; i < p->n_module; i++) /* ranks round-trips (absent: tp) */
            CHECK_EQ(cl->profile->module[i].ranks, p->module[i].ranks);
    }
    pt_cluster_free(cl);
    pt_calibration_deinit(&c);
}

static void test_bad_options(void) {
    pt_calibrate_options o = {.models = &tiny, .n_models = 1, .quick = 1, .threads = -1};
    pt_calibration c;
    CHECK_EQ(pt_calibrate(&o, &c), PT_ERR_INVALID);
    CHECK(strstr(pt_error_message(), "threads -1") != NULL);
    pt_model_config odd = tiny;
    odd.n_head = 3; /* 64 % 3 */
    o = (pt_calibrate_options){.models = &odd, .n_models = 1, .quick = 1};
    CHECK(pt_calibrate(&o, &c) != PT_OK);
    CHECK(strstr(pt_error_message(), "n_head") != NULL);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void test_cache(void) {
    pt_calibrate_options o = {.models = &tiny, .n_models = 1, .quick = 1, .threads = 1};
    char path[4096], again[4096], other[4096], prefix[128];
    int measured = -1;
    CHECK_OK(pt_calibrate_cached(&o, path, sizeof path, &measured));
    CHECK_EQ(measured, 1);
    snprintf(prefix, sizeof prefix, "%s/partrain/profile-", dir);
    CHECK(strncmp(path, prefix, strlen(prefix)) == 0);
    CHECK(access(path, R_OK) == 0);
    CHECK_OK(pt_calibrate_cached(&o, again, sizeof again, &measured));
    CHECK_EQ(measured, 0);
    CHECK(strcmp(path, again) == 0);
    /* another thread limit is another key */
    pt_calibrate_options o1 = o;
    o1.threads = 2;
    CHECK_OK(pt_calibrate_cache_path(&o1, other, sizeof other));
    CHECK(strcmp(path, other) != 0);
    /* a profile from another binary, then garbage: measured again */
    char cpu[PT_PLAN_NAME_MAX], binary[PT_PLAN_NAME_MAX], text[1024];
    pt_calibrate_identity(cpu, binary);
    snprintf(text, sizeof text, "{\"profile\": {\"cpu\": \"%s\", \"binary\": \"elsewhere\"}}", cpu);
    write_text(path, text);
    CHECK_OK(pt_calibrate_cached(&o, again, sizeof again, &measured));
    CHECK_EQ(measured, 1);
    write_text(path, "not json");
    CHECK_OK(pt_calibrate_cached(&o, again, sizeof again, &measured));
    CHECK_EQ(measured, 1);
    CHECK_OK(pt_calibrate_cached(&o, again, sizeof again, &measured));
    CHECK_EQ(measured, 0);
    char *got = NULL;
    CHECK_OK(pt_read_text_file(path, 1 << 24, &got));
    CHECK(got && strstr(got, binary) != NULL);
    free(got);
}

static void test_write_errors(void) {
    pt_calibration c;
    memset(&c, 0, sizeof c);
    char p[128];
    CHECK_EQ(pt_calibrate_write(&c, dir), PT_ERR_IO); /* a directory */
    CHECK(strstr(pt_error_message(), "is a directory") != NULL);
    snprintf(p, sizeof p, "%s/missing/p.json", dir);
    CHECK_EQ(pt_calibrate_write(&c, p), PT_ERR_IO);
    CHECK(strstr(pt_error_message(), p) != NULL);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/pt-test-calcache-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    setenv("XDG_CACHE_HOME", dir, 1);
    pt_log_set_level(PT_LOG_WARN);
    /* test_tables last: it starts the kernels' pool thread (threads up to
     * the cores), and pt_calibrate wants a single-threaded process for its
     * forks; the cache's measurements run on one thread */
    RUN(test_bad_options);
    RUN(test_cache);
    RUN(test_write_errors);
    RUN(test_tables);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return TEST_DONE();
}
