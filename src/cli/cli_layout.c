/* partrain train --layout auto: the planner picks the layout for this
 * machine (docs/plan.md). The cluster is this machine's calibrate profile
 * for the config's model shape, measured on first use and cached (by CPU,
 * binary and shape), or a cluster file given with --cluster. The layout
 * keys given by --set stay fixed; those of the config file are what the
 * plan replaces (configs/default.json spells out a one-worker layout). */
#include "cli_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/calibrate.h"
#include "partrain/plan.h"

#define MAX_FIXED 64

/* The --set keys a layout sets, copied into names (fixed[] points there). */
static int fixed_keys(const pt_cli_config_args *a, char names[][128], const char **fixed) {
    int n = 0;
    for (int k = 0; k < a->nsets && n < MAX_FIXED; k++) {
        const char *eq = strchr(a->sets[k], '=');
        size_t len = eq ? (size_t)(eq - a->sets[k]) : strlen(a->sets[k]);
        snprintf(names[n], 128, "%.*s", (int)(len < 127 ? len : 127), a->sets[k]);
        if (pt_cli_layout_key(names[n])) fixed[n] = names[n], n++;
    }
    return n;
}

static void say_choice(const pt_plan_result *r, int world, const pt_cluster *cl,
                       const char *cluster) {
    const pt_plan_entry *e = &r->entry[0];
    char name[PT_PLAN_NAME_MAX * 4];
    pt_plan_layout_name(&e->layout, name, sizeof name);
    fprintf(stderr,
            "layout auto: %s, the fastest of %ld fitting layouts (%ld valid) of %d rank%s on %s "
            "(%s)\n",
            name, r->n_fitting, r->n_considered, world, world > 1 ? "s" : "", cl->name, cluster);
    const pt_plan_time *t = &e->time;
    fprintf(stderr,
            "  predicted: %.1f ms a step (compute %.1f, bubble %.1f, tp %.1f, dp %.1f, pp %.1f, "
            "optimizer %.1f), %.0f tokens/s, %.1f MiB a rank\n",
            t->step_s * 1e3, t->compute_s * 1e3, t->bubble_s * 1e3, t->comm_s[0] * 1e3,
            t->comm_s[1] * 1e3, t->comm_s[2] * 1e3, t->optim_s * 1e3, t->tokens_per_s,
            e->mem.total / (1 << 20));
    for (int k = 0; k < e->n_why; k++) fprintf(stderr, "  - %s\n", e->why[k]);
    if (r->n_fit > 1) {
        pt_plan_layout_name(&r->entry[1].layout, name, sizeof name);
        fprintf(stderr, "  next: %s at %.1f ms (%+.1f%%)\n", name, r->entry[1].time.step_s * 1e3,
                100 * (r->entry[1].time.step_s / t->step_s - 1));
    }
}

void pt_cli_profile_note(const pt_cluster *cl, const pt_model_config *m, const char *cluster) {
    if (!cl->profile || pt_plan_profile_has_model(cl->profile, m)) return;
    fprintf(stderr,
            "partrain: note: %s's profile has no measured modules of this model's shape (C %d, "
            "NH %d, T %d, V %d): its passes are modelled from the product table, which misses "
            "their cost beyond the products; `partrain calibrate --config MODEL.json` measures "
            "them\n",
            cluster, m->n_embd, m->n_head, m->seq_len, m->vocab_size);
}

pt_status pt_cli_layout_auto(pt_config *cfg, const pt_cli_config_args *a, int world,
                             const char *cluster) {
    /* the run's outputs before planning (and maybe a minute of calibrating) */
    PT_CHECK(pt_trainer_check_outputs(cfg));
    char path[PT_CONFIG_STR_MAX];
    if (!cluster) {
        pt_calibrate_options o = {0};
        o.models = &cfg->model;
        o.n_models = 1;
        o.progress = stderr;
        int measured = 0;
        PT_CHECK(pt_calibrate_cache_path(&o, path, sizeof path));
        fprintf(stderr,
                "layout auto: this machine's profile (%s; measured once, about a "
                "minute, if not cached)\n",
                path);
        PT_CHECK(pt_calibrate_cached(&o, path, sizeof path, &measured));
        cluster = path;
    }
    pt_cluster *cl = NULL;
    PT_CHECK(pt_cluster_load_file(&cl, cluster));
    pt_cli_profile_note(cl, &cfg->model, cluster);
    char names[MAX_FIXED][128];
    const char *fixed[MAX_FIXED];
    int nfixed = fixed_keys(a, names, fixed);
    pt_plan_result r = {0};
    pt_status st = pt_plan_search(cfg, fixed, nfixed, cl, world, &r);
    if (st == PT_OK && !pt_plan_entry_finite(&r.entry[0]))
        st = pt_error_set(PT_ERR_INTERNAL, "layout auto: the plan's figures are not finite");
    if (st == PT_OK) {
        say_choice(&r, world, cl, cluster);
        pt_plan_layout_apply(&r.entry[0].layout, cfg);
        st = pt_config_validate(cfg);
    }
    pt_plan_result_free(&r);
    pt_cluster_free(cl);
    return st;
}
