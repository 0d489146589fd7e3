/* The single-worker trainer: builds model, optimizer and data from a config,
 * takes optimizer steps (micro-batches accumulate into one gradient),
 * validates, writes the progress line and JSON-lines metrics, and saves and
 * resumes checkpoints so that a resumed run is bitwise the same run.
 *
 * What makes resume bitwise: everything a step depends on is either in the
 * checkpoint (parameters, AdamW moments, step count, the data RNG's key and
 * counter) or a pure function of the step (learning rate). Validation reads
 * fixed windows and touches no state.
 *
 * Not here: several workers (parallel/), trace output. */
#include "train_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/kernels.h"

struct pt_trainer {
    pt_config cfg;
    pt_model *model;
    pt_adamw *opt;
    pt_data *train, *val;
    pt_rng data_rng;
    int step;
    int micro_B;
    int *inputs, *targets; /* (batch_size, T) */
    char layout[64];
    size_t mem_peak[PT_MEM_NCAT], mem_peak_total;
    FILE *metrics;
};

/* Prefix the last error message (copied first: it is the buffer being set). */
static pt_status prefix_error(pt_status st, const char *prefix) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", pt_error_message());
    return pt_error_set(st, "%s: %s", prefix, msg);
}

static pt_status open_data(pt_data **out, const char *key, const char *path, int V, int T) {
    pt_status st = pt_data_open(out, path, V);
    if (st != PT_OK) return prefix_error(st, key);
    if (pt_data_num_tokens(*out) < (size_t)T + 1) {
        st = pt_error_set(PT_ERR_FORMAT,
                          "%s: %s is shorter than one sequence (%zu tokens, need seq_len+1 = %d)",
                          key, path, pt_data_num_tokens(*out), T + 1);
        pt_data_free(*out);
        *out = NULL;
    }
    return st;
}

void pt_trainer_free(pt_trainer *t) {
    if (!t) return;
    if (t->metrics) fclose(t->metrics);
    pt_mem_free(t->targets);
    pt_mem_free(t->inputs);
    pt_data_free(t->val);
    pt_data_free(t->train);
    pt_adamw_free(t->opt);
    pt_model_free(t->model);
    free(t);
}

pt_status pt_trainer_new(pt_trainer **out, const pt_config *cfg) {
    *out = NULL;
    PT_CHECK(pt_config_validate(cfg));
    pt_status st = PT_OK;
    pt_trainer *t = calloc(1, sizeof *t);
    if (!t) return pt_error_set(PT_ERR_NOMEM, "trainer");
    t->cfg = *cfg;
    const pt_model_config *mc = &cfg->model;
    t->micro_B = cfg->train.batch_size / cfg->parallel.microbatches;
    pt_config_layout(cfg, t->layout, sizeof t->layout);
    pt_kernels_set_threads(cfg->train.threads);

    if (cfg->data.train[0])
        PT_CHECK_GOTO(
            st, open_data(&t->train, "data.train", cfg->data.train, mc->vocab_size, mc->seq_len),
            fail);
    if (cfg->data.val[0])
        PT_CHECK_GOTO(
            st, open_data(&t->val, "data.val", cfg->data.val, mc->vocab_size, mc->seq_len), fail);

    PT_CHECK_GOTO(st, pt_model_new(&t->model, mc, t->micro_B), fail);
    pt_model_init(t->model, (uint64_t)cfg->train.seed);

    int ntens = pt_model_num_tensors(t->model);
    pt_optim_segment *segs = malloc((size_t)ntens * sizeof *segs);
    if (!segs) {
        st = pt_error_set(PT_ERR_NOMEM, "optimizer segments");
        goto fail;
    }
    for (int i = 0; i < ntens; i++) {
        const pt_param_info *p = pt_model_tensor(t->model, i);
        segs[i] = (pt_optim_segment){p->offset, p->numel, p->decay};
    }
    pt_adamw_hparams hp = {(float)cfg->train.beta1, (float)cfg->train.beta2, 1e-8f,
                           (float)cfg->train.weight_decay};
    st = pt_adamw_new(&t->opt, pt_model_num_params(t->model), segs, ntens, &hp);
    free(segs);
    if (st != PT_OK) goto fail;

    size_t ntok = (size_t)cfg->train.batch_size * (size_t)mc->seq_len;
    t->inputs = pt_mem_alloc(PT_MEM_ACTS, ntok * sizeof(int));
    t->targets = pt_mem_alloc(PT_MEM_ACTS, ntok * sizeof(int));
    if (!t->inputs || !t->targets) {
        st = PT_ERR_NOMEM;
        goto fail;
    }
    pt_rng_init(&t->data_rng, (uint64_t)cfg->train.seed, "data.train");
    *out = t;
    return PT_OK;
fail:
    pt_trainer_free(t);
    return st;
}

