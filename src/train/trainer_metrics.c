/* The trainer's metrics file (log.metrics, JSON lines written by rank 0,
 * docs/report.md): the run record first (layout, resolved config, machine,
 * version, the plan's prediction), then one line per step, per validation
 * and per checkpoint save. Every write is checked: the first failure (a full
 * disk, a file over its size limit) is remembered with its errno and stops
 * the run with one line naming the file.
 *
 * Not here: the loop that calls these (trainer_run.c), the figures
 * (trainer_step.c), reading the file back (src/report/). */
#include "trainer_impl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "partrain/kernels.h"

void pt_metrics_printf(pt_trainer *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (vfprintf(t->metrics, fmt, ap) < 0 && !t->metrics_errno)
        t->metrics_errno = errno ? errno : EIO;
    va_end(ap);
}

/* Flush the line written: a failure is an error naming the file, so that
 * a run whose metrics were lost does not exit 0 (rank 0 stops; the other
 * ranks are stopped as for any failed rank). */
pt_status pt_metrics_flush(pt_trainer *t) {
    errno = 0;
    if (fflush(t->metrics) != 0 && !t->metrics_errno) t->metrics_errno = errno ? errno : EIO;
    if (ferror(t->metrics) && !t->metrics_errno) t->metrics_errno = EIO;
    if (!t->metrics_errno) return PT_OK;
    return pt_error_set(PT_ERR_IO, "log.metrics: %s: write failed at step %d: %s",
                        t->cfg.log.metrics, t->step, strerror(t->metrics_errno));
}

pt_status pt_trainer_set_plan(pt_trainer *t, const char *json) {
    cJSON *o = json ? cJSON_Parse(json) : NULL;
    int ok = cJSON_IsObject(o);
    cJSON_Delete(o);
    if (!ok) return pt_error_set(PT_ERR_INVALID, "the run's plan is not a JSON object");
    char *copy = strdup(json);
    if (!copy) return pt_error_set(PT_ERR_NOMEM, "the run's plan");
    free(t->plan_json);
    t->plan_json = copy;
    return PT_OK;
}

int pt_trainer_planned(const pt_trainer *t, double *step_ms, double *mem_bytes) {
    cJSON *o = t->plan_json ? cJSON_Parse(t->plan_json) : NULL;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "predicted");
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(p, "step_ms");
    const cJSON *mem = cJSON_GetObjectItemCaseSensitive(p, "mem");
    const cJSON *total = cJSON_GetObjectItemCaseSensitive(mem, "total");
    int ok = cJSON_IsNumber(ms) && cJSON_IsNumber(total);
    if (ok) *step_ms = ms->valuedouble, *mem_bytes = total->valuedouble;
    cJSON_Delete(o);
    return ok;
}

/* The pipeline's bubble by the schedule's formula (pt_schedule_bubble at
 * equal pass times: F = B = W), beside the measured one; -1 at pp = 1. */
double pt_trainer_formula_bubble(const pt_trainer *t) {
    const pt_config *c = &t->cfg;
    if (!t->pp) return -1;
    return pt_schedule_bubble(pt_config_schedule(c), c->parallel.microbatches, t->pp_size,
                              pt_config_virtual_stages(c), 1, 1, 1);
}

/* The machine: CPU, cores, the kernels chosen, threads per rank. */
static cJSON *machine_json(const pt_trainer *t) {
    cJSON *m = cJSON_CreateObject();
    char cpu[256];
    pt_cpu_model_name(cpu, sizeof cpu);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int ok = m && cJSON_AddStringToObject(m, "cpu", cpu) &&
             cJSON_AddNumberToObject(m, "cores", (double)(cores > 0 ? cores : 1)) &&
             cJSON_AddStringToObject(m, "gemm", pt_gemm_path_name()) &&
             cJSON_AddStringToObject(m, "blas_core", pt_blas_corename()) &&
             cJSON_AddNumberToObject(m, "threads", t->cfg.train.threads);
    if (!ok) cJSON_Delete(m);
    return ok ? m : NULL;
}

/* Add the JSON text `text` under name (an object, parsed); 1 when done. */
static int add_parsed(cJSON *o, const char *name, const char *text) {
    cJSON *x = text ? cJSON_Parse(text) : NULL;
    if (x && cJSON_AddItemToObject(o, name, x)) return 1;
    cJSON_Delete(x);
    return 0;
}

