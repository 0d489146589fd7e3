/* The report's reader: a training run's metrics file (JSON lines, written
 * by src/train/trainer_metrics.c) into a pt_report_run, line by line.
 *
 * The file is untrusted: each line is parsed on its own (cJSON), every
 * field is optional and checked for its type and range, and whatever does
 * not fit is skipped and counted, so that a run killed half-way (its last
 * line cut) and a run of an older version (no run record, no parts) still
 * give what they have; the run's notes say what is missing. Memory grows
 * with the steps only (the series); per-rank figures are summed as they
 * come, in fixed tables.
 *
 * Not here: what the page shows (report_data.c), the file (report_html.c). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "report_impl.h"

const char *const rp_part_names[RP_NPARTS] = {"compute", "dp",        "tp",   "pp",
                                              "zero",    "optimizer", "other"};
const char *const rp_group_names[RP_NGROUPS] = {"dp", "tp", "pp", "zero"};
const char *const rp_mem_names[RP_NMEM] = {"params", "grads",   "optim", "acts",
                                           "comm",   "scratch", "total"};

int rp_push(rp_series *s, double v) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        double *p = realloc(s->v, cap * sizeof *p);
        if (!p) return 0;
        s->v = p;
        s->cap = cap;
    }
    s->v[s->n++] = v;
    return 1;
}

static void note(pt_report_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(pt_report_run *r, const char *fmt, ...) {
    if (r->nnotes == RP_MAX_NOTES) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->notes[r->nnotes++], sizeof r->notes[0], fmt, ap);
    va_end(ap);
}

/* o[key] as a finite number in [lo, hi]: 1 with *v set, else 0. */
static int num(const cJSON *o, const char *key, double lo, double hi, double *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble)) return 0;
    if (x->valuedouble < lo || x->valuedouble > hi) return 0;
    *v = x->valuedouble;
    return 1;
}

/* o[key] if a number as above, else NaN (a gap in a series) */
static double opt(const cJSON *o, const char *key, double lo, double hi) {
    double v;
    return num(o, key, lo, hi, &v) ? v : NAN;
}

#define BIG 1e300 /* any finite magnitude */

/* A spread object {"min","max","mean","max_rank"[,"ranks"]} of a part;
 * ranks[] filled when present with world entries (world <= 64). */
typedef struct {
    double min, max, mean;
    int max_rank, has_ranks;
    double ranks[RP_MAX_RANKS];
} spread;

static int read_spread(const cJSON *o, int world, spread *s) {
    double mr;
    if (!num(o, "min", 0, BIG, &s->min) || !num(o, "max", 0, BIG, &s->max) ||
        !num(o, "mean", 0, BIG, &s->mean) || !num(o, "max_rank", 0, 1 << 20, &mr))
        return 0;
    s->max_rank = (int)mr;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "ranks");
    s->has_ranks = cJSON_IsArray(a) && world <= RP_MAX_RANKS && cJSON_GetArraySize(a) == world;
    int k = 0;
    for (const cJSON *x = s->has_ranks ? a->child : NULL; x; x = x->next, k++) {
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || x->valuedouble < 0)
            return s->has_ranks = 0, 1;
        s->ranks[k] = x->valuedouble;
    }
    return 1;
}

/* The groups' traffic of one step: {"dp": {"bytes","comm_ms","overlap_ms"}, ...} */
static void read_groups(rp_parts *p, const cJSON *g) {
    for (int k = 0; k < RP_NGROUPS; k++) {
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(g, rp_group_names[k]);
        double b, ms, ov;
        if (!num(o, "bytes", 0, BIG, &b) || !num(o, "comm_ms", 0, BIG, &ms)) continue;
        p->has_group[k] = 1;
        p->bytes[k] += b;
        p->comm_ms[k] += ms;
        p->overlap_ms[k] += num(o, "overlap_ms", 0, BIG, &ov) ? ov : 0;
    }
}

/* A step's "parts_ms" and "rank_step_ms" into p (all or nothing: a step
 * without every part adds none of them). */
