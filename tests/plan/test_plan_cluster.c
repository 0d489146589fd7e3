/* The cluster loader (src/plan/cluster.c): the shipped descriptions load
 * with their datasheet figures; each bad input is one error line naming
 * the file, the dotted field and its range (every physical quantity has
 * a plausible one, integers print as integers, the world is capped as
 * --world is); a profile without products or modules is refused; the
 * JSON written back loads to the same values, profile included, and a
 * value the loader refuses is refused by the writer. And the layout helpers (layout.c): a layout
 * through the config keys and back is the same layout. */
#include "partrain/plan.h"
#include "pt_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A description with a profile of one entry per table. */
static const char *base =
    "{\"name\": \"t\", \"nodes\": 2, \"devices_per_node\": 4,\n"
    " \"device\": {\"name\": \"cpu\", \"peak_flops\": {\"fp32\": 1e11, \"bf16\": 0},\n"
    "            \"memory_bytes\": 1e9, \"memory_bw\": 1e10},\n"
    " \"links\": {\"intra_node\": {\"bw\": 5e9, \"latency\": 1e-6},\n"
    "           \"inter_node\": {\"bw\": 1e9, \"latency\": 1e-5}},\n"
    " \"efficiency\": {\"matmul\": 0.5},\n"
    " \"profile\": {\"version\": 1, \"cpu\": \"x\", \"binary\": \"b\", \"cores\": 2,\n"
    "   \"memory_bw\": 1.2e10, \"elementwise_s\": 1e-10, \"adamw_s\": 2e-9, \"sgd_s\": 4e-10,\n"
    "   \"gemm\": [{\"m\": 256, \"n\": 768, \"k\": 768, \"threads\": 1, \"flops_s\": 9.1e10}],\n"
    "   \"modules\": [{\"kind\": \"head\", \"n_embd\": 384, \"n_head\": 6, \"seq_len\": 256,\n"
    "     \"vocab_size\": 256, \"tp\": 1, \"tokens\": 1024, \"threads\": 1, \"fwd_s\": 0.011,\n"
    "     \"bgrad_s\": 0.01, \"wgrad_s\": 0.009, \"recompute_s\": [0, 0.002, 0.011]}],\n"
    "   \"comm\": [{\"backend\": \"shm\", \"op\": \"reduce_scatter\", \"ranks\": 2,\n"
    "     \"bytes\": 1048576, \"seconds\": 2.1e-4}]}}";

/* base with the first `from` replaced by `to` (malloc'd) */
static char *patch(const char *from, const char *to) {
    const char *at = strstr(base, from);
    if (!at) {
        fprintf(stderr, "patch: '%s' not in the base text\n", from);
        exit(1);
    }
    size_t n = strlen(base) - strlen(from) + strlen(to) + 1;
    char *s = malloc(n);
    snprintf(s, n, "%.*s%s%s", (int)(at - base), base, to, at + strlen(from));
    return s;
}

static void test_shipped(void) {
    static const struct {
        const char *file;
        double fp32, bf16, bw, mem_bw, nvlink, ib;
    } want[] = {{"dgx-a100-80gb.json", 19.5e12, 312e12, 85899345920.0, 2.039e12, 300e9, 25e9},
                {"dgx-h100.json", 67e12, 989e12, 80e9, 3.35e12, 450e9, 50e9}};
    for (int i = 0; i < 2; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", PT_CLUSTERS_DIR, want[i].file);
        pt_cluster *c = NULL;
        CHECK_OK(pt_cluster_load_file(&c, path));
        if (!c) continue;
        CHECK_EQ(c->devices_per_node, 8);
        CHECK_EQ(c->device.peak_flops_fp32, want[i].fp32);
        CHECK_EQ(c->device.peak_flops_bf16, want[i].bf16);
        CHECK_EQ(c->device.memory_bytes, want[i].bw);
        CHECK_EQ(c->device.memory_bw, want[i].mem_bw);
        CHECK_EQ(c->intra_node.bw, want[i].nvlink);
        CHECK_EQ(c->inter_node.bw, want[i].ib);
        CHECK(c->profile == NULL);
        /* no efficiency object: the documented defaults */
        CHECK_NEAR(c->efficiency.matmul, 0.75, 0, 0);
        CHECK_NEAR(c->efficiency.elementwise, 0.8, 0, 0);
        CHECK_NEAR(c->efficiency.comm, 0.8, 0, 0);
        pt_cluster_free(c);
    }
}

