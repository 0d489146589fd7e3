/* Fuzz target: a plan file's text (what `partrain train --plan FILE`
 * reads) through pt_plan_file_load_string: the JSON, its "plan" section,
 * its "config" object and everything pt_config_load_string checks in it,
 * and the layout the plan names against the config's; when it loads,
 * pt_config_validate and the config written back, which must load again
 * and write the same text. A NUL byte ends the input as
 * pt_read_text_file would refuse it. */
#include <stdlib.h>

#include "fuzz.h"
#include "fuzz_config_check.h"
#include "partrain/plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_text(data, size);
    if (!text) return 0;
    pt_config c;
    pt_config_defaults(&c);
    if (pt_plan_file_load_string(text, "fuzz.json", &c) == PT_OK) fuzz_config_check(&c);
    free(text);
    return 0;
}
