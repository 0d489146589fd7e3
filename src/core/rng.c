/* Counter-based random numbers: Philox-4x32-10 (Salmon, Moraes, Dror, Shaw,
 * "Parallel random numbers: as easy as 1, 2, 3", SC'11). Pure functions of
 * (key, counter): the basis of layout-independent initialization. */
#include "partrain/core.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t *hi) {
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

void pt_philox(uint64_t key, uint64_t counter_hi, uint64_t counter_lo, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)counter_lo, c1 = (uint32_t)(counter_lo >> 32);
    uint32_t c2 = (uint32_t)counter_hi, c3 = (uint32_t)(counter_hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int round = 0; round < 10; round++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = mulhilo(PHILOX_M0, c0, &hi0);
        uint32_t lo1 = mulhilo(PHILOX_M1, c2, &hi1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* FNV-1a of the name, then a splitmix64 finalizer with the seed folded in. */
uint64_t pt_rng_key(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    uint64_t z = h ^ (seed * 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* 24 random bits -> [0, 1) exactly representable in float. */
static inline float u32_to_unit(uint32_t x) {
    return (float)(x >> 8) * (1.0f / 16777216.0f);
}

float pt_rng_uniform_at(uint64_t key, uint64_t index) {
    uint32_t w[4];
    pt_philox(key, 0, index, w);
    return u32_to_unit(w[0]);
}

float pt_rng_normal_at(uint64_t key, uint64_t index) {
    uint32_t w[4];
    pt_philox(key, 0, index, w);
    /* u1 in (0, 1] so that log never sees 0; computed in double so that the
     * value does not depend on libm's float rounding. */
    double u1 = ((double)(w[0] >> 8) + 1.0) / 16777216.0;
    double u2 = (double)(w[1] >> 8) / 16777216.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void pt_rng_init(pt_rng *r, uint64_t seed, const char *name) {
    r->key = pt_rng_key(seed, name);
    r->counter = 0;
}

uint64_t pt_rng_next_u64(pt_rng *r) {
    uint32_t w[4];
    pt_philox(r->key, 1, r->counter++, w);
    return ((uint64_t)w[1] << 32) | w[0];
}

uint64_t pt_rng_below(pt_rng *r, uint64_t n) {
    PT_ASSERT(n > 0);
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = pt_rng_next_u64(r);
    while (x >= limit);
    return x % n;
}

float pt_rng_uniform(pt_rng *r) {
    return (float)(pt_rng_next_u64(r) >> 40) * (1.0f / 16777216.0f);
}
