/* Private to the train layer: the checkpoint directory protocol used by the
 * trainer (checkpoint.c). */
#ifndef PT_TRAIN_IMPL_H
#define PT_TRAIN_IMPL_H

#include <cjson/cJSON.h>

#include "partrain/train.h"

/* mkdir -p */
pt_status pt_mkdir_p(const char *dir);
/* Write DIR/step_NNNNNNNN (model parameters `params`, full-length and laid
 * out like m's flat buffer; optimizer moments when adam_m is non-NULL;
 * state.json with state_json's text) through a temporary directory, fsync
 * and rename, then point DIR/latest at it. */
pt_status pt_ckpt_write(const char *dir, int step, const pt_model *m, const float *params,
                        const float *adam_m, const float *adam_v, const char *state_json);
/* Parse a step directory's state.json (caller deletes *out). */
pt_status pt_ckpt_read_state(const char *stepdir, cJSON **out);

#endif
