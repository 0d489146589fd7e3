/* Tensors: a shape and a float32 buffer, owned or viewed. */
#include "partrain/core.h"

#include <stdlib.h>

int64_t pt_shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        if (shape[i] != 0 && n > INT64_MAX / shape[i]) return -1;
        n *= shape[i];
    }
    return n;
}

static pt_status tensor_header(pt_tensor **out, int ndim, const int64_t *shape) {
    *out = NULL;
    if (ndim < 0 || ndim > PT_MAX_DIMS)
        return pt_error_set(PT_ERR_INVALID, "tensor rank %d is outside 0..%d", ndim, PT_MAX_DIMS);
    int64_t n = pt_shape_numel(ndim, shape);
    if (n < 0) return pt_error_set(PT_ERR_INVALID, "tensor shape is negative or too large");
    pt_tensor *t = calloc(1, sizeof *t);
    if (!t) return pt_error_set(PT_ERR_NOMEM, "out of memory for a tensor header");
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->numel = n;
    *out = t;
    return PT_OK;
}

pt_status pt_tensor_new(pt_tensor **out, pt_mem_cat c, int ndim, const int64_t *shape) {
    PT_CHECK(tensor_header(out, ndim, shape));
    pt_tensor *t = *out;
    t->data = pt_mem_alloc(c, (size_t)t->numel * sizeof(float));
    if (!t->data) {
        free(t);
        *out = NULL;
        return PT_ERR_NOMEM;
    }
    t->cat = c;
    t->owns = 1;
    return PT_OK;
}

pt_status pt_tensor_view(pt_tensor **out, float *data, int ndim, const int64_t *shape) {
    PT_CHECK(tensor_header(out, ndim, shape));
    (*out)->data = data;
    (*out)->cat = PT_MEM_SCRATCH;
    return PT_OK;
}

void pt_tensor_free(pt_tensor *t) {
    if (!t) return;
    if (t->owns) pt_mem_free(t->data);
    free(t);
}
