/* Pipeline stages (parallel.h, stages.c): the balanced split is the best
 * contiguous cut, checked against every cut by brute force (n_layer 1..7,
 * every p); stages cover the modules in order, none empty; the parameters
 * add up to the model's plus the last stage's copy of wte; with two chunks
 * a rank the cut balances the ranks and, of those cuts, has the fastest
 * simulated step (brute force too); the parallel.stage_layers override
 * lands where it says; and every bad split is one line naming the value. */
#include <string.h>

#include "partrain/parallel.h"
#include "pt_test.h"

static pt_model_config model(int L) {
    pt_model_config c = {L, 64, 4, 512, 128};
    return c;
}

static double max_cost(const pt_stage *s, int p) {
    double m = 0;
    for (int k = 0; k < p; k++)
        if (s[k].cost > m) m = s[k].cost;
    return m;
}

/* The smallest largest-stage cost over every cut of n modules into p
 * contiguous non-empty stages (costs of single-module stages from the
 * split itself at p = n). */
static double brute(const double *cost, int n, int p) {
    if (p == 1) {
        double s = 0;
        for (int i = 0; i < n; i++) s += cost[i];
        return s;
    }
    double best = -1, tail = 0;
    for (int i = n - 1; i >= p - 1; i--) { /* the last stage is [i, n) */
        tail += cost[i];
        double rest = brute(cost, i, p - 1), m = rest > tail ? rest : tail;
        if (best < 0 || m < best) best = m;
    }
    return best;
}

static void test_balanced_is_best(void) {
    pt_stage s[16];
    for (int L = 1; L <= 7; L++) {
        pt_model_config c = model(L);
        int n = L + 2;
        double cost[16];
        CHECK_OK(pt_stage_split(&c, n, "", s)); /* one module per stage: each module's cost */
        for (int i = 0; i < n; i++) cost[i] = s[i].cost;
        size_t total = pt_model_config_num_params(&c), wte = 512 * 64;
        for (int p = 1; p <= n; p++) {
            CHECK_OK(pt_stage_split(&c, p, NULL, s));
            CHECK_NEAR(max_cost(s, p), brute(cost, n, p), 0, 1e-12);
            int next = 0;
            size_t params = 0;
            for (int k = 0; k < p; k++) {
                CHECK(s[k].first == next && s[k].last >= s[k].first);
                next = s[k].last + 1;
                params += s[k].params;
            }
            CHECK_EQ(next, n);
            CHECK_EQ(params, total + (p > 1 ? wte : 0));
        }
    }
}

static void test_override(void) {
    pt_model_config c = model(8);
    pt_stage s[4];
    char buf[256];
    CHECK_OK(pt_stage_split(&c, 3, "3,3,2", s));
    CHECK(s[0].first == 0 && s[0].last == 3 && s[1].first == 4 && s[1].last == 6 &&
          s[2].first == 7 && s[2].last == 9);
    pt_stage_describe(&c, 3, s, buf, sizeof buf);
    CHECK(!strcmp(buf, "embedding + 3 blocks | 3 blocks | 2 blocks + head"));
    CHECK_OK(pt_stage_split(&c, 2, "0,8", s)); /* the embedding alone */
    CHECK(s[0].first == 0 && s[0].last == 0 && s[1].first == 1 && s[1].last == 9);
    CHECK_OK(pt_stage_split(&c, 1, "8", s));
    CHECK(s[0].first == 0 && s[0].last == 9);
}

/* Whether the last error message holds s (and says so when not). */
static int msg_has(const char *s) {
    int ok = strstr(pt_error_message(), s) != NULL;
    if (!ok) fprintf(stderr, "  message '%s' lacks '%s'\n", pt_error_message(), s);
    return ok;
}

