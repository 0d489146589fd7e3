/* The report's data: what report.js draws, one JSON object built from the
 * runs as read (report_read.c). The C side decides the numbers (means over
 * steps, per rank, per group, downsampled series); the script only draws.
 *
 *   {"generator": "partrain VERSION", "runs": [{
 *      "name", "notes": [..], "layout", "world",
 *      "record": the run record as written (config, machine, version, plan) | null,
 *      "trace": {"path", "bytes"} | null,
 *      "steps": {"step", "loss", "lr", "grad_norm", "step_ms", "tokens_per_s",
 *                "elapsed_s", "bubble"}: arrays, null for a gap,
 *      "elapsed": "wall" (elapsed_s written) | "steps" (summed step times),
 *      "val": {"step", "loss", "elapsed_s"},
 *      "loop": {"val_ms", "nval", "save_ms", "nsaves"},
 *      "bubble_formula": x | null,
 *      "parts": {"names", "steps", "min", "mean", "max", "step": {min, mean,
 *                max}, "ranks": [[ms per part] per rank] | null,
 *                "rank_step": [..] | null, "slowest": [steps per rank]} | null,
 *      "groups": {"dp": {"bytes", "comm_ms", "gbps", "overlap_ms"}, ..},
 *      "mem": {"names", "max": [..], "ranks": [[..] per rank] | null}}]}
 *
 * Means are over the steps after each start's first (its warm-up), or
 * over the first ones when there is nothing else.
 *
 * Not here: reading (report_read.c), the HTML (report_html.c). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "report_impl.h"

/* Every value at most PT_REPORT_MAX_POINTS: means of consecutive buckets
 * (a bucket's non-finite values skipped; all of them: null). */
static cJSON *series(const rp_series *s) {
    cJSON *a = cJSON_CreateArray();
    size_t n = s->n, b = (n + PT_REPORT_MAX_POINTS - 1) / PT_REPORT_MAX_POINTS;
    if (b < 1) b = 1;
    for (size_t i = 0; a && i < n; i += b) {
        double sum = 0;
        size_t k = 0;
        for (size_t j = i; j < i + b && j < n; j++)
            if (isfinite(s->v[j])) sum += s->v[j], k++;
        cJSON *x = k ? cJSON_CreateNumber(sum / (double)k) : cJSON_CreateNull();
        if (!x || !cJSON_AddItemToArray(a, x)) {
            cJSON_Delete(x);
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}

static int add(cJSON *o, const char *name, cJSON *x) {
    if (x && cJSON_AddItemToObject(o, name, x)) return 1;
    cJSON_Delete(x);
    return 0;
}

/* a number, or null when not finite */
static cJSON *number(double v) {
    return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull();
}

static cJSON *numbers(const double *v, int n, double scale) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++)
        if (!cJSON_AddItemToArray(a, number(v[i] * scale))) {
            cJSON_Delete(a);
            return NULL;
        }
    return a;
}

static cJSON *strings(const char *const *v, int n) {
    return cJSON_CreateStringArray(v, n);
}

/* The steps' series; elapsed summed from the step times when no line says it. */
static cJSON *steps_json(const pt_report_run *r, int *wall) {
    cJSON *o = cJSON_CreateObject();
    *wall = 0;
    for (size_t i = 0; i < r->elapsed_s.n && !*wall; i++) *wall = isfinite(r->elapsed_s.v[i]);
    rp_series el = {0};
    if (!*wall) {
        double t = 0;
        for (size_t i = 0; i < r->step_ms.n; i++) {
            if (isfinite(r->step_ms.v[i])) t += r->step_ms.v[i] / 1e3;
            if (!rp_push(&el, t)) break;
        }
    }
    int ok = o && add(o, "step", series(&r->step)) && add(o, "loss", series(&r->loss)) &&
             add(o, "lr", series(&r->lr)) && add(o, "grad_norm", series(&r->grad_norm)) &&
             add(o, "step_ms", series(&r->step_ms)) &&
             add(o, "tokens_per_s", series(&r->tokens_per_s)) &&
             add(o, "elapsed_s", series(*wall ? &r->elapsed_s : &el)) &&
             add(o, "bubble", series(&r->bubble));
    free(el.v);
    if (!ok) cJSON_Delete(o);
    return ok ? o : NULL;
}

