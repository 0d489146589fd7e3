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
 * The cut a pipeline runs weighs each stage's WHOLE step (pt_stage_step):
 * its passes, and its optimizer update, which is memory-bound: a cost per
 * parameter it updates, in the passes' units, over the sequences a step
 * runs. The tied wte's update counts where it runs: half on the first
 * stage and half on the last where the two split it (tied_split.c), else
 * whole on the first. gpt2 at pp 2 (seq_len 64, batch 4) by its passes:
 * embedding + 9 blocks | 3 blocks + head, 102 M of the 124 M parameters
 * updated on rank 0 (tens of ms after the passes while rank 1 waits).
 *
 * Not here: running stages (the pipeline schedules), the planner's memory
 * model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/parallel.h"

size_t pt_stage_module_params(const pt_model_config *c, int i) {
    size_t C = (size_t)c->n_embd;
    if (i == 0) return (size_t)c->vocab_size * C + (size_t)c->seq_len * C;
    if (i <= c->n_layer) return 12 * C * C + 13 * C;
    return 2 * C;
}

/* Parameters whose update module i's stage runs: its own, the tied wte's
 * rows split between the embedding's and the head's (the head's module
 * carries the second half: with one stage the two add up to wte). */
static double module_updated(const pt_model_config *c, const pt_stage_step *s, int i) {
    double own = (double)pt_stage_module_params(c, i), C = c->n_embd;
    if (!s || !s->tied_split || (i != 0 && i <= c->n_layer)) return own;
    double hi = (double)(c->vocab_size - (int)pt_tied_split_rows(c->vocab_size)) * C;
    return i == 0 ? own - hi : own + hi;
}

/* Module i's work in a step, in flops per sequence: forward + backward,
 * and with a step given its share of the update. */
static double module_cost(const pt_model_config *c, const pt_stage_step *step, int i) {
    double C = c->n_embd, T = c->seq_len, V = c->vocab_size, f;
    if (i == 0)
        f = 3.0 * T * C;
    else if (i <= c->n_layer)
        f = 3.0 * (24.0 * T * C * C + 4.0 * T * T * C);
    else
        f = 3.0 * 2.0 * T * C * V;
    return step ? f + step->update * module_updated(c, step, i) : f;
}

/* Flops the passes run in the time one parameter's update takes: AdamW
 * reads a parameter, its gradient and two moments and writes three (28
 * bytes), SGD 12, and the next step's gradient reset writes 4 more. On
 * this 2-core Xeon (AVX-512) one thread updates a parameter in 0.80 ns
 * (AdamW, calibrate's adamw_s; 40 GB/s with the reset) while its sgemm
 * runs at 165 GFLOP/s (docs/benchmarks.md): about 4 flops a byte. */
#define FLOPS_PER_UPDATE_BYTE 4.0

pt_stage_step pt_stage_step_of(int sgd, double sequences, int dp) {
    double bytes = (sgd ? 12.0 : 28.0) + 4.0;
    return (pt_stage_step){bytes * FLOPS_PER_UPDATE_BYTE / (sequences > 0 ? sequences : 1),
                           dp <= 1};
}

static void fill(const pt_model_config *c, const pt_stage_step *step, pt_stage *s, int first,
                 int last, int is_last) {
    s->first = first;
    s->last = last;
    s->cost = 0;
    s->update = 0;
    s->params = 0;
    for (int i = first; i <= last; i++) {
        s->cost += module_cost(c, step, i);
        if (step) s->update += step->update * module_updated(c, step, i);
        s->params += pt_stage_module_params(c, i);
    }
    /* the tied LM head reads wte: the last stage keeps a copy */
    if (is_last && first > 0) s->params += (size_t)c->vocab_size * (size_t)c->n_embd;
}

/* What the cut's p x v entries are, for messages: "parallel.pp = 2", or
 * with several chunks a rank "parallel.pp x parallel.virtual_stages = 2 x 2
 * = 4 chunks" (the list names every chunk, not every rank). */