static void test_errors(void) {
    pt_model_config c = model(8);
    pt_stage s[16];
    CHECK(pt_stage_split(&c, 0, NULL, s) == PT_ERR_INVALID && msg_has("parallel.pp = 0"));
    CHECK(pt_stage_split(&c, 11, NULL, s) == PT_ERR_INVALID && msg_has("10 modules"));
    CHECK(pt_stage_split(&c, 3, "3,5", s) == PT_ERR_INVALID &&
          msg_has("names 2 stages, but parallel.pp = 3"));
    CHECK(pt_stage_split(&c, 3, "3,3,3", s) == PT_ERR_INVALID &&
          msg_has("adds up to 9 blocks, but model.n_layer = 8"));
    CHECK(pt_stage_split(&c, 2, "3,3,2", s) == PT_ERR_INVALID &&
          msg_has("names 3 stages, but parallel.pp = 2"));
    CHECK(pt_stage_split(&c, 2, "a,8", s) == PT_ERR_INVALID &&
          msg_has("entry 1 ('a') is not a non-negative integer"));
    CHECK(pt_stage_split(&c, 2, "-1,9", s) == PT_ERR_INVALID && msg_has("entry 1 ('-1')"));
    CHECK(pt_stage_split(&c, 3, "4,0,4", s) == PT_ERR_INVALID &&
          msg_has("entry 2 is 0, but only the first stage holds the embedding"));
}

/* parallel.stage_layers follows the comma-list grammar (core.h): blanks
 * around an entry are fine, an empty entry, a sign, a leading zero or a
 * blank inside a number are not, and a number over model.n_layer is
 * refused naming the limit, however many digits it has (issue 37, item 9). */
