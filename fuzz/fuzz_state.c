/* Fuzz target: a checkpoint's state.json (what resume, eval and sample
 * read from a step directory) through pt_ckpt_parse_state, then its
 * readers: pt_ckpt_state_fields (step, data_rng, rank_state) and
 * pt_ckpt_state_files (rank_state.files: the rank-state files and their
 * groups), whose results must hold what they promise, and
 * pt_ckpt_state_config, whose config, when it loads, goes through
 * fuzz_config_check. A NUL byte ends the input as pt_read_text_file would
 * refuse it. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "fuzz_config_check.h"
#include "train_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_text(data, size);
    if (!text) return 0;
    cJSON *root = NULL;
    if (pt_ckpt_parse_state(text, "state.json", &root) == PT_OK) {
        pt_ckpt_state s;
        if (pt_ckpt_state_fields(root, "state.json", &s) == PT_OK &&
            (s.step < 0 || s.optim_t < 0 ||
             (s.rank_state && (s.ranks < 1 || s.pipe_start < 0 || s.pipe_start > s.step))))
            abort();
        pt_ckpt_files f;
        int legacy = 0;
        if (pt_ckpt_state_files(root, "state.json", &f, &legacy) == PT_OK) {
            for (int i = 0; i < f.nf; i++) {
                if (f.f[i].ng < 1 || f.f[i].ng > PT_CKPT_GROUP_MAX ||
                    strlen(f.f[i].name) >= PT_CKPT_FILE_MAX)
                    abort();
                for (int g = 0; g < f.f[i].ng; g++)
                    if (!f.f[i].group[g][0] || strchr(f.f[i].group[g], '/')) abort();
            }
            pt_ckpt_files_deinit(&f);
        }
        pt_config c;
        if (pt_ckpt_state_config(root, "state.json", &c) == PT_OK) fuzz_config_check(&c);
        cJSON_Delete(root);
    }
    free(text);
    return 0;
}
