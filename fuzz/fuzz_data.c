/* Fuzz target: a data file's bytes through pt_data_parse (the .bin/text
 * rule, llm.c's two headers (uint16 and uint32 tokens), UTF-8, vocabulary), then reads of every
 * window and of sampled windows when the file is long enough. The first input byte picks the file
 * name's suffix and the vocabulary, so that both names and small vocabularies are reached. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "parse_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *name = data[0] & 1 ? "fuzz.bin" : "fuzz.txt";
    /* bit 3: Llama 3's vocabulary, for llm.c's uint32 token files */
    int vocab = data[0] & 8 ? 128256 : data[0] & 2 ? 256 : (data[0] & 4 ? 50257 : 100);
    unsigned char *raw = malloc(size); /* taken over by pt_data_parse */
    if (!raw) return 0;
    memcpy(raw, data + 1, size - 1);
    pt_data *d = NULL;
    if (pt_data_parse(&d, name, raw, size - 1, vocab) != PT_OK) return 0;
    enum { T = 4 };
    int x[2 * T], y[2 * T];
    size_t nw = pt_data_num_windows(d, T);
    for (size_t w = 0; w < nw; w++) {
        pt_data_window(d, w, T, x, y);
        for (int t = 0; t < T; t++)
            if (x[t] < 0 || x[t] >= vocab || y[t] < 0 || y[t] >= vocab) abort();
    }
    if (pt_data_num_tokens(d) >= T + 1) {
        pt_rng r;
        pt_rng_init(&r, 1, "fuzz");
        pt_data_sample(d, &r, 2, T, x, y);
    }
    pt_data_free(d);
    return 0;
}
