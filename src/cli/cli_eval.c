/* partrain eval: mean loss of a checkpoint on a data file, over consecutive
 * non-overlapping windows of seq_len+1 tokens (the model's config comes from
 * the checkpoint's state.json). */
#include "cli_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/kernels.h"
#include "partrain/train.h"

static void usage(FILE *f) {
    fprintf(f, "usage: partrain eval --checkpoint DIR --data FILE [--batch N] [--threads N]\n\n"
               "  --checkpoint DIR  checkpoint directory (with 'latest') or one step directory\n"
               "  --data FILE       UTF-8 text or llm.c .bin tokens\n"
               "  --batch N         windows per forward pass (default 8)\n"
               "  --threads N       kernel threads (default 1)\n\n"
               "Prints the mean loss over consecutive non-overlapping windows of seq_len+1 "
               "tokens.\n");
}

int pt_cli_eval(int argc, char **argv) {
    const char *ckpt = NULL, *data = NULL;
    int batch = 8, threads = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if ((r = pt_cli_option(argc, argv, &i, "--checkpoint", "eval", &v)) != 0)
            ckpt = v;
        else if ((r = pt_cli_option(argc, argv, &i, "--data", "eval", &v)) != 0)
            data = v;
        else if ((r = pt_cli_option(argc, argv, &i, "--batch", "eval", &v)) != 0) {
            if (r > 0 && !pt_cli_parse_int(a, v, 1, 1000000, &batch)) return 2;
        } else if ((r = pt_cli_option(argc, argv, &i, "--threads", "eval", &v)) != 0) {
            if (r > 0 && !pt_cli_parse_int(a, v, 1, 1024, &threads)) return 2;
        } else {
            fprintf(stderr, "partrain: unknown option '%s' (see partrain eval --help)\n", a);
            return 2;
        }
        if (r < 0) return 2;
    }
    if (!ckpt || !data) {
        fprintf(stderr, "partrain: eval needs --checkpoint DIR and --data FILE\n");
        return 2;
    }
    pt_kernels_set_threads(threads);
    char stepdir[PT_CONFIG_STR_MAX + 64];
    pt_config cfg;
    pt_model *m = NULL;
    pt_data *d = NULL;
    int *inp = NULL, *tgt = NULL;
    int rc = 1;
    if (pt_cli_checkpoint_open(ckpt, stepdir, sizeof stepdir, &cfg) != PT_OK) goto err;
    int T = cfg.model.seq_len;
    if (pt_data_open(&d, data, cfg.model.vocab_size) != PT_OK) goto err;
    size_t nwin = pt_data_num_windows(d, T);
    if (nwin == 0) {
        pt_error_set(PT_ERR_FORMAT, "%s: shorter than one window (%zu tokens, need seq_len+1 = %d)",
                     data, pt_data_num_tokens(d), T + 1);
        goto err;
    }
    if ((size_t)batch > nwin) batch = (int)nwin;
    if (pt_cli_checkpoint_model(stepdir, &cfg, batch, &m) != PT_OK) goto err;
    inp = pt_mem_alloc(PT_MEM_ACTS, (size_t)batch * T * sizeof(int));
    tgt = pt_mem_alloc(PT_MEM_ACTS, (size_t)batch * T * sizeof(int));
    if (!inp || !tgt) goto err;
    double sum = 0;
    for (size_t w = 0; w < nwin; w += (size_t)batch) {
        int B = (int)(nwin - w < (size_t)batch ? nwin - w : (size_t)batch);
        for (int b = 0; b < B; b++)
            pt_data_window(d, w + (size_t)b, T, inp + (size_t)b * T, tgt + (size_t)b * T);
        pt_batch bt = {inp, tgt, 0.0f, B, T, 0, 0};
        float loss = 0;
        pt_model_forward(m, &bt, &loss);
        sum += (double)loss * B;
    }
    printf("loss %.6f  (%zu windows of %d tokens from %s; checkpoint %s)\n", sum / (double)nwin,
           nwin, T + 1, data, stepdir);
    rc = 0;
    goto done;
err:
    pt_cli_fail(pt_error_message());
done:
    pt_mem_free(tgt);
    pt_mem_free(inp);
    pt_model_free(m);
    pt_data_free(d);
    return rc;
}
