/* Plain reference kernels: the oracle every optimized kernel is tested
 * against (STYLE rule 11). Loops in the manner of llm.c's train_gpt2.c, one
 * thread, no BLAS, no tricks; contracts as in partrain/kernels.h.
 *
 * Deliberately not here: anything fast. Nothing on the training path calls
 * these. */
#include <math.h>
#include <string.h>

#include "kernels_impl.h"

#define GELU_SCALING_FACTOR 0.7978845608028654f /* sqrt(2/pi) */

void pt_ref_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                            int T, int C) {
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float *o = out + ((long)b * T + t) * C;
            const float *we = wte + (long)inp[b * T + t] * C;
            const float *pe = wpe + (long)t * C;
            for (int i = 0; i < C; i++) o[i] = we[i] + pe[i];
        }
    }
}

void pt_ref_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                             int T, int C) {
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((long)b * T + t) * C;
            float *dwe = dwte + (long)inp[b * T + t] * C;
            float *dpe = dwpe + (long)t * C;
            for (int i = 0; i < C; i++) {
                dwe[i] += d[i];
                dpe[i] += d[i];
            }
        }
    }
}

void pt_ref_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int N, int C) {
    const float eps = 1e-5f;
    for (int n = 0; n < N; n++) {
        const float *x = inp + (long)n * C;
        float m = 0.0f;
        for (int i = 0; i < C; i++) m += x[i];
        m /= C;
        float v = 0.0f;
        for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
        v /= C;
        float s = 1.0f / sqrtf(v + eps);
        float *o = out + (long)n * C;
        for (int i = 0; i < C; i++) o[i] = (s * (x[i] - m)) * weight[i] + bias[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

void pt_ref_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, int N, int C) {
    for (int n = 0; n < N; n++) {
        const float *d = dout + (long)n * C;
        const float *x = inp + (long)n * C;
        float *dx = dinp + (long)n * C;
        float m = mean[n], s = rstd[n];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s;
            float dnorm = weight[i] * d[i];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s;
            float dnorm = weight[i] * d[i];
            dbias[i] += d[i];
            dweight[i] += norm * d[i];
            dx[i] += s * (dnorm - dnorm_mean - norm * dnorm_norm_mean);
        }
    }
}

void pt_ref_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                           int N, int C, int OC) {
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            float acc = bias ? bias[o] : 0.0f;
            for (int i = 0; i < C; i++) acc += inp[(long)n * C + i] * weight[(long)i * OC + o];
            out[(long)n * OC + o] = acc;
        }
    }
}

void pt_ref_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int C, int OC) {
    for (int n = 0; n < N; n++) {
        for (int i = 0; i < C; i++) {
            float acc = 0.0f;
            for (int o = 0; o < OC; o++) acc += dout[(long)n * OC + o] * weight[(long)i * OC + o];
            if (dinp) dinp[(long)n * C + i] += acc;
        }
    }
    for (int i = 0; i < C; i++) {
        for (int o = 0; o < OC; o++) {
            float acc = 0.0f;
            for (int n = 0; n < N; n++) acc += inp[(long)n * C + i] * dout[(long)n * OC + o];
            dweight[(long)i * OC + o] += acc;
        }
    }
    if (dbias) {
        for (int o = 0; o < OC; o++) {
            float acc = 0.0f;
            for (int n = 0; n < N; n++) acc += dout[(long)n * OC + o];
            dbias[o] += acc;
        }
    }
}

void pt_ref_matmul_forward_wt(float *out, const float *inp, const float *weight, const float *bias,
                              int N, int C, int OC) {
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            float acc = bias ? bias[o] : 0.0f;
            for (int i = 0; i < C; i++) acc += inp[(long)n * C + i] * weight[(long)o * C + i];
            out[(long)n * OC + o] = acc;
        }
    }
}

void pt_ref_matmul_backward_wt(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, int N, int C, int OC) {
    for (int n = 0; n < N; n++) {
        for (int i = 0; i < C; i++) {
            float acc = 0.0f;
            for (int o = 0; o < OC; o++) acc += dout[(long)n * OC + o] * weight[(long)o * C + i];
            if (dinp) dinp[(long)n * C + i] += acc;
        }
    }
    for (int o = 0; o < OC; o++) {
        for (int i = 0; i < C; i++) {
            float acc = 0.0f;
            for (int n = 0; n < N; n++) acc += inp[(long)n * C + i] * dout[(long)n * OC + o];
            dweight[(long)o * C + i] += acc;
        }
    }
    if (dbias) {
        for (int o = 0; o < OC; o++) {
            float acc = 0.0f;
            for (int n = 0; n < N; n++) acc += dout[(long)n * OC + o];
            dbias[o] += acc;
        }
    }
}

