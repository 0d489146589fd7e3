/* Whole small text files (configs, checkpoint state), read into one
 * NUL-terminated buffer with a size cap, so that a wrong path (a model file
 * given as a config) fails with a message instead of eating memory, and a
 * NUL byte (which would silently cut the text short) is refused. */
#include "partrain/core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

pt_status pt_read_text_file(const char *path, size_t max_bytes, char **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return pt_error_set(PT_ERR_IO, "%s: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0;
    pt_status st = PT_OK;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *t = realloc(text, cap);
            if (!t) {
                st = pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
            text = t;
        }
        size_t n = fread(text + len, 1, 4096, f);
        len += n;
        if (len > max_bytes) {
            st = pt_error_set(PT_ERR_FORMAT, "%s: larger than %zu bytes", path, max_bytes);
            break;
        }
        if (n < 4096) break;
    }
    if (st == PT_OK && ferror(f)) st = pt_error_set(PT_ERR_IO, "%s: read error", path);
    fclose(f);
    if (st != PT_OK) {
        free(text);
        return st;
    }
    /* a NUL would end the text early and hide the rest from the parser */
    const char *nul = memchr(text, '\0', len);
    if (nul) {
        pt_status bad = pt_error_set(PT_ERR_FORMAT, "%s: NUL byte at offset %zu: not a text file",
                                     path, (size_t)(nul - text));
        free(text);
        return bad;
    }
    text[len] = '\0';
    *out = text;
    return PT_OK;
}