static char *run_record(const pt_trainer *t) {
    const pt_config *c = &t->cfg;
    cJSON *root = cJSON_CreateObject(), *run = root ? cJSON_AddObjectToObject(root, "run") : NULL;
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd)) cwd[0] = '\0';
    char *conf = pt_config_to_json(c);
    double bubble = pt_trainer_formula_bubble(t);
    int ok = run && cJSON_AddStringToObject(run, "version", pt_version()) &&
             cJSON_AddStringToObject(run, "layout", t->layout) &&
             cJSON_AddNumberToObject(run, "world", t->nranks) &&
             cJSON_AddStringToObject(run, "backend",
                                     t->world ? pt_comm_backend_name(t->world) : "single") &&
             cJSON_AddNumberToObject(run, "start_step", t->step) &&
             cJSON_AddStringToObject(run, "cwd", cwd) && add_parsed(run, "config", conf);
    cJSON *m = ok ? machine_json(t) : NULL;
    ok = m && cJSON_AddItemToObject(run, "machine", m);
    if (!ok) cJSON_Delete(m);
    if (ok && bubble >= 0) ok = cJSON_AddNumberToObject(run, "bubble_formula", bubble) != NULL;
    if (ok && t->plan_json) ok = add_parsed(run, "plan", t->plan_json);
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    free(conf);
    return text;
}

pt_status pt_metrics_open(pt_trainer *t) {
    const pt_config *c = &t->cfg;
    if (!c->log.metrics[0] || t->metrics || t->rank != 0) return PT_OK;
    char parent[PT_CONFIG_STR_MAX];
    snprintf(parent, sizeof parent, "%s", c->log.metrics);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = '\0';
        if (pt_mkdir_p(parent) != PT_OK) return pt_trainer_prefix_error(PT_ERR_IO, "log.metrics");
    }
    t->metrics_errno = 0;
    pt_status st = pt_file_open_output(c->log.metrics, t->step > 0, &t->metrics);
    if (st != PT_OK) return pt_trainer_prefix_error(st, "log.metrics");
    char *rec = run_record(t);
    if (!rec) return pt_error_set(PT_ERR_NOMEM, "log.metrics: the run record");
    pt_metrics_printf(t, "%s\n", rec);
    free(rec);
    return pt_metrics_flush(t);
}

/* "name":{"min":..,"max":..,"mean":..,"max_rank":r[,"ranks":[..]]} */
static void write_spread(pt_trainer *t, const char *name, const pt_spread *s,
                         const pt_step_info *info, int part) {
    pt_metrics_printf(t, "\"%s\":{\"min\":%.4f,\"max\":%.4f,\"mean\":%.4f,\"max_rank\":%d", name,
                      s->min, s->max, s->mean, s->max_rank);
    if (part >= 0 && info->nranks <= PT_STEP_MAX_RANKS) {
        pt_metrics_printf(t, ",\"ranks\":[");
        for (int r = 0; r < info->nranks; r++) {
            double v = part < PT_NPARTS ? info->rank_part_ms[r][part] : info->rank_wall_ms[r];
            pt_metrics_printf(t, "%s%.4f", r ? "," : "", v);
        }
        pt_metrics_printf(t, "]");
    }
    pt_metrics_printf(t, "}");
}

/* The groups this layout has (a group of one is no group). */
static int has_group(const pt_trainer *t, int g) {
    switch (g) {
    case PT_GROUP_DP:
        return t->dps || (t->mode == MODE_LOCAL && t->dp_size > 1);
    case PT_GROUP_TP:
        return t->tp != NULL;
    case PT_GROUP_PP:
        return t->pp != NULL;
    default:
        return t->zero != NULL;
    }
}

/* The parts of every rank's step, the overlapped time and traffic per
 * group, every rank's memory peaks (docs/report.md). */
static void write_times(pt_trainer *t, const pt_step_info *info) {
    pt_metrics_printf(t, ",\"rank_step_ms\":{");
    write_spread(t, "step", &info->wall, info, PT_NPARTS);
    pt_metrics_printf(t, "},\"parts_ms\":{");
    for (int k = 0; k < PT_NPARTS; k++) {
        if (k) pt_metrics_printf(t, ",");
        write_spread(t, pt_step_part_name((pt_step_part)k), &info->part[k], info, k);
    }
    pt_metrics_printf(t, "},\"groups\":{");
    int first = 1;
    for (int g = 0; g < PT_NGROUPS; g++) {
        if (!has_group(t, g)) continue;
        double ms = info->group_comm_ms[g], n = info->nranks > 0 ? info->nranks : 1;
        pt_metrics_printf(t,
                          "%s\"%s\":{\"bytes\":%.0f,\"comm_ms\":%.4f,\"gbps\":%.4f,"
                          "\"overlap_ms\":%.4f}",
                          first ? "" : ",", pt_group_name((pt_group)g), info->group_bytes[g] / n,
                          ms / n, ms > 0 ? info->group_bytes[g] / (ms * 1e6) : 0,
                          info->overlap[g].mean);
        first = 0;
    }
    pt_metrics_printf(t, "}");
    if (info->nranks > PT_STEP_MAX_RANKS) return;
    pt_metrics_printf(t, ",\"mem_ranks\":{");
    for (int k = 0; k <= PT_MEM_NCAT; k++) {
        pt_metrics_printf(t, "%s\"%s\":[", k ? "," : "",
                          k < PT_MEM_NCAT ? pt_mem_cat_name((pt_mem_cat)k) : "total");
        for (int r = 0; r < info->nranks; r++)
            pt_metrics_printf(t, "%s%llu", r ? "," : "", (unsigned long long)info->rank_mem[r][k]);
        pt_metrics_printf(t, "]");
    }
    pt_metrics_printf(t, "}");
}