void pt_ref_gelu_forward(float *out, const float *inp, long N) {
    for (long i = 0; i < N; i++) {
        float x = inp[i];
        float cube = 0.044715f * x * x * x;
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALING_FACTOR * (x + cube)));
    }
}

void pt_ref_gelu_backward(float *dinp, const float *inp, const float *dout, long N) {
    for (long i = 0; i < N; i++) {
        float x = inp[i];
        float cube = 0.044715f * x * x * x;
        float tanh_arg = GELU_SCALING_FACTOR * (x + cube);
        float tanh_out = tanhf(tanh_arg);
        float sech2 = 1.0f - tanh_out * tanh_out;
        float grad = 0.5f * (1.0f + tanh_out) +
                     x * 0.5f * sech2 * GELU_SCALING_FACTOR * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += grad * dout[i];
    }
}

void pt_ref_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH) {
    int hs = C / NH;
    long C3 = 3L * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((long)b * T + t) * C3 + h * hs;
                float *a = att + (((long)b * NH + h) * T + t) * T;
                float maxv = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((long)b * T + t2) * C3 + C + h * hs;
                    float s = 0.0f;
                    for (int i = 0; i < hs; i++) s += q[i] * k[i];
                    s *= scale;
                    a[t2] = s;
                    if (s > maxv) maxv = s;
                }
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    a[t2] = expf(a[t2] - maxv);
                    sum += a[t2];
                }
                for (int t2 = 0; t2 <= t; t2++) a[t2] /= sum;
                for (int t2 = t + 1; t2 < T; t2++) a[t2] = 0.0f;
                float *o = out + ((long)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) o[i] = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = qkv + ((long)b * T + t2) * C3 + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++) o[i] += a[t2] * v[i];
                }
            }
        }
    }
}

void pt_ref_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH) {
    int hs = C / NH;
    long C3 = 3L * C;
    float scale = 1.0f / sqrtf((float)hs);
    float *datt = scratch; /* T floats: one row of d(att) */
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const float *a = att + (((long)b * NH + h) * T + t) * T;
                const float *d = dout + ((long)b * T + t) * C + h * hs;
                const float *q = qkv + ((long)b * T + t) * C3 + h * hs;
                float *dq = dqkv + ((long)b * T + t) * C3 + h * hs;
                /* out = sum a[t2] v[t2]: datt[t2] = d . v[t2]; dv[t2] += a[t2] d */
                float dot = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = qkv + ((long)b * T + t2) * C3 + 2 * C + h * hs;
                    float *dv = dqkv + ((long)b * T + t2) * C3 + 2 * C + h * hs;
                    float s = 0.0f;
                    for (int i = 0; i < hs; i++) {
                        s += d[i] * v[i];
                        dv[i] += a[t2] * d[i];
                    }
                    datt[t2] = s;
                    dot += a[t2] * s;
                }
                /* softmax backward, then the scaled q.k product */
                for (int t2 = 0; t2 <= t; t2++) {
                    float dpre = a[t2] * (datt[t2] - dot) * scale;
                    const float *k = qkv + ((long)b * T + t2) * C3 + C + h * hs;
                    float *dk = dqkv + ((long)b * T + t2) * C3 + C + h * hs;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += dpre * k[i];
                        dk[i] += dpre * q[i];
                    }
                }
            }
        }
    }
}

void pt_ref_softmax_xent_forward_backward(float *losses, float *dlogits, const float *logits,
                                          const int *targets, int N, int V, float dloss) {
    for (int n = 0; n < N; n++) {
        const float *l = logits + (long)n * V;
        float maxv = -INFINITY;
        for (int i = 0; i < V; i++)
            if (l[i] > maxv) maxv = l[i];
        double sum = 0.0;
        for (int i = 0; i < V; i++) sum += exp((double)l[i] - maxv);
        int tg = targets[n];
        float lt = l[tg];
        losses[n] = (float)(log(sum) + maxv - lt);
        if (dlogits) {
            float *dl = dlogits + (long)n * V;
            for (int i = 0; i < V; i++) {
                float p = (float)(exp((double)l[i] - maxv) / sum);
                dl[i] = dloss * (p - (i == tg ? 1.0f : 0.0f));
            }
        }
    }
}

void pt_ref_adamw_update(float *param, const float *grad, float *m, float *v, long n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, int t,
                         float grad_scale) {
    float bc1 = 1.0f - powf(beta1, (float)t);
    float bc2 = 1.0f - powf(beta2, (float)t);
    for (long i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
        float mhat = m[i] / bc1;
        float vhat = v[i] / bc2;
        param[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * param[i]);
    }
}
