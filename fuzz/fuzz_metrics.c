/* Fuzz target: a metrics file's text (what `partrain report RUN_DIR`
 * reads, log.metrics' JSON lines) through pt_report_run_parse: every line
 * parsed on its own, each field checked for type and range, the per-rank
 * tables indexed by what the lines say; then the report's data built from
 * it (pt_report_data_json), which must be JSON again. Any bytes, NUL
 * included: the reader takes the file as it is. */
#include <cjson/cJSON.h>
#include <stdlib.h>

#include "fuzz.h"
#include "partrain/report.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pt_report_run *r = NULL;
    if (pt_report_run_parse(&r, (const char *)data, size, "fuzz.jsonl") != PT_OK) return 0;
    char *json = pt_report_data_json(&r, 1);
    if (json) {
        cJSON *back = cJSON_Parse(json);
        if (!back) abort(); /* the page could not read its own data */
        cJSON_Delete(back);
        free(json);
    }
    pt_report_run_free(r);
    return 0;
}
