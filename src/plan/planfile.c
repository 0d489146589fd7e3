/* Plan files and the JSON of a planned layout: what `partrain plan --json`
 * prints per layout, what `--write FILE` saves (the whole config of the
 * chosen layout, which `partrain train --plan FILE` runs as it is, plus
 * the prediction and the reasons for the per-part choices) and the loader
 * that train uses.
 *
 *   {"config": { every key, as pt_config_to_json writes them },
 *    "plan": {"layout": "dp2-tp1-pp2-...", "predicted": <the entry's JSON>,
 *             "why": ["stage 0 recomputes ...", ...]}}
 *
 * Not here: the search (search.c), the CLI (src/cli/cli_plan.c). */
#include "partrain/plan.h"

#include "plan_json_impl.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const recompute_names[] = {"none", "selective", "full"};

static cJSON *entry_json(const pt_plan_entry *e) {
    const pt_plan_layout *l = &e->layout;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    char name[PT_PLAN_NAME_MAX * 4];
    pt_plan_layout_name(l, name, sizeof name);
    int rc = l->recompute >= 0 && l->recompute <= 2 ? l->recompute : 0;
    int ok = cJSON_AddStringToObject(o, "layout", name) &&
             cJSON_AddNumberToObject(o, "dp", l->dp) && cJSON_AddNumberToObject(o, "tp", l->tp) &&
             cJSON_AddNumberToObject(o, "pp", l->pp) &&
             cJSON_AddNumberToObject(o, "zero", l->zero) &&
             cJSON_AddNumberToObject(o, "zero_group", l->zero_group) &&
             cJSON_AddBoolToObject(o, "sequence_parallel", l->sequence_parallel) &&
             cJSON_AddStringToObject(o, "schedule", l->schedule) &&
             cJSON_AddNumberToObject(o, "microbatches", l->microbatches) &&
             cJSON_AddNumberToObject(o, "virtual_stages", l->virtual_stages) &&
             cJSON_AddStringToObject(o, "recompute", recompute_names[rc]) &&
             cJSON_AddStringToObject(o, "stage_layers", l->stage_layers) &&
             cJSON_AddStringToObject(o, "stage_recompute", l->stage_recompute) &&
             cJSON_AddStringToObject(o, "zero_whole", l->zero_whole) &&
             cJSON_AddBoolToObject(o, "fits", e->fits) &&
             cJSON_AddStringToObject(o, "reason", e->reason);
    cJSON *mem = ok ? cJSON_AddObjectToObject(o, "mem") : NULL;
    static const char *const cat[PT_MEM_NCAT] = {
#define PT_X_NAME(id, s) s,
        PT_MEM_CATEGORY_LIST(PT_X_NAME)
#undef PT_X_NAME
    };
    ok = mem != NULL;
    for (int k = 0; ok && k < PT_MEM_NCAT; k++)
        ok = cJSON_AddNumberToObject(mem, cat[k], e->mem.cat[k]) != NULL;
    ok = ok && cJSON_AddNumberToObject(mem, "slack", e->mem.slack) &&
         cJSON_AddNumberToObject(mem, "total", e->mem.total) &&
         cJSON_AddNumberToObject(mem, "save", e->mem.save);
    const pt_plan_time *t = &e->time;
    if (ok && e->fits) {
        cJSON *b = NULL;
        ok = cJSON_AddNumberToObject(o, "step_ms", t->step_s * 1e3) &&
             cJSON_AddNumberToObject(o, "tokens_per_s", t->tokens_per_s) &&
             cJSON_AddNumberToObject(o, "mfu", t->mfu) &&
             (b = cJSON_AddObjectToObject(o, "breakdown")) &&
             cJSON_AddNumberToObject(b, "compute_ms", t->compute_s * 1e3) &&
             cJSON_AddNumberToObject(b, "bubble_ms", t->bubble_s * 1e3) &&
             cJSON_AddNumberToObject(b, "tp_ms", t->comm_s[0] * 1e3) &&
             cJSON_AddNumberToObject(b, "dp_ms", t->comm_s[1] * 1e3) &&
             cJSON_AddNumberToObject(b, "pp_ms", t->comm_s[2] * 1e3) &&
             cJSON_AddNumberToObject(b, "optim_ms", t->optim_s * 1e3) &&
             cJSON_AddNumberToObject(b, "bubble", t->bubble);
    }
    cJSON *why = ok ? cJSON_AddArrayToObject(o, "why") : NULL;
    ok = why != NULL;
    for (int i = 0; ok && i < e->n_why; i++) {
        cJSON *s = cJSON_CreateString(e->why[i]);
        ok = s && cJSON_AddItemToArray(why, s);
    }
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

char *pt_plan_entry_to_json(const pt_plan_entry *e) {
    cJSON *o = entry_json(e);
    if (!o) return NULL;
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

pt_status pt_plan_write_file(const char *path, const pt_config *cfg, const pt_plan_entry *e) {
    pt_config c = *cfg;
    pt_plan_layout_apply(&e->layout, &c);
    char *cj = pt_config_to_json(&c), *text = NULL;
    cJSON *root = cJSON_CreateObject(), *conf = cj ? cJSON_Parse(cj) : NULL, *plan = NULL;
    cJSON *pred = entry_json(e), *why = NULL;
    char name[PT_PLAN_NAME_MAX * 4];
    pt_plan_layout_name(&e->layout, name, sizeof name);
    int ok = root && conf && pred && cJSON_AddItemToObject(root, "config", conf);
    if (!ok) cJSON_Delete(conf);
    ok = ok && (plan = cJSON_AddObjectToObject(root, "plan")) &&
         cJSON_AddStringToObject(plan, "layout", name) &&
         cJSON_AddItemToObject(plan, "predicted", pred);
    if (!ok) cJSON_Delete(pred);
    ok = ok && (why = cJSON_AddArrayToObject(plan, "why"));
    for (int i = 0; ok && i < e->n_why; i++) {
        cJSON *s = cJSON_CreateString(e->why[i]);
        ok = s && cJSON_AddItemToArray(why, s);
    }
    if (ok) text = cJSON_Print(root);
    cJSON_Delete(root);
    free(cj);
    if (!text) return pt_error_set(PT_ERR_NOMEM, "%s: out of memory building the plan", path);
    /* atomically (a temporary beside it, flushed, synced, renamed): the
     * plan written whole or the old file left as it was */
    size_t n = strlen(text);
    text[n] = '\n'; /* cJSON_Print's text, its NUL turned into the last line's end */
    pt_status st = pt_file_write_atomic(path, text, n + 1);
    free(text);
    return st;
}

/* The "plan" section's shape: an object with "layout" a string, and when
 * they are there "predicted" an object whose "layout" is the same and
 * "why" an array of strings. */
static pt_status check_plan_shape(const cJSON *plan, const char *name) {
    if (!plan)
        return pt_error_set(PT_ERR_FORMAT,
                            "%s: no \"plan\" object (a plan file from partrain plan --write holds "
                            "\"config\" and \"plan\")",
                            name);
    if (!cJSON_IsObject(plan))
        return pt_error_set(PT_ERR_FORMAT, "%s: plan must be an object (got %s)", name,
                            pt_plan_json_kind(plan));
    const cJSON *layout = cJSON_GetObjectItemCaseSensitive(plan, "layout");
    const cJSON *pred = cJSON_GetObjectItemCaseSensitive(plan, "predicted");
    const cJSON *why = cJSON_GetObjectItemCaseSensitive(plan, "why");
    if (!cJSON_IsString(layout))
        return pt_error_set(PT_ERR_FORMAT,
                            "%s: plan.layout must be a string, the name of the layout its config "
                            "runs (got %s)",
                            name, layout ? pt_plan_json_kind(layout) : "none");
    if (pred && !cJSON_IsObject(pred))
        return pt_error_set(PT_ERR_FORMAT, "%s: plan.predicted must be an object (got %s)", name,
                            pt_plan_json_kind(pred));
    const cJSON *pl = pred ? cJSON_GetObjectItemCaseSensitive(pred, "layout") : NULL;
    if (pl && (!cJSON_IsString(pl) || strcmp(pl->valuestring, layout->valuestring) != 0))
        return pt_error_set(PT_ERR_FORMAT,
                            "%s: plan.predicted.layout is %s%.200s%s, but plan.layout is "
                            "\"%.200s\"",
                            name, cJSON_IsString(pl) ? "\"" : "",
                            cJSON_IsString(pl) ? pl->valuestring : pt_plan_json_kind(pl),
                            cJSON_IsString(pl) ? "\"" : "", layout->valuestring);
    if (why && !cJSON_IsArray(why))
        return pt_error_set(PT_ERR_FORMAT, "%s: plan.why must be an array of strings (got %s)",
                            name, pt_plan_json_kind(why));
    int k = 0;
    for (const cJSON *w = why ? why->child : NULL; w; w = w->next, k++)
        if (!cJSON_IsString(w))
            return pt_error_set(PT_ERR_FORMAT, "%s: plan.why[%d] must be a string (got %s)", name,
                                k, pt_plan_json_kind(w));
    return PT_OK;
}

pt_status pt_plan_file_load_string(const char *text, const char *name, pt_config *c) {
    cJSON *root = cJSON_Parse(text);
    if (!root) return pt_error_set(PT_ERR_FORMAT, "%s: not a JSON plan file", name);
    const cJSON *conf = cJSON_GetObjectItemCaseSensitive(root, "config");
    const cJSON *plan = cJSON_GetObjectItemCaseSensitive(root, "plan");
    pt_status st = PT_OK;
    if (!cJSON_IsObject(conf))
        st = pt_error_set(PT_ERR_FORMAT,
                          "%s: no \"config\" object (a plan file from partrain "
                          "plan --write)",
                          name);
    if (st == PT_OK) st = check_plan_shape(plan, name);
    if (st == PT_OK) {
        char *cj = cJSON_PrintUnformatted(conf);
        char what[PT_CONFIG_STR_MAX + 16];
        snprintf(what, sizeof what, "%s: config", name);
        st = cj ? pt_config_load_string(c, cj, what)
                : pt_error_set(PT_ERR_NOMEM, "%s: out of memory", name);
        free(cj);
    }
    if (st == PT_OK) {
        /* the layout the file names is the one its config runs: a file
         * edited on one side is refused, not run as whichever side won */
        pt_plan_layout l;
        char runs[PT_PLAN_NAME_MAX * 4];
        pt_plan_layout_from_config(&l, c);
        pt_plan_layout_name(&l, runs, sizeof runs);
        const char *says = cJSON_GetObjectItemCaseSensitive(plan, "layout")->valuestring;
        if (strcmp(says, runs) != 0)
            st = pt_error_set(PT_ERR_FORMAT,
                              "%s: plan.layout is \"%.200s\", but its config runs %s (edited "
                              "on one side? write it again with partrain plan --write)",
                              name, says, runs);
    }
    cJSON_Delete(root);
    return st;
}

pt_status pt_plan_file_load(const char *path, pt_config *c) {
    char *text = NULL;
    PT_CHECK(pt_read_text_file(path, 16u << 20, &text));
    pt_status st = pt_plan_file_load_string(text, path, c);
    free(text);
    return st;
}