pt_status pt_metrics_step(pt_trainer *t, const pt_step_info *info, double elapsed_s) {
    if (!t->metrics) return PT_OK;
    pt_metrics_printf(
        t,
        "{\"step\":%d,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"step_ms\":%.4f,"
        "\"tokens_per_s\":%.1f,\"compute_ms\":%.4f,\"comm_ms\":%.4f,\"exposed_comm_ms\":%.4f,"
        "\"skew_ms\":%.4f,\"local_lag_ms\":%.4f,\"exposed_transfer_ms\":%.4f,\"comm_bytes\":%"
        "llu,\"tp_comm_bytes\":%llu,\"sync\":\"%s\",\"world\":%d,\"layout\":\"%s\","
        "\"mem\":{",
        info->step, (double)info->loss, (double)info->lr, (double)info->grad_norm, info->step_ms,
        info->tokens_per_s, info->compute_ms, info->comm_ms, info->exposed_comm_ms, info->skew_ms,
        info->local_lag_ms, info->exposed_transfer_ms, (unsigned long long)info->comm_bytes,
        (unsigned long long)info->tp_comm_bytes, t->cfg.parallel.sync, t->nranks, t->layout);
    static const pt_mem_cat cats[] = {PT_MEM_PARAMS, PT_MEM_GRADS, PT_MEM_OPTIM, PT_MEM_ACTS,
                                      PT_MEM_COMM};
    for (size_t i = 0; i < sizeof cats / sizeof cats[0]; i++)
        pt_metrics_printf(t, "\"%s\":%zu,", pt_mem_cat_name(cats[i]), t->mem_peak[cats[i]]);
    /* mem_current: bytes held at the end of the step (what stays between steps) */
    pt_metrics_printf(t, "\"total\":%zu},\"mem_current\":{", t->mem_peak_total);
    for (size_t i = 0; i < sizeof cats / sizeof cats[0]; i++)
        pt_metrics_printf(t, "\"%s\":%zu,", pt_mem_cat_name(cats[i]), t->mem_cur[cats[i]]);
    pt_metrics_printf(t, "\"total\":%zu}", t->mem_cur_total);
    if (t->pp) { /* the bubble (mean over ranks), each stage's activation peak and idle time */
        pt_metrics_printf(t, ",\"bubble\":%.6f,\"bubble_formula\":%.6f,\"pp_comm_bytes\":%llu",
                          info->bubble, pt_trainer_formula_bubble(t),
                          (unsigned long long)info->pp_comm_bytes);
        pt_metrics_printf(t, ",\"stage_acts\":[");
        for (int k = 0; k < info->stages && k < PT_STEP_MAX_STAGES; k++)
            pt_metrics_printf(t, "%s%llu", k ? "," : "", (unsigned long long)info->stage_acts[k]);
        pt_metrics_printf(t, "],\"stage_idle_ms\":[");
        for (int k = 0; k < info->stages && k < PT_STEP_MAX_STAGES; k++)
            pt_metrics_printf(t, "%s%.3f", k ? "," : "", info->stage_idle_ms[k]);
        pt_metrics_printf(t, "]");
    }
    if (info->probe_flops_s > 0)
        pt_metrics_printf(t, ",\"probe_flops_s\":%.6g", info->probe_flops_s);
    write_times(t, info);
    pt_metrics_printf(t, ",\"elapsed_s\":%.3f}\n", elapsed_s);
    return pt_metrics_flush(t);
}

pt_status pt_metrics_val(pt_trainer *t, float val_loss, double elapsed_s, double val_ms) {
    if (!t->metrics) return PT_OK;
    pt_metrics_printf(t,
                      "{\"step\":%d,\"val_loss\":%.9g,\"elapsed_s\":%.3f,\"val_ms\":%.3f,"
                      "\"world\":%d,\"layout\":\"%s\"}\n",
                      t->step, (double)val_loss, elapsed_s, val_ms, t->nranks, t->layout);
    return pt_metrics_flush(t);
}

pt_status pt_metrics_save(pt_trainer *t, double elapsed_s, double save_ms) {
    if (!t->metrics) return PT_OK;
    pt_metrics_printf(t,
                      "{\"step\":%d,\"save_ms\":%.3f,\"elapsed_s\":%.3f,\"world\":%d,"
                      "\"layout\":\"%s\"}\n",
                      t->step, save_ms, elapsed_s, t->nranks, t->layout);
    return pt_metrics_flush(t);
}

pt_status pt_metrics_close(pt_trainer *t, pt_status st) {
    if (!t->metrics) return st;
    /* closed here, where a failed last write can still be reported */
    int bad = fclose(t->metrics) != 0, err = errno;
    t->metrics = NULL;
    if (bad && st == PT_OK)
        st = pt_error_set(PT_ERR_IO, "log.metrics: %s: write failed: %s", t->cfg.log.metrics,
                          strerror(err));
    return st;
}
