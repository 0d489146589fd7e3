/* Fuzz target: a cluster description's text through pt_cluster_load_string
 * (JSON, unknown and duplicate keys, every field's type and range, the
 * profile's tables) and, when it loads, the JSON written back, which must
 * load again and write the same text. A NUL byte ends the input as
 * pt_read_text_file would refuse it. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "partrain/plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_text(data, size);
    if (!text) return 0;
    pt_cluster *c = NULL;
    if (pt_cluster_load_string(&c, text, "fuzz.json") == PT_OK) {
        char *back = pt_cluster_to_json(c);
        if (back) {
            pt_cluster *again = NULL;
            if (pt_cluster_load_string(&again, back, "round trip") != PT_OK) abort();
            char *twice = pt_cluster_to_json(again);
            if (!twice || strcmp(back, twice) != 0) abort(); /* the round trip is exact */
            free(twice);
            free(back);
            pt_cluster_free(again);
        }
        pt_cluster_free(c);
    }
    free(text);
    return 0;
}
