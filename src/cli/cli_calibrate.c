/* partrain calibrate: measure this machine (calibrate.h) and write the
 * profile, a cluster description of this machine, to --out or the cache;
 * print a short summary. --probe S times the speed probe alone and prints
 * its line (and writes it to --out, when given: a user who names a file
 * wants the result there, not a silent exit 0 with nothing written). */
#include "cli_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/calibrate.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: partrain calibrate [--out FILE] [--config FILE ...] [--quick] [--threads N]\n"
            "       partrain calibrate --probe SECONDS [--out FILE]\n\n"
            "Measures this machine (about two minutes on 2 cores; longer when it is busy)\n"
            "and writes a profile: matrix products by shape and thread count, each module's\n"
            "forward, input-gradient and weight-gradient time, recomputation, memory\n"
            "bandwidth, elementwise and optimizer rates, the shm backend's collectives and\n"
            "point-to-point. The file is a cluster description of this machine\n"
            "(docs/plan.md), usable as --cluster.\n\n"
            "  --out FILE     where to write (default: the cache, $XDG_CACHE_HOME/partrain/ or\n"
            "                 ~/.cache/partrain/profile-<hash of CPU, binary, options>.json)\n"
            "  --config FILE  a model whose shape is timed (repeatable; default: the default,\n"
            "                 small and gpt2 shapes)\n"
            "  --quick        a few seconds: the first shape, fewer sizes and repetitions\n"
            "  --threads N    most BLAS threads timed (default: the cores this process may use)\n"
            "  --probe S      only the speed probe (a one-thread product), for S seconds: prints\n"
            "                 its median rate as one JSON line, to compare with a profile's\n"
            "                 probe_flops_s (every profile figure is scaled to that median);\n"
            "                 with --out FILE the same line is also written to FILE\n\n"
            "--out FILE must be a regular file or not exist yet, in an existing folder: a\n"
            "FIFO, device, socket or directory there is refused before anything is measured.\n"
            "The file is replaced whole (a temporary beside it, renamed) or not at all.\n");
}

static void summary(const pt_calibration *c, const char *path) {
    const pt_profile *p = &c->profile;
    const pt_cluster *cl = &c->cluster;
    printf("cpu        %s, %d cores\n", p->cpu, p->cores);
    printf("gemm       best %.1f GFLOP/s on 1 thread (peak_flops.fp32)",
           cl->device.peak_flops_fp32 / 1e9);
    double best_all = 0;
    for (int i = 0; i < p->n_gemm; i++)
        if (p->gemm[i].threads == p->cores && p->gemm[i].flops_s > best_all)
            best_all = p->gemm[i].flops_s;
    if (p->cores > 1 && best_all > 0) printf(", %.1f on %d", best_all / 1e9, p->cores);
    printf("; %d shapes x threads\n", p->n_gemm);
    printf("           backward's transposed products at 512 rows, of the forward's rate: "
           "input gradient %.2f-%.2fx, weight gradient %.2f-%.2fx\n",
           c->transpose_lo[0], c->transpose_hi[0], c->transpose_lo[1], c->transpose_hi[1]);
    printf("memory     %.2f GB/s copy, elementwise %.2f ns/float, adamw %.2f ns/param, "
           "sgd %.2f ns/param\n",
           p->memory_bw / 1e9, p->elementwise_s * 1e9, p->adamw_s * 1e9, p->sgd_s * 1e9);
    if (c->n_probes)
        printf("probe      median %.1f GFLOP/s over %d one-core probes (%.1f-%.1f)",
               p->probe_flops_s / 1e9, c->n_probes, c->probe_lo / 1e9, c->probe_hi / 1e9);
    if (c->n_probes && c->probe_all_cores > 1)
        printf(", %.1f on %d cores at once (the slowest's)", c->probe_all / 1e9,
               c->probe_all_cores);
    if (c->n_probes) printf(": each figure scaled to the median on its thread count\n");
    if (c->n_retimed)
        printf("groups     %d micro-batch size%s timed again: outliers against the "
               "neighbouring sizes\n",
               c->n_retimed, c->n_retimed == 1 ? "" : "s");
    printf("links      shm p2p %.2f GB/s, latency %.1f us\n", cl->intra_node.bw / 1e9,
           cl->intra_node.latency * 1e6);
    printf("\n%-9s %5s %5s %3s %6s %7s %9s %9s %9s %9s %9s\n", "module", "C", "T", "tp", "tokens",
           "threads", "fwd ms", "bgrad ms", "wgrad ms", "sel ms", "full ms");
    static const char *const kinds[] = {"embedding", "block", "head"};
    for (int i = 0; i < p->n_module; i++) {
        const pt_profile_module *m = &p->module[i];
        printf("%-9s %5d %5d %3d %6d %7d %9.3f %9.3f %9.3f %9.3f %9.3f\n", kinds[m->kind],
               m->n_embd, m->seq_len, m->tp, m->tokens, m->threads, m->fwd_s * 1e3,
               m->bgrad_s * 1e3, m->wgrad_s * 1e3, m->recompute_s[1] * 1e3,
               m->recompute_s[2] * 1e3);
    }
    printf("\n%d collective and p2p points (shm, 2 and 4 ranks)\n", p->n_comm);
    printf("measured in %.1f s (comm %.1f, groups %.1f, memory %.1f, gemm %.1f, modules %.1f)\n",
           c->seconds, c->phase_s[0], c->phase_s[4], c->phase_s[1], c->phase_s[2], c->phase_s[3]);
    printf("wrote %s\n", path);
}