pt_model *pt_trainer_model(pt_trainer *t) {
    return t->model;
}
pt_adamw *pt_trainer_optim(pt_trainer *t) {
    return t->opt;
}
const pt_config *pt_trainer_config(const pt_trainer *t) {
    return &t->cfg;
}
int pt_trainer_step_count(const pt_trainer *t) {
    return t->step;
}

pt_status pt_trainer_step_batch(pt_trainer *t, const int *inputs, const int *targets,
                                pt_step_info *info) {
    const pt_config *c = &t->cfg;
    int T = c->model.seq_len, M = c->parallel.microbatches, mB = t->micro_B;
    uint64_t t0 = pt_time_ns();
    pt_mem_reset_peak();
    pt_model_zero_grads(t->model);
    double loss_sum = 0;
    for (int mb = 0; mb < M; mb++) {
        size_t off = (size_t)mb * (size_t)mB * (size_t)T;
        pt_batch b = {inputs + off, targets + off, 1.0f / ((float)c->train.batch_size * (float)T),
                      mB, T};
        float loss = 0;
        pt_model_forward(t->model, &b, &loss);
        pt_model_backward(t->model);
        loss_sum += loss;
    }
    float loss = (float)(loss_sum / M);
    size_t n = pt_model_num_params(t->model);
    double sumsq = pt_optim_grad_sumsq(pt_model_grads(t->model), n);
    float scale = pt_optim_clip_scale(sumsq, (float)c->train.grad_clip);
    float lr = pt_lr_schedule(t->step, c->train.steps, c->train.warmup_steps, (float)c->train.lr,
                              (float)c->train.min_lr);
    pt_adamw_step(t->opt, pt_model_params(t->model), pt_model_grads(t->model), lr, scale);
    t->step++;
    double ms = (double)(pt_time_ns() - t0) / 1e6;
    for (int k = 0; k < PT_MEM_NCAT; k++) t->mem_peak[k] = pt_mem_peak((pt_mem_cat)k);
    t->mem_peak_total = pt_mem_peak_total();
    if (info) {
        info->step = t->step;
        info->loss = loss;
        info->lr = lr;
        info->grad_norm = (float)sqrt(sumsq);
        info->step_ms = ms;
        info->tokens_per_s = (double)c->train.batch_size * T / (ms > 0 ? ms / 1e3 : 1e-9);
    }
    if (!isfinite(loss))
        return pt_error_set(PT_ERR_INTERNAL, "training diverged at step %d (loss %g)", t->step,
                            (double)loss);
    return PT_OK;
}

pt_status pt_trainer_step(pt_trainer *t, pt_step_info *info) {
    if (!t->train) return pt_error_set(PT_ERR_INVALID, "data.train is not set");
    pt_data_sample(t->train, &t->data_rng, t->cfg.train.batch_size, t->cfg.model.seq_len, t->inputs,
                   t->targets);
    return pt_trainer_step_batch(t, t->inputs, t->targets, info);
}

pt_status pt_trainer_validate(pt_trainer *t, float *val_loss) {
    if (!t->val) return pt_error_set(PT_ERR_INVALID, "data.val is not set");
    int T = t->cfg.model.seq_len, mB = t->micro_B;
    size_t nwin = pt_data_num_windows(t->val, T);
    size_t want = (size_t)t->cfg.train.val_batches * (size_t)mB;
    if (nwin > want) nwin = want;
    double sum = 0;
    for (size_t w = 0; w < nwin; w += (size_t)mB) {
        int B = (int)(nwin - w < (size_t)mB ? nwin - w : (size_t)mB);
        for (int b = 0; b < B; b++)
            pt_data_window(t->val, w + (size_t)b, T, t->inputs + (size_t)b * T,
                           t->targets + (size_t)b * T);
        pt_batch batch = {t->inputs, t->targets, 0.0f, B, T};
        float loss = 0;
        pt_model_forward(t->model, &batch, &loss);
        sum += (double)loss * B;
    }
    *val_loss = (float)(sum / (double)nwin);
    return PT_OK;
}

/* ---- checkpoints ---- */

