/* Fuzz target: a whole safetensors file in memory, through the code that
 * pt_safetensors_load runs on files (pt_st_load_buffer: header length,
 * header parse and checks, match against a tiny model, copy), then the
 * shape inference of a bare checkpoint (pt_st_model_config). The seed
 * corpus holds real checkpoints of the same tiny model, so that mutations
 * start from files that get all the way to the copy. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "parse_impl.h"

static const pt_model_config tiny = {1, 8, 2, 16, 4}; /* L, C, NH, V, T */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static pt_model *m;
    if (!m && pt_model_new(&m, &tiny, 1) != PT_OK) abort();
    pt_ckpt_group g = {"", pt_model_params(m)};
    (void)pt_st_load_buffer("fuzz.safetensors", data, size, m, NULL, &g, 1);
    /* a rank file's groups: prefixes and required metadata */
    static float second[4096];
    if (pt_model_num_params(m) > sizeof second / sizeof second[0]) abort();
    pt_ckpt_group gs[2] = {{"m", pt_model_params(m)}, {"v", second}};
    static const char *const want[] = {"rank", "0", NULL};
    (void)pt_st_load_buffer("fuzz.safetensors", data, size, m, want, gs, 2);

    uint64_t hlen;
    if (size < 8 || pt_st_header_len("fuzz", data, size, &hlen) != PT_OK) return 0;
    char *json = malloc((size_t)hlen + 1);
    if (!json) return 0;
    memcpy(json, data + 8, (size_t)hlen);
    json[hlen] = '\0';
    pt_st_header h;
    if (pt_st_header_parse("fuzz", json, (size_t)hlen, size, &h) == PT_OK) {
        pt_model_config mc;
        (void)pt_st_model_config("fuzz", &h, &mc);
        pt_st_header_deinit(&h);
    }
    free(json);
    return 0;
}
