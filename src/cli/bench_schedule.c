/* `partrain bench schedule`: what a pipeline schedule costs on paper, for
 * given pass times: the bubble (pt_schedule_bubble: closed form or the
 * simulator), the step's makespan (pt_schedule_simulate) and every rank's
 * peak micro-batches of activations in flight (pt_schedule_build_all),
 * with the wall time that build took (zbv's is one run of its list
 * scheduler over all ranks, which every rank also runs at start).
 * bench/pp_bench.sh sets the measured F, B, W times here to get the
 * formula bubble beside the measured one.
 *
 * Not here: running anything (no model, no ranks); the schedules themselves
 * (src/parallel/schedule.c, pipeline/). */
#include "cli_impl.h"
#include "partrain/parallel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(
        f, "usage: partrain bench schedule --schedule S --pp P --microbatches M\n"
           "                               [--virtual-stages V] [--tf X --tb Y --tw Z] [--json]\n\n"
           "The bubble, makespan and per-rank activations in flight of a pipeline schedule\n"
           "when F, B and W passes take tf, tb and tw (a non-split backward BW = tb + tw),\n"
           "and the wall time to build every rank's list.\n\n"
           "  --schedule S        gpipe, 1f1b, interleaved, zb1 or zbv\n"
           "  --pp P              pipeline ranks (stages), >= 2\n"
           "  --microbatches M    micro-batches per step\n"
           "  --virtual-stages V  chunks per rank (default: the schedule's fewest, 2 for\n"
           "                      interleaved and zbv, 1 for the others)\n"
           "  --tf X --tb Y --tw Z  pass times, any unit (default 1 1 1)\n"
           "  --json              one JSON object: schedule, pp, microbatches, virtual_stages,\n"
           "                      tf, tb, tw, bubble, makespan, build_s (seconds to build every\n"
           "                      rank's list), busy, in_flight (per rank)\n");
}

int pt_cli_bench_schedule(int argc, char **argv) {
    const char *cmd = "bench schedule", *name = NULL;
    int p = 0, m = 0, v = 0, json = 0;
    double t[3] = {1, 1, 1};
    static const char *const topt[3] = {"--tf", "--tb", "--tw"};
    for (int i = 1; i < argc; i++) {
        const char *val;
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--json")) {
            json = 1;
            continue;
        }
        if ((r = pt_cli_option(argc, argv, &i, "--schedule", cmd, &val))) {
            if (r < 0) return 2;
            name = val;
            continue;
        }
        if ((r = pt_cli_option(argc, argv, &i, "--pp", cmd, &val))) {
            if (r < 0 || !pt_cli_parse_int("--pp", val, 2, 1024, &p)) return 2;
            continue;
        }
        if ((r = pt_cli_option(argc, argv, &i, "--microbatches", cmd, &val))) {
            if (r < 0 || !pt_cli_parse_int("--microbatches", val, 1, PT_SCHEDULE_MAX_MICRO, &m))
                return 2;
            continue;
        }
        if ((r = pt_cli_option(argc, argv, &i, "--virtual-stages", cmd, &val))) {
            if (r < 0 || !pt_cli_parse_int("--virtual-stages", val, 1, PT_SCHEDULE_MAX_VIRTUAL, &v))
                return 2;
            continue;
        }
        int k = 0;
        for (; k < 3; k++)
            if ((r = pt_cli_option(argc, argv, &i, topt[k], cmd, &val))) break;
        if (k < 3) {
            /* a zero time is allowed (tw = 0: no weight pass), a negative not */
            if (r < 0 || !pt_cli_parse_num(topt[k], val, 0, 1e12, &t[k])) return 2;
            continue;
        }
        fprintf(stderr, "partrain: bench schedule: unknown option '%s' (see --help)\n", argv[i]);
        return 2;
    }
    if (!name || !p || !m) {
        fprintf(stderr, "partrain: bench schedule needs --schedule, --pp and --microbatches "
                        "(see --help)\n");
        return 2;
    }
    const pt_sched *d = pt_sched_find(name);
    if (!v) v = d ? d->v_default : 1;
    /* validates name, m, p and v: one line naming the key and value */
    if (pt_schedule_check(name, m, p, v, 0) != PT_OK) {
        fprintf(stderr, "partrain: %s\n", pt_error_message());
        return 2;
    }
    double bubble = pt_schedule_bubble(name, m, p, v, t[0], t[1], t[2]), makespan = 0;
    double *busy = calloc((size_t)p, sizeof *busy);
    int *in_flight = calloc((size_t)p, sizeof *in_flight);
    pt_schedule *sc = calloc((size_t)p, sizeof *sc);
    if (!busy || !in_flight || !sc) {
        free(busy);
        free(in_flight);
        free(sc);
        return pt_cli_fail("out of memory");
    }
    pt_status s = bubble < 0 ? PT_ERR_INVALID : PT_OK;
    if (s == PT_OK) s = pt_schedule_simulate(name, m, p, v, t[0], t[1], t[2], &makespan, busy);
    /* every rank's list at once: zbv's from one run of its list scheduler,
     * where building each rank's on its own ran it p times (p 256, m 256:
     * 2.3 s of CPU against 0.01 s) */
    uint64_t t0 = pt_time_ns();
    if (s == PT_OK) s = pt_schedule_build_all(sc, name, m, p, v);
    double build_s = (double)(pt_time_ns() - t0) / 1e9;
    for (int r = 0; r < p && s == PT_OK; r++) {
        in_flight[r] = sc[r].in_flight;
        pt_schedule_free(&sc[r]);
    }
    free(sc);
    if (s != PT_OK) {
        fprintf(stderr, "partrain: %s\n", pt_error_message());
        free(busy);
        free(in_flight);
        return 1;
    }
    if (json) {
        printf("{\"schedule\":\"%s\",\"pp\":%d,\"microbatches\":%d,\"virtual_stages\":%d,"
               "\"tf\":%.6g,\"tb\":%.6g,\"tw\":%.6g,\"bubble\":%.6f,\"makespan\":%.6g,"
               "\"build_s\":%.6f,\"busy\":[",
               name, p, m, v, t[0], t[1], t[2], bubble, makespan, build_s);
        for (int r = 0; r < p; r++) printf("%s%.6g", r ? "," : "", busy[r]);
        printf("],\"in_flight\":[");
        for (int r = 0; r < p; r++) printf("%s%d", r ? "," : "", in_flight[r]);
        printf("]}\n");
    } else {
        printf("schedule %s  pp %d  microbatches %d  virtual_stages %d  tf %g tb %g tw %g\n", name,
               p, m, v, t[0], t[1], t[2]);
        printf("bubble    %.6f\n", bubble);
        printf("makespan  %.6g\n", makespan);
        printf("build     %.6f s (every rank's list, wall time)\n", build_s);
        printf("rank  busy        in_flight\n");
        for (int r = 0; r < p; r++) printf("%4d  %-10.6g  %d\n", r, busy[r], in_flight[r]);
    }
    free(busy);
    free(in_flight);
    return 0;
}
