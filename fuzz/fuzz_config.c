/* Fuzz target: a config file's text through pt_config_load_string (the
 * JSON, duplicate and trailing-content checks, the key table, ranges) and,
 * when it loads, pt_config_validate and the JSON written back into
 * checkpoints, which must load again to the same values. A NUL byte ends
 * the input as pt_read_text_file would refuse it. */
#include <stdlib.h>

#include "fuzz.h"
#include "fuzz_config_check.h"
#include "partrain/train.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_text(data, size);
    if (!text) return 0;
    pt_config c;
    pt_config_defaults(&c);
    if (pt_config_load_string(&c, text, "fuzz.json") == PT_OK) fuzz_config_check(&c);
    free(text);
    return 0;
}
