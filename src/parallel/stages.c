/* Pipeline stages: the module list (0 the embedding, 1..L the blocks, L+1
 * the head) cut into p contiguous stages, balanced by a cost model of each
 * module's compute, or as parallel.stage_layers says (blocks per stage; the
 * embedding joins the first stage and the head the last). The cost of a
 * module is its forward and backward floating-point work per sequence
 * (backward = 2x forward, the usual count): a block 3 (24 T C^2 + 4 T^2 C),
 * the head 3 (2 T C V) (ln_f is noise next to the LM head), the embedding
 * 3 T C (a lookup and a scatter-add). The balanced split minimises the
 * largest stage's cost over every contiguous cut (exact, by dynamic
 * programming over the L + 2 modules). Memory per stage (parameters; the
 * tied wte on the last stage too) is reported beside it.
 *
 * Not here: running stages (the pipeline schedules), the planner's memory
 * model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/parallel.h"

/* Forward + backward work of module i, in flops per sequence. */
static double module_cost(const pt_model_config *c, int i) {
    double C = c->n_embd, T = c->seq_len, V = c->vocab_size;
    if (i == 0) return 3.0 * T * C;
    if (i <= c->n_layer) return 3.0 * (24.0 * T * C * C + 4.0 * T * T * C);
    return 3.0 * 2.0 * T * C * V;
}

/* Parameters (floats) of module i. */
static size_t module_params(const pt_model_config *c, int i) {
    size_t C = (size_t)c->n_embd;
    if (i == 0) return (size_t)c->vocab_size * C + (size_t)c->seq_len * C;
    if (i <= c->n_layer) return 12 * C * C + 13 * C;
    return 2 * C;
}

static void fill(const pt_model_config *c, pt_stage *s, int first, int last, int is_last) {
    s->first = first;
    s->last = last;
    s->cost = 0;
    s->params = 0;
    for (int i = first; i <= last; i++) {
        s->cost += module_cost(c, i);
        s->params += module_params(c, i);
    }
    /* the tied LM head reads wte: the last stage keeps a copy */
    if (is_last && first > 0) s->params += (size_t)c->vocab_size * (size_t)c->n_embd;
}

/* "3,3,2": blocks per stage, p entries >= 0 summing to L, every stage
 * holding at least one module. */
static pt_status parse_layers(const pt_model_config *c, int p, const char *layers, int *blocks) {
    const char *s = layers;
    int n = 0, sum = 0;
    while (*s) {
        char *end = NULL;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > c->n_layer || (*end && *end != ','))
            return pt_error_set(PT_ERR_INVALID,
                                "parallel.stage_layers = \"%s\": expected blocks per stage as "
                                "non-negative integers separated by commas, e.g. \"3,3,2\"",
                                layers);
        if (n == p)
            return pt_error_set(PT_ERR_INVALID,
                                "parallel.stage_layers = \"%s\" names more than parallel.pp (%d) "
                                "stages",
                                layers, p);
        blocks[n++] = (int)v;
        sum += (int)v;
        s = *end ? end + 1 : end;
    }
    if (n != p || sum != c->n_layer)
        return pt_error_set(PT_ERR_INVALID,
                            "parallel.stage_layers = \"%s\": %d stage%s of %d block%s in all, but "
                            "parallel.pp = %d and model.n_layer = %d",
                            layers, n, n == 1 ? "" : "s", sum, sum == 1 ? "" : "s", p, c->n_layer);
    for (int k = 1; k + 1 < p; k++)
        if (blocks[k] == 0)
            return pt_error_set(PT_ERR_INVALID,
                                "parallel.stage_layers = \"%s\": stage %d holds no module (only "
                                "the first holds the embedding, only the last the head)",
                                layers, k);
    return PT_OK;
}

