/* partrain: the command-line tool. Dispatches to one subcommand; each lives
 * in its own cli_<name>.c. */
#include "cli_impl.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"train", pt_cli_train, "train a model (--config FILE [--set key=value ...] [--resume])"},
    {"eval", pt_cli_eval, "mean loss of a checkpoint on a data file"},
    {"sample", pt_cli_sample, "generate text from a checkpoint"},
    {"bench", pt_cli_bench, "benchmarks (bench comm: collectives per backend)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: partrain <command> [options]   (partrain <command> --help)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "partrain: unknown command '%s' (see partrain --help)\n", argv[1]);
    return 2;
}
