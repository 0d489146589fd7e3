/* What the subcommands share: the one-line error, an output option's
 * check, options with a value ("--x V" or "--x=V") and their numbers, the config of --config /
 * --set, and opening a --checkpoint (resolve, saved config, model with its parameters), so that
 * train, eval and sample parse and fail alike.
 *
 * Not here: any subcommand's own options, usage text or work (cli_<name>.c),
 * the config table itself (train/config.c). */
#include "cli_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int pt_cli_fail(const char *msg) {
    fprintf(stderr, "partrain: %s\n", msg);
    if (msg == pt_error_message()) pt_cli_error_trail();
    return 1;
}

int pt_cli_check_output(const char *opt, const char *path) {
    if (pt_file_check_output(path, 0) == PT_OK) return 0;
    fprintf(stderr, "partrain: %s %s\n", opt, pt_error_message());
    return 1;
}

void pt_cli_error_trail(void) {
    if (pt_error_trail()[0]) PT_DEBUG("error trail: %s", pt_error_trail());
}

int pt_cli_option(int argc, char **argv, int *i, const char *name, const char *cmd,
                  const char **value) {
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return 0;
    if (a[n] == '=') {
        *value = a + n + 1;
        return 1;
    }
    if (a[n] != '\0') return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "partrain: %s needs a value (see partrain %s --help)\n", name, cmd);
        return -1;
    }
    *value = argv[++*i];
    return 1;
}

int pt_cli_parse_int(const char *opt, const char *s, long min, long max, int *out) {
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < min || v > max) {
        fprintf(stderr, "partrain: %s must be an integer in [%ld, %ld] (got '%s')\n", opt, min, max,
                s);
        return 0;
    }
    *out = (int)v;
    return 1;
}

int pt_cli_parse_num(const char *opt, const char *s, double min, double max, double *out) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= min && v <= max)) {
        fprintf(stderr, "partrain: %s must be a number in [%g, %g] (got '%s')\n", opt, min, max, s);
        return 0;
    }
    *out = v;
    return 1;
}

int pt_cli_config_args_init(pt_cli_config_args *a, int argc) {
    a->config = NULL;
    a->nsets = 0;
    a->sets = malloc((size_t)(argc > 0 ? argc : 1) * sizeof *a->sets);
    return a->sets ? 0 : pt_cli_fail("out of memory");
}

void pt_cli_config_args_deinit(pt_cli_config_args *a) {
    free(a->sets);
    a->sets = NULL;
}

int pt_cli_config_arg(pt_cli_config_args *a, int argc, char **argv, int *i, const char *cmd) {
    const char *v = NULL;
    int r = pt_cli_option(argc, argv, i, "--config", cmd, &v);
    if (r > 0) a->config = v;
    if (r != 0) return r;
    r = pt_cli_option(argc, argv, i, "--set", cmd, &v);
    if (r > 0) a->sets[a->nsets++] = v; /* at most one per argument: argc fits */
    return r;
}

pt_status pt_cli_config_build(const pt_cli_config_args *a, pt_config *cfg) {
    pt_config_defaults(cfg);
    if (a->config) PT_CHECK(pt_config_load_file(cfg, a->config));
    for (int k = 0; k < a->nsets; k++) PT_CHECK(pt_config_set(cfg, a->sets[k]));
    return pt_config_validate(cfg);
}

pt_status pt_cli_checkpoint_open(const char *arg, char *stepdir, size_t n, pt_config *cfg) {
    PT_CHECK(pt_checkpoint_resolve(arg, stepdir, n));
    return pt_checkpoint_read_config(stepdir, cfg);
}

pt_status pt_cli_checkpoint_model(const char *stepdir, const pt_config *cfg, int B,
                                  pt_model **out) {
    *out = NULL;
    char path[PT_CONFIG_STR_MAX + 128];
    if ((size_t)snprintf(path, sizeof path, "%s/model.safetensors", stepdir) >= sizeof path)
        return pt_error_set(PT_ERR_INVALID, "%s: checkpoint path too long", stepdir);
    pt_model *m = NULL;
    PT_CHECK(pt_model_new(&m, &cfg->model, B));
    pt_status st = pt_safetensors_load(path, m, pt_model_params(m));
    if (st != PT_OK) {
        pt_model_free(m);
        return st;
    }
    *out = m;
    return PT_OK;
}

int pt_cli_layout_key(const char *k) {
    return !strncmp(k, "parallel.", 9) || !strcmp(k, "model.recompute") ||
           !strcmp(k, "model.stage_recompute") || !strcmp(k, "train.threads");
}
