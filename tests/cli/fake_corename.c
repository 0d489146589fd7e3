/* LD_PRELOAD shim for test_blas_reexec.sh: makes OpenBLAS report the core
 * Debian's 0.3.21 falls back to on CPU models it does not know ("Prescott")
 * unless OPENBLAS_CORETYPE is set, then the core it names, as OpenBLAS
 * does. Lets the test drive partrain's re-execution on any CPU with AVX2;
 * OpenBLAS's real kernels are not affected. */
#include <stdlib.h>

char *openblas_get_corename(void);

char *openblas_get_corename(void) {
    static char prescott[] = "Prescott";
    char *e = getenv("OPENBLAS_CORETYPE");
    return e && *e ? e : prescott;
}
