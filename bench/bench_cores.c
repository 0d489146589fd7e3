/* bench_cores: every core's speed over time, all cores at once. Run by
 * hand; not a test.
 *
 *   bench_cores [--seconds S] [--bin MS] [--json]
 *
 * One process per core (forked, each pinned to its core) runs the speed
 * probe (kernels.h's pt_speed_probe: a one-thread 256 x 384 x 1152 product,
 * the fastest of three after a warm-up) back to back for S seconds (default
 * 30) and keeps the best rate of each bin of MS milliseconds (default 500).
 * Printed: each bin's rate per core; per core the 10th, 50th and 90th
 * percentile of its bins; and the fraction of bins in which every core ran
 * within 10% of its own 90th percentile ("all fast"). A product split over
 * two threads, or two ranks that wait for each other, run at the slower
 * core's speed, so that fraction is how often they see the machine's whole
 * speed; the slowest core's median is what they see most of the time.
 *
 * Why: calibrate scales its figures by this probe, taken on one core, and
 * a training run logs it from rank 0's core (log.probe). Where the cores'
 * speeds move independently the probe describes its own core only. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "partrain/core.h"
#include "partrain/kernels.h"

enum { MAX_CORES = 64, MAX_BINS = 4096 };

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double percentile(const double *v, int n, double q) {
    double *s = malloc(sizeof(double) * (size_t)n);
    if (!s) return 0;
    memcpy(s, v, sizeof(double) * (size_t)n);
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    double r = s[(int)(q * (n - 1) + 0.5)];
    free(s);
    return r;
}

/* Core `core`'s probes until `end`, the best of each bin into rates[]. */
static int run_core(int core, double t0, double end, double bin_s, int nbins, double *rates) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(core, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        perror("bench_cores: sched_setaffinity");
        return 1;
    }
    pt_kernels_set_threads(1);
    float *buf = calloc(pt_speed_probe_floats(), sizeof(float));
    if (!buf) return 1;
    for (double t; (t = pt_time_s()) < end;) {
        double r = pt_speed_probe(buf);
        int b = (int)((t - t0) / bin_s);
        if (b >= 0 && b < nbins && r > rates[b]) rates[b] = r;
    }
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    double seconds = 30, bin_ms = 500;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--bin") && i + 1 < argc)
            bin_ms = atof(argv[++i]);
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else {
            fprintf(stderr, "usage: bench_cores [--seconds S] [--bin MS] [--json]\n");
            return 2;
        }
    }
    cpu_set_t own;
    if (sched_getaffinity(0, sizeof own, &own) != 0) {
        perror("bench_cores: sched_getaffinity");
        return 1;
    }
    int cores[MAX_CORES], n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < MAX_CORES; c++)
        if (CPU_ISSET(c, &own)) cores[n++] = c;
    double bin_s = bin_ms / 1e3;
    int nbins = (int)(seconds / bin_s);
    if (seconds <= 0 || bin_ms <= 0 || nbins < 1 || nbins > MAX_BINS) {
        fprintf(stderr, "bench_cores: --seconds / --bin: 1 to %d bins\n", MAX_BINS);
        return 2;
    }
    size_t bytes = sizeof(double) * (size_t)n * (size_t)nbins;
    double *rates = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (rates == MAP_FAILED) {
        perror("bench_cores: mmap");
        return 1;
    }
    memset(rates, 0, bytes);
    double t0 = pt_time_s() + 0.2, end = t0 + nbins * bin_s; /* the children start together */
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("bench_cores: fork");
            return 1;
        }
        if (pid == 0) _exit(run_core(cores[i], t0, end, bin_s, nbins, rates + (size_t)i * nbins));
    }
    int failed = 0;
    for (int i = 0; i < n; i++) {
        int status;
        if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
    }
    if (failed) {
        fprintf(stderr, "bench_cores: a core's process failed\n");
        return 1;
    }
    double p10[MAX_CORES], p50[MAX_CORES], p90[MAX_CORES], slowest[MAX_BINS];
    int all_fast = 0;
    printf("%8s", "t s");
    for (int i = 0; i < n; i++) printf("  core %-3d", cores[i]);
    printf("  (GFLOP/s, best of each %.0f ms)\n", bin_ms);
    for (int i = 0; i < n; i++) {
        p10[i] = percentile(rates + (size_t)i * nbins, nbins, 0.1);
        p50[i] = percentile(rates + (size_t)i * nbins, nbins, 0.5);
        p90[i] = percentile(rates + (size_t)i * nbins, nbins, 0.9);
    }
    for (int b = 0; b < nbins; b++) {
        int fast = 1;
        slowest[b] = 0;
        printf("%8.1f", b * bin_s);
        for (int i = 0; i < n; i++) {
            double r = rates[(size_t)i * nbins + b];
            printf("  %8.1f", r / 1e9);
            fast &= r >= 0.9 * p90[i];
            if (i == 0 || r < slowest[b]) slowest[b] = r;
        }
        printf("\n");
        all_fast += fast;
    }
    printf("\n%-8s %8s %8s %8s %8s\n", "core", "p10", "p50", "p90", "p90/p10");
    for (int i = 0; i < n; i++)
        printf("%-8d %8.1f %8.1f %8.1f %8.2f\n", cores[i], p10[i] / 1e9, p50[i] / 1e9, p90[i] / 1e9,
               p90[i] / p10[i]);
    double slow50 = percentile(slowest, nbins, 0.5);
    printf("all %d cores within 10%% of their p90: %.0f%% of %d bins; the slowest core's median "
           "%.1f GFLOP/s\n",
           n, 100.0 * all_fast / nbins, nbins, slow50 / 1e9);
    if (json) {
        printf("{\"bench\": \"cores\", \"cores\": %d, \"seconds\": %g, \"bin_ms\": %g, "
               "\"all_fast\": %.4f, \"slowest_p50\": %.4g, \"p10\": [",
               n, seconds, bin_ms, (double)all_fast / nbins, slow50);
        for (int i = 0; i < n; i++) printf("%s%.4g", i ? ", " : "", p10[i]);
        printf("], \"p50\": [");
        for (int i = 0; i < n; i++) printf("%s%.4g", i ? ", " : "", p50[i]);
        printf("], \"p90\": [");
        for (int i = 0; i < n; i++) printf("%s%.4g", i ? ", " : "", p90[i]);
        printf("]}\n");
    }
    munmap(rates, bytes);
    return 0;
}