static void read_parts(pt_report_run *r, rp_parts *p, const cJSON *o, int world) {
    const cJSON *parts = cJSON_GetObjectItemCaseSensitive(o, "parts_ms");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(o, "rank_step_ms");
    spread s[RP_NPARTS + 1];
    if (!cJSON_IsObject(parts) ||
        !read_spread(cJSON_GetObjectItemCaseSensitive(rs, "step"), world, &s[RP_NPARTS]))
        return;
    for (int k = 0; k < RP_NPARTS; k++)
        if (!read_spread(cJSON_GetObjectItemCaseSensitive(parts, rp_part_names[k]), world, &s[k]))
            return;
    int ranks = s[RP_NPARTS].has_ranks;
    for (int k = 0; k < RP_NPARTS; k++) ranks = ranks && s[k].has_ranks;
    if (p->n > 0 && p->world != (ranks ? world : 0)) { /* another layout: start again */
        r->layout_changes++;
        memset(p, 0, sizeof *p);
    }
    p->world = ranks ? world : 0;
    for (int k = 0; k < RP_NPARTS; k++) {
        p->min[k] += s[k].min, p->max[k] += s[k].max, p->mean[k] += s[k].mean;
        for (int q = 0; ranks && q < world; q++) p->rank_part[q][k] += s[k].ranks[q];
    }
    p->step_min += s[RP_NPARTS].min, p->step_max += s[RP_NPARTS].max;
    p->step_mean += s[RP_NPARTS].mean;
    for (int q = 0; ranks && q < world; q++) p->rank_step[q] += s[RP_NPARTS].ranks[q];
    if (s[RP_NPARTS].max_rank < RP_MAX_RANKS) p->slowest[s[RP_NPARTS].max_rank]++;
    read_groups(p, cJSON_GetObjectItemCaseSensitive(o, "groups"));
    p->n++;
}

/* Memory peaks: "mem" (max over ranks) and "mem_ranks" (per rank). */
static void read_mem(pt_report_run *r, const cJSON *o, int world) {
    const cJSON *mem = cJSON_GetObjectItemCaseSensitive(o, "mem");
    for (int k = 0; k < RP_NMEM; k++) {
        double v;
        if (num(mem, rp_mem_names[k], 0, BIG, &v) && v > r->mem_max[k]) r->mem_max[k] = v;
        if (cJSON_IsObject(mem)) r->has_mem = 1;
    }
    const cJSON *mr = cJSON_GetObjectItemCaseSensitive(o, "mem_ranks");
    if (!cJSON_IsObject(mr) || world > RP_MAX_RANKS) return;
    for (int k = 0; k < RP_NMEM; k++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(mr, rp_mem_names[k]);
        if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != world) continue;
        if (r->mem_world != world) memset(r->mem_rank, 0, sizeof r->mem_rank);
        r->mem_world = world;
        int q = 0;
        for (const cJSON *x = a->child; x; x = x->next, q++)
            if (cJSON_IsNumber(x) && isfinite(x->valuedouble) && x->valuedouble > r->mem_rank[q][k])
                r->mem_rank[q][k] = x->valuedouble;
    }
}

static int read_step(pt_report_run *r, const cJSON *o) {
    double step, loss, w;
    if (!num(o, "step", 0, 1e15, &step) || !num(o, "loss", -BIG, BIG, &loss)) return 0;
    int world = num(o, "world", 1, 1 << 20, &w) ? (int)w : r->world > 0 ? r->world : 1;
    const cJSON *lay = cJSON_GetObjectItemCaseSensitive(o, "layout");
    if (cJSON_IsString(lay)) snprintf(r->layout, sizeof r->layout, "%s", lay->valuestring);
    r->world = world;
    int ok = rp_push(&r->step, step) && rp_push(&r->loss, loss) &&
             rp_push(&r->lr, opt(o, "lr", -BIG, BIG)) &&
             rp_push(&r->grad_norm, opt(o, "grad_norm", 0, BIG)) &&
             rp_push(&r->step_ms, opt(o, "step_ms", 0, BIG)) &&
             rp_push(&r->tokens_per_s, opt(o, "tokens_per_s", 0, BIG)) &&
             rp_push(&r->elapsed_s, opt(o, "elapsed_s", 0, BIG)) &&
             rp_push(&r->bubble, opt(o, "bubble", 0, 1));
    if (!ok) return -1;
    double bf;
    if (num(o, "bubble_formula", 0, 1, &bf)) r->bubble_formula = bf;
    read_parts(r, r->warm_next ? &r->warm : &r->main, o, world);
    r->warm_next = 0;
    read_mem(r, o, world);
    return 1;
}

static int read_val(pt_report_run *r, const cJSON *o) {
    double step, vl, ms;
    if (!num(o, "step", 0, 1e15, &step) || !num(o, "val_loss", -BIG, BIG, &vl)) return 0;
    if (!rp_push(&r->val_step, step) || !rp_push(&r->val_loss, vl) ||
        !rp_push(&r->val_elapsed, opt(o, "elapsed_s", 0, BIG)))
        return -1;
    if (num(o, "val_ms", 0, BIG, &ms)) r->val_ms += ms, r->nval_ms++;
    return 1;
}

