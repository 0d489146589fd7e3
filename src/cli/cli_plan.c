/* partrain plan: the layouts of a model on a cluster, ranked by predicted
 * step time (pt_plan_search), as a table or JSON lines; the best one as a
 * plan file (--write, which `partrain train --plan FILE` runs) and as a
 * simulated Chrome trace (--trace). Plans allocate nothing of the model's
 * size and need no data file. Errors: one line, exit 1 (bad usage: 2).
 *
 * Not here: the models and the search (src/plan). */
#include "cli_impl.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/plan.h"

static void usage(FILE *f) {
    fprintf(f, "usage: partrain plan --config MODEL.json --cluster FILE [--world N]\n"
               "                     [--set key=value ...] [--top K] [--json] [--write FILE]\n"
               "                     [--trace FILE]\n\n"
               "Every valid layout of N ranks for the config's model, batch and sequence length\n"
               "on the cluster (clusters/*.json, or what partrain calibrate writes): per layout\n"
               "the per-rank peak memory by category and the predicted step time (compute,\n"
               "exposed communication per group, pipeline bubble, optimizer); what does not fit\n"
               "is rejected with the category that overflows, the rest ranked by step time.\n"
               "train.precision = bf16 plans a GPU run (bf16 with fp32 master weights and\n"
               "optimizer state). Any parallel.* key given (in the config or by --set), and\n"
               "model.recompute, model.stage_recompute and train.threads, is held fixed; the\n"
               "rest is searched (a fixed parallel.stage_layers of n entries: pp = n, or\n"
               "pp x virtual_stages = n under interleaved and zbv). When no layout is valid,\n"
               "the error names the constraint that no candidate passes.\n\n"
               "  --config FILE    the model's config (JSON; no data file is read)\n"
               "  --cluster FILE   the cluster description (docs/plan.md; every number in its\n"
               "                   plausible range)\n"
               "  --world N        ranks to plan for (default: every device of the cluster;\n"
               "                   at most 1048576)\n"
               "  --set key=value  override one key (repeatable; a layout key is then fixed)\n"
               "  --top K          layouts shown (default: 10 in the table; with --json every\n"
               "                   one kept, the fastest 256)\n"
               "  --json           one JSON object per layout (the shown ones, then the\n"
               "                   smallest rejected): layout, dp, tp, pp, zero, zero_group,\n"
               "                   sequence_parallel, schedule, microbatches, virtual_stages,\n"
               "                   recompute, stage_layers, stage_recompute, zero_whole, fits,\n"
               "                   reason, mem, step_ms, tokens_per_s, mfu, breakdown, why\n"
               "  --write FILE     the best layout as a plan file: partrain train --plan FILE\n"
               "  --trace FILE     the best layout's simulated timeline (Chrome trace: a track\n"
               "                   per pipeline rank and per link)\n\n"
               "--write and --trace must each be a regular file or not exist yet, in an\n"
               "existing folder: anything else (a FIFO, device, socket, directory) is refused\n"
               "before planning. Each file is replaced whole (a temporary beside it, renamed)\n"
               "or, on any error, left as it was.\n");
}

/* The layout keys a config file gives (nested sections or dotted names),
 * appended to fixed[] (names malloc'd into store). */
static pt_status file_keys(const char *path, char ***store, int *n) {
    char *text = NULL;
    PT_CHECK(pt_read_text_file(path, 16u << 20, &text));
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) return PT_OK; /* the config loader says what is wrong with it */
    char name[256];
    const cJSON *it, *ch;
    pt_status st = PT_OK;
    cJSON_ArrayForEach(it, root) {
        int nested = cJSON_IsObject(it);
        const cJSON *first = nested ? it->child : it;
        for (ch = first; ch && st == PT_OK; ch = nested ? ch->next : NULL) {
            if (nested)
                snprintf(name, sizeof name, "%s.%s", it->string, ch->string);
            else
                snprintf(name, sizeof name, "%s", it->string);
            if (!pt_cli_layout_key(name)) continue;
            char **grown = realloc(*store, sizeof *grown * (size_t)(*n + 1));
            if (!grown || !(grown[*n] = strdup(name))) {
                if (grown) *store = grown;
                st = pt_error_set(PT_ERR_NOMEM, "out of memory");
                break;
            }
            *store = grown;
            (*n)++;
        }
    }
    cJSON_Delete(root);
    return st;
}