pt_status pt_stage_split(const pt_model_config *c, int p, const char *layers, pt_stage *out) {
    int nmod = c->n_layer + 2;
    if (p < 1 || p > nmod)
        return pt_error_set(PT_ERR_INVALID,
                            "parallel.pp (%d) must be in [1, %d]: the model has %d modules (the "
                            "embedding, %d blocks, the head) and a stage holds at least one",
                            p, nmod, nmod, c->n_layer);
    if (layers && *layers) {
        int *blocks = malloc((size_t)p * sizeof *blocks);
        if (!blocks) return pt_error_set(PT_ERR_NOMEM, "stage split");
        pt_status st = parse_layers(c, p, layers, blocks);
        for (int k = 0, next = 1; st == PT_OK && k < p; k++) {
            int first = k == 0 ? 0 : next, last = next + blocks[k] - 1 + (k == p - 1);
            fill(c, &out[k], first, last, k == p - 1);
            next += blocks[k];
        }
        free(blocks);
        return st;
    }
    /* best[k][j]: the smallest largest-stage cost of modules [0, j) in k
     * stages; cut[k][j] the start of the k-th stage there */
    size_t n = (size_t)(p + 1) * (size_t)(nmod + 1);
    double *best = malloc(n * sizeof *best), *pre = malloc((size_t)(nmod + 1) * sizeof *pre);
    int *cut = malloc(n * sizeof *cut);
    if (!best || !pre || !cut) {
        free(best);
        free(pre);
        free(cut);
        return pt_error_set(PT_ERR_NOMEM, "stage split");
    }
#define AT(k, j) ((size_t)(k) * (size_t)(nmod + 1) + (size_t)(j))
    pre[0] = 0;
    for (int i = 0; i < nmod; i++) pre[i + 1] = pre[i] + module_cost(c, i);
    for (int j = 0; j <= nmod; j++) best[AT(1, j)] = pre[j], cut[AT(1, j)] = 0;
    for (int k = 2; k <= p; k++)
        for (int j = k; j <= nmod; j++) {
            best[AT(k, j)] = -1;
            for (int i = k - 1; i < j; i++) { /* stage k holds [i, j) */
                double a = best[AT(k - 1, i)], b = pre[j] - pre[i], m = a > b ? a : b;
                if (best[AT(k, j)] < 0 || m < best[AT(k, j)]) {
                    best[AT(k, j)] = m;
                    cut[AT(k, j)] = i;
                }
            }
        }
    for (int k = p, j = nmod; k >= 1; k--) {
        int i = cut[AT(k, j)];
        fill(c, &out[k - 1], i, j - 1, k == p);
        j = i;
    }
#undef AT
    free(best);
    free(pre);
    free(cut);
    return PT_OK;
}

void pt_stage_describe(const pt_model_config *c, int p, const pt_stage *s, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = 0;
    for (int k = 0; k < p && len < n; k++) {
        int blocks = 0;
        for (int i = s[k].first; i <= s[k].last; i++) blocks += i >= 1 && i <= c->n_layer;
        len +=
            (size_t)snprintf(buf + len, n - len, "%s%s%d block%s%s", k ? " | " : "",
                             s[k].first == 0 ? "embedding + " : "", blocks, blocks == 1 ? "" : "s",
                             s[k].last == c->n_layer + 1 ? " + head" : "");
    }
}

/* ---- a rank's chunks together ---- */

typedef struct {
    const pt_model_config *c;
    int G, p, nmod;
    const int *rank_of; /* virtual stage -> rank */
    const double *pre;  /* prefix sums of the modules' costs */
    int *cur, *best;    /* starts of virtual stages 1..G-1 */
    double best_rank, best_stage;
    long budget; /* cuts left to try */
} search;

/* Every cut whose stages 0..g-1 are chosen (cur[k - 1]: the first module
 * of stage k), stage g - 1 starting at `at`: the rest by recursion; each
 * complete cut scored by its most loaded rank, then its costliest stage. */
