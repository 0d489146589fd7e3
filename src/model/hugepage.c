/* Transparent huge pages for the model's large buffers.
 *
 * The step's matrix products walk activations row by row with
 * row strides of 1.5-6 KiB, so with 4 KiB pages nearly every row of a packed
 * panel is a TLB miss; this machine's THP mode is "madvise", so nothing got
 * huge pages unless asked. Measured (OpenBLAS alone, small's nine linear
 * shapes, 1 thread): 136-145 -> 127-131 ms.
 *
 * Activations and backward scratch only: with parameters and gradients in
 * huge pages too, AdamW's pass (param, grad, m, v at equal offsets) took
 * 4.3-4.9% of small's step instead of 1.6-2.6%, more than the products gained.
 *
 * The buffers come from pt_mem_alloc already zeroed (faulted in as 4 KiB
 * pages), so MADV_HUGEPAGE alone would wait for khugepaged; MADV_COLLAPSE
 * (Linux 6.1+) collapses them now. Advice only: any failure (older kernel,
 * THP off, no 2 MiB run inside the buffer, not Linux) leaves the buffer as
 * it was and is ignored. */
#define _DEFAULT_SOURCE /* madvise under -std=c11 */
#include "model_impl.h"

#include <stdint.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#define HUGE_BYTES ((uintptr_t)2 << 20)

void pt_model_advise_huge(void *p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    uintptr_t lo = ((uintptr_t)p + HUGE_BYTES - 1) & ~(HUGE_BYTES - 1);
    uintptr_t hi = ((uintptr_t)p + bytes) & ~(HUGE_BYTES - 1);
    if (!p || hi <= lo) return;
    if (madvise((void *)lo, hi - lo, MADV_HUGEPAGE) != 0) return;
#if defined(MADV_COLLAPSE)
    (void)madvise((void *)lo, hi - lo, MADV_COLLAPSE);
#else
    (void)madvise((void *)lo, hi - lo, 25); /* MADV_COLLAPSE, older headers */
#endif
#else
    (void)p, (void)bytes;
#endif
}