static void test_profile(void) {
    pt_cluster *c = NULL;
    CHECK_OK(pt_cluster_load_string(&c, base, "t.json"));
    if (!c) return;
    CHECK_NEAR(c->efficiency.matmul, 0.5, 0, 0);
    CHECK_NEAR(c->efficiency.comm, 0.8, 0, 0);
    CHECK_EQ(c->device.peak_flops_bf16, 0);
    CHECK(c->profile != NULL);
    CHECK_EQ(c->profile->n_gemm, 1);
    CHECK_EQ(c->profile->gemm[0].k, 768);
    CHECK_EQ(c->profile->n_module, 1);
    CHECK_EQ(c->profile->module[0].kind, PT_MODULE_HEAD);
    CHECK_NEAR(c->profile->module[0].recompute_s[2], 0.011, 0, 0);
    CHECK_EQ(c->profile->n_comm, 1);
    CHECK_EQ(c->profile->comm[0].op, PT_PROFILE_REDUCE_SCATTER);
    CHECK(!strcmp(c->profile->comm[0].backend, "shm"));
    CHECK(!strcmp(c->profile->cpu, "x"));
    pt_cluster_free(c);
}

/* load(to_json(c)) holds c's values and writes the same text again */
static void test_round_trip(void) {
    pt_cluster *c = NULL, *d = NULL;
    CHECK_OK(pt_cluster_load_string(&c, base, "t.json"));
    if (!c) return;
    char *j = pt_cluster_to_json(c);
    CHECK(j != NULL);
    CHECK_OK(pt_cluster_load_string(&d, j, "round trip"));
    if (d) {
        CHECK(!strcmp(c->name, d->name));
        CHECK_EQ(c->nodes, d->nodes);
        CHECK(c->device.memory_bytes == d->device.memory_bytes);
        CHECK(c->inter_node.latency == d->inter_node.latency);
        CHECK(c->efficiency.matmul == d->efficiency.matmul);
        CHECK(c->profile->elementwise_s == d->profile->elementwise_s);
        CHECK(!memcmp(c->profile->gemm, d->profile->gemm, sizeof *c->profile->gemm));
        CHECK(!memcmp(c->profile->module, d->profile->module, sizeof *c->profile->module));
        CHECK(!memcmp(c->profile->comm, d->profile->comm, sizeof *c->profile->comm));
        char *j2 = pt_cluster_to_json(d);
        CHECK(j2 && !strcmp(j, j2));
        free(j2);
    }
    free(j);
    pt_cluster_free(d);
    pt_cluster_free(c);
}

