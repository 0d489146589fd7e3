/* The counting allocator: every sizeable block is charged to a category so
 * that memory can be reported per category, current and peak. A 64-byte
 * header in front of each block records its size and category.
 *
 * Not here: pooling or reuse. Callers allocate up front (STYLE rule 10), so
 * the allocator's own speed does not matter. */
#include "partrain/core.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define PT_MEM_ALIGN 64

typedef struct {
    size_t bytes;
    int cat;
    uint32_t magic;
} mem_header;

#define MEM_MAGIC 0x70746d6du /* "ptmm" */

_Static_assert(sizeof(mem_header) <= PT_MEM_ALIGN, "header fits in the alignment pad");

static _Atomic size_t cur_bytes[PT_MEM_NCAT];
static _Atomic size_t peak_bytes[PT_MEM_NCAT];
static _Atomic size_t cur_total;
static _Atomic size_t peak_total;
static _Atomic long fail_countdown;

static const char *const cat_names[] = {
#define PT_X_NAME(name, str) str,
    PT_MEM_CATEGORY_LIST(PT_X_NAME)
#undef PT_X_NAME
};

const char *pt_mem_cat_name(pt_mem_cat c) {
    return (c >= 0 && c < PT_MEM_NCAT) ? cat_names[c] : "unknown";
}

static void raise_peak(_Atomic size_t *peak, size_t now) {
    size_t old = atomic_load(peak);
    while (now > old && !atomic_compare_exchange_weak(peak, &old, now)) {
    }
}

void *pt_mem_alloc(pt_mem_cat c, size_t bytes) {
    PT_ASSERT(c >= 0 && c < PT_MEM_NCAT);
    long n = atomic_load(&fail_countdown);
    if (n > 0 && atomic_fetch_sub(&fail_countdown, 1) == 1) {
        pt_error_set(PT_ERR_NOMEM, "out of memory allocating %zu bytes of %s (injected)", bytes,
                     cat_names[c]);
        return NULL;
    }
    size_t padded = (bytes + PT_MEM_ALIGN - 1) / PT_MEM_ALIGN * PT_MEM_ALIGN;
    if (padded < bytes || padded > SIZE_MAX - PT_MEM_ALIGN) {
        pt_error_set(PT_ERR_NOMEM, "allocation of %zu bytes of %s is too large", bytes,
                     cat_names[c]);
        return NULL;
    }
    char *base = aligned_alloc(PT_MEM_ALIGN, padded + PT_MEM_ALIGN);
    if (!base) {
        pt_error_set(PT_ERR_NOMEM, "out of memory allocating %zu bytes of %s", bytes, cat_names[c]);
        return NULL;
    }
    mem_header *h = (mem_header *)base;
    h->bytes = bytes;
    h->cat = (int)c;
    h->magic = MEM_MAGIC;
    memset(base + PT_MEM_ALIGN, 0, bytes);
    raise_peak(&peak_bytes[c], atomic_fetch_add(&cur_bytes[c], bytes) + bytes);
    raise_peak(&peak_total, atomic_fetch_add(&cur_total, bytes) + bytes);
    return base + PT_MEM_ALIGN;
}

void pt_mem_free(void *p) {
    if (!p) return;
    mem_header *h = (mem_header *)((char *)p - PT_MEM_ALIGN);
    PT_ASSERT(h->magic == MEM_MAGIC);
    h->magic = 0;
    atomic_fetch_sub(&cur_bytes[h->cat], h->bytes);
    atomic_fetch_sub(&cur_total, h->bytes);
    free(h);
}

size_t pt_mem_current(pt_mem_cat c) {
    return atomic_load(&cur_bytes[c]);
}

size_t pt_mem_peak(pt_mem_cat c) {
    return atomic_load(&peak_bytes[c]);
}

size_t pt_mem_current_total(void) {
    return atomic_load(&cur_total);
}

size_t pt_mem_peak_total(void) {
    return atomic_load(&peak_total);
}

void pt_mem_reset_peak(void) {
    for (int c = 0; c < PT_MEM_NCAT; c++) atomic_store(&peak_bytes[c], atomic_load(&cur_bytes[c]));
    atomic_store(&peak_total, atomic_load(&cur_total));
}

void pt_mem_fail_after(long n) {
    atomic_store(&fail_countdown, n > 0 ? n : 0);
}