static void print_table(const pt_plan_result *r, int top, int world, const pt_cluster *cl) {
    pt_plan_capacity cap;
    pt_plan_rank_capacity(cl, world, &cap);
    printf("%ld valid layouts of %d ranks on %s, where %s: %ld evaluated (the rest\n"
           "cannot beat the fastest kept), %ld fit; the fastest %d:\n\n",
           r->n_considered, world, cl->name, cap.what, r->n_evaluated, r->n_fitting,
           top < r->n_fit ? top : r->n_fit);
    printf("%-4s %-44s %8s %10s %12s %6s %9s %9s %8s %8s %8s %8s\n", "#", "layout", "mem GB",
           "step ms", "tokens/s", "MFU", "compute", "bubble", "tp", "dp", "pp", "optim");
    for (int i = 0; i < r->n_fit && i < top; i++) {
        const pt_plan_entry *e = &r->entry[i];
        const pt_plan_time *t = &e->time;
        char name[PT_PLAN_NAME_MAX * 4];
        pt_plan_layout_name(&e->layout, name, sizeof name);
        printf("%-4d %-44s %8.2f %10.2f %12.0f %5.1f%% %9.2f %9.2f %8.2f %8.2f %8.2f %8.2f\n",
               i + 1, name, e->mem.total / 1e9, t->step_s * 1e3, t->tokens_per_s, 100 * t->mfu,
               t->compute_s * 1e3, t->bubble_s * 1e3, t->comm_s[0] * 1e3, t->comm_s[1] * 1e3,
               t->comm_s[2] * 1e3, t->optim_s * 1e3);
        for (int k = 0; k < e->n_why; k++) printf("     - %s\n", e->why[k]);
    }
    if (r->n > r->n_fit) {
        printf("\nsmallest rejected:\n");
        for (int i = r->n_fit; i < r->n && i < r->n_fit + 3; i++) {
            char name[PT_PLAN_NAME_MAX * 4];
            pt_plan_layout_name(&r->entry[i].layout, name, sizeof name);
            printf("     %s: %s\n", name, r->entry[i].reason);
        }
    }
    printf("\nmemory: the largest rank's peak, slack included; times in ms per step: compute\n"
           "(the busiest rank's passes), bubble (its idle time), exposed tp / dp / pp\n"
           "communication, optimizer. MFU = (6 P + 12 L C T) tokens / (ranks x peak x step).\n");
}

