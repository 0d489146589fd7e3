/* Writes a token file for the vocabulary tests through pt_data_write (so
 * the narrow or the wide llm.c file, whichever the ids need):
 *   make_tokens OUT N VOCAB DISTINCT SEED
 * N tokens drawn from DISTINCT ids spread evenly over [0, VOCAB) (the
 * last of them VOCAB - 1, so a vocabulary above 65,536 puts ids past a
 * uint16 in the file), by a counter-based RNG: the same file for the
 * same arguments. Few distinct ids make a corpus a tiny model learns in a
 * few steps. */
#include <stdio.h>
#include <stdlib.h>

#include "partrain/core.h"
#include "partrain/train.h"

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: make_tokens OUT N VOCAB DISTINCT SEED\n");
        return 2;
    }
    long n = atol(argv[2]), vocab = atol(argv[3]), distinct = atol(argv[4]);
    if (n < 1 || vocab < 1 || distinct < 1 || distinct > vocab) {
        fprintf(stderr, "make_tokens: bad N, VOCAB or DISTINCT\n");
        return 2;
    }
    int *tok = malloc((size_t)n * sizeof *tok);
    if (!tok) return 1;
    pt_rng r;
    pt_rng_init(&r, (uint64_t)atoll(argv[5]), "make_tokens");
    for (long i = 0; i < n; i++) {
        long k = (long)pt_rng_below(&r, (uint64_t)distinct); /* the k-th of the ids */
        tok[i] = distinct == 1 ? (int)(vocab - 1) : (int)(k * (vocab - 1) / (distinct - 1));
    }
    pt_status st = pt_data_write(argv[1], tok, (size_t)n);
    free(tok);
    if (st != PT_OK) {
        fprintf(stderr, "make_tokens: %s\n", pt_error_message());
        return 1;
    }
    return 0;
}