static void test_list_grammar(void) {
    pt_model_config c = model(8);
    pt_stage s[16];
    static const char *const same[] = {"3,5", " 3,5", "3 ,5", "3, 5", "\t3 , 5\t", "  3  ,  5  "};
    for (size_t k = 0; k < sizeof same / sizeof same[0]; k++) {
        CHECK_OK(pt_stage_split(&c, 2, same[k], s));
        CHECK(s[0].last == 3 && s[1].first == 4);
    }
    static const struct {
        const char *layers, *says;
    } bad[] = {
        {",8", "entry 1 is empty"},
        {"8,", "entry 2 is empty"},
        {"4,,4", "entry 2 is empty"},
        {" ", "entry 1 is empty"},
        {"4, ,4", "entry 2 is empty"},
        {"+3,5", "entry 1 ('+3') is not a non-negative integer"},
        {"03,5", "entry 1 ('03') is not a non-negative integer"},
        {"3 5", "entry 1 ('3 5') is not a non-negative integer"},
        {"3,5x", "entry 2 ('5x') is not a non-negative integer"},
        {"9,0", "entry 1 (9) is over the limit 8 (model.n_layer)"},
        {"99999999999999999999,2", "entry 1 (99999999999999999999) is over the limit 8"},
        {"2,18446744073709551616", "entry 2 (18446744073709551616) is over the limit 8"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        int ok = pt_stage_split(&c, 2, bad[k].layers, s) == PT_ERR_INVALID &&
                 msg_has("parallel.stage_layers") && msg_has(bad[k].says);
        CHECK(ok);
        if (!ok) fprintf(stderr, "  layers '%s'\n", bad[k].layers);
    }
}

/* Several chunks a rank: the list names every chunk, and a refusal says
 * so, parallel.pp x parallel.virtual_stages rather than a pp it never had
 * (issue 37, item 6). */
static void test_chunk_errors(void) {
    pt_model_config c = model(4);
    pt_stage s[16];
    CHECK(pt_stage_split_for(&c, "interleaved", 2, 2, 2, "2,2", s) == PT_ERR_INVALID &&
          msg_has("names 2 chunks, but parallel.pp x parallel.virtual_stages = 2 x 2 = 4 chunks"));
    CHECK(!strstr(pt_error_message(), "parallel.pp = 4"));
    CHECK(pt_stage_split_for(&c, "zbv", 2, 2, 2, "1,0,2,1", s) == PT_ERR_INVALID &&
          msg_has("entry 2 is 0, but only the first chunk holds the embedding"));
    CHECK(pt_stage_split_for(&c, "interleaved", 4, 2, 4, NULL, s) == PT_ERR_INVALID &&
          msg_has("parallel.pp x parallel.virtual_stages = 4 x 2 = 8 chunks must be in [1, 6]"));
    CHECK_OK(pt_stage_split_for(&c, "interleaved", 2, 2, 2, "1,1,1,1", s));
    CHECK(s[0].last == 1 && s[3].first == 4 && s[3].last == 5);
}

/* The smallest most-loaded-rank cost over every cut of n modules into 4
 * virtual stages, rank_of mapping stages to 2 ranks. */
static double brute_ranks(const double *cost, int n, const int *rank_of) {
    double best = -1;
    for (int a = 1; a < n; a++)
        for (int b = a + 1; b < n; b++)
            for (int d = b + 1; d < n; d++) {
                int cut[5] = {0, a, b, d, n};
                double r[2] = {0, 0};
                for (int k = 0; k < 4; k++)
                    for (int i = cut[k]; i < cut[k + 1]; i++) r[rank_of[k]] += cost[i];
                double m = r[0] > r[1] ? r[0] : r[1];
                if (best < 0 || m < best) best = m;
            }
    return best;
}

/* Several chunks a rank: the cut balances each rank's SUM of chunks (zbv:
 * rank 0 holds stages 0 and 3; interleaved: 0 and 2), the best of every
 * cut; with one chunk a rank it is pt_stage_split's. */
static void test_ranks_balanced(void) {
    pt_stage s[16], one[16];
    static const struct {
        const char *name;
        int rank_of[4];
    } sch[] = {{"zbv", {0, 1, 1, 0}}, {"interleaved", {0, 1, 0, 1}}};
    for (int L = 2; L <= 9; L++) {
        pt_model_config c = model(L);
        int n = L + 2;
        double cost[16];
        CHECK_OK(pt_stage_split(&c, n, "", one));
        for (int i = 0; i < n; i++) cost[i] = one[i].cost;
        for (int k = 0; k < 2; k++) {
            CHECK_OK(pt_stage_split_for(&c, sch[k].name, 2, 2, 4, "", s));
            double r[2] = {0, 0};
            int next = 0;
            for (int g = 0; g < 4; g++) {
                CHECK(s[g].first == next && s[g].last >= s[g].first);
                next = s[g].last + 1;
                r[sch[k].rank_of[g]] += s[g].cost;
            }
            CHECK_EQ(next, n);
            CHECK_NEAR(r[0] > r[1] ? r[0] : r[1], brute_ranks(cost, n, sch[k].rank_of), 0, 1e-12);
        }
        CHECK_OK(pt_stage_split_for(&c, "1f1b", 2, 1, 4, "", s));
        CHECK_OK(pt_stage_split(&c, 2, "", one));
        CHECK(s[0].last == one[0].last && s[1].first == one[1].first);
    }
}

/* The simulated step of cut `at` (the starts of stages 1..3) over lists,
 * each stage's F, B and W a third of its cost. */
static double step_of(const pt_schedule *lists, const double *cost, int n, const int *at) {
    int cut[5] = {0, at[0], at[1], at[2], n};
    double scale[4], total = 0, t[4];
    for (int i = 0; i < n; i++) total += cost[i];
    for (int k = 0; k < 4; k++) {
        scale[k] = 0;
        for (int i = cut[k]; i < cut[k + 1]; i++) scale[k] += cost[i] / total;
        t[k] = 1.0 / 3 * scale[k];
    }
    pt_sched_times times = {.f = t, .b = t, .w = t};
    pt_sched_result out = {0};
    CHECK_OK(pt_sched_simulate(lists, &times, &out));
    return out.makespan;
}

/* Of the cuts that balance the ranks, the one whose simulated step ends
 * first (brute force over every cut; zbv and interleaved at p 2, m 2 to
 * 8, 2 to 9 blocks and configs/gpt2.json's 12). On gpt2, interleaved at
 * m 4, that is embedding + 3 | 3 | 6 | head, where the lightest largest
 * stage alone gives embedding + 4 | 3 | 5 | head, whose step the
 * simulation ends later. */
static void test_ranks_simulated(void) {
    static const struct {
        const char *name;
        int rank_of[4];
    } sch[] = {{"zbv", {0, 1, 1, 0}}, {"interleaved", {0, 1, 0, 1}}};
    for (int q = 0; q < 2; q++)
        for (int L = 2; L <= 12; L++)
            for (int m = 2; m <= 8; m *= 2) {
                if (L == 10 || L == 11) continue;
                pt_model_config c = L == 12 ? (pt_model_config){12, 768, 12, 50257, 64} : model(L);
                int n = L + 2;
                pt_stage one[16], s[4];
                pt_schedule lists[2];
                CHECK_OK(pt_stage_split(&c, n, "", one));
                double cost[16];
                for (int i = 0; i < n; i++) cost[i] = one[i].cost;
                for (int r = 0; r < 2; r++)
                    CHECK_OK(pt_schedule_build_stage(&lists[r], sch[q].name, m, 2, r, 2));
                CHECK_OK(pt_stage_split_for(&c, sch[q].name, 2, 2, m, "", s));
                int got[3] = {s[1].first, s[2].first, s[3].first};
                double top = brute_ranks(cost, n, sch[q].rank_of), fastest = -1;
                for (int a = 1; a < n; a++)
                    for (int b = a + 1; b < n; b++)
                        for (int d = b + 1; d < n; d++) {
                            int cut[5] = {0, a, b, d, n}, at[3] = {a, b, d};
                            double w[2] = {0, 0};
                            for (int k = 0; k < 4; k++)
                                for (int i = cut[k]; i < cut[k + 1]; i++)
                                    w[sch[q].rank_of[k]] += cost[i];
                            if ((w[0] > w[1] ? w[0] : w[1]) > top * (1 + 1e-12)) continue;
                            double end = step_of(lists, cost, n, at);
                            if (fastest < 0 || end < fastest) fastest = end;
                        }
                CHECK_NEAR(step_of(lists, cost, n, got), fastest, 0, 1e-12);
                if (L == 12 && q == 1 && m == 4)
                    CHECK(s[0].last == 3 && s[1].last == 6 && s[2].last == 12);
                for (int r = 0; r < 2; r++) pt_schedule_free(&lists[r]);
            }
}

/* The cut by the whole step (pt_stage_split_step): gpt2 at seq_len 64,
 * batch 4, pp 2 is embedding + 9 blocks | 3 blocks + head by its passes
 * (the head weighs about 5.4 blocks), 102 M parameters updated on rank 0;
 * with each stage's update (AdamW, the tied wte split) embedding + 8 |
 * 4 + head. Each stage's update is the cost per parameter times what it
 * updates (the tied wte's halves on the two stages), the stage's cost its
 * passes plus that; the simulator's step ends at the passes plus the
 * longest update. */
static void test_whole_step(void) {
    pt_model_config c = {12, 768, 12, 50257, 64};
    pt_stage s[2];
    CHECK_OK(pt_stage_split_for(&c, "1f1b", 2, 1, 2, "", s));
    CHECK_EQ(s[0].last, 9);
    CHECK(s[0].update == 0 && s[1].update == 0);
    pt_stage_step st = pt_stage_step_of(0, 4, 1);
    CHECK(st.tied_split && st.update > 0);
    CHECK_OK(pt_stage_split_step(&c, &st, "1f1b", 2, 1, 2, "", s));
    CHECK_EQ(s[0].last, 8);
    double C = 768, V = 50257, hi = (V - (double)pt_tied_split_rows(50257)) * C;
    double blk = 12 * C * C + 13 * C;
    CHECK_NEAR(s[0].update, st.update * (V * C + 64 * C - hi + 8 * blk), 1e-9, 0);
    CHECK_NEAR(s[1].update, st.update * (4 * blk + 2 * C + hi), 1e-9, 0);
    pt_stage q[2]; /* the same cut by its passes alone: the cost less the update */
    CHECK_OK(pt_stage_split_for(&c, "1f1b", 2, 1, 2, "8,4", q));
    for (int k = 0; k < 2; k++) CHECK_NEAR(s[k].cost - s[k].update, q[k].cost, 1e-9, 0);
    /* without the split (dp > 1) all of wte on the first stage */
    pt_stage_step whole = pt_stage_step_of(0, 4, 2);
    CHECK(!whole.tied_split);
    CHECK_OK(pt_stage_split_step(&c, &whole, "1f1b", 2, 1, 2, "8,4", s));
    CHECK_NEAR(s[1].update, whole.update * (4 * blk + 2 * C), 1e-9, 0);
    double upd[3] = {1, 3, 2};
    CHECK_NEAR(pt_sched_step_end(10, upd, 3), 13, 1e-12, 0);
    CHECK_NEAR(pt_sched_step_end(10, NULL, 3), 10, 1e-12, 0);
}

int main(void) {
    RUN(test_balanced_is_best);
    RUN(test_whole_step);
    RUN(test_ranks_balanced);
    RUN(test_ranks_simulated);
    RUN(test_override);
    RUN(test_errors);
    RUN(test_list_grammar);
    RUN(test_chunk_errors);
    return TEST_DONE();
}
