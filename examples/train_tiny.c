/* train_tiny: partrain as a library. Trains a tiny GPT-2 on a text the
 * program writes itself, through the public API alone (partrain/train.h),
 * and checks that it learns: the loss of the last steps must be well below
 * the first step's. Built against an installed partrain with pkg-config:
 *
 *   cmake --install build --prefix /tmp/pt
 *   export PKG_CONFIG_PATH=/tmp/pt/lib/pkgconfig
 *   cc -o train_tiny examples/train_tiny.c $(pkg-config --cflags --libs partrain)
 *   LD_LIBRARY_PATH=/tmp/pt/lib ./train_tiny
 *
 * The same config keys as `partrain train --help`, set by pt_config_set. */
#include <stdio.h>
#include <stdlib.h>

#include <partrain/train.h>

/* A learnable text: sentences of a few words in a fixed pseudo-random order. */
static int write_text(const char *path) {
    static const char *words[] = {"the ", "quick ", "brown ", "fox ", "jumps ", "over ",
                                  "the ", "lazy ",  "dog ",   "and ", "runs ",  "away. "};
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    unsigned x = 12345;
    for (int i = 0; i < 40000; i++) {
        x = x * 1664525u + 1013904223u;
        fputs(words[(x >> 24) % 12], f);
    }
    return fclose(f);
}

static int fail(const char *what) {
    fprintf(stderr, "train_tiny: %s: %s\n", what, pt_error_message());
    return 1;
}

int main(void) {
    const char *data = "train_tiny.txt";
    if (write_text(data) != 0) return fail("writing the text");
    pt_config c;
    pt_config_defaults(&c);
    const char *sets[] = {"model.n_layer=2",      "model.n_embd=64",   "model.n_head=4",
                          "model.vocab_size=256", "model.seq_len=32",  "train.batch_size=8",
                          "train.steps=60",       "train.lr=3e-3",     "train.warmup_steps=5",
                          "train.threads=1",      "train.val_every=0", "data.train=train_tiny.txt"};
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
        if (pt_config_set(&c, sets[i]) != PT_OK) return fail(sets[i]);
    pt_trainer *t = NULL;
    if (pt_trainer_new(&t, &c) != PT_OK) return fail("pt_trainer_new");
    double first = 0, last = 0;
    for (int s = 0; s < c.train.steps; s++) {
        pt_step_info info;
        if (pt_trainer_step(t, &info) != PT_OK) {
            pt_trainer_free(t);
            return fail("pt_trainer_step");
        }
        if (s == 0) first = info.loss;
        if (s >= c.train.steps - 10) last += info.loss / 10;
        if (s % 10 == 0 || s == c.train.steps - 1)
            printf("step %2d  loss %.4f  %.0f tok/s\n", info.step, (double)info.loss,
                   info.tokens_per_s);
    }
    pt_trainer_free(t);
    remove(data);
    printf("partrain %s: loss %.3f -> %.3f\n", pt_version(), first, last);
    if (!(last < 0.7 * first)) {
        fprintf(stderr, "train_tiny: did not learn (%.3f -> %.3f)\n", first, last);
        return 1;
    }
    return 0;
}
