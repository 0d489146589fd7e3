/* Which CPU kernels OpenBLAS runs, against what the CPU can do.
 *
 * OpenBLAS (DYNAMIC_ARCH builds, as Debian's) picks its kernels from the
 * CPU's family and model when the library initialises. A model it does not
 * know falls back to an old core: Debian's 0.3.21 runs its `Prescott` (SSE3)
 * sgemm on family 6 model 207 (Emerald Rapids: AVX-512, AMX) at ~27 GFLOP/s
 * on one core, against 100-120 with OPENBLAS_CORETYPE=SkylakeX (same
 * results, within float rounding). Attention's products and the whole
 * non-AVX-512 path run on it there.
 *
 * pt_blas_coretype_advice is the decision, a pure function so that a test
 * feeds it both kinds of CPU; the environment variable can only take effect
 * before OpenBLAS initialises, so the CLI (src/cli/main.c) sets it and
 * re-executes itself.
 *
 * Not here: setting the variable or re-executing (the CLI's job), threads
 * (threads.c). */
#include <cblas.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "kernels_impl.h"

/* OpenBLAS's x86-64 core names (openblas_get_corename) by level: 2 for its
 * AVX-512 cores, 1 for the cores it picks for AVX2 CPUs it knows (Haswell's
 * kernels, Zen's, and Excavator's own FMA kernels: AMD's tuning, left
 * alone), 0 for everything older (Prescott, Nehalem, Sandybridge, ...). */
static int core_level(const char *corename) {
    static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    static const char *const avx2[] = {"Haswell", "Zen", "Excavator"};
    if (!corename) return 0;
    for (size_t i = 0; i < sizeof avx512 / sizeof avx512[0]; i++)
        if (!strcasecmp(corename, avx512[i])) return 2;
    for (size_t i = 0; i < sizeof avx2 / sizeof avx2[0]; i++)
        if (!strcasecmp(corename, avx2[i])) return 1;
    return 0;
}

const char *pt_blas_coretype_advice(const char *corename, const pt_cpu_features *f) {
    int cpu = f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq ? 2
              : f->avx2 && f->fma                                     ? 1
                                                                      : 0;
    if (core_level(corename) >= cpu) return NULL;
    return cpu == 2 ? "SkylakeX" : "Haswell";
}

void pt_cpu_features_detect(pt_cpu_features *f) {
    *f = (pt_cpu_features){0};
#if defined(__x86_64__) || defined(__i386__)
    /* __builtin_cpu_supports also checks that the OS saves the vector
     * registers (XCR0), not only the CPUID bits. */
    __builtin_cpu_init();
    f->avx2 = __builtin_cpu_supports("avx2") != 0;
    f->fma = __builtin_cpu_supports("fma") != 0;
    f->avx512f = __builtin_cpu_supports("avx512f") != 0;
    f->avx512bw = __builtin_cpu_supports("avx512bw") != 0;
    f->avx512vl = __builtin_cpu_supports("avx512vl") != 0;
    f->avx512dq = __builtin_cpu_supports("avx512dq") != 0;
#endif
}

const char *pt_blas_corename(void) {
    return openblas_get_corename();
}

void pt_cpu_model_name(char *buf, size_t n) {
    snprintf(buf, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) != 0 || !colon) continue;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t') v++;
        v[strcspn(v, "\n")] = 0;
        if (*v) snprintf(buf, n, "%s", v);
        break;
    }
    fclose(f);
}