static void count_name(int p, int v, char *buf, size_t n) {
    if (v == 1)
        snprintf(buf, n, "parallel.pp = %d", p);
    else
        snprintf(buf, n, "parallel.pp x parallel.virtual_stages = %d x %d = %d chunks", p / v, v,
                 p);
}

/* "3,3,2" (the comma-list grammar, core.h): blocks per stage, p entries
 * of at most L each summing to L, every stage holding at least one module.
 * p = pp x v stages; v only names them. */
static pt_status parse_layers(const pt_model_config *c, int p, int v, const char *layers,
                              int *blocks) {
    const char *key = "parallel.stage_layers";
    char what[128];
    count_name(p, v, what, sizeof what);
    pt_list l;
    pt_list_init(&l, key, layers);
    int n = 0, r;
    long sum = 0;
    while ((r = pt_list_next(&l)) > 0) {
        long b;
        PT_CHECK(pt_list_number(&l, c->n_layer, "model.n_layer", &b));
        if (n < p) blocks[n] = (int)b;
        n++;
        sum += b;
    }
    if (r < 0) return (pt_status)r;
    if (n != p)
        return pt_error_set(PT_ERR_INVALID,
                            "%s = \"%s\" names %d %s%s, but %s (one entry of blocks for each)", key,
                            layers, n, v > 1 ? "chunk" : "stage", n == 1 ? "" : "s", what);
    if (sum != c->n_layer)
        return pt_error_set(PT_ERR_INVALID,
                            "%s = \"%s\" adds up to %ld block%s, but model.n_layer = %d", key,
                            layers, sum, sum == 1 ? "" : "s", c->n_layer);
    for (int k = 1; k + 1 < p; k++)
        if (blocks[k] == 0)
            return pt_error_set(PT_ERR_INVALID,
                                "%s = \"%s\": entry %d is 0, but only the first %s holds the "
                                "embedding and only the last the head: one between them needs a "
                                "block",
                                key, layers, k + 1, v > 1 ? "chunk" : "stage");
    return PT_OK;
}

/* The first i of [from, j - 1] with the least max(a[i], pre[j] - pre[i]),
 * as a scan of every i keeping the first minimum finds it; *cross is
 * where the scan for j - 1 left off (from at j = from + 1). a (the best
 * cost of modules [0, i) in one stage fewer) never falls as i grows and
 * pre[j] - pre[i] never rises (the costs are >= 0 and rounding is
 * monotone), so the maximum falls with the second until the first
 * reaches it, then rises with the first; that crossing only moves right
 * as j grows. So a row of the table costs O(n), where the scan made it
 * O(n^2): the planner validates every layout it evaluates, and a
 * 1,000-layer model cut at 64 stages took 64 x 1,000^2 steps a layout. */
static int least_cut(const double *a, const double *pre, int from, int j, int *cross) {
    int x = *cross; /* the first i with a[i] >= pre[j] - pre[i], or j */
    while (x < j && a[x] < pre[j] - pre[x]) x++;
    *cross = x;
    if (x == from) return from;        /* the rising side only: its first */
    double left = pre[j] - pre[x - 1]; /* the falling side's least */
    if (x < j && a[x] < left) return x;
    int i = x - 1; /* the falling side's first i at that value (a flat run) */
    while (i > from && pre[j] - pre[i - 1] <= left) i--;
    return i;
}

