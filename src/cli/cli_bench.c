/* `partrain bench`: dispatch to one benchmark. Each lives in its own
 * bench_<name>.c and prints its own --help. */
#include "cli_impl.h"

#include <stdio.h>
#include <string.h>

/* bench_comm.c */
int pt_cli_bench_comm(int argc, char **argv);
/* bench_schedule.c */
int pt_cli_bench_schedule(int argc, char **argv);

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} benches[] = {
    {"comm", pt_cli_bench_comm,
     "collectives per backend (shm, mpi, mpi_native, memcpy): latency and bus bandwidth"},
    {"schedule", pt_cli_bench_schedule,
     "a pipeline schedule's bubble, makespan and activations in flight for given pass times"},
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: partrain bench <benchmark> [options]   (partrain bench <benchmark> --help)\n\n"
            "benchmarks:\n");
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        fprintf(f, "  %-8s %s\n", benches[i].name, benches[i].help);
}

int pt_cli_bench(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        if (!strcmp(argv[1], benches[i].name)) return benches[i].run(argc - 1, argv + 1);
    fprintf(stderr, "partrain bench: unknown benchmark '%s' (see partrain bench --help)\n",
            argv[1]);
    return 2;
}
