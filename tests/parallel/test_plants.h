/* Bugs planted on purpose, for the parity harness's self-check
 * (test_parity_selfcheck.c): each is a WRAPPER around a real strategy's
 * stack entry (the trainer's test seam, src/train/trainer_test.h) that
 * calls the entry and breaks one thing a synchronizer could get wrong. None
 * of this reaches the product.
 *
 *   double_bucket  "ddp": the head's all-reduced gradient doubled (the
 *                  bucket holding its end, bucket 0)
 *   no_avg         "ddp" or "zero": every rank weighs its loss by 1/(its
 *                  own tokens): the summed gradient is dp x the mean
 *   skip_module    "ddp": h.0's gradient left out of the all-reduce (each
 *                  rank keeps its own share)
 *   tp_skip_f      the tensor-parallel block without Megatron's f: c_attn's
 *                  input gradient not summed over the tp group (the model's
 *                  test seam: the collective lives inside the module)
 *   tp_norm        "tp_norm": the tensors every tp rank holds whole counted
 *                  once per rank in the gradient norm
 *   pp_tied        "tied": the other stage's part of the tied wte's
 *                  gradient never added (the whole update: the head's on
 *                  the embedding's stage; split: each stage's rows)
 *   pp_norm        "pp_norm": each stage's gradient norm its own
 * A plant on a layout without its entry is an error (a self-check that
 * plants nothing would pass). Header-only and static, like the harness. */
#ifndef PT_TEST_PLANTS_H
#define PT_TEST_PLANTS_H

#include <stdlib.h>
#include <string.h>

#include "../../src/model/model_test.h"
#include "../../src/train/trainer_test.h"
#include "partrain/parallel.h"

typedef enum {
    P_DOUBLE,
    P_NO_AVG,
    P_SKIP,
    P_TP_SKIP_F,
    P_TP_NORM,
    P_PP_TIED,
    P_PP_NORM
} plant_kind;

static const struct {
    const char *name, *entry; /* entry NULL: not a stack entry's */
    plant_kind kind;
} PLANTS[] = {{"double_bucket", "ddp", P_DOUBLE}, {"no_avg", "ddp", P_NO_AVG},
              {"skip_module", "ddp", P_SKIP},     {"tp_skip_f", NULL, P_TP_SKIP_F},
              {"tp_norm", "tp_norm", P_TP_NORM},  {"pp_tied", "tied", P_PP_TIED},
              {"pp_norm", "pp_norm", P_PP_NORM}};

/* One wrapper: the inner entry, the model, and a module's saved gradient. */
typedef struct {
    pt_strategy in;
    pt_strategy_ops ops; /* the inner's, some slots replaced */
    plant_kind kind;
    pt_model *m;
    float *keep; /* a module's gradient kept across the inner's work */
    size_t keep_n;
} plant;

static float *plant_grads(plant *w, int module, size_t *n) {
    size_t off;
    pt_model_module_region(w->m, module, &off, n);
    return pt_model_module_grads(w->m, module);
}

static pt_status plant_begin(void *self, pt_step_begin *b) {
    plant *w = self;
    PT_CHECK(w->in.ops->begin ? w->in.ops->begin(w->in.self, b) : PT_OK);
    if (w->kind == P_NO_AVG && !b->eval) b->dloss = b->local_dloss;
    return PT_OK;
}

/* skip_module keeps h.0's own gradient before its bucket launches;
 * pp_tied keeps wte's before the head's half is added, and puts it back. */
static pt_status plant_grads_point(void *self, const pt_hook_point *p) {
    plant *w = self;
    int mod = w->kind == P_SKIP ? 1 : 0;
    int keep = p->last && p->module == mod && (w->kind == P_SKIP || w->kind == P_PP_TIED);
    size_t n = 0;
    float *g = keep ? plant_grads(w, mod, &n) : NULL;
    if (keep && (!w->keep || w->keep_n != n)) {
        free(w->keep);
        w->keep = malloc(n * sizeof(float));
        w->keep_n = n;
        if (!w->keep) return pt_error_set(PT_ERR_NOMEM, "plant");
    }
    if (keep) memcpy(w->keep, g, n * sizeof(float));
    PT_CHECK(w->in.ops->grads ? w->in.ops->grads(w->in.self, p) : PT_OK);
    if (keep && w->kind == P_PP_TIED) memcpy(g, w->keep, n * sizeof(float));
    return PT_OK;
}

/* The stage's wte gradient (the embedding's, or the head's copy). */
static float *plant_wte_grads(plant *w, size_t *n) {
    float *p, *g;
    pt_model_tied_wte(w->m, &p, &g, n);
    return g ? g : plant_grads(w, 0, n);
}

