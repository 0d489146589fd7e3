/* A layout (pt_plan_layout) to and from the config keys that run it, and
 * its short name. The planner enumerates layouts; the trainer reads keys.
 *
 * Not here: which layouts are valid (pt_config_validate decides). */
#include "partrain/plan.h"

#include <stdio.h>
#include <string.h>

static const char *const recompute_names[] = {"none", "selective", "full"};

static void copy_str(char *dst, size_t n, const char *src) {
    snprintf(dst, n, "%s", src);
}

void pt_plan_layout_apply(const pt_plan_layout *l, pt_config *c) {
    c->parallel.dp = l->dp;
    c->parallel.tp = l->tp;
    c->parallel.pp = l->pp;
    c->parallel.zero = l->zero;
    c->parallel.zero_group = l->zero_group;
    c->parallel.sequence_parallel = l->sequence_parallel;
    c->parallel.microbatches = l->microbatches;
    /* the runtime's own count, spelled out (the config's 0 would mean the
     * same) */
    c->parallel.virtual_stages = l->virtual_stages;
    copy_str(c->parallel.schedule, sizeof c->parallel.schedule, l->schedule);
    int rc = l->recompute >= 0 && l->recompute <= 2 ? l->recompute : 0;
    copy_str(c->train.recompute, sizeof c->train.recompute, recompute_names[rc]);
    c->train.threads = l->threads;
    copy_str(c->parallel.stage_layers, sizeof c->parallel.stage_layers, l->stage_layers);
    copy_str(c->train.stage_recompute, sizeof c->train.stage_recompute, l->stage_recompute);
    copy_str(c->parallel.zero_whole, sizeof c->parallel.zero_whole, l->zero_whole);
}

void pt_plan_layout_from_config(pt_plan_layout *l, const pt_config *c) {
    memset(l, 0, sizeof *l);
    l->dp = c->parallel.dp;
    l->tp = c->parallel.tp;
    l->pp = c->parallel.pp;
    l->zero = c->parallel.zero;
    l->zero_group = c->parallel.zero_group;
    l->sequence_parallel = c->parallel.sequence_parallel;
    l->microbatches = c->parallel.microbatches;
    l->virtual_stages = pt_config_virtual_stages(c);
    copy_str(l->schedule, sizeof l->schedule, pt_config_schedule(c));
    l->recompute = PT_RECOMPUTE_NONE;
    for (int i = 0; i < 3; i++)
        if (!strcmp(c->train.recompute, recompute_names[i])) l->recompute = i;
    l->threads = c->train.threads;
    copy_str(l->stage_layers, sizeof l->stage_layers, c->parallel.stage_layers);
    copy_str(l->stage_recompute, sizeof l->stage_recompute, c->train.stage_recompute);
    copy_str(l->zero_whole, sizeof l->zero_whole, c->parallel.zero_whole);
}

void pt_plan_layout_name(const pt_plan_layout *l, char *buf, size_t n) {
    char zg[24] = "", vs[24] = "";
    /* HSDP: the shard group's size, as pt_config_layout writes it */
    if (l->zero > 0 && l->zero_group > 0 && l->zero_group < l->dp)
        snprintf(zg, sizeof zg, "-g%d", l->zero_group);
    if (l->virtual_stages > 1) snprintf(vs, sizeof vs, "-v%d", l->virtual_stages);
    int rc = l->recompute >= 0 && l->recompute <= 2 ? l->recompute : 0;
    int k = snprintf(buf, n, "dp%d-tp%d%s-pp%d-zero%d%s-%s%s-m%d-r%s", l->dp, l->tp,
                     l->sequence_parallel ? "-sp" : "", l->pp, l->zero, zg, l->schedule, vs,
                     l->microbatches, recompute_names[rc]);
    /* the per-part choices, when not the runtime's own */
    const char *tag[3] = {"-L", "-R", "-W"};
    const char *val[3] = {l->stage_layers, l->stage_recompute, l->zero_whole};
    for (int i = 0; i < 3; i++)
        if (val[i][0] && k >= 0 && (size_t)k < n)
            k += snprintf(buf + k, n - (size_t)k, "%s%s", tag[i], val[i]);
}
