/* Private to the train layer: the parsers of untrusted bytes (safetensors
 * headers, data files), working on memory so that the fuzzers in fuzz/ run
 * exactly the code that the file readers run. The file readers
 * (checkpoint.c, data.c) only open, size and read files, then call these.
 *
 * Every function here treats its input as hostile: each number is checked
 * for range and integrality before it is converted, each length before it
 * is used, and a failure is one pt_error_set line naming `what` (the file)
 * and the offending tensor or byte offset. */
#ifndef PT_PARSE_IMPL_H
#define PT_PARSE_IMPL_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "partrain/model.h"
#include "partrain/train.h"
#include "train_impl.h"

/* ---- text ---- */

/* Offset of the first byte of buf[0, n) that is a NUL or not part of
 * strictly valid UTF-8 (no overlong forms, no surrogates, nothing above
 * U+10FFFF, no sequence cut off by the end); n when there is none. */
size_t pt_text_first_bad(const unsigned char *buf, size_t n);

/* ---- safetensors headers ---- */

#define PT_ST_MAX_HEADER (100u << 20) /* the reference implementation's limit */
#define PT_ST_MAX_DIMS   8

typedef struct {
    const char *name; /* into the header's cJSON tree */
    char dtype[8];
    int ndim;
    int64_t shape[PT_ST_MAX_DIMS];
    uint64_t begin, end; /* byte offsets into the data section */
    float *dst;          /* pt_st_match: where its data go (NULL: skipped) */
    int tensor;          /* pt_st_match: the model tensor it holds (-1: a skipped buffer) */
    int group;           /* pt_st_match: the group it belongs to */
} pt_st_entry;

typedef struct {
    cJSON *root;
    const cJSON *meta;    /* "__metadata__" (an object of strings), or NULL */
    pt_st_entry *entries; /* sorted by begin: they tile the data section */
    int n;
    uint64_t data_start; /* 8 + the header length */
    uint64_t data_size;
} pt_st_header;

/* The header length from a file's first 8 bytes, checked against the file
 * size (at least 2, at most PT_ST_MAX_HEADER, inside the file). */
pt_status pt_st_header_len(const char *what, const unsigned char first8[8], uint64_t file_size,
                           uint64_t *hlen);
/* Parse and check the hlen header bytes of a file of file_size bytes
 * (hlen already checked by pt_st_header_len): UTF-8 without NUL, one JSON
 * object (then only whitespace), no duplicate names, __metadata__ of
 * strings, every entry a known dtype with a shape and offsets that agree,
 * and the entries tiling the data section exactly (sorted by offset:
 * contiguous from 0, no gap, no overlap, ending at the file's end), as the
 * safetensors reference implementation requires. On success h owns a
 * cJSON tree (pt_st_header_deinit); on failure h is empty. */
pt_status pt_st_header_parse(const char *what, const char *json, size_t hlen, uint64_t file_size,
                             pt_st_header *h);
void pt_st_header_deinit(pt_st_header *h);

/* Match the header against ng groups of the model's tensors: every model
 * tensor of every group present once, as F32 of its shape; GPT-2's
 * "transformer." prefix and attention-mask buffers accepted; anything else
 * an error. Sets each entry's dst (NULL for a skipped buffer, and for every
 * entry of a group whose buf is NULL: matched, not placed) and tensor.
 * __metadata__ must hold meta_want's key, value pairs (NULL-terminated;
 * NULL: none). */
pt_status pt_st_match(const char *what, pt_st_header *h, const pt_model *m,
                      const char *const *meta_want, const pt_ckpt_group *groups, int ng);

/* Open path and parse its header into h (pt_st_header_len, then
 * pt_st_header_parse); *fp stays open, positioned after the header, on
 * success (the caller closes it and deinits h). */
pt_status pt_st_read_header(const char *path, FILE **fp, pt_st_header *h);

/* The model shape of a bare GPT-2-style file (no state.json): V and C from
 * wte, T from wpe, L from the highest h.<i>., and NH from __metadata__
 * "n_head" (which partrain writes; it cannot be read from shapes: refused
 * when absent). */
pt_status pt_st_model_config(const char *what, const pt_st_header *h, pt_model_config *mc);

/* Parse a whole safetensors file held in memory into groups (what
 * pt_st_read_groups does with a file): for the fuzzer and tests. */
pt_status pt_st_load_buffer(const char *what, const unsigned char *buf, size_t len,
                            const pt_model *m, const char *const *meta_want,
                            const pt_ckpt_group *groups, int ng);

/* ---- data files ---- */

/* Build a data set from a file's bytes (raw[0, len), taken over: freed
 * here on every path). `path` names the file (its .bin suffix matters). */
pt_status pt_data_parse(pt_data **out, const char *path, unsigned char *raw, size_t len,
                        int vocab_size);

#endif