pt_status pt_trainer_save(pt_trainer *t) {
    if (!t->cfg.checkpoint.dir[0]) return pt_error_set(PT_ERR_INVALID, "checkpoint.dir is not set");
    char *cfg_json = pt_config_to_json(&t->cfg);
    cJSON *root = cJSON_CreateObject();
    cJSON *cfg = cfg_json ? cJSON_Parse(cfg_json) : NULL;
    free(cfg_json);
    if (!root || !cfg) {
        cJSON_Delete(root);
        cJSON_Delete(cfg);
        return pt_error_set(PT_ERR_NOMEM, "checkpoint state");
    }
    char key[32], counter[32];
    snprintf(key, sizeof key, "%016" PRIx64, t->data_rng.key);
    snprintf(counter, sizeof counter, "%016" PRIx64, t->data_rng.counter);
    cJSON_AddNumberToObject(root, "step", t->step);
    cJSON_AddNumberToObject(root, "optim_t", pt_adamw_t(t->opt));
    cJSON *rng = cJSON_AddObjectToObject(root, "data_rng");
    cJSON_AddStringToObject(rng, "key", key);
    cJSON_AddStringToObject(rng, "counter", counter);
    cJSON_AddNumberToObject(root, "data_position", (double)t->data_rng.counter);
    cJSON_AddItemToObject(root, "config", cfg);
    char *state = cJSON_Print(root);
    cJSON_Delete(root);
    if (!state) return pt_error_set(PT_ERR_NOMEM, "checkpoint state");
    pt_status st = pt_ckpt_write(t->cfg.checkpoint.dir, t->step, t->model, pt_adamw_m(t->opt),
                                 pt_adamw_v(t->opt), state);
    free(state);
    return st;
}

static int parse_hex64(const cJSON *s, uint64_t *out) {
    if (!cJSON_IsString(s)) return 0;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s->valuestring, &end, 16);
    if (end == s->valuestring || *end || errno) return 0;
    *out = v;
    return 1;
}

pt_status pt_trainer_resume(pt_trainer *t) {
    const char *dir = t->cfg.checkpoint.dir;
    if (!dir[0]) return pt_error_set(PT_ERR_INVALID, "--resume needs checkpoint.dir");
    char stepdir[PT_CONFIG_STR_MAX + 64], path[PT_CONFIG_STR_MAX + 128];
    PT_CHECK(pt_checkpoint_resolve(dir, stepdir, sizeof stepdir));
    pt_config saved;
    PT_CHECK(pt_checkpoint_read_config(stepdir, &saved));
    const struct {
        const char *name;
        int have, want;
    } shape[] = {{"model.n_layer", saved.model.n_layer, t->cfg.model.n_layer},
                 {"model.n_embd", saved.model.n_embd, t->cfg.model.n_embd},
                 {"model.n_head", saved.model.n_head, t->cfg.model.n_head},
                 {"model.vocab_size", saved.model.vocab_size, t->cfg.model.vocab_size},
                 {"model.seq_len", saved.model.seq_len, t->cfg.model.seq_len}};
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++)
        if (shape[i].have != shape[i].want)
            return pt_error_set(PT_ERR_FORMAT,
                                "%s: checkpoint has %s = %d but the config says %d (a checkpoint "
                                "of another model shape)",
                                stepdir, shape[i].name, shape[i].have, shape[i].want);
    cJSON *root = NULL;
    PT_CHECK(pt_ckpt_read_state(stepdir, &root));
    cJSON *step = cJSON_GetObjectItemCaseSensitive(root, "step");
    cJSON *rng = cJSON_GetObjectItemCaseSensitive(root, "data_rng");
    uint64_t key = 0, counter = 0;
    int ok = cJSON_IsNumber(step) && step->valuedouble >= 0 && step->valuedouble < 2e9 &&
             cJSON_IsObject(rng) &&
             parse_hex64(cJSON_GetObjectItemCaseSensitive(rng, "key"), &key) &&
             parse_hex64(cJSON_GetObjectItemCaseSensitive(rng, "counter"), &counter);
    int nstep = ok ? (int)step->valuedouble : 0;
    cJSON_Delete(root);
    if (!ok)
        return pt_error_set(PT_ERR_FORMAT, "%s/state.json: missing or bad step / data_rng",
                            stepdir);
    snprintf(path, sizeof path, "%s/model.safetensors", stepdir);
    PT_CHECK(pt_safetensors_load(path, t->model, pt_model_params(t->model)));
    snprintf(path, sizeof path, "%s/optim_m.safetensors", stepdir);
    PT_CHECK(pt_safetensors_load(path, t->model, pt_adamw_m(t->opt)));
    snprintf(path, sizeof path, "%s/optim_v.safetensors", stepdir);
    PT_CHECK(pt_safetensors_load(path, t->model, pt_adamw_v(t->opt)));
    pt_adamw_set_t(t->opt, nstep);
    t->step = nstep;
    t->data_rng.key = key;
    t->data_rng.counter = counter;
    PT_INFO("resumed from %s at step %d", stepdir, nstep);
    return PT_OK;
}

/* ---- the loop ---- */

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