/* pt_stage_split, p = pp x v stages (v names them in messages). */
static pt_status split(const pt_model_config *c, const pt_stage_step *step, int p, int v,
                       const char *layers, pt_stage *out) {
    int nmod = c->n_layer + 2;
    if (p < 1 || p > nmod) {
        char what[128];
        count_name(p, v, what, sizeof what);
        return pt_error_set(PT_ERR_INVALID,
                            "%s must be in [1, %d]: the model has %d modules (the embedding, %d "
                            "blocks, the head) and a stage holds at least one",
                            what, nmod, nmod, c->n_layer);
    }
    if (layers && *layers) {
        int *blocks = malloc((size_t)p * sizeof *blocks);
        if (!blocks) return pt_error_set(PT_ERR_NOMEM, "stage split");
        pt_status st = parse_layers(c, p, v, layers, blocks);
        for (int k = 0, next = 1; st == PT_OK && k < p; k++) {
            int first = k == 0 ? 0 : next, last = next + blocks[k] - 1 + (k == p - 1);
            fill(c, step, &out[k], first, last, k == p - 1);
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
    for (int i = 0; i < nmod; i++) pre[i + 1] = pre[i] + module_cost(c, step, i);
    for (int j = 0; j <= nmod; j++) best[AT(1, j)] = pre[j], cut[AT(1, j)] = 0;
    for (int k = 2; k <= p; k++)
        for (int j = k, cross = k - 1; j <= nmod; j++) { /* stage k holds [i, j) */
            int i = least_cut(&best[AT(k - 1, 0)], pre, k - 1, j, &cross);
            double a = best[AT(k - 1, i)], b = pre[j] - pre[i];
            best[AT(k, j)] = a > b ? a : b;
            cut[AT(k, j)] = i;
        }
    for (int k = p, j = nmod; k >= 1; k--) {
        int i = cut[AT(k, j)];
        fill(c, step, &out[k - 1], i, j - 1, k == p);
        j = i;
    }
#undef AT
    free(best);
    free(pre);
    free(cut);
    return PT_OK;
}

pt_status pt_stage_split(const pt_model_config *c, int p, const char *layers, pt_stage *out) {
    return split(c, NULL, p, 1, layers, out);
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

/* Cuts as light as the lightest are collected up to CUT_CANDIDATES (past
 * that the lightest largest stage stays, unsimulated), and the first
 * CUT_SIMULATED of them by largest stage are simulated, at up to
 * CUT_MAX_RANKS ranks. */
#define CUT_CANDIDATES 4096
#define CUT_SIMULATED  64
#define CUT_MAX_RANKS  64 /* the simulator's lists on the stack */

typedef struct {
    int G, p, nmod;
    const int *rank_of; /* virtual stage -> rank */
    const double *pre;  /* prefix sums of the modules' costs */
    const double *upre; /* and of their updates' (part of pre) */
    int *cur, *best;    /* starts of virtual stages 1..G-1 */
    double best_rank, best_stage;
    double *part;       /* per rank: the cost of its stages closed so far */
    int collect;        /* 1: gather the cuts as light as best_rank */
    int *cand, n_cand;  /* n_cand x (G - 1) starts; n_cand > CUT_CANDIDATES: too many */
    double *cand_stage; /* each one's largest stage */
} search;

/* The cut `at` (starts of stages 1..G-1): its most loaded rank's compute
 * and its costliest stage. */
static void score(const search *x, const int *at, double *top, double *stage) {
    double rank[PT_SCHEDULE_MAX_VIRTUAL * 64] = {0};
    *top = *stage = 0;
    for (int k = 0; k < x->G; k++) {
        int a = k ? at[k - 1] : 0, b = k + 1 < x->G ? at[k] : x->nmod;
        double w = x->pre[b] - x->pre[a];
        rank[x->rank_of[k]] += w;
        if (w > *stage) *stage = w;
    }
    for (int r = 0; r < x->p; r++)
        if (rank[r] > *top) *top = rank[r];
}

/* a < b, beyond rounding */
static int below(double a, double b) {
    return a < b * (1 - 1e-12);
}

/* Every cut whose stages 0..g-1 are chosen (cur[k - 1]: the first module
 * of stage k), stage g - 1 starting at `at`: the rest by recursion. Each
 * complete cut is kept if it beats the best so far on its most loaded
 * rank, then its costliest stage; or, collecting, gathered if it is as
 * light as the best. */
static void try_cuts(search *x, int g, int at) {
    if (g == x->G) {
        double top, stage;
        score(x, x->cur, &top, &stage);
        if (x->collect) {
            if (below(x->best_rank, top)) return;
            if (x->n_cand < CUT_CANDIDATES) {
                memcpy(x->cand + (size_t)x->n_cand * (size_t)(x->G - 1), x->cur,
                       (size_t)(x->G - 1) * sizeof *x->cur);
                x->cand_stage[x->n_cand] = stage;
            }
            x->n_cand++;
        } else if (below(top, x->best_rank) ||
                   (!below(x->best_rank, top) && below(stage, x->best_stage))) {
            x->best_rank = top;
            x->best_stage = stage;
            memcpy(x->best, x->cur, (size_t)(x->G - 1) * sizeof *x->cur);
        }
        return;
    }
    /* stage g - 1 starts at `at`; stage g at `next`, leaving a module for
     * each stage after it. A rank already heavier than the best cut ends
     * the loop: a later `next` only adds to it */
    double *part = &x->part[x->rank_of[g - 1]], base = *part;
    for (int next = at + 1; next <= x->nmod - (x->G - g); next++) {
        *part = base + (x->pre[next] - x->pre[at]);
        if (below(x->best_rank, *part)) break;
        x->cur[g - 1] = next;
        try_cuts(x, g + 1, next);
    }
    *part = base;
}

/* A candidate by its largest stage, then the order found. */
typedef struct {
    double stage;
    int i;
} by_stage;

static int by_stage_cmp(const void *pa, const void *pb) {
    const by_stage *a = pa, *b = pb;
    if (below(a->stage, b->stage)) return -1;
    if (below(b->stage, a->stage)) return 1;
    return (a->i > b->i) - (a->i < b->i);
}

/* Of x's candidates, the one whose step the schedule's simulator (its
 * lists at m micro-batches, each virtual stage's F, B and W a third of its
 * cost) ends first, into x->best; ties to the lighter largest stage, then
 * to the order found. The lightest largest stage is among the simulated. */
static pt_status simulate_cuts(search *x, const char *schedule, int m, int v) {
    int G = x->G, n = x->n_cand;
    pt_schedule lists[CUT_MAX_RANKS];
    double t[3][PT_SCHEDULE_MAX_VIRTUAL * 64]; /* F, B, W by virtual stage */
    pt_sched_times times = {.f = t[0], .b = t[1], .w = t[2]};
    by_stage *order = malloc((size_t)n * sizeof *order);
    if (!order) return pt_error_set(PT_ERR_NOMEM, "stage split");
    for (int i = 0; i < n; i++) order[i] = (by_stage){x->cand_stage[i], i};
    qsort(order, (size_t)n, sizeof *order, by_stage_cmp);
    pt_status st = pt_schedule_build_all(lists, schedule, m, x->p, v);
    double best_end = -1;
    for (int k = 0; st == PT_OK && k < n && k < CUT_SIMULATED; k++) {
        const int *at = x->cand + (size_t)order[k].i * (size_t)(G - 1);
        double upd[CUT_MAX_RANKS] = {0};
        for (int g = 0; g < G; g++) {
            int a = g ? at[g - 1] : 0, b = g + 1 < G ? at[g] : x->nmod;
            double u = (x->upre[b] - x->upre[a]) / x->pre[x->nmod];
            t[0][g] = t[1][g] = t[2][g] = 1.0 / 3 * ((x->pre[b] - x->pre[a]) / x->pre[x->nmod] - u);
            upd[x->rank_of[g]] += u;
        }
        times.update = upd;
        pt_sched_result res = {0};
        st = pt_sched_simulate(lists, &times, &res);
        if (st == PT_OK && (best_end < 0 || below(res.step, best_end))) {
            best_end = res.step;
            memcpy(x->best, at, (size_t)(G - 1) * sizeof *at);
        }
    }
    for (int r = 0; r < x->p; r++) pt_schedule_free(&lists[r]); /* zeroed if not built */
    free(order);
    return st;
}

pt_status pt_stage_split_for(const pt_model_config *c, const char *schedule, int p, int v, int m,
                             const char *layers, pt_stage *out) {
    return pt_stage_split_step(c, NULL, schedule, p, v, m, layers, out);
}

pt_status pt_stage_split_step(const pt_model_config *c, const pt_stage_step *step,
                              const char *schedule, int p, int v, int m, const char *layers,
                              pt_stage *out) {
    int G = p * v, nmod = c->n_layer + 2;
    PT_CHECK(split(c, step, G, v, layers, out));
    /* one chunk a rank, or the cut given: as it is */
    if (v == 1 || (layers && *layers) || G > PT_SCHEDULE_MAX_VIRTUAL * 64) return PT_OK;
    /* Several chunks a rank: what a rank works is the SUM of its chunks,
     * which the per-stage cut does not balance (ZB-V at p 2 over 6 blocks:
     * 2 blocks and 4). Try every cut (up to 2e6 of them; past that, the
     * per-stage cut stays) for the smallest largest rank, then the
     * smallest largest stage. Of the cuts that light (several, when the
     * modules cost the same), the pipeline's own step decides: how a
     * rank's chunks are sized moves the waits between them (gpt2's 12
     * blocks, interleaved at p 2, m 4: embedding + 4 | 3 | 5 | head by
     * largest stage, 0.142 of the step idle in the simulation; embedding +
     * 3 | 3 | 6 | head, 0.120). */
    long total = 1; /* C(nmod - 1, G - 1), capped: the search's size */
    for (int k = 1; k < G && total <= 2000000; k++) total = total * (nmod - k) / k;
    if (total > 2000000) return PT_OK;
    int rank_of[PT_SCHEDULE_MAX_VIRTUAL * 64];
    for (int g = 0; g < G; g++) rank_of[g] = pt_schedule_locate(schedule, p, v, g, NULL);
    double *pre = malloc(2 * (size_t)(nmod + 1) * sizeof *pre), *upre = pre + nmod + 1;
    int *cur = malloc((size_t)G * sizeof *cur), *best = malloc((size_t)G * sizeof *best);
    int *cand = malloc((size_t)CUT_CANDIDATES * (size_t)G * sizeof *cand);
    double *cand_stage = malloc((size_t)CUT_CANDIDATES * sizeof *cand_stage);
    double *part = calloc((size_t)p, sizeof *part);
    pt_status st = PT_OK;
    if (!pre || !cur || !best || !cand || !cand_stage || !part) {
        st = pt_error_set(PT_ERR_NOMEM, "stage split");
        goto done;
    }
    pre[0] = upre[0] = 0;
    for (int i = 0; i < nmod; i++) {
        pre[i + 1] = pre[i] + module_cost(c, step, i);
        upre[i + 1] = upre[i] + (step ? step->update * module_updated(c, step, i) : 0);
    }
    search x = {G, p, nmod, rank_of, pre, upre, cur, best, 0, 0, part, 0, cand, 0, cand_stage};
    /* the per-stage cut is the one to beat */
    for (int k = 1; k < G; k++) best[k - 1] = cur[k - 1] = out[k].first;
    score(&x, best, &x.best_rank, &x.best_stage);
    try_cuts(&x, 1, 0);
    x.collect = 1;
    try_cuts(&x, 1, 0);
    if (x.n_cand > 1 && x.n_cand <= CUT_CANDIDATES && p <= CUT_MAX_RANKS)
        st = simulate_cuts(&x, schedule, m, v);
    for (int k = 0; st == PT_OK && k < G; k++) {
        int a = k ? best[k - 1] : 0, b = k + 1 < G ? best[k] : nmod;
        fill(c, step, &out[k], a, b - 1, k == G - 1);
    }
done:
    free(pre);
    free(cur);
    free(best);
    free(cand);
    free(cand_stage);
    free(part);
    return st;
}
