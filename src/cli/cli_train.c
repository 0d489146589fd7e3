/* partrain train: build the config (defaults < --config FILE < --set, in
 * order), then run the single-worker trainer, optionally resuming from
 * checkpoint.dir/latest. Errors: one line "partrain: ..." and exit 1. */
#include "cli_impl.h"

#include <stdio.h>
#include <string.h>

#include "partrain/train.h"

static void usage(FILE *f) {
    fprintf(f, "usage: partrain train [--config FILE] [--set key=value ...] [--resume]\n\n"
               "  --config FILE    JSON config (see configs/default.json)\n"
               "  --set key=value  override one key (repeatable, applied after --config)\n"
               "  --resume         continue from checkpoint.dir/latest (bitwise the same run)\n\n");
    pt_config_print_help(f);
}

static int fail(const char *msg) {
    fprintf(stderr, "partrain: %s\n", msg);
    return 1;
}

int pt_cli_train(int argc, char **argv) {
    const char *config = NULL;
    int resume = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--config") || !strcmp(a, "--set")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "partrain: %s needs a value (see partrain train --help)\n", a);
                return 2;
            }
            if (!strcmp(a, "--config"))
                config = argv[++i];
            else
                i++; /* applied below, after the file */
        } else if (!strncmp(a, "--config=", 9)) {
            config = a + 9;
        } else if (!strncmp(a, "--set=", 6)) {
            /* applied below */
        } else if (!strcmp(a, "--resume")) {
            resume = 1;
        } else if (!strcmp(a, "--nproc") || !strncmp(a, "--nproc=", 8) || !strcmp(a, "--backend")) {
            fprintf(stderr, "partrain: %s is not supported yet (single worker only)\n", a);
            return 2;
        } else {
            fprintf(stderr, "partrain: unknown option '%s' (see partrain train --help)\n", a);
            return 2;
        }
    }
    pt_config cfg;
    pt_config_defaults(&cfg);
    if (config && pt_config_load_file(&cfg, config) != PT_OK) return fail(pt_error_message());
    for (int i = 1; i < argc; i++) {
        const char *set = NULL;
        if (!strcmp(argv[i], "--set"))
            set = argv[++i];
        else if (!strncmp(argv[i], "--set=", 6))
            set = argv[i] + 6;
        else if (!strcmp(argv[i], "--config"))
            i++;
        if (set && pt_config_set(&cfg, set) != PT_OK) return fail(pt_error_message());
    }
    if (pt_config_validate(&cfg) != PT_OK) return fail(pt_error_message());
    if (!cfg.data.train[0])
        return fail("data.train is not set (in the config, or --set data.train=FILE)");
    pt_trainer *t = NULL;
    if (pt_trainer_new(&t, &cfg) != PT_OK) return fail(pt_error_message());
    pt_status st = PT_OK;
    if (resume) st = pt_trainer_resume(t);
    if (st == PT_OK) st = pt_trainer_run(t);
    int rc = 0;
    if (st != PT_OK) rc = fail(pt_error_message());
    pt_trainer_free(t);
    return rc;
}
