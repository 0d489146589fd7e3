/* What the configuration says about the pipeline and its stages: the
 * schedule a config runs, its virtual stages, each stage's step and
 * recompute mode, ZeRO's whole modules, and the checks of those keys that
 * pt_config_validate_layout runs (one line each, before anything is
 * allocated).
 *
 * Not here: the key table and its parsing (config.c). */
#include "train_impl.h"

#include "partrain/parallel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *pt_config_schedule(const pt_config *c) {
    /* at pp > 1, what the schedule runs as a pipeline (none: 1f1b) */
    const pt_sched *d = pt_sched_find(c->parallel.schedule);
    return d && c->parallel.pp > 1 ? d->as_pipeline : c->parallel.schedule;
}

int pt_config_virtual_stages(const pt_config *c) {
    if (c->parallel.virtual_stages > 0) return c->parallel.virtual_stages;
    /* 0: the schedule's own, the fewest it runs with (interleaved's >= 2:
     * 2, the count of the Megatron paper's runs and the least memory) */
    const pt_sched *d = pt_sched_find(pt_config_schedule(c));
    return d ? d->v_default : 1;
}

/* Pipeline keys: the schedule, its micro-batches and chunks, the stage cut
 * (one line each, before anything is allocated). */
pt_status pt_config_check_pipeline(const pt_config *c) {
    const char *name = pt_config_schedule(c);
    int pp = c->parallel.pp, v = pt_config_virtual_stages(c), nmod = c->model.n_layer + 2;
    if (pp == 1) {
        const pt_sched *d = pt_sched_find(name);
        if (!d || !d->whole)
            return pt_error_set(PT_ERR_INVALID,
                                "parallel.schedule = %s is a pipeline schedule: it needs "
                                "parallel.pp > 1 (got 1; at pp 1: none or gpipe)",
                                name);
        if (c->parallel.virtual_stages > 1)
            return pt_error_set(PT_ERR_INVALID,
                                "parallel.virtual_stages = %d needs a pipeline (parallel.pp > 1)",
                                c->parallel.virtual_stages);
        if (c->parallel.stage_layers[0])
            return pt_error_set(PT_ERR_INVALID,
                                "parallel.stage_layers = \"%s\" needs a pipeline (parallel.pp > 1)",
                                c->parallel.stage_layers);
        return PT_OK;
    }
    PT_CHECK(pt_schedule_check(name, c->parallel.microbatches, pp, v, nmod));
    /* the cut given: what the trainer will cut (a balanced cut cannot fail
     * once pt_schedule_check passed), its errors naming pp x v when a rank
     * has several chunks */
    if (!c->parallel.stage_layers[0]) return PT_OK;
    pt_stage *st = malloc((size_t)(pp * v) * sizeof *st);
    if (!st) return pt_error_set(PT_ERR_NOMEM, "stage split");
    pt_stage_step step = pt_config_stage_step(c, c->parallel.dp);
    pt_status s = pt_stage_split_step(&c->model, &step, name, pp, v, c->parallel.microbatches,
                                      c->parallel.stage_layers, st);
    free(st);
    return s;
}

static int recompute_mode(const char *s) {
    return !strcmp(s, "none")        ? PT_RECOMPUTE_NONE
           : !strcmp(s, "selective") ? PT_RECOMPUTE_SELECTIVE
           : !strcmp(s, "full")      ? PT_RECOMPUTE_FULL
                                     : -1;
}

/* model.stage_recompute: one valid mode per pipeline rank (at pp 1 the one
 * entry is allowed: it is model.recompute by another name). */
pt_status pt_config_check_stage_recompute(const pt_config *c) {
    pt_list l;
    pt_list_init(&l, "model.stage_recompute", c->train.stage_recompute);
    int n = 0, r;
    while ((r = pt_list_next(&l)) > 0) {
        if (recompute_mode(l.item) < 0)
            return pt_list_error(&l, "is not one of none|selective|full");
        n++;
    }
    if (r < 0) return (pt_status)r;
    if (n > 0 && n != c->parallel.pp)
        return pt_error_set(PT_ERR_INVALID,
                            "model.stage_recompute = \"%s\" names %d mode%s, but parallel.pp is "
                            "%d (one per pipeline rank)",
                            c->train.stage_recompute, n, n == 1 ? "" : "s", c->parallel.pp);
    return PT_OK;
}

pt_stage_step pt_config_stage_step(const pt_config *c, int dp) {
    dp = dp > 0 ? dp : 1;
    return pt_stage_step_of(!strcmp(c->train.optimizer, "sgd"), (double)c->train.batch_size / dp,
                            dp);
}

pt_recompute pt_config_stage_recompute(const pt_config *c, int pp_rank) {
    pt_list l;
    pt_list_init(&l, "model.stage_recompute", c->train.stage_recompute);
    while (pt_list_next(&l) > 0)
        if (l.index == pp_rank + 1 && recompute_mode(l.item) >= 0)
            return (pt_recompute)recompute_mode(l.item);
    int m = recompute_mode(c->train.recompute);
    return m < 0 ? PT_RECOMPUTE_NONE : (pt_recompute)m;
}

pt_status pt_config_zero_whole(const pt_config *c, unsigned char *whole) {
    int L = c->model.n_layer;
    memset(whole, 0, (size_t)L + 2);
    pt_list l;
    pt_list_init(&l, "parallel.zero_whole", c->parallel.zero_whole);
    int r;
    while ((r = pt_list_next(&l)) > 0) {
        int i = -1;
        long blk;
        if (!strcmp(l.item, "embedding"))
            i = 0;
        else if (!strcmp(l.item, "head"))
            i = L + 1;
        else if (!strncmp(l.item, "h.", 2) && pt_list_uint(l.item + 2, L - 1, &blk) > 0)
            i = (int)blk + 1; /* h.N: a list number, N < L */
        if (i < 0)
            return pt_list_error(&l, "is not a module (embedding, head, or h.0 .. h.%d)", L - 1);
        if (whole[i]) return pt_list_error(&l, "is named twice");
        whole[i] = 1;
    }
    return r < 0 ? (pt_status)r : PT_OK;
}

/* parallel.zero_whole: ZeRO-3 only, every name a module. */
pt_status pt_config_check_zero_whole(const pt_config *c) {
    if (!c->parallel.zero_whole[0]) return PT_OK;
    if (c->parallel.zero != 3)
        return pt_error_set(PT_ERR_INVALID,
                            "parallel.zero_whole = \"%s\" needs parallel.zero = 3 (got %d): "
                            "below it every module's parameters are whole already",
                            c->parallel.zero_whole, c->parallel.zero);
    unsigned char *w = malloc((size_t)c->model.n_layer + 2);
    if (!w) return pt_error_set(PT_ERR_NOMEM, "parallel.zero_whole");
    pt_status st = pt_config_zero_whole(c, w);
    free(w);
    return st;
}