/* each case: one substitution in base, and the message it must give */
static void test_bad(void) {
    static const struct {
        const char *from, *to, *msg;
    } cases[] = {
        {"\"nodes\": 2, ", "", "t.json: nodes is missing"},
        {"\"inter_node\": {\"bw\": 1e9", "\"inter_node\": {\"bw\": -1",
         "t.json: links.inter_node.bw must be a number in [1e6, 1e15] bytes/s (got -1)"},
        {"\"memory_bw\": 1e10", "\"memory_bw\": \"fast\"",
         "t.json: device.memory_bw must be a number in [1e6, 1e15] bytes/s (got a string)"},
        {"\"nodes\": 2", "\"nodes\": 2.5",
         "t.json: nodes must be an integer in [1, 1048576] (got 2.5)"},
        {"\"fp32\": 1e11", "\"fp32\": 1e999",
         "t.json: device.peak_flops.fp32 must be a number in [1e6, 1e18] flop/s (got inf)"},
        {"\"name\": \"t\",", "\"name\": \"t\", \"gpus\": 3,", "t.json: unknown key 'gpus'"},
        {"\"name\": \"t\",", "\"name\": \"t\", \"nodes\": 3,", "t.json: duplicate key 'nodes'"},
        {"\"matmul\": 0.5", "\"matmul\": 1.5",
         "t.json: efficiency.matmul must be 0 or a number in [0.01, 1] (got 1.5)"},
        {"\"latency\": 1e-6", "\"latency\": 0",
         "t.json: links.intra_node.latency must be a number in [1e-9, 1] s (got 0)"},
        {"\"kind\": \"head\"", "\"kind\": \"tail\"",
         "t.json: profile.modules[0].kind must be one of embedding|block|head (got 'tail')"},
        {"\"threads\": 1, \"flops_s\"", "\"flops_s\"",
         "t.json: profile.gemm[0].threads is missing"},
        {"\"bytes\": 1048576", "\"bytes\": 1048576, \"extra\": 1",
         "t.json: unknown key 'profile.comm[0].extra'"},
        {"[0, 0.002, 0.011]", "[0, 0.002]",
         "t.json: profile.modules[0].recompute_s must be an array of 3 numbers (none, selective, "
         "full), each 0 or a number in [1e-12, 1e6] s"},
        {"\"gemm\": [", "\"gemm\": 7, \"x\": [", "t.json: unknown key 'profile.x'"},
        {"\"version\": 1", "\"version\": 2", "t.json: profile.version 2 is not supported (1)"},
        {"\"devices_per_node\": 4", "\"devices_per_node\": 4,", "t.json: invalid JSON near line 1"},
        {"\"intra_node\": {", "\"intra_node\": [], \"x\": {", "t.json: unknown key 'links.x'"},
        {"\"links\": {\"intra_node\"", "\"links\": 3, \"l\": {\"intra_node\"",
         "t.json: unknown key 'l'"},
        {"\"device\": {", "\"device\": [], \"d\": {", "t.json: unknown key 'd'"},
        /* integers as integers, the limit named */
        {"\"nodes\": 2", "\"nodes\": 2147483648",
         "t.json: nodes must be an integer in [1, 1048576] (got 2147483648)"},
        {"\"devices_per_node\": 4", "\"devices_per_node\": 1e30",
         "t.json: devices_per_node must be an integer in [1, 1048576] (got 1e30)"},
        {"\"cores\": 2", "\"cores\": 100000",
         "t.json: profile.cores must be an integer in [1, 65536] (got 100000)"},
        /* the world as --world's cap */
        {"\"nodes\": 2, \"devices_per_node\": 4", "\"nodes\": 2048, \"devices_per_node\": 1024",
         "t.json: nodes x devices_per_node (2048 x 1024 = 2097152 ranks) must be at most 1048576 "
         "ranks (the planner's world, as --world's)"},
        {"\"nodes\": 2, \"devices_per_node\": 4", "\"nodes\": 1000000, \"devices_per_node\": 8",
         "t.json: nodes x devices_per_node (1000000 x 8 = 8000000 ranks) must be at most 1048576 "
         "ranks (the planner's world, as --world's)"},
        /* every physical quantity in a plausible range */
        {"\"fp32\": 1e11", "\"fp32\": 1e-300",
         "t.json: device.peak_flops.fp32 must be a number in [1e6, 1e18] flop/s (got 1e-300)"},
        {"\"bf16\": 0", "\"bf16\": 1e-300",
         "t.json: device.peak_flops.bf16 must be 0 or a number in [1e6, 1e18] flop/s (got "
         "1e-300)"},
        {"\"memory_bytes\": 1e9", "\"memory_bytes\": 1e-300",
         "t.json: device.memory_bytes must be a number in [1e6, 1e15] bytes (got 1e-300)"},
        {"\"memory_bw\": 1e10", "\"memory_bw\": 1e300",
         "t.json: device.memory_bw must be a number in [1e6, 1e15] bytes/s (got 1e300)"},
        {"\"inter_node\": {\"bw\": 1e9", "\"inter_node\": {\"bw\": 1e-300",
         "t.json: links.inter_node.bw must be a number in [1e6, 1e15] bytes/s (got 1e-300)"},
        {"\"latency\": 1e-5", "\"latency\": 3600",
         "t.json: links.inter_node.latency must be a number in [1e-9, 1] s (got 3600)"},
        {"\"matmul\": 0.5", "\"matmul\": 1e-300",
         "t.json: efficiency.matmul must be 0 or a number in [0.01, 1] (got 1e-300)"},
        {"\"memory_bw\": 1.2e10", "\"memory_bw\": 1e-300",
         "t.json: profile.memory_bw must be a number in [1e6, 1e15] bytes/s (got 1e-300)"},
        {"\"elementwise_s\": 1e-10", "\"elementwise_s\": 1e-300",
         "t.json: profile.elementwise_s must be a number in [1e-15, 1] s (got 1e-300)"},
        {"\"sgd_s\": 4e-10", "\"sgd_s\": 4e-10, \"probe_flops_s\": 1e-300",
         "t.json: profile.probe_flops_s must be a number in [1e6, 1e18] flop/s (got 1e-300)"},
        {"\"flops_s\": 9.1e10", "\"flops_s\": 1e-300",
         "t.json: profile.gemm[0].flops_s must be a number in [1e6, 1e18] flop/s (got 1e-300)"},
        {"\"fwd_s\": 0.011", "\"fwd_s\": 1e-300",
         "t.json: profile.modules[0].fwd_s must be a number in [1e-12, 1e6] s (got 1e-300)"},
        {"[0, 0.002, 0.011]", "[0, 1e300, 0.011]",
         "t.json: profile.modules[0].recompute_s[1] must be 0 or a number in [1e-12, 1e6] s (got "
         "1e300)"},
        {"\"seconds\": 2.1e-4", "\"seconds\": 1e-300",
         "t.json: profile.comm[0].seconds must be a number in [1e-12, 1e6] s (got 1e-300)"},
        /* a profile without what calibrate measures */
        {"\"gemm\": [{\"m\": 256, \"n\": 768, \"k\": 768, \"threads\": 1, \"flops_s\": 9.1e10}]",
         "\"gemm\": []",
         "t.json: profile.gemm is empty: a calibrate profile holds the measured matrix products "
         "and module passes (partrain calibrate writes them); without a profile the plan is "
         "modelled from the datasheet figures"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *s = patch(cases[i].from, cases[i].to);
        pt_cluster *c = (pt_cluster *)&c; /* must come back NULL */
        pt_status st = pt_cluster_load_string(&c, s, "t.json");
        CHECK(st != PT_OK);
        CHECK(c == NULL);
        if (strcmp(pt_error_message(), cases[i].msg) != 0) {
            fprintf(stderr, "case %zu: got   '%s'\n         want  '%s'\n", i, pt_error_message(),
                    cases[i].msg);
            CHECK(0);
        }
        CHECK(!strchr(pt_error_message(), '\n')); /* one line */
        free(s);
    }
    /* a mistyped section, a missing section */
    char *s = patch("\"links\": {", "\"links\": 3, \"unused\": {");
    pt_cluster *c = NULL;
    CHECK(pt_cluster_load_string(&c, s, "t.json") != PT_OK);
    free(s);
    s = patch("\"device\": {", "\"device\": 3, \"x\": {");
    CHECK(pt_cluster_load_string(&c, s, "t.json") != PT_OK);
    free(s);
}

/* a profile whose tables calibrate always fills: both empty is refused,
 * naming both */
static void test_empty_profile(void) {
    const char *gemm = strstr(base, "\"gemm\": ["), *comm = strstr(base, "\"comm\": [");
    size_t n = strlen(base) + 64;
    char *s = malloc(n);
    snprintf(s, n, "%.*s\"gemm\": [], \"modules\": [],\n   %s", (int)(gemm - base), base, comm);
    pt_cluster *c = NULL;
    CHECK(pt_cluster_load_string(&c, s, "t.json") != PT_OK);
    CHECK(c == NULL);
    CHECK(strstr(pt_error_message(), "t.json: profile.gemm and profile.modules are empty") != NULL);
    free(s);
}

/* what is written loads: a value the loader would refuse is refused by
 * the writer, named (cJSON would write a non-finite one as null) */
static void test_write_refuses(void) {
    pt_cluster *c = NULL;
    CHECK_OK(pt_cluster_load_string(&c, base, "t.json"));
    if (!c) return;
    c->device.peak_flops_fp32 = INFINITY;
    CHECK(pt_cluster_to_json(c) == NULL);
    CHECK(strstr(pt_error_message(), "device.peak_flops.fp32") != NULL);
    c->device.peak_flops_fp32 = 1e11;
    c->profile->gemm[0].flops_s = 1e-300;
    CHECK(pt_cluster_to_json(c) == NULL);
    CHECK(strstr(pt_error_message(), "profile.gemm[0].flops_s") != NULL);
    c->profile->gemm[0].flops_s = 9.1e10;
    char *j = pt_cluster_to_json(c);
    CHECK(j != NULL);
    free(j);
    pt_cluster_free(c);
}

static void test_files(void) {
    pt_cluster *c = NULL;
    CHECK(pt_cluster_load_file(&c, PT_CLUSTERS_DIR) != PT_OK); /* a directory */
    CHECK(c == NULL);
    CHECK(strstr(pt_error_message(), "is a directory, not a regular file") != NULL);
    CHECK(strstr(pt_error_message(), PT_CLUSTERS_DIR) != NULL);
    CHECK(pt_cluster_load_file(&c, PT_CLUSTERS_DIR "/nonexistent.json") != PT_OK);
    CHECK(strstr(pt_error_message(), "nonexistent.json: No such file") != NULL);
    pt_cluster_free(NULL);
}

static void test_layout(void) {
    pt_plan_layout l = {.dp = 2,
                        .tp = 2,
                        .pp = 2,
                        .zero = 1,
                        .zero_group = 1,
                        .sequence_parallel = 1,
                        .microbatches = 4,
                        .virtual_stages = 2,
                        .schedule = "interleaved",
                        .recompute = PT_RECOMPUTE_SELECTIVE,
                        .threads = 3,
                        .stage_layers = "1,1,1,1"};
    pt_config c;
    pt_config_defaults(&c);
    pt_plan_layout_apply(&l, &c);
    CHECK_EQ(c.parallel.tp, 2);
    CHECK(!strcmp(c.train.recompute, "selective"));
    CHECK(!strcmp(c.parallel.schedule, "interleaved"));
    pt_plan_layout back;
    pt_plan_layout_from_config(&back, &c);
    CHECK(!memcmp(&l, &back, sizeof l));
    char name[256];
    pt_plan_layout_name(&l, name, sizeof name);
    CHECK(!strcmp(name, "dp2-tp2-sp-pp2-zero1-g1-interleaved-v2-m4-rselective-L1,1,1,1"));
    /* the runtime's names: pp > 1 with schedule none runs 1f1b, one chunk */
    pt_config_defaults(&c);
    c.parallel.pp = 2;
    pt_plan_layout_from_config(&back, &c);
    CHECK(!strcmp(back.schedule, "1f1b"));
    CHECK_EQ(back.virtual_stages, 1);
    pt_plan_layout_name(&back, name, sizeof name);
    CHECK(!strcmp(name, "dp1-tp1-pp2-zero0-1f1b-m1-rnone"));
}

int main(void) {
    RUN(test_shipped);
    RUN(test_profile);
    RUN(test_round_trip);
    RUN(test_bad);
    RUN(test_empty_profile);
    RUN(test_write_refuses);
    RUN(test_files);
    RUN(test_layout);
    return TEST_DONE();
}