static cJSON *parts_json(const rp_parts *p) {
    double n = (double)p->n, mn[RP_NPARTS], me[RP_NPARTS], mx[RP_NPARTS];
    for (int k = 0; k < RP_NPARTS; k++)
        mn[k] = p->min[k] / n, me[k] = p->mean[k] / n, mx[k] = p->max[k] / n;
    cJSON *o = cJSON_CreateObject(), *st = NULL, *ranks = NULL;
    int ok = o && add(o, "names", strings(rp_part_names, RP_NPARTS)) &&
             cJSON_AddNumberToObject(o, "steps", n) && add(o, "min", numbers(mn, RP_NPARTS, 1)) &&
             add(o, "mean", numbers(me, RP_NPARTS, 1)) &&
             add(o, "max", numbers(mx, RP_NPARTS, 1)) &&
             (st = cJSON_AddObjectToObject(o, "step")) &&
             cJSON_AddNumberToObject(st, "min", p->step_min / n) &&
             cJSON_AddNumberToObject(st, "mean", p->step_mean / n) &&
             cJSON_AddNumberToObject(st, "max", p->step_max / n);
    double slow[RP_MAX_RANKS];
    int w = p->world;
    for (int q = 0; q < RP_MAX_RANKS; q++) slow[q] = (double)p->slowest[q];
    if (ok && w > 0) {
        ok = (ranks = cJSON_AddArrayToObject(o, "ranks")) &&
             add(o, "rank_step", numbers(p->rank_step, w, 1 / n)) &&
             add(o, "slowest", numbers(slow, w, 1));
        for (int q = 0; ok && q < w; q++)
            ok = cJSON_AddItemToArray(ranks, numbers(p->rank_part[q], RP_NPARTS, 1 / n));
    } else if (ok) {
        ok = cJSON_AddNullToObject(o, "ranks") && cJSON_AddNullToObject(o, "rank_step") &&
             add(o, "slowest", numbers(slow, RP_MAX_RANKS, 1));
    }
    cJSON *g = ok ? cJSON_AddObjectToObject(o, "groups") : NULL;
    ok = g != NULL;
    for (int k = 0; ok && k < RP_NGROUPS; k++) {
        if (!p->has_group[k]) continue;
        cJSON *x = cJSON_AddObjectToObject(g, rp_group_names[k]);
        double ms = p->comm_ms[k];
        ok = x && cJSON_AddNumberToObject(x, "bytes", p->bytes[k] / n) &&
             cJSON_AddNumberToObject(x, "comm_ms", ms / n) &&
             cJSON_AddNumberToObject(x, "gbps", ms > 0 ? p->bytes[k] / (ms * 1e6) : 0) &&
             cJSON_AddNumberToObject(x, "overlap_ms", p->overlap_ms[k] / n);
    }
    if (!ok) cJSON_Delete(o);
    return ok ? o : NULL;
}

static cJSON *mem_json(const pt_report_run *r) {
    cJSON *o = cJSON_CreateObject(), *ranks = NULL;
    int ok = o && add(o, "names", strings(rp_mem_names, RP_NMEM)) &&
             add(o, "max", numbers(r->mem_max, RP_NMEM, 1));
    if (ok && r->mem_world > 0) {
        ok = (ranks = cJSON_AddArrayToObject(o, "ranks")) != NULL;
        for (int q = 0; ok && q < r->mem_world; q++)
            ok = cJSON_AddItemToArray(ranks, numbers(r->mem_rank[q], RP_NMEM, 1));
    } else if (ok) {
        ok = cJSON_AddNullToObject(o, "ranks") != NULL;
    }
    if (!ok) cJSON_Delete(o);
    return ok ? o : NULL;
}

static cJSON *trace_json(const pt_report_run *r) {
    if (!r->trace) return cJSON_CreateNull();
    char *abs = realpath(r->trace, NULL);
    cJSON *o = cJSON_CreateObject();
    int ok = o && cJSON_AddStringToObject(o, "path", abs ? abs : r->trace) &&
             cJSON_AddNumberToObject(o, "bytes", r->trace_bytes);
    free(abs);
    if (!ok) cJSON_Delete(o);
    return ok ? o : NULL;
}

static cJSON *run_json(const pt_report_run *r) {
    cJSON *o = cJSON_CreateObject(), *notes = cJSON_CreateArray(), *loop = NULL;
    int ok = o && notes && cJSON_AddItemToObject(o, "notes", notes);
    if (!ok) cJSON_Delete(notes);
    for (int k = 0; ok && k < r->nnotes; k++)
        ok = cJSON_AddItemToArray(notes, cJSON_CreateString(r->notes[k]));
    const rp_parts *p = r->main.n ? &r->main : &r->warm;
    int wall = 0;
    ok = ok && cJSON_AddStringToObject(o, "name", r->name) &&
         cJSON_AddStringToObject(o, "layout", r->layout) &&
         cJSON_AddNumberToObject(o, "world", r->world) &&
         add(o, "record", r->record ? cJSON_Parse(r->record) : cJSON_CreateNull()) &&
         add(o, "trace", trace_json(r)) && add(o, "steps", steps_json(r, &wall)) &&
         cJSON_AddStringToObject(o, "elapsed", wall ? "wall" : "steps") &&
         (loop = cJSON_AddObjectToObject(o, "loop")) &&
         cJSON_AddNumberToObject(loop, "val_ms", r->val_ms) &&
         cJSON_AddNumberToObject(loop, "nval", (double)r->nval_ms) &&
         cJSON_AddNumberToObject(loop, "save_ms", r->save_ms) &&
         cJSON_AddNumberToObject(loop, "nsaves", (double)r->nsaves) &&
         add(o, "bubble_formula", number(r->bubble_formula)) &&
         add(o, "parts", p->n ? parts_json(p) : cJSON_CreateNull()) &&
         add(o, "mem", r->has_mem ? mem_json(r) : cJSON_CreateNull());
    cJSON *val = ok ? cJSON_AddObjectToObject(o, "val") : NULL;
    ok = val && add(val, "step", series(&r->val_step)) && add(val, "loss", series(&r->val_loss)) &&
         add(val, "elapsed_s", series(&r->val_elapsed));
    if (!ok) cJSON_Delete(o);
    return ok ? o : NULL;
}

char *pt_report_data_json(pt_report_run *const *runs, int n) {
    cJSON *root = cJSON_CreateObject(), *a = NULL;
    char gen[160];
    snprintf(gen, sizeof gen, "partrain %s", pt_version());
    int ok = root && cJSON_AddStringToObject(root, "generator", gen) &&
             (a = cJSON_AddArrayToObject(root, "runs"));
    for (int i = 0; ok && i < n; i++) {
        cJSON *x = run_json(runs[i]);
        ok = x && cJSON_AddItemToArray(a, x);
        if (!ok) cJSON_Delete(x);
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return text;
}