int pt_cli_plan(int argc, char **argv) {
    const char *cluster = NULL, *write = NULL, *trace = NULL, *v = NULL;
    int world = 0, top = 0, json = 0, rc = 0; /* top 0: 10 in the table, all with --json */
    pt_cli_config_args ca;
    if (pt_cli_config_args_init(&ca, argc) != 0) return 1;
    for (int i = 1; i < argc && rc == 0; i++) {
        const char *a = argv[i];
        int r;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            pt_cli_config_args_deinit(&ca);
            return 0;
        } else if ((r = pt_cli_config_arg(&ca, argc, argv, &i, "plan")) != 0) {
            if (r < 0) rc = 2;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if ((r = pt_cli_option(argc, argv, &i, "--cluster", "plan", &v)) != 0) {
            if (r < 0) rc = 2;
            cluster = v;
        } else if ((r = pt_cli_option(argc, argv, &i, "--write", "plan", &v)) != 0) {
            if (r < 0) rc = 2;
            write = v;
        } else if ((r = pt_cli_option(argc, argv, &i, "--trace", "plan", &v)) != 0) {
            if (r < 0) rc = 2;
            trace = v;
        } else if ((r = pt_cli_option(argc, argv, &i, "--world", "plan", &v)) != 0) {
            if (r < 0 || !pt_cli_parse_int("--world", v, 1, PT_PLAN_MAX_WORLD, &world)) rc = 2;
        } else if ((r = pt_cli_option(argc, argv, &i, "--top", "plan", &v)) != 0) {
            if (r < 0 || !pt_cli_parse_int("--top", v, 1, 1 << 20, &top)) rc = 2;
        } else {
            fprintf(stderr, "partrain: unknown option '%s' (see partrain plan --help)\n", a);
            rc = 2;
        }
    }
    if (rc == 0 && (!ca.config || !cluster)) {
        fprintf(stderr, "partrain: plan needs --config and --cluster (see partrain plan --help)\n");
        rc = 2;
    }
    /* the outputs before any work: a FIFO or device there would be replaced
     * by a regular file, a missing folder found only after the search */
    if (rc == 0 && write) rc = pt_cli_check_output("--write", write);
    if (rc == 0 && trace) rc = pt_cli_check_output("--trace", trace);
    if (rc != 0) {
        pt_cli_config_args_deinit(&ca);
        return rc;
    }
    pt_config *cfg = malloc(sizeof *cfg);
    pt_cluster *cl = NULL;
    pt_plan_result res;
    memset(&res, 0, sizeof res);
    char **fixed = NULL;
    int nfixed = 0;
    pt_status st = cfg ? PT_OK : pt_error_set(PT_ERR_NOMEM, "out of memory");
    if (st == PT_OK) {
        pt_config_defaults(cfg);
        st = pt_config_load_file(cfg, ca.config);
    }
    for (int k = 0; st == PT_OK && k < ca.nsets; k++) st = pt_config_set(cfg, ca.sets[k]);
    /* the model's own keys; the layout's cross-key rules are the search's
     * (each layout validated with its keys written in) */
    if (st == PT_OK) st = pt_model_config_validate(&cfg->model);
    if (st == PT_OK) st = file_keys(ca.config, &fixed, &nfixed);
    for (int k = 0; st == PT_OK && k < ca.nsets; k++) {
        const char *eq = strchr(ca.sets[k], '=');
        size_t n = eq ? (size_t)(eq - ca.sets[k]) : strlen(ca.sets[k]);
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(n < 255 ? n : 255), ca.sets[k]);
        if (!pt_cli_layout_key(name)) continue;
        char **grown = realloc(fixed, sizeof *grown * (size_t)(nfixed + 1));
        if (!grown || !(grown[nfixed] = strdup(name))) {
            if (grown) fixed = grown;
            st = pt_error_set(PT_ERR_NOMEM, "out of memory");
            break;
        }
        fixed = grown;
        nfixed++;
    }
    if (st == PT_OK) st = pt_cluster_load_file(&cl, cluster);
    if (st == PT_OK) pt_cli_profile_note(cl, &cfg->model, cluster);
    if (st == PT_OK && world == 0) world = cl->nodes * cl->devices_per_node;
    if (st == PT_OK) st = pt_plan_search(cfg, (const char *const *)fixed, nfixed, cl, world, &res);
    if (st == PT_OK && top == 0) top = json ? res.n_fit : 10;
    for (int i = 0; st == PT_OK && i < res.n; i++) /* what prints is finite */
        if (!pt_plan_entry_finite(&res.entry[i])) {
            char name[PT_PLAN_NAME_MAX * 4];
            pt_plan_layout_name(&res.entry[i].layout, name, sizeof name);
            st = pt_error_set(PT_ERR_INTERNAL, "plan: %s's predicted figures are not finite", name);
        }
    if (st == PT_OK) {
        if (json) {
            int shown = 0;
            for (int i = 0; i < res.n; i++) {
                if (i < res.n_fit && shown >= top) continue;
                char *s = pt_plan_entry_to_json(&res.entry[i]);
                if (!s) {
                    st = pt_error_set(PT_ERR_NOMEM, "out of memory");
                    break;
                }
                printf("%s\n", s);
                free(s);
                shown += i < res.n_fit;
            }
        } else {
            print_table(&res, top, world, cl);
        }
    }
    if (st == PT_OK && write) st = pt_plan_write_file(write, cfg, &res.entry[0]);
    if (st == PT_OK && trace) st = pt_plan_trace_write(trace, cfg, &res.entry[0].layout, cl);
    if (st == PT_OK && fflush(stdout) != 0) st = pt_error_set(PT_ERR_IO, "stdout: write failed");
    if (st != PT_OK) rc = pt_cli_fail(pt_error_message());
    pt_plan_result_free(&res);
    pt_cluster_free(cl);
    for (int k = 0; k < nfixed; k++) free(fixed[k]);
    free(fixed);
    free(cfg);
    pt_cli_config_args_deinit(&ca);
    return rc;
}