static int read_save(pt_report_run *r, const cJSON *o) {
    double step, ms;
    if (!num(o, "step", 0, 1e15, &step) || !num(o, "save_ms", 0, BIG, &ms)) return 0;
    r->save_ms += ms;
    r->nsaves++;
    return 1;
}

static int read_record(pt_report_run *r, const cJSON *run) {
    if (!cJSON_IsObject(run)) return 0;
    char *text = cJSON_PrintUnformatted(run);
    if (!text) return -1;
    free(r->record);
    r->record = text;
    r->records++;
    r->warm_next = 1;
    double w;
    if (num(run, "world", 1, 1 << 20, &w)) r->world = (int)w;
    const cJSON *lay = cJSON_GetObjectItemCaseSensitive(run, "layout");
    if (cJSON_IsString(lay)) snprintf(r->layout, sizeof r->layout, "%s", lay->valuestring);
    return 1;
}

/* One line (n bytes, no newline; `last_open`: the file's last line, with
 * no newline after it). 0 when out of memory. */
static int read_line(pt_report_run *r, const char *line, size_t n, int last_open) {
    r->lines++;
    size_t k = 0;
    while (k < n && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r')) k++;
    if (k == n) return 1; /* blank */
    cJSON *o = cJSON_ParseWithLength(line, n);
    if (!o) {
        if (last_open)
            r->cut = 1;
        else if (r->bad++ == 0)
            r->first_bad = r->lines;
        return 1;
    }
    int got = 0;
    if (cJSON_IsObject(o)) {
        const cJSON *run = cJSON_GetObjectItemCaseSensitive(o, "run");
        got = run                                               ? read_record(r, run)
              : cJSON_GetObjectItemCaseSensitive(o, "val_loss") ? read_val(r, o)
              : cJSON_GetObjectItemCaseSensitive(o, "save_ms")  ? read_save(r, o)
                                                                : read_step(r, o);
    }
    cJSON_Delete(o);
    if (got < 0) return 0;
    if (got == 0 && r->unknown++ == 0) r->first_unknown = r->lines;
    return 1;
}

static pt_report_run *run_new(const char *name, const char *dir) {
    pt_report_run *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->name = strdup(name);
    r->dir = strdup(dir);
    r->bubble_formula = NAN;
    r->warm_next = 1;
    if (!r->name || !r->dir) {
        pt_report_run_free(r);
        return NULL;
    }
    return r;
}

void pt_report_run_free(pt_report_run *r) {
    if (!r) return;
    rp_series *s[] = {&r->step,     &r->loss,         &r->lr,         &r->grad_norm,
                      &r->step_ms,  &r->tokens_per_s, &r->elapsed_s,  &r->bubble,
                      &r->val_step, &r->val_loss,     &r->val_elapsed};
    for (size_t k = 0; k < sizeof s / sizeof s[0]; k++) free(s[k]->v);
    free(r->name);
    free(r->dir);
    free(r->record);
    free(r->trace);
    free(r);
}

/* A regular file at path: its size, 1; else 0. */
static int regular(const char *path, double *bytes) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    *bytes = (double)st.st_size;
    return 1;
}

/* The trace: the record's log.trace (relative to the record's cwd), else
 * the same name or trace.json beside the metrics. */
static void find_trace(pt_report_run *r) {
    cJSON *run = r->record ? cJSON_Parse(r->record) : NULL;
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(run, "config");
    const cJSON *log = cJSON_GetObjectItemCaseSensitive(cfg, "log");
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(log, "trace");
    const cJSON *cwd = cJSON_GetObjectItemCaseSensitive(run, "cwd");
    const char *given = cJSON_IsString(tr) ? tr->valuestring : "";
    char path[4096] = "";
    if (given[0] == '/')
        snprintf(path, sizeof path, "%s", given);
    else if (given[0] && cJSON_IsString(cwd))
        snprintf(path, sizeof path, "%s/%s", cwd->valuestring, given);
    if (!path[0] || !regular(path, &r->trace_bytes)) {
        const char *base = strrchr(given, '/') ? strrchr(given, '/') + 1 : given;
        if (r->dir[0]) snprintf(path, sizeof path, "%s/%s", r->dir, base[0] ? base : "trace.json");
        if (!r->dir[0] || !regular(path, &r->trace_bytes)) path[0] = '\0';
    }
    if (path[0]) r->trace = strdup(path);
    if (!r->trace && given[0])
        note(r, "no trace: %.200s (log.trace) is not there", given);
    else if (!r->trace)
        note(r, "no trace (log.trace was not set): the Perfetto link is missing");
    cJSON_Delete(run);
}

