/* partrain train --layout auto: the planner picks the layout for this
 * machine (docs/plan.md). The cluster is this machine's calibrate profile
 * for the config's model shape, measured on first use and cached (by CPU,
 * binary and shape), or a cluster file given with --cluster. The layout
 * keys given by --set stay fixed; those of the config file are what the
 * plan replaces. */
#include "cli_impl.h"

#include <cjson/cJSON.h>
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

/* The profile's measured collectives as bus bandwidths (nccl-tests' bus
 * factors, as pt_comm_stats counts bytes), and the cluster's links. */
static cJSON *profile_json(const pt_cluster *cl, const char *path) {
    cJSON *o = cJSON_CreateObject(), *pts = NULL;
    static const char *const ops[PT_PROFILE_NOPS] = {"allreduce", "allgather", "reduce_scatter",
                                                     "broadcast", "p2p"};
    int ok = o && cJSON_AddStringToObject(o, "path", path) &&
             cJSON_AddStringToObject(o, "name", cl->name) &&
             cJSON_AddNumberToObject(o, "intra_node_gbps", cl->intra_node.bw / 1e9) &&
             cJSON_AddNumberToObject(o, "inter_node_gbps", cl->inter_node.bw / 1e9) &&
             (pts = cJSON_AddArrayToObject(o, "comm"));
    for (int i = 0; ok && cl->profile && i < cl->profile->n_comm; i++) {
        const pt_profile_comm *p = &cl->profile->comm[i];
        if (p->op < 0 || p->op >= PT_PROFILE_NOPS || !(p->seconds > 0) || p->ranks < 2) continue;
        double n = p->ranks, f = p->op == PT_PROFILE_ALLREDUCE        ? 2 * (n - 1) / n
                                 : p->op <= PT_PROFILE_REDUCE_SCATTER ? (n - 1) / n
                                                                      : 1;
        cJSON *e = cJSON_CreateObject();
        ok = e && cJSON_AddItemToArray(pts, e) && cJSON_AddStringToObject(e, "op", ops[p->op]) &&
             cJSON_AddStringToObject(e, "backend", p->backend) &&
             cJSON_AddNumberToObject(e, "ranks", p->ranks) &&
             cJSON_AddNumberToObject(e, "bytes", p->bytes) &&
             cJSON_AddNumberToObject(e, "gbps", f * p->bytes / p->seconds / 1e9);
    }
    if (!ok) cJSON_Delete(o);
    return ok ? o : NULL;
}

/* {"source": .., "layout": .., "predicted": entry, "why": [..], "profile": ..}:
 * what the run record says of the plan (pt_trainer_set_plan). */
static char *plan_json(const pt_plan_entry *e, const pt_cluster *cl, const char *cluster) {
    char *entry = pt_plan_entry_to_json(e), *text = NULL;
    cJSON *o = cJSON_CreateObject(), *pred = entry ? cJSON_Parse(entry) : NULL;
    cJSON *layout = cJSON_GetObjectItemCaseSensitive(pred, "layout");
    cJSON *prof = profile_json(cl, cluster);
    int ok = o && pred && cJSON_AddStringToObject(o, "source", "layout auto") &&
             cJSON_IsString(layout) && cJSON_AddStringToObject(o, "layout", layout->valuestring) &&
             cJSON_AddItemToObject(o, "predicted", pred);
    if (!ok) cJSON_Delete(pred);
    if (ok && prof)
        ok = cJSON_AddItemToObject(o, "profile", prof);
    else
        cJSON_Delete(prof);
    if (ok) text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    free(entry);
    return text;
}

char *pt_cli_plan_file_json(const char *path) {
    char *text = NULL, *out = NULL;
    if (pt_read_text_file(path, (size_t)64 << 20, &text) != PT_OK) return NULL;
    cJSON *root = cJSON_Parse(text), *o = cJSON_CreateObject();
    cJSON *plan = cJSON_DetachItemFromObjectCaseSensitive(root, "plan");
    if (o && cJSON_IsObject(plan) && cJSON_AddStringToObject(o, "source", "plan file") &&
        cJSON_AddStringToObject(o, "path", path)) {
        for (cJSON *x = plan->child; x; x = x->next)
            cJSON_AddItemReferenceToObject(o, x->string, x);
        out = cJSON_PrintUnformatted(o);
    }
    cJSON_Delete(o);
    cJSON_Delete(plan);
    cJSON_Delete(root);
    free(text);
    return out;
}

pt_status pt_cli_layout_auto(pt_config *cfg, const pt_cli_config_args *a, int world,
                             const char *cluster, char **plan) {
    *plan = NULL;
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
        double t0 = pt_time_s();
        PT_CHECK(pt_calibrate_cached(&o, path, sizeof path, &measured));
        if (measured) fprintf(stderr, "layout auto: calibrated in %.1f s\n", pt_time_s() - t0);
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
        /* the run record's plan; without it the run still runs */
        if (st == PT_OK) *plan = plan_json(&r.entry[0], cl, cluster);
    }
    pt_plan_result_free(&r);
    pt_cluster_free(cl);
    return st;
}
