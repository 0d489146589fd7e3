/* Private to the planner's JSON readers (cluster.c, planfile.c): what they
 * share in their messages.
 *
 * Not here: the readers themselves. */
#ifndef PT_PLAN_JSON_IMPL_H
#define PT_PLAN_JSON_IMPL_H

#include <cjson/cJSON.h>

/* "a number", "a string", "a boolean", "an array", "an object" or "null":
 * what a JSON value is, for a message that names what was found where
 * something else was wanted (cluster.c). */
const char *pt_plan_json_kind(const cJSON *x);

#endif
