/* partrain: the command-line tool. Dispatches to one subcommand; each lives
 * in its own cli_<name>.c. Before that, ignores SIGXFSZ (see main) and makes
 * sure OpenBLAS runs the best kernels this CPU has (blas_coretype_fix). */
#include "cli_impl.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "partrain/kernels.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"train", pt_cli_train, "train a model (--config FILE [--set key=value ...] [--resume])"},
    {"eval", pt_cli_eval, "mean loss of a checkpoint on a data file"},
    {"sample", pt_cli_sample, "generate text from a checkpoint"},
    {"bench", pt_cli_bench, "benchmarks (bench comm: collectives per backend)"},
    {"plan", pt_cli_plan,
     "rank the layouts of a model on a cluster (--config FILE --cluster FILE)"},
    {"calibrate", pt_cli_calibrate, "measure this machine into a profile (--out FILE)"},
    {"report", pt_cli_report,
     "one HTML file of charts from runs' metrics (RUN_DIR... [--out FILE])"},
    {"flight", pt_cli_flight, "the first mismatch in a dead job's flight recorder dumps (DIR)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: partrain <command> [options]   (partrain <command> --help)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n  --version  the version and the commit it was built from\n");
}

/* Set by the re-executed process's parent: the value it chose. */
#define REEXEC_MARK "PT_BLAS_REEXEC"

/* OpenBLAS reads OPENBLAS_CORETYPE only when it initialises (before main),
 * and falls back to its SSE3 `Prescott` kernels on CPU models it does not
 * know (Debian's 0.3.21 on Emerald Rapids: sgemm 4x slower). When its choice
 * is below what the CPU supports, set the variable and run this program
 * again, once: the marker stops a second try. A value the user set is their
 * choice and is left alone. Under mpirun every rank re-executes itself and
 * only rank 0 says so. */
static void blas_coretype_fix(char **argv) {
    pt_cpu_features f;
    pt_cpu_features_detect(&f);
    const char *core = pt_blas_corename();
    const char *want = pt_blas_coretype_advice(core, &f);
    const char *mark = getenv(REEXEC_MARK), *rank = getenv("OMPI_COMM_WORLD_RANK");
    int speak = !rank || !strcmp(rank, "0");
    if (mark) {
        if (want && speak)
            PT_WARN("OpenBLAS runs its %s kernels although OPENBLAS_CORETYPE=%s was set: "
                    "matrix products are slower than this CPU allows",
                    core, mark);
        return;
    }
    if (!want || getenv("OPENBLAS_CORETYPE")) return;
    if (speak)
        PT_INFO("OpenBLAS chose its %s kernels on this CPU; re-running with "
                "OPENBLAS_CORETYPE=%s (set OPENBLAS_CORETYPE yourself to choose)",
                core, want);
    fflush(stderr);
    if (setenv("OPENBLAS_CORETYPE", want, 1) == 0 && setenv(REEXEC_MARK, want, 1) == 0)
        execv("/proc/self/exe", argv);
    /* still here: the exec failed; run on with the slower kernels */
    if (speak)
        PT_WARN("could not re-run partrain (%s): OpenBLAS keeps its %s kernels", strerror(errno),
                core);
}

int main(int argc, char **argv) {
    /* A write past the file size limit (ulimit -f) raises SIGXFSZ, which
     * kills silently (exit 153) and leaves temporaries behind. Ignored, the
     * write fails with EFBIG and the writer names the file (core/file.c).
     * Kept across the exec below and by every forked rank; under mpirun
     * each rank runs this main. */
    signal(SIGXFSZ, SIG_IGN);
    blas_coretype_fix(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("partrain %s\n", pt_version());
        return 0;
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
