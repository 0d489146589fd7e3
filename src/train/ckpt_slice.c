/* Checkpoints by tensor-parallel slice: the writer that assembles every tp
 * rank's slices into the full GPT-2 tensors, and the reader that loads one
 * rank's slice from a full-tensor safetensors file, seeking to the rows and
 * columns it holds. Which elements a slice holds is shard.c's description
 * (pt_shard_run), the same one that init uses, so that a checkpoint saved at
 * one tp degree loads at any other. The padding rows of a vocabulary that
 * tp does not divide are in no run: never written, zeroed on reading.
 *
 * Checks are not repeated here: the reader parses the header with parse.c's
 * parsers (pt_st_read_header) and matches it against the FULL model's
 * tensor table (pt_st_match: names, dtypes, shapes, tiling), exactly as
 * pt_safetensors_load does; the writer writes through pt_safetensors_save.
 *
 * Not here: the trainer's checkpoints, which every rank writes and reads
 * by slice in place, in parallel (ckpt_impl.h); the checkpoint directory
 * (ckpt_dir.c). */
#include "parse_impl.h"
#include "train_impl.h"

#include <stdio.h>
#include <string.h>
#include <sys/types.h>

/* Scatter tensor i's slice `part` (laid out like slice's flat buffer) into
 * its place in `whole` (laid out like full's). */
static void scatter_slice(const pt_model *full, const pt_model *slice, int i, float *whole,
                          const float *part) {
    const pt_param_info *ft = pt_model_tensor(full, i), *st = pt_model_tensor(slice, i);
    size_t nruns = pt_shard_num_runs(&st->shard);
    for (size_t k = 0; k < nruns; k++) {
        size_t g, l, len;
        pt_shard_run(&st->shard, k, &g, &l, &len);
        PT_ASSERT(g + len <= ft->numel && l + len <= st->numel);
        memcpy(whole + ft->offset + g, part + st->offset + l, len * sizeof(float));
    }
}

pt_status pt_safetensors_save_slices(const char *path, const pt_model *m,
                                     const float *const *bufs) {
    int t, r;
    pt_model_tp(m, &t, &r);
    const pt_model_config *cfg = pt_model_config_of(m);
    pt_model *full = NULL, *slice = NULL;
    float *whole = NULL;
    pt_status st = PT_OK;
    PT_CHECK_GOTO(st, pt_model_new_slice(&full, cfg, 0, 1, 0), done);
    whole = pt_mem_alloc(PT_MEM_SCRATCH, pt_model_num_params(full) * sizeof(float));
    if (!whole) {
        st = pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    for (int q = 0; q < t; q++) {
        PT_ASSERT(bufs[q]);
        PT_CHECK_GOTO(st, pt_model_new_slice(&slice, cfg, 0, t, q), done);
        for (int i = 0; i < pt_model_num_tensors(full); i++)
            if (q == 0 || pt_model_tensor(slice, i)->shard.split_dim >= 0)
                scatter_slice(full, slice, i, whole, bufs[q]);
        pt_model_free(slice);
        slice = NULL;
    }
    st = pt_safetensors_save(path, full, whole);
done:
    pt_model_free(slice);
    pt_mem_free(whole);
    pt_model_free(full);
    return st;
}

/* Read len floats at element `at` of the tensor whose data begin at byte
 * `begin` of the data section. */
static pt_status read_run(FILE *f, const char *path, const pt_st_header *h, const pt_st_entry *e,
                          size_t at, float *dst, size_t len) {
    uint64_t pos = h->data_start + e->begin + (uint64_t)at * sizeof(float);
    if (fseeko(f, (off_t)pos, SEEK_SET) != 0 || fread(dst, sizeof(float), len, f) != len)
        return pt_error_set(PT_ERR_IO, "%s: read error in tensor '%s'", path, e->name);
    return PT_OK;
}

pt_status pt_safetensors_load_slice(const char *path, const pt_model *m, float *buf) {
    pt_model *full = NULL;
    PT_CHECK(pt_model_new_slice(&full, pt_model_config_of(m), 0, 1, 0));
    FILE *f = NULL;
    pt_st_header h;
    pt_status st = pt_st_read_header(path, &f, &h);
    if (st != PT_OK) {
        pt_model_free(full);
        return st;
    }
    /* a group without a buffer: matched against the full shapes, placed
     * here by slice */
    pt_ckpt_group g = {"", NULL};
    st = pt_st_match(path, &h, full, NULL, &g, 1);
    /* entries are sorted by offset and runs by index: one forward pass */
    for (int j = 0; st == PT_OK && j < h.n; j++) {
        const pt_st_entry *e = &h.entries[j];
        if (e->tensor < 0) continue; /* a buffer that is not a parameter */
        const pt_param_info *ft = pt_model_tensor(full, e->tensor);
        const pt_param_info *lt = pt_model_find(m, ft->name);
        if (!lt) continue; /* a module another pipeline stage holds */
        PT_ASSERT((e->end - e->begin) / sizeof(float) == ft->numel);
        size_t nruns = pt_shard_num_runs(&lt->shard);
        for (size_t k = 0; st == PT_OK && k < nruns; k++) {
            size_t gi, li, len;
            pt_shard_run(&lt->shard, k, &gi, &li, &len);
            PT_ASSERT(gi + len <= ft->numel && li + len <= lt->numel);
            st = read_run(f, path, &h, e, gi, buf + lt->offset + li, len);
        }
        /* the padding rows at the slice's end are in no file: zero them, so
         * that a loaded slice does not depend on what the buffer held */
        size_t width = lt->ndim == 2 ? (size_t)lt->shape[1] : 1;
        size_t npad = (size_t)lt->shard.pad * width;
        PT_ASSERT(npad <= lt->numel);
        if (st == PT_OK && npad)
            memset(buf + lt->offset + lt->numel - npad, 0, npad * sizeof(float));
    }
    pt_st_header_deinit(&h);
    fclose(f);
    pt_model_free(full);
    return st;
}
