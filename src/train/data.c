/* The data loader: a whole token file in memory, from UTF-8 text (each byte
 * a token) or llm.c's .bin format (uint16 tokens, or uint32 ones for
 * vocabularies above 65,536), its writer, and the two ways of
 * reading it: random windows drawn from a counter-based RNG (training; the
 * RNG state is the data position saved in checkpoints) and consecutive
 * non-overlapping windows (validation and eval).
 *
 * Which format a file is (checked, since a wrong guess trains on garbage):
 * a file that starts with one of llm.c's magics is a token file whatever
 * its name; a file whose name ends in ".bin" must start with one; anything else is
 * text and must be valid UTF-8 without NUL bytes. The rest is refused with
 * the offset of the first bad byte.
 *
 * Not here: sharding by data-parallel rank (a rank will draw the global batch
 * and take its slice, so that every layout sees the same data). */
#include "parse_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* llm.c's two token files (its dev/data/data_common.py): GPT-2's, and the
 * one it writes for Llama 3's 128,256-token vocabulary. */
#define BIN_MAGIC        20240520 /* version 1, uint16 tokens */
#define BIN_VERSION16    1
#define BIN_MAGIC32      20240801 /* version 7, uint32 tokens */
#define BIN_VERSION32    7
#define BIN_HEADER_INT   256
#define BIN_HEADER_BYTES ((size_t)BIN_HEADER_INT * sizeof(int32_t))

/* Tokens as the file held them: uint16 (text, and 16-bit files: half the
 * memory of uint32) or uint32 (wide). */
struct pt_data {
    char path[PT_CONFIG_STR_MAX];
    void *tokens;
    int wide;
    size_t n;
};

static uint32_t token_at(const pt_data *d, size_t i) {
    return d->wide ? ((const uint32_t *)d->tokens)[i] : ((const uint16_t *)d->tokens)[i];
}

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

/* llm.c's header (bytes 4..11, after the magic): version and token count,
 * and which magic goes with which version and token width. */
static pt_status bin_check_header(const char *path, const int32_t *header, size_t len, int *width) {
    int wide = header[0] == BIN_MAGIC32;
    int want = wide ? BIN_VERSION32 : BIN_VERSION16;
    if (header[1] != want)
        return pt_error_set(PT_ERR_FORMAT,
                            "%s: llm.c .bin version %d is not supported with magic %d (magic %d: "
                            "version %d, uint16 tokens; magic %d: version %d, uint32 tokens)",
                            path, header[1], header[0], BIN_MAGIC, BIN_VERSION16, BIN_MAGIC32,
                            BIN_VERSION32);
    if (header[2] <= 0)
        return pt_error_set(PT_ERR_FORMAT, "%s: empty data file (token count %d)", path, header[2]);
    *width = wide ? 4 : 2;
    size_t ntok = (size_t)header[2], want_len = BIN_HEADER_BYTES + (size_t)*width * ntok;
    if (len != want_len)
        return pt_error_set(PT_ERR_FORMAT,
                            "%s: header says %zu tokens of %d bytes (%zu bytes) but the file has "
                            "%zu bytes",
                            path, ntok, *width, want_len, len);
    return PT_OK;
}

/* The tokens after llm.c's header, each checked against the vocabulary. */
static pt_status parse_bin(pt_data *d, const char *path, const unsigned char *raw, size_t len,
                           int vocab_size) {
    int32_t header[BIN_HEADER_INT];
    memcpy(header, raw, sizeof header);
    int width = 0;
    PT_CHECK(bin_check_header(path, header, len, &width));
    size_t ntok = (size_t)header[2];
    d->n = ntok;
    d->tokens = pt_mem_alloc(PT_MEM_SCRATCH, ntok * (size_t)width);
    if (!d->tokens) return pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
    d->wide = width == 4;
    memcpy(d->tokens, raw + BIN_HEADER_BYTES, ntok * (size_t)width);
    for (size_t i = 0; i < ntok; i++) {
        uint32_t tok = token_at(d, i);
        if (tok >= (uint32_t)vocab_size)
            return pt_error_set(
                PT_ERR_FORMAT, "%s: token %" PRIu32 " at offset %zu (byte %zu) is >= vocab_size %d",
                path, tok, i, BIN_HEADER_BYTES + (size_t)width * i, vocab_size);
    }
    return PT_OK;
}