static void try_cuts(search *x, int g, int at) {
    if (x->budget <= 0) return;
    if (g == x->G) {
        x->budget--;
        double rank[PT_SCHEDULE_MAX_VIRTUAL * 64] = {0}, top = 0, stage = 0;
        for (int k = 0; k < x->G; k++) {
            int a = k ? x->cur[k - 1] : 0, b = k + 1 < x->G ? x->cur[k] : x->nmod;
            double v = x->pre[b] - x->pre[a];
            rank[x->rank_of[k]] += v;
            if (v > stage) stage = v;
        }
        for (int r = 0; r < x->p; r++)
            if (rank[r] > top) top = rank[r];
        if (top < x->best_rank * (1 - 1e-12) ||
            (top <= x->best_rank * (1 + 1e-12) && stage < x->best_stage * (1 - 1e-12))) {
            x->best_rank = top;
            x->best_stage = stage;
            memcpy(x->best, x->cur, (size_t)(x->G - 1) * sizeof *x->cur);
        }
        return;
    }
    /* stage g - 1 starts at `at`; stage g at `next`, leaving a module for
     * each stage after it */
    for (int next = at + 1; next <= x->nmod - (x->G - g); next++) {
        x->cur[g - 1] = next;
        try_cuts(x, g + 1, next);
    }
}

pt_status pt_stage_split_for(const pt_model_config *c, const char *schedule, int p, int v,
                             const char *layers, pt_stage *out) {
    int G = p * v, nmod = c->n_layer + 2;
    PT_CHECK(pt_stage_split(c, G, layers, out));
    /* one chunk a rank, or the cut given: as it is */
    if (v == 1 || (layers && *layers) || G > PT_SCHEDULE_MAX_VIRTUAL * 64) return PT_OK;
    /* Several chunks a rank: what a rank works is the SUM of its chunks,
     * which the per-stage cut does not balance (ZB-V at p 2 over 6 blocks:
     * 2 blocks and 4). Try every cut (up to a budget; past it, the
     * per-stage cut stays) for the smallest largest rank, then stage. */
    int rank_of[PT_SCHEDULE_MAX_VIRTUAL * 64];
    for (int g = 0; g < G; g++) rank_of[g] = pt_schedule_locate(schedule, p, v, g, NULL);
    double *pre = malloc((size_t)(nmod + 1) * sizeof *pre);
    int *cur = malloc((size_t)G * sizeof *cur), *best = malloc((size_t)G * sizeof *best);
    if (!pre || !cur || !best) {
        free(pre);
        free(cur);
        free(best);
        return pt_error_set(PT_ERR_NOMEM, "stage split");
    }
    pre[0] = 0;
    for (int i = 0; i < nmod; i++) pre[i + 1] = pre[i] + module_cost(c, i);
    search x = {c, G, p, nmod, rank_of, pre, cur, best, 0, 0, 2000000};
    /* the per-stage cut is the one to beat */
    for (int k = 1; k < G; k++) best[k - 1] = cur[k - 1] = out[k].first;
    {
        double rank[PT_SCHEDULE_MAX_VIRTUAL * 64] = {0};
        for (int k = 0; k < G; k++) {
            rank[rank_of[k]] += out[k].cost;
            if (out[k].cost > x.best_stage) x.best_stage = out[k].cost;
        }
        for (int r = 0; r < p; r++)
            if (rank[r] > x.best_rank) x.best_rank = rank[r];
    }
    long total = 1; /* C(nmod - 1, G - 1), capped: the search's size */
    for (int k = 1; k < G && total <= x.budget; k++) total = total * (nmod - k) / k;
    if (total <= x.budget) try_cuts(&x, 1, 0);
    for (int k = 0; k < G; k++) {
        int a = k ? best[k - 1] : 0, b = k + 1 < G ? best[k] : nmod;
        fill(c, &out[k], a, b - 1, k == G - 1);
    }
    free(pre);
    free(cur);
    free(best);
    return PT_OK;
}
