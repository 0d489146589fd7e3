/* TEST SEAM, never for training: a trainer whose strategy stack a test may
 * rewrap before the first step, so that the parity harness's self-check can
 * plant a bug in front of a real strategy (tests/parallel/test_plants.h)
 * and show that the harness catches it. Not a public header: the product
 * has no way to reach it. */
#ifndef PT_TRAINER_TEST_H
#define PT_TRAINER_TEST_H

#include "partrain/parallel.h"
#include "partrain/train.h"

/* Called once the stack is built, before the checkpoint lock: may replace
 * entries of stack (pt_stack_find) by wrappers that call them. */
typedef pt_status (*pt_trainer_wrap_fn)(pt_trainer *t, pt_stack *stack, void *arg);

/* pt_trainer_new_dist, then wrap(t, its stack, arg) when wrap is not NULL. */
pt_status pt_trainer_new_wrapped(pt_trainer **out, const pt_config *cfg, pt_comm *world,
                                 pt_trainer_wrap_fn wrap, void *arg);

/* Every rank's parameters, full (laid out like the tp = 1 model's flat
 * buffer, n = pt_trainer_num_params floats), into out on world rank 0;
 * collective. The harness's oracle comparison at every layout, including
 * those that cannot save a checkpoint yet (stale and local SGD under a
 * pipeline). */
pt_status pt_trainer_gather_params(pt_trainer *t, float *out);

/* The bytes this rank wrote in its last checkpoint (of an asynchronous
 * save: once waited for), its share of the files. */
uint64_t pt_trainer_ckpt_written(const pt_trainer *t);

#endif