/* UTF-8 text: each byte a token (held as uint16, as before the 32-bit
 * variant existed). */
static pt_status parse_text(pt_data *d, const char *path, const unsigned char *raw, size_t len,
                            int vocab_size) {
    size_t bad = pt_text_first_bad(raw, len);
    if (bad < len)
        return pt_error_set(PT_ERR_FORMAT,
                            "%s: byte %zu (0x%02x) is %s: not UTF-8 text, and not llm.c tokens "
                            "(no magic %d or %d)",
                            path, bad, raw[bad], raw[bad] ? "not valid UTF-8" : "a NUL", BIN_MAGIC,
                            BIN_MAGIC32);
    d->n = len;
    uint16_t *tok = pt_mem_alloc(PT_MEM_SCRATCH, len * sizeof(uint16_t));
    d->tokens = tok;
    if (!tok) return pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < len; i++) {
        if (raw[i] >= vocab_size)
            return pt_error_set(PT_ERR_FORMAT,
                                "%s: byte %u at offset %zu is >= vocab_size %d (text data needs "
                                "vocab_size 256)",
                                path, raw[i], i, vocab_size);
        tok[i] = raw[i];
    }
    return PT_OK;
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
    int32_t magic = 0;
    if (len >= BIN_HEADER_BYTES) memcpy(&magic, raw, sizeof magic);
    int is_bin = magic == BIN_MAGIC || magic == BIN_MAGIC32;
    if (!is_bin && has_suffix(path, ".bin")) {
        st = pt_error_set(PT_ERR_FORMAT,
                          "%s: a .bin file must be llm.c tokens, but %s (bytes 0-3 must hold the "
                          "magic %d or %d)",
                          path,
                          len < BIN_HEADER_BYTES ? "it is shorter than the 1024-byte header"
                                                 : "it lacks llm.c's magic",
                          BIN_MAGIC, BIN_MAGIC32);
        goto fail;
    }
    st = is_bin ? parse_bin(d, path, raw, len, vocab_size)
                : parse_text(d, path, raw, len, vocab_size);
    if (st != PT_OK) goto fail;
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
    if (d->wide) {
        const uint32_t *p = (const uint32_t *)d->tokens + start;
        for (int t = 0; t < T; t++) { /* each < vocab_size <= INT_MAX: parse_bin checked */
            inputs[t] = (int)p[t];
            targets[t] = (int)p[t + 1];
        }
        return;
    }
    const uint16_t *p = (const uint16_t *)d->tokens + start;
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

/* ---- writing ---- */

pt_status pt_data_write(const char *path, const int *tokens, size_t n) {
    if (n == 0 || n > INT32_MAX)
        return pt_error_set(PT_ERR_INVALID,
                            "%s: %zu tokens: a .bin file holds 1 to 2147483647 (an int32 count)",
                            path, n);
    int wide = 0;
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0)
            return pt_error_set(PT_ERR_INVALID, "%s: token %d at offset %zu is negative", path,
                                tokens[i], i);
        wide |= tokens[i] > UINT16_MAX;
    }
    /* the narrow file whenever it can hold the tokens: llm.c's GPT-2
     * readers take it, and it is half the size */
    int32_t header[BIN_HEADER_INT] = {0};
    header[0] = wide ? BIN_MAGIC32 : BIN_MAGIC;
    header[1] = wide ? BIN_VERSION32 : BIN_VERSION16;
    header[2] = (int32_t)n;
    pt_out *o = NULL;
    PT_CHECK(pt_out_open(&o, path));
    pt_status st = pt_out_write(o, header, sizeof header);
    enum { CHUNK = 4096 };
    union {
        uint16_t u16[CHUNK];
        uint32_t u32[CHUNK];
    } buf;
    for (size_t i = 0; i < n && st == PT_OK; i += CHUNK) {
        size_t k = n - i < CHUNK ? n - i : CHUNK;
        for (size_t j = 0; j < k; j++) {
            if (wide)
                buf.u32[j] = (uint32_t)tokens[i + j];
            else
                buf.u16[j] = (uint16_t)tokens[i + j];
        }
        st = pt_out_write(o, &buf, k * (wide ? 4 : 2));
    }
    if (st != PT_OK) {
        pt_out_abort(o);
        return st;
    }
    return pt_out_commit(o);
}