/* What is missing, said once each; an error when nothing of a run is there. */
static pt_status finish(pt_report_run *r) {
    if (!r->records && !r->step.n && !r->val_step.n)
        return pt_error_set(PT_ERR_FORMAT,
                            "%s: not a partrain metrics file (no run record, step or "
                            "validation line in %ld line%s)",
                            r->name, r->lines, r->lines == 1 ? "" : "s");
    if (r->cut)
        note(r, "the last line (%ld) is cut short: the run stopped while writing it", r->lines);
    if (r->bad)
        note(r, "%ld line%s not JSON (the first: line %ld), skipped", r->bad,
             r->bad == 1 ? " is" : "s are", r->first_bad);
    if (r->unknown)
        note(r, "%ld line%s no partrain metrics (the first: line %ld), skipped", r->unknown,
             r->unknown == 1 ? " holds" : "s hold", r->first_unknown);
    if (!r->records)
        note(r, "no run record (an older partrain): no config, machine, version or plan");
    if (!r->step.n) note(r, "no step lines");
    if (!r->main.n && !r->warm.n && r->step.n)
        note(r, "no step-time parts (an older partrain): the split of the step is not shown");
    else if (!r->main.world && !r->warm.world && r->world > RP_MAX_RANKS)
        note(r, "more than %d ranks: min, mean and max over the ranks, not each", RP_MAX_RANKS);
    if (r->layout_changes) note(r, "the layout changed: the parts are the last layout's");
    if (!r->val_step.n) note(r, "no validation lines (data.val was not set)");
    find_trace(r);
    return PT_OK;
}

pt_status pt_report_run_parse(pt_report_run **out, const char *text, size_t n, const char *name) {
    *out = NULL;
    pt_report_run *r = run_new(name, "");
    if (!r) return pt_error_set(PT_ERR_NOMEM, "%s: out of memory", name);
    size_t a = 0;
    while (a < n) {
        const char *nl = memchr(text + a, '\n', n - a);
        size_t len = nl ? (size_t)(nl - (text + a)) : n - a;
        if (!read_line(r, text + a, len, !nl)) {
            pt_report_run_free(r);
            return pt_error_set(PT_ERR_NOMEM, "%s: out of memory", name);
        }
        a += len + (nl != NULL);
    }
    pt_status st = finish(r);
    if (st != PT_OK)
        pt_report_run_free(r);
    else
        *out = r;
    return st;
}

/* path -> the metrics file to read and its folder */
static pt_status locate(const char *path, char *file, size_t n, char *dir, size_t dn) {
    struct stat st;
    if (stat(path, &st) != 0) return pt_error_set(PT_ERR_IO, "%s: no such file or directory", path);
    if (S_ISDIR(st.st_mode)) {
        snprintf(file, n, "%s/metrics.jsonl", path);
        snprintf(dir, dn, "%s", path);
        if (stat(file, &st) != 0)
            return pt_error_set(PT_ERR_INVALID,
                                "%s: not a run directory (no metrics.jsonl in it; a run "
                                "directory holds the file log.metrics names, e.g. "
                                "runs/NAME/metrics.jsonl)",
                                path);
        return PT_OK;
    }
    snprintf(file, n, "%s", path);
    snprintf(dir, dn, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    else
        snprintf(dir, dn, ".");
    return PT_OK;
}

pt_status pt_report_run_load(pt_report_run **out, const char *path) {
    *out = NULL;
    char file[4096], dir[4096];
    PT_CHECK(locate(path, file, sizeof file, dir, sizeof dir));
    FILE *f = NULL;
    PT_CHECK(pt_file_open_regular(file, &f, NULL));
    pt_report_run *r = run_new(path, dir);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    pt_status st = r ? PT_OK : pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
    while (st == PT_OK && (len = getline(&line, &cap, f)) >= 0) {
        int open = len == 0 || line[len - 1] != '\n';
        if (!read_line(r, line, (size_t)len - !open, open))
            st = pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
    }
    if (st == PT_OK && ferror(f)) st = pt_error_set(PT_ERR_IO, "%s: read error", file);
    free(line);
    fclose(f);
    if (st == PT_OK) st = finish(r);
    if (st != PT_OK)
        pt_report_run_free(r);
    else
        *out = r;
    return st;
}

int pt_report_run_notes(const pt_report_run *r) {
    return r->nnotes;
}
const char *pt_report_run_note(const pt_report_run *r, int k) {
    return k >= 0 && k < r->nnotes ? r->notes[k] : "";
}
size_t pt_report_run_steps(const pt_report_run *r) {
    return r->step.n;
}
