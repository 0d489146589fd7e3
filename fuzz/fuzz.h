/* The entry point every harness in fuzz/ defines: libFuzzer's, so that the
 * same file links against libFuzzer (scripts/fuzz.sh) or against
 * fuzz_main.c, which replays saved inputs in the quick test tier. */
#ifndef PT_FUZZ_H
#define PT_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input as NUL-terminated text (malloc'd; the caller frees), or NULL
 * when it holds a NUL byte (pt_read_text_file refuses those before any
 * parser sees them) or memory runs out. */
static inline char *fuzz_text(const uint8_t *data, size_t size) {
    if (memchr(data, 0, size)) return NULL;
    char *text = malloc(size + 1);
    if (!text) return NULL;
    memcpy(text, data, size);
    text[size] = '\0';
    return text;
}

#endif