static pt_status plant_sync(void *self, pt_update *u) {
    plant *w = self;
    size_t n = 0;
    /* pp_tied under the split update: the other stage's rows are added here */
    float *g = w->kind == P_PP_TIED && w->in.ops->sync ? plant_wte_grads(w, &n) : NULL;
    if (g && (!w->keep || w->keep_n != n)) {
        free(w->keep);
        w->keep = malloc(n * sizeof(float));
        w->keep_n = n;
        if (!w->keep) return pt_error_set(PT_ERR_NOMEM, "plant");
    }
    if (g) memcpy(w->keep, g, n * sizeof(float));
    PT_CHECK(w->in.ops->sync ? w->in.ops->sync(w->in.self, u) : PT_OK);
    if (g) memcpy(g, w->keep, n * sizeof(float));
    if (w->kind == P_SKIP && w->keep) memcpy(plant_grads(w, 1, &n), w->keep, w->keep_n * 4);
    if (w->kind == P_DOUBLE) {
        int head = pt_model_num_modules(w->m) - 1;
        float *g = plant_grads(w, head, &n);
        for (size_t i = 0; i < n; i++) g[i] *= 2.0f;
    }
    return PT_OK;
}

static pt_status plant_norm(void *self, double parts[2]) {
    plant *w = self;
    if (w->kind == P_PP_NORM) return PT_OK; /* the stage's own */
    if (w->kind == P_TP_NORM) {             /* whole tensors counted per rank */
        parts[0] += parts[1];
        parts[1] = 0;
    }
    return w->in.ops->norm(w->in.self, parts);
}

/* The slots a plant leaves alone: the inner entry's, with its own self. */
#define PLANT_FORWARD(slot, T)                                                                     \
    static pt_status plant_##slot(void *self, T arg) {                                             \
        plant *w = self;                                                                           \
        return w->in.ops->slot(w->in.self, arg);                                                   \
    }
PLANT_FORWARD(before_forward, const pt_hook_point *)
PLANT_FORWARD(after_forward, const pt_hook_point *)
PLANT_FORWARD(before_backward, const pt_hook_point *)
PLANT_FORWARD(after_backward, const pt_hook_point *)
PLANT_FORWARD(before_weight, const pt_hook_point *)
PLANT_FORWARD(after_weight, const pt_hook_point *)
PLANT_FORWARD(end, const pt_step_begin *)
PLANT_FORWARD(update, pt_update *)
PLANT_FORWARD(state, pt_state_visit *)

static void plant_stats(void *self, pt_sync_stats *s) {
    plant *w = self;
    w->in.ops->stats(w->in.self, s);
}

static void plant_counts(void *self, pt_comm_counts *k) {
    plant *w = self;
    w->in.ops->counts(w->in.self, k);
}

static void plant_free(void *self) {
    plant *w = self;
    if (w->in.ops->free) w->in.ops->free(w->in.self);
    free(w->keep);
    free(w);
}

/* The trainer's wrap hook: arg is the plant's name. */
static pt_status plant_wrap(pt_trainer *t, pt_stack *stack, void *arg) {
    const char *name = arg;
    for (size_t i = 0; i < sizeof PLANTS / sizeof PLANTS[0]; i++) {
        if (strcmp(name, PLANTS[i].name) != 0) continue;
        if (!PLANTS[i].entry) { /* tp_skip_f */
            int tp = 1, r = 0;
            pt_model_tp(pt_trainer_model(t), &tp, &r);
            if (tp < 2)
                return pt_error_set(PT_ERR_INVALID, "plant %s: no tensor parallelism", name);
            pt_model_test_skip_f(pt_trainer_model(t), 1);
            return PT_OK;
        }
        pt_strategy *e = pt_stack_find(stack, PLANTS[i].entry);
        if (!e && PLANTS[i].kind == P_NO_AVG) e = pt_stack_find(stack, "zero");
        if (!e)
            return pt_error_set(PT_ERR_INVALID, "plant %s: this layout has no %s entry", name,
                                PLANTS[i].entry);
        plant *w = calloc(1, sizeof *w);
        if (!w) return pt_error_set(PT_ERR_NOMEM, "plant");
        *w = (plant){.in = *e, .ops = *e->ops, .kind = PLANTS[i].kind, .m = pt_trainer_model(t)};
        /* a slot the inner entry lacks stays NULL (the stack skips it) */
        pt_strategy_ops *o = &w->ops;
#define PLANT_SLOT(slot, fn) o->slot = e->ops->slot ? fn : NULL
        PLANT_SLOT(before_forward, plant_before_forward);
        PLANT_SLOT(after_forward, plant_after_forward);
        PLANT_SLOT(before_backward, plant_before_backward);
        PLANT_SLOT(after_backward, plant_after_backward);
        PLANT_SLOT(before_weight, plant_before_weight);
        PLANT_SLOT(after_weight, plant_after_weight);
        PLANT_SLOT(end, plant_end);
        PLANT_SLOT(update, plant_update);
        PLANT_SLOT(stats, plant_stats);
        PLANT_SLOT(counts, plant_counts);
        PLANT_SLOT(norm, plant_norm);
        PLANT_SLOT(state, plant_state);
#undef PLANT_SLOT
        o->begin = plant_begin;
        o->grads = plant_grads_point;
        o->sync = plant_sync;
        o->free = plant_free;
        *e = (pt_strategy){&w->ops, w};
        return PT_OK;
    }
    return pt_error_set(PT_ERR_INVALID, "plant %s: unknown", name);
}

#endif
