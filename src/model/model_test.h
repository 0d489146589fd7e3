/* The model's test seams: private to the model layer, for the tests and
 * the trainer's PT_TEST_PLANT (parallel.h) only, never for training. Not
 * in the public header, so that no caller mistakes them for an option. */
#ifndef PT_MODEL_TEST_H
#define PT_MODEL_TEST_H

#include "partrain/model.h"

/* PT_PLANT_TP_SKIP_F: on, the block's input-gradient pass skips the sum
 * over the tensor-parallel group of c_attn's input gradient (Megatron's f),
 * so that the parity tests and test_model_tp can show they catch it. */
void pt_model_test_skip_f(pt_model *m, int on);

#endif
