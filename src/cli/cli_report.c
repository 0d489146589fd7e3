/* partrain report RUN_DIR... [--out FILE]: one self-contained HTML file of
 * charts from the runs' metrics (partrain/report.h, docs/report.md);
 * several runs overlay on the same axes. Prints the file's path and, per
 * run, what is missing from it. Errors (a path that is not a run, an
 * output that cannot be written): one line "partrain: ..." and exit 1;
 * bad usage exit 2. */
#include "cli_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "partrain/report.h"

#define MAX_RUNS 16

static void usage(FILE *f) {
    fprintf(f,
            "usage: partrain report RUN_DIR... [--out FILE]\n\n"
            "  RUN_DIR      a run's directory, holding the metrics.jsonl that log.metrics names\n"
            "               (the default configs write runs/NAME/metrics.jsonl), or that file\n"
            "               itself; give several to overlay them (at most %d)\n"
            "  --out FILE   the HTML file to write (default: RUN_DIR/report.html for one run\n"
            "               directory, else report.html here)\n\n"
            "The file holds everything it shows (uPlot and the data inline): it opens from\n"
            "disk in any browser and loads nothing from the network. A run killed half-way,\n"
            "one without a trace, and one of an older partrain get a report of what they\n"
            "have, with a line saying what is missing (docs/report.md).\n",
            MAX_RUNS);
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

int pt_cli_report(int argc, char **argv) {
    const char *out = NULL, *paths[MAX_RUNS];
    int n = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if ((r = pt_cli_option(argc, argv, &i, "--out", "report", &v)) != 0) {
            if (r < 0) return 2;
            out = v;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "partrain: unknown option '%s' (see partrain report --help)\n",
                    argv[i]);
            return 2;
        } else if (n == MAX_RUNS) {
            fprintf(stderr, "partrain: report: at most %d runs at once\n", MAX_RUNS);
            return 2;
        } else {
            paths[n++] = argv[i];
        }
    }
    if (n == 0) {
        fprintf(stderr, "partrain: report needs a run directory (partrain report RUN_DIR...)\n");
        return 2;
    }
    char def[4096];
    if (!out) {
        if (n == 1 && is_dir(paths[0]))
            snprintf(def, sizeof def, "%s/report.html", paths[0]);
        else
            snprintf(def, sizeof def, "report.html");
        out = def;
    }
    if (pt_cli_check_output("--out", out)) return 1;
    pt_report_run *runs[MAX_RUNS] = {0};
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        if (pt_report_run_load(&runs[i], paths[i]) != PT_OK) rc = pt_cli_fail(pt_error_message());
    if (rc == 0 && pt_report_write(out, runs, n) != PT_OK) rc = pt_cli_fail(pt_error_message());
    for (int i = 0; i < n && rc == 0; i++) {
        for (int k = 0; k < pt_report_run_notes(runs[i]); k++)
            fprintf(stderr, "report: %s: %s\n", paths[i], pt_report_run_note(runs[i], k));
    }
    if (rc == 0) printf("wrote %s\n", out);
    for (int i = 0; i < n; i++) pt_report_run_free(runs[i]);
    return rc;
}