static void write_metrics(pt_trainer *t, const pt_step_info *info) {
    if (!t->metrics) return;
    fprintf(t->metrics,
            "{\"step\":%d,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"step_ms\":%.4f,"
            "\"tokens_per_s\":%.1f,\"world\":1,\"layout\":\"%s\",\"mem\":{",
            info->step, (double)info->loss, (double)info->lr, (double)info->grad_norm,
            info->step_ms, info->tokens_per_s, t->layout);
    static const pt_mem_cat cats[] = {PT_MEM_PARAMS, PT_MEM_GRADS, PT_MEM_OPTIM, PT_MEM_ACTS,
                                      PT_MEM_COMM};
    for (size_t i = 0; i < sizeof cats / sizeof cats[0]; i++)
        fprintf(t->metrics, "\"%s\":%zu,", pt_mem_cat_name(cats[i]), t->mem_peak[cats[i]]);
    fprintf(t->metrics, "\"total\":%zu}}\n", t->mem_peak_total);
    fflush(t->metrics);
}

static pt_status run_validation(pt_trainer *t) {
    float vl = 0;
    PT_CHECK(pt_trainer_validate(t, &vl));
    fprintf(stderr, "step %d: val loss %.4f\n", t->step, (double)vl);
    if (t->metrics) {
        fprintf(t->metrics, "{\"step\":%d,\"val_loss\":%.9g,\"world\":1,\"layout\":\"%s\"}\n",
                t->step, (double)vl, t->layout);
        fflush(t->metrics);
    }
    return PT_OK;
}

static void format_eta(char *buf, size_t n, double s) {
    if (s < 0 || !isfinite(s)) s = 0;
    int sec = (int)(s + 0.5);
    if (sec >= 3600)
        snprintf(buf, n, "%dh%02dm", sec / 3600, sec / 60 % 60);
    else
        snprintf(buf, n, "%dm%02ds", sec / 60, sec % 60);
}

pt_status pt_trainer_run(pt_trainer *t) {
    const pt_config *c = &t->cfg;
    if (!t->train) return pt_error_set(PT_ERR_INVALID, "data.train is not set");
    pt_status st = PT_OK;
    if (c->log.metrics[0] && !t->metrics) {
        char parent[PT_CONFIG_STR_MAX];
        snprintf(parent, sizeof parent, "%s", c->log.metrics);
        char *slash = strrchr(parent, '/');
        if (slash && slash != parent) {
            *slash = '\0';
            if (pt_mkdir_p(parent) != PT_OK) return prefix_error(PT_ERR_IO, "log.metrics");
        }
        t->metrics = fopen(c->log.metrics, t->step > 0 ? "a" : "w");
        if (!t->metrics)
            return pt_error_set(PT_ERR_IO, "log.metrics: %s: %s", c->log.metrics, strerror(errno));
    }
    if (c->log.trace[0]) PT_WARN("log.trace: the single-worker trainer writes no trace yet");
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    interrupted = 0;
    sigaction(SIGINT, &sa, &old);

    PT_INFO("model: %zu parameters, %d layers, n_embd %d, %d heads, seq_len %d, vocab %d",
            pt_model_num_params(t->model), c->model.n_layer, c->model.n_embd, c->model.n_head,
            c->model.seq_len, c->model.vocab_size);
    int last_val = -1, last_save = -1, start = t->step;
    if (t->val) {
        PT_CHECK_GOTO(st, run_validation(t), done);
        last_val = t->step;
    }
    double t_start = pt_time_s();
    while (t->step < c->train.steps && !interrupted) {
        pt_step_info info;
        PT_CHECK_GOTO(st, pt_trainer_step(t, &info), done);
        write_metrics(t, &info);
        if (t->step % c->log.every == 0 || t->step == c->train.steps || t->step == start + 1) {
            double elapsed = pt_time_s() - t_start;
            char eta[32];
            format_eta(eta, sizeof eta, elapsed / (t->step - start) * (c->train.steps - t->step));
            fprintf(stderr, "step %5d/%d  loss %.4f  lr %.2e  %.0f tok/s  %.1f ms  ETA %s\n",
                    t->step, c->train.steps, (double)info.loss, (double)info.lr, info.tokens_per_s,
                    info.step_ms, eta);
        }
        if (t->val && c->train.val_every > 0 && t->step % c->train.val_every == 0) {
            PT_CHECK_GOTO(st, run_validation(t), done);
            last_val = t->step;
        }
        if (c->checkpoint.dir[0] && c->checkpoint.every > 0 && t->step % c->checkpoint.every == 0) {
            PT_CHECK_GOTO(st, pt_trainer_save(t), done);
            last_save = t->step;
        }
    }
    if (t->val && last_val != t->step) PT_CHECK_GOTO(st, run_validation(t), done);
    if (c->checkpoint.dir[0] && last_save != t->step) {
        PT_CHECK_GOTO(st, pt_trainer_save(t), done);
        fprintf(stderr, "saved checkpoint %s/step_%08d\n", c->checkpoint.dir, t->step);
    }
    if (interrupted) st = pt_error_set(PT_ERR_INTERRUPTED, "interrupted at step %d", t->step);
done:
    sigaction(SIGINT, &old, NULL);
    return st;
}