/* --probe S: the probe's line on stdout and, with --out, in that file
 * (checked before the probe runs, written atomically). */
static int probe(double seconds, const char *out) {
    if (out && pt_calibrate_check_out(out) != PT_OK) return pt_cli_fail(pt_error_message());
    double med, lo, hi;
    if (pt_calibrate_probe(seconds, &med, &lo, &hi) != PT_OK)
        return pt_cli_fail(pt_error_message());
    char line[160];
    int n = snprintf(line, sizeof line, "{\"probe_flops_s\": %.6g, \"lo\": %.6g, \"hi\": %.6g}\n",
                     med, lo, hi);
    if (out && pt_file_write_atomic(out, line, (size_t)n) != PT_OK)
        return pt_cli_fail(pt_error_message());
    fputs(line, stdout);
    return 0;
}

int pt_cli_calibrate(int argc, char **argv) {
    pt_model_config models[PT_CALIBRATE_MAX_MODELS];
    pt_calibrate_options o = {.progress = stderr};
    const char *out = NULL;
    double probe_s = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--quick")) {
            o.quick = 1;
            continue;
        }
        if ((r = pt_cli_option(argc, argv, &i, "--out", "calibrate", &v)) != 0) {
            out = v;
        } else if ((r = pt_cli_option(argc, argv, &i, "--probe", "calibrate", &v)) != 0) {
            char *end = NULL;
            if (r > 0) probe_s = strtod(v, &end);
            if (r > 0 && (end == v || *end || !(probe_s > 0 && probe_s <= 3600))) {
                fprintf(stderr, "partrain: --probe '%s' must be seconds in (0, 3600]\n", v);
                return 2;
            }
        } else if ((r = pt_cli_option(argc, argv, &i, "--threads", "calibrate", &v)) != 0) {
            if (r > 0 && !pt_cli_parse_int(a, v, 1, 1024, &o.threads)) return 2;
        } else if ((r = pt_cli_option(argc, argv, &i, "--config", "calibrate", &v)) != 0) {
            if (r > 0) {
                if (o.n_models == PT_CALIBRATE_MAX_MODELS) {
                    fprintf(stderr, "partrain: calibrate: more than %d --config files\n",
                            PT_CALIBRATE_MAX_MODELS);
                    return 2;
                }
                pt_config cfg;
                pt_config_defaults(&cfg);
                if (pt_config_load_file(&cfg, v) != PT_OK) return pt_cli_fail(pt_error_message());
                models[o.n_models++] = cfg.model;
            }
        } else {
            fprintf(stderr, "partrain: unknown option '%s' (see partrain calibrate --help)\n", a);
            return 2;
        }
        if (r < 0) return 2;
    }
    if (probe_s > 0) return probe(probe_s, out);
    if (o.n_models) o.models = models;
    if (!pt_knob_is_set("PT_LOG")) pt_log_set_level(PT_LOG_WARN); /* the ranks' backend lines */
    char cache[4096];
    if (!out) {
        if (pt_calibrate_cache_path(&o, cache, sizeof cache) != PT_OK)
            return pt_cli_fail(pt_error_message());
        out = cache;
    }
    /* before a minute or two of measuring: a path that cannot take the file */
    if (pt_calibrate_check_out(out) != PT_OK) return pt_cli_fail(pt_error_message());
    pt_calibration c;
    if (pt_calibrate(&o, &c) != PT_OK) return pt_cli_fail(pt_error_message());
    pt_status st = pt_calibrate_write(&c, out);
    if (st == PT_OK) summary(&c, out);
    pt_calibration_deinit(&c);
    return st == PT_OK ? 0 : pt_cli_fail(pt_error_message());
}
