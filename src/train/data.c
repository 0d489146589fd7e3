/* The data loader: a whole token file in memory (uint16 tokens), from UTF-8
 * text (each byte a token) or llm.c's .bin format, and the two ways of
 * reading it: random windows drawn from a counter-based RNG (training; the
 * RNG state is the data position saved in checkpoints) and consecutive
 * non-overlapping windows (validation and eval).
 *
 * Which format a file is (checked, since a wrong guess trains on garbage):
 * a file that starts with llm.c's magic is a token file whatever its name;
 * a file whose name ends in ".bin" must start with it; anything else is
 * text and must be valid UTF-8 without NUL bytes. The rest is refused with
 * the offset of the first bad byte.
 *
 * Not here: sharding by data-parallel rank (a rank will draw the global batch
 * and take its slice, so that every layout sees the same data). */
#include "parse_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define BIN_MAGIC      20240520
#define BIN_HEADER_INT 256

struct pt_data {
    char path[PT_CONFIG_STR_MAX];
    uint16_t *tokens;
    size_t n;
};

void pt_data_free(pt_data *d) {
    if (!d) return;
    pt_mem_free(d->tokens);
    free(d);
}

static pt_status read_all(const char *path, unsigned char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    FILE *f = NULL;
    uint64_t fsize = 0;
    PT_CHECK(pt_file_open_regular(path, &f, &fsize)); /* a FIFO would block a plain fopen */
    pt_status st = PT_OK;
    long size = (long)fsize;
    unsigned char *buf = malloc((size_t)size + 1);
    if (!buf) {
        st = pt_error_set(PT_ERR_NOMEM, "%s: out of memory (%ld bytes)", path, size);
        goto done;
    }
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        free(buf);
        st = pt_error_set(PT_ERR_IO, "%s: read error", path);
        goto done;
    }
    *out = buf;
    *len = (size_t)size;
done:
    fclose(f);
    return st;
}

pt_status pt_data_open(pt_data **out, const char *path, int vocab_size) {
    *out = NULL;
    if (!path || !*path) return pt_error_set(PT_ERR_INVALID, "no data file given");
    unsigned char *raw = NULL;
    size_t len = 0;
    PT_CHECK(read_all(path, &raw, &len));
    return pt_data_parse(out, path, raw, len, vocab_size);
}

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

pt_status pt_data_parse(pt_data **out, const char *path, unsigned char *raw, size_t len,
                        int vocab_size) {
    *out = NULL;
    pt_status st = PT_OK;
    pt_data *d = calloc(1, sizeof *d);
    if (!d) {
        free(raw);
        return pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
    }
    snprintf(d->path, sizeof d->path, "%s", path);
    if (len == 0) {
        st = pt_error_set(PT_ERR_FORMAT, "%s: empty data file", path);
        goto fail;
    }
    int32_t header[BIN_HEADER_INT];
    int is_bin = 0;
    if (len >= sizeof header) {
        memcpy(header, raw, sizeof header);
        is_bin = header[0] == BIN_MAGIC;
    }
    if (!is_bin && has_suffix(path, ".bin")) {
        st = pt_error_set(PT_ERR_FORMAT,
                          "%s: a .bin file must be llm.c tokens, but %s (bytes 0-3 must hold the "
                          "magic %d)",
                          path,
                          len < sizeof header ? "it is shorter than the 1024-byte header"
                                              : "it lacks llm.c's magic",
                          BIN_MAGIC);
        goto fail;
    }
    if (is_bin) {
        if (header[1] != 1) {
            st = pt_error_set(PT_ERR_FORMAT,
                              "%s: llm.c .bin version %d is not supported (1: uint16)", path,
                              header[1]);
            goto fail;
        }
        if (header[2] <= 0) {
            st = pt_error_set(PT_ERR_FORMAT, "%s: empty data file (token count %d)", path,
                              header[2]);
            goto fail;
        }
        size_t ntok = (size_t)header[2];
        if (len != sizeof header + 2 * ntok) {
            st = pt_error_set(PT_ERR_FORMAT,
                              "%s: header says %zu tokens (%zu bytes) but the file has %zu bytes",
                              path, ntok, sizeof header + 2 * ntok, len);
            goto fail;
        }
        d->n = ntok;
        d->tokens = pt_mem_alloc(PT_MEM_SCRATCH, ntok * sizeof(uint16_t));
        if (!d->tokens) {
            st = pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
            goto fail;
        }
        memcpy(d->tokens, raw + sizeof header, ntok * sizeof(uint16_t));
        for (size_t i = 0; i < ntok; i++)
            if (d->tokens[i] >= vocab_size) {
                st = pt_error_set(PT_ERR_FORMAT,
                                  "%s: token %u at offset %zu (byte %zu) is >= vocab_size %d", path,
                                  d->tokens[i], i, sizeof header + 2 * i, vocab_size);
                goto fail;
            }
    } else {
        size_t bad = pt_text_first_bad(raw, len);
        if (bad < len) {
            st = pt_error_set(PT_ERR_FORMAT,
                              "%s: byte %zu (0x%02x) is %s: not UTF-8 text, and not llm.c tokens "
                              "(no magic %d)",
                              path, bad, raw[bad], raw[bad] ? "not valid UTF-8" : "a NUL",
                              BIN_MAGIC);
            goto fail;
        }
        d->n = len;
        d->tokens = pt_mem_alloc(PT_MEM_SCRATCH, len * sizeof(uint16_t));
        if (!d->tokens) {
            st = pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
            goto fail;
        }
        for (size_t i = 0; i < len; i++) {
            if (raw[i] >= vocab_size) {
                st = pt_error_set(PT_ERR_FORMAT,
                                  "%s: byte %u at offset %zu is >= vocab_size %d (text data needs "
                                  "vocab_size 256)",
                                  path, raw[i], i, vocab_size);
                goto fail;
            }
            d->tokens[i] = raw[i];
        }
    }
    free(raw);
    *out = d;
    return PT_OK;
fail:
    free(raw);
    pt_data_free(d);
    return st;
}

size_t pt_data_num_tokens(const pt_data *d) {
    return d->n;
}
const char *pt_data_path(const pt_data *d) {
    return d->path;
}

static void copy_window(const pt_data *d, size_t start, int T, int *inputs, int *targets) {
    const uint16_t *p = d->tokens + start;
    for (int t = 0; t < T; t++) {
        inputs[t] = p[t];
        targets[t] = p[t + 1];
    }
}

void pt_data_sample(const pt_data *d, pt_rng *rng, int B, int T, int *inputs, int *targets) {
    PT_ASSERT(d->n >= (size_t)T + 1);
    uint64_t nstarts = d->n - (size_t)T; /* starts 0 .. n-T-1 */
    for (int b = 0; b < B; b++) {
        size_t start = (size_t)pt_rng_below(rng, nstarts);
        copy_window(d, start, T, inputs + (size_t)b * T, targets + (size_t)b * T);
    }
}

size_t pt_data_num_windows(const pt_data *d, int T) {
    return d->n / ((size_t)T + 1);
}

void pt_data_window(const pt_data *d, size_t w, int T, int *inputs, int *targets) {
    PT_ASSERT(w < pt_data_num_windows(d, T));
    copy_window(d, w * ((size_t)T + 1), T, inputs, targets);
}
