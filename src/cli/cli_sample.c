/* partrain sample: generate bytes from a byte-level checkpoint, starting
 * from a prompt, with temperature and top-k sampling from a seeded
 * counter-based RNG (the same seed gives the same text). No KV cache: each
 * new token re-runs the model over the last seq_len tokens, which is plenty
 * for the small models this trains. */
#include "cli_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/kernels.h"
#include "partrain/train.h"

static void usage(FILE *f) {
    fprintf(f, "usage: partrain sample --checkpoint DIR --prompt TEXT [--tokens N] "
               "[--temperature X] [--top-k K] [--seed S]\n\n"
               "  --checkpoint DIR  checkpoint directory (with 'latest') or one step directory\n"
               "  --prompt TEXT     the start of the text (bytes)\n"
               "  --tokens N        tokens to generate (default 200)\n"
               "  --temperature X   softmax temperature; 0 = greedy (default 1.0)\n"
               "  --top-k K         sample among the K most likely tokens; 0 = all (default 0)\n"
               "  --seed S          sampling seed (default 1337)\n"
               "  --threads N       kernel threads (default 1)\n");
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* Pick a token from logits (V) with temperature and top-k. */
static int pick(const float *logits, int V, double temp, int topk, pt_rng *rng, float *work) {
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (temp <= 0) return best;
    float cutoff = -INFINITY;
    if (topk > 0 && topk < V) {
        memcpy(work, logits, (size_t)V * sizeof(float));
        qsort(work, (size_t)V, sizeof(float), cmp_desc);
        cutoff = work[topk - 1];
    }
    double sum = 0;
    for (int v = 0; v < V; v++) {
        double p = logits[v] >= cutoff ? exp((logits[v] - logits[best]) / temp) : 0.0;
        work[v] = (float)p;
        sum += p;
    }
    double r = pt_rng_uniform(rng) * sum, acc = 0;
    for (int v = 0; v < V; v++) {
        acc += work[v];
        if (r < acc) return v;
    }
    return best;
}

int pt_cli_sample(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = NULL;
    double ntok = 200, temp = 1.0, topk = 0, seed = 1337, threads = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r, ok = 1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if ((r = pt_cli_option(argc, argv, &i, "--checkpoint", "sample", &v)) != 0)
            ckpt = v;
        else if ((r = pt_cli_option(argc, argv, &i, "--prompt", "sample", &v)) != 0)
            prompt = v;
        else if ((r = pt_cli_option(argc, argv, &i, "--tokens", "sample", &v)) != 0)
            ok = r < 0 || pt_cli_parse_num(a, v, 0, 1e7, &ntok);
        else if ((r = pt_cli_option(argc, argv, &i, "--temperature", "sample", &v)) != 0)
            ok = r < 0 || pt_cli_parse_num(a, v, 0, 1e3, &temp);
        else if ((r = pt_cli_option(argc, argv, &i, "--top-k", "sample", &v)) != 0)
            ok = r < 0 || pt_cli_parse_num(a, v, 0, 1e6, &topk);
        else if ((r = pt_cli_option(argc, argv, &i, "--seed", "sample", &v)) != 0)
            ok = r < 0 || pt_cli_parse_num(a, v, 0, 4294967295.0, &seed);
        else if ((r = pt_cli_option(argc, argv, &i, "--threads", "sample", &v)) != 0)
            ok = r < 0 || pt_cli_parse_num(a, v, 1, 1024, &threads);
        else {
            fprintf(stderr, "partrain: unknown option '%s' (see partrain sample --help)\n", a);
            return 2;
        }
        if (r < 0 || !ok) return 2;
    }
    if (!ckpt || !prompt) {
        fprintf(stderr, "partrain: sample needs --checkpoint DIR and --prompt TEXT\n");
        return 2;
    }
    pt_kernels_set_threads((int)threads);
    char stepdir[PT_CONFIG_STR_MAX + 64];
    pt_config cfg;
    pt_model *m = NULL;
    int *ctx = NULL;
    float *work = NULL;
    int rc = 1;
    if (pt_cli_checkpoint_open(ckpt, stepdir, sizeof stepdir, &cfg) != PT_OK) goto err;
    int T = cfg.model.seq_len, V = cfg.model.vocab_size;
    if (V > 256) {
        pt_error_set(PT_ERR_UNSUPPORTED,
                     "%s: vocab_size %d is not byte-level; sample decodes bytes only", stepdir, V);
        goto err;
    }
    size_t plen = strlen(prompt);
    for (size_t i = 0; i < plen; i++)
        if ((unsigned char)prompt[i] >= V) {
            pt_error_set(PT_ERR_INVALID, "--prompt: byte %u at offset %zu is >= vocab_size %d",
                         (unsigned char)prompt[i], i, V);
            goto err;
        }
    if (pt_cli_checkpoint_model(stepdir, &cfg, 1, &m) != PT_OK) goto err;
    size_t cap = plen + (size_t)ntok + 1;
    ctx = malloc(cap * sizeof(int));
    work = malloc((size_t)V * sizeof(float));
    if (!ctx || !work) {
        pt_error_set(PT_ERR_NOMEM, "sample: out of memory");
        goto err;
    }
    size_t len = 0;
    if (plen == 0) ctx[len++] = '\n' < V ? '\n' : 0;
    for (size_t i = 0; i < plen; i++) ctx[len++] = (unsigned char)prompt[i];
    fwrite(prompt, 1, plen, stdout);
    pt_rng rng;
    pt_rng_init(&rng, (uint64_t)seed, "sample");
    for (int k = 0; k < (int)ntok; k++) {
        size_t n = len < (size_t)T ? len : (size_t)T;
        pt_batch b = {ctx + len - n, NULL, 0.0f, 1, (int)n, 0, 0};
        pt_model_forward(m, &b, NULL);
        const float *logits = pt_model_logits(m) + (n - 1) * (size_t)V;
        int tok = pick(logits, V, temp, (int)topk, &rng, work);
        ctx[len++] = tok;
        putchar(tok);
        fflush(stdout);
    }
    putchar('\n');
    rc = 0;
    goto done;
err:
    pt_cli_fail(pt_error_message());
done:
    free(work);
    free(ctx);
    pt_model_free(m);
    return rc;
}
