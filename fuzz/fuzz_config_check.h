/* What a config that loaded must survive, for the targets whose input
 * holds one (a config file, a plan file's "config"): pt_config_validate,
 * and the JSON written back (into checkpoints and plan files), which must
 * load again and write the same text; abort() otherwise. */
#ifndef PT_FUZZ_CONFIG_CHECK_H
#define PT_FUZZ_CONFIG_CHECK_H

#include <stdlib.h>
#include <string.h>

#include "partrain/train.h"

static inline void fuzz_config_check(const pt_config *c) {
    (void)pt_config_validate(c);
    char *back = pt_config_to_json(c);
    if (!back) return; /* out of memory */
    pt_config again;
    pt_config_defaults(&again);
    if (pt_config_load_string(&again, back, "round trip") != PT_OK) abort();
    char *twice = pt_config_to_json(&again);
    if (!twice || strcmp(back, twice) != 0) abort(); /* the round trip is exact */
    free(twice);
    free(back);
}

#endif
