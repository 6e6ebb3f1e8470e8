/* JAX's default generator in C: threefry2x32 bits and jax.random.normal's float32 normals as XLA computes them on
 * its CPU backend, or (backend 1) on an NVIDIA GPU.
 *
 * The project's own code (C11, no dependencies but libm and pthreads). The constants come from spec/jax_rng.py
 * through the generated header jax_rng_constants.h (c_rng/build.py writes it), so they are written once.
 * XLA's float32 steps (spec.jax_rng: the log polynomial, log1p, Giles' erf_inv) are float operations here: each
 * plain step rounds once, as spec.jax_rng's double-carried step does, and each fused step is fmaf, XLA's FMA (all
 * 2^23 inputs agree with the definition: tests/torch_impl/random/test_native.py). The GPU's steps (spec.jax_rng.normal_of_u_gpu:
 * libdevice's log1pf, Giles' polynomial unfused, sqrt.approx.f32 as measured offsets) follow the CPU's. Needs
 * -ffp-contract=off and no
 * fast-math (c_rng/build.py's flags); every loop is straight-line code over a block, which the compiler
 * vectorises, and the block's bits stay in L1 between the hash and the normal.
 *
 * A key is two uint32 words (held in int64, as torch_impl.random's keys); under key b, element j of a draw of n
 * values hashes the counter (j >> 32, j mod 2^32) and keeps y0 ^ y1 (jax_threefry_partitionable=True).
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "jax_rng_constants.h"

#define BLOCK 256                            /* elements hashed and transformed together, kept in L1 */

static inline uint32_t rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

/* y0 ^ y1 of threefry2x32 under (k0, k1) for counters lo + 0..m-1 (high word hi), into out[0..m). */
static void hash_block(uint32_t k0, uint32_t k1, uint32_t hi, uint32_t lo, int m, uint32_t *out)
{
    static const int rot[2][4] = {{JR_ROT0_0, JR_ROT0_1, JR_ROT0_2, JR_ROT0_3},
                                  {JR_ROT1_0, JR_ROT1_1, JR_ROT1_2, JR_ROT1_3}};
    const uint32_t ks[3] = {k0, k1, k0 ^ k1 ^ JR_PARITY32};
    uint32_t x0[BLOCK], x1[BLOCK];
    for (int j = 0; j < BLOCK; j++) {
        x0[j] = hi + k0;
        x1[j] = lo + (uint32_t)j + k1;
    }
    for (int i = 0; i < 5; i++) {
        for (int q = 0; q < 4; q++) {
            const int r = rot[i & 1][q];
            for (int j = 0; j < BLOCK; j++) {
                x0[j] += x1[j];
                x1[j] = rotl32(x1[j], r) ^ x0[j];
            }
        }
        const uint32_t a = ks[(i + 1) % 3], b = ks[(i + 2) % 3] + (uint32_t)(i + 1);
        for (int j = 0; j < BLOCK; j++) {
            x0[j] += a;
            x1[j] += b;
        }
    }
    for (int j = 0; j < m; j++) out[j] = x0[j] ^ x1[j];
}

/* threefry2x32 under (k0, k1) of the single counter pair (x0, x1): both output words, into out[0], out[1] */
static void hash_pair(uint32_t k0, uint32_t k1, uint32_t x0, uint32_t x1, uint32_t *out)
{
    static const int rot[2][4] = {{JR_ROT0_0, JR_ROT0_1, JR_ROT0_2, JR_ROT0_3},
                                  {JR_ROT1_0, JR_ROT1_1, JR_ROT1_2, JR_ROT1_3}};
    const uint32_t ks[3] = {k0, k1, k0 ^ k1 ^ JR_PARITY32};
    x0 += k0;
    x1 += k1;
    for (int i = 0; i < 5; i++) {
        for (int q = 0; q < 4; q++) {
            x0 += x1;
            x1 = rotl32(x1, rot[i & 1][q]) ^ x0;
        }
        x0 += ks[(i + 1) % 3];
        x1 += ks[(i + 2) % 3] + (uint32_t)(i + 1);
    }
    out[0] = x0;
    out[1] = x1;
}

/* XLA's float32 steps. A single float operation equals the double-carried step of spec.jax_rng rounded once
 * (double holds over twice float's precision, so the double rounding is innocuous); a fused step is fmaf. */
#define F(x) ((float)(x))

/* Each step below runs over a whole block as its own loop (the polynomials coefficient by coefficient), so that
 * every loop is straight-line arithmetic the compiler vectorises; selections compute both sides, as XLA's do. */

/* XLA CPU's float32 log of positive normal floats y (spec.jax_rng.log_of_parts), in place. */
static void xla_log_block(float *y, int m)
{
    float t[BLOCK], e[BLOCK], t3[BLOCK], p0[BLOCK], p1[BLOCK], p2[BLOCK];
    for (int i = 0; i < m; i++) {
        uint32_t w;
        memcpy(&w, &y[i], 4);
        const uint32_t mw = (w & 0x807FFFFFu) | 0x3F000000u;               /* y = mant 2^e, mant in [0.5, 1) */
        float mant;
        memcpy(&mant, &mw, 4);
        const float below = mant < F(JR_LOG_SQRTHF) ? 1.0f : 0.0f;
        t[i] = (mant - 1.0f) + mant * below;                                /* exact: mant - 1, or 2 mant - 1 */
        e[i] = (float)((int32_t)((w >> 23) & 0xFF) - 126) - below;
        t3[i] = (t[i] * t[i]) * t[i];
        p0[i] = F(JR_LOG_P[0]);
        p1[i] = F(JR_LOG_P[3]);
        p2[i] = F(JR_LOG_P[6]);
    }
    for (int c = 1; c < 3; c++) {
        const float a0 = F(JR_LOG_P[c]), a1 = F(JR_LOG_P[3 + c]), a2 = F(JR_LOG_P[6 + c]);
        for (int i = 0; i < m; i++) {
            p0[i] = fmaf(p0[i], t[i], a0);
            p1[i] = fmaf(p1[i], t[i], a1);
            p2[i] = fmaf(p2[i], t[i], a2);
        }
    }
    for (int i = 0; i < m; i++) {
        const float t2 = t[i] * t[i];
        const float yy = fmaf(fmaf(fmaf(p0[i], t3[i], p1[i]), t3[i], p2[i]), t3[i], e[i] * F(JR_LOG_Q1));
        y[i] = fmaf(e[i], F(JR_LOG_Q2), (t[i] - 0.5f * t2) + yy);
    }
}

/* XLA's float32 log1p for x in (-1, 0] (spec.jax_rng.log1p), x[0..m) -> out[0..m). */
static void xla_log1p_block(const float *x, int m, float *out)
{
    float num[BLOCK], den[BLOCK], big[BLOCK];
    for (int i = 0; i < m; i++) {
        num[i] = fmaf(x[i], F(JR_LOG1P_NUM[0]), F(JR_LOG1P_NUM[1]));
        den[i] = x[i] + F(JR_LOG1P_DEN[1]);
        big[i] = x[i] + 1.0f;
    }
    for (int c = 2; c < JR_LOG1P_NUM_N; c++) {
        const float a = F(JR_LOG1P_NUM[c]);
        for (int i = 0; i < m; i++) num[i] = fmaf(num[i], x[i], a);
    }
    for (int c = 2; c < JR_LOG1P_DEN_N; c++) {
        const float a = F(JR_LOG1P_DEN[c]);
        for (int i = 0; i < m; i++) den[i] = fmaf(den[i], x[i], a);
    }
    xla_log_block(big, m);
    for (int i = 0; i < m; i++) {
        const float x2 = x[i] * x[i];
        const float small = x[i] + (-0.5f * x2 + (x[i] * x2) * (num[i] / den[i]));
        out[i] = fabsf(x[i]) < F(JR_LOG1P_SMALL) ? small : big[i];
    }
}

/* ----------------------------------------------------------------------------- XLA's CUDA normal */
/* libdevice's log1pf of x[0..m) in (-1, 0] (spec.jax_rng.nv_log1p_of_parts), into out. k, with (1 + x) 2^-k in
 * [0.75, 1.5), is the exponent of the double 1 + x plus its first fraction bit (1 + x is exact in double, or for
 * |x| < 2^-29 rounded to a double that is still in [0.75, 1.5)); r = x 2^-k + (2^-k - 1) rounded once. */
static void nv_log1p_block(const float *x, int m, float *out)
{
    float r[BLOCK], k[BLOCK], q[BLOCK];
    for (int i = 0; i < m; i++) {
        const double y = (double)x[i] + 1.0;
        uint64_t b;
        memcpy(&b, &y, 8);
        const int32_t kk = (int32_t)((b >> 52) & 0x7FF) - 1023 + (int32_t)((b >> 51) & 1);
        const uint32_t sw = (uint32_t)(127 - kk) << 23;                     /* 2^-k, k in [-23, 0] */
        float scale;
        memcpy(&scale, &sw, 4);
        r[i] = x[i] * scale + (scale - 1.0f);
        k[i] = (float)kk;
        q[i] = F(JR_NV_LOG1P[0]);
    }
    for (int c = 1; c < JR_NV_LOG1P_N; c++) {
        const float a = F(JR_NV_LOG1P[c]);
        for (int i = 0; i < m; i++) q[i] = fmaf(q[i], r[i], a);
    }
    for (int i = 0; i < m; i++) out[i] = fmaf(k[i], F(JR_NV_LN2), fmaf(q[i] * r[i], r[i], r[i]));
}

/* The GPU's sqrt.approx.f32 of the tail's w (w >= 5) for mantissa mant: the correctly rounded sqrtf moved by the
 * measured offset (spec.jax_rng.gpu_sqrt_offsets); central mantissas read entry 0, unused. */
static float gpu_sqrt(float w, uint32_t mant)
{
    const uint32_t hi = JR_N_MANTISSAS - 2 * JR_GPU_TAIL;
    const uint32_t at = mant < JR_GPU_TAIL ? mant : (mant >= hi ? mant - hi : 0);
    const float s = sqrtf(w);
    uint32_t sb;
    memcpy(&sb, &s, 4);
    sb += (uint32_t)(int32_t)JR_GPU_SQRT_OFFSETS[at];
    float out;
    memcpy(&out, &sb, 4);
    return out;
}

/* The float32 normals of draws' bits, as XLA's CPU code (gpu 0: spec.jax_rng.normal_of_u) or its CUDA code (gpu 1:
 * normal_of_u_gpu) computes them from u = u_of_mantissa(bits >> 9). The two differ in three steps only: the log1p
 * (XLA's or libdevice's), the tail's square root (correctly rounded, or the GPU's approximate one) and the erf_inv
 * polynomial's multiply-adds (fused on the CPU, two roundings on the GPU). `gpu` is a constant at each call, so the
 * compiler specialises each caller's loops. */
static inline void normal_block_of(const uint32_t *bits, int m, float *out, const int gpu)
{
    float u[BLOCK], x[BLOCK], w[BLOCK], z[BLOCK], p[BLOCK], central[BLOCK];
    for (int i = 0; i < m; i++) {
        u[i] = ((float)(bits[i] >> 9) * 4.0f - 16777215.0f) * 0x1p-24f;    /* 2f - 1 + 2^-24, exact */
        x[i] = u[i] * -u[i];
    }
    if (gpu) nv_log1p_block(x, m, w);
    else xla_log1p_block(x, m, w);
    for (int i = 0; i < m; i++) {
        const float wi = -w[i], tail = (gpu ? gpu_sqrt(wi, bits[i] >> 9) : sqrtf(wi)) - 3.0f;
        central[i] = wi < 5.0f ? 1.0f : 0.0f;
        z[i] = wi < 5.0f ? wi - 2.5f : tail;
        p[i] = wi < 5.0f ? F(JR_ERFINV_SMALL[0]) : F(JR_ERFINV_LARGE[0]);
    }
    for (int c = 1; c < JR_ERFINV_N; c++) {
        const float a = F(JR_ERFINV_SMALL[c]), b = F(JR_ERFINV_LARGE[c]);
        if (gpu) for (int i = 0; i < m; i++) p[i] = p[i] * z[i] + (central[i] != 0.0f ? a : b);    /* two roundings */
        else for (int i = 0; i < m; i++) p[i] = fmaf(p[i], z[i], central[i] != 0.0f ? a : b);
    }
    for (int i = 0; i < m; i++) out[i] = (u[i] * p[i]) * F(JR_SQRT2);
}

/* ----------------------------------------------------------------------------- threads over flat spans */
typedef struct {
    const int64_t *keys;
    int64_t n, start, stop;
    void *out;
    int kind;                                /* 0: CPU normals (float), 1: bits (uint32), 2: GPU normals (float) */
} Job;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* the flat elements [start, stop) of a (n_keys, n) draw, a block at a time: never past a row's end, nor across a
 * 2^32 boundary of the counter (where its high word steps) */
static void run_job(Job *job)
{
    uint32_t bits[BLOCK];
    for (int64_t start = job->start; start < job->stop;) {
        const int64_t b = start / job->n, j = start % job->n;
        const int m = (int)min64(min64(job->n - j, job->stop - start),
                                 min64(BLOCK, ((int64_t)1 << 32) - (int64_t)(uint32_t)j));
        uint32_t *dst = job->kind == 1 ? (uint32_t *)job->out + start : bits;
        hash_block((uint32_t)job->keys[2 * b], (uint32_t)job->keys[2 * b + 1], (uint32_t)((uint64_t)j >> 32),
                   (uint32_t)j, m, dst);
        if (job->kind == 0) normal_block_of(bits, m, (float *)job->out + start, 0);
        if (job->kind == 2) normal_block_of(bits, m, (float *)job->out + start, 1);
        start += m;
    }
}

static void *thread_main(void *arg)
{
    run_job((Job *)arg);
    return NULL;
}

#define MAX_THREADS 64
#define MIN_PER_THREAD 65536                 /* below this many elements a thread costs more than it saves */

static void run_parallel(const int64_t *keys, int64_t n_keys, int64_t n, void *out, int kind, int threads)
{
    const int64_t total = n_keys * n;
    if (total <= 0) return;
    int64_t t = threads < 1 ? 1 : (threads > MAX_THREADS ? MAX_THREADS : threads);
    if (t > total / MIN_PER_THREAD) t = total / MIN_PER_THREAD > 0 ? total / MIN_PER_THREAD : 1;
    Job jobs[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int64_t i = 0; i < t; i++) {
        jobs[i] = (Job){keys, n, total * i / t, total * (i + 1) / t, out, kind};
    }
    for (int64_t i = 1; i < t; i++) started[i] = pthread_create(&ids[i], NULL, thread_main, &jobs[i]) == 0;
    run_job(&jobs[0]);
    for (int64_t i = 1; i < t; i++) {
        if (started[i]) pthread_join(ids[i], NULL);
        else run_job(&jobs[i]);              /* no thread to be had: this one does the span */
    }
}

/* out (n_keys, n) float32: jax.random.normal(key_b, (n,)) for each key b on JAX's CPU (backend 0) or an NVIDIA GPU
 * (backend 1); up to `threads` threads */
void jr_normal(const int64_t *keys, int64_t n_keys, int64_t n, float *out, int threads, int backend)
{
    run_parallel(keys, n_keys, n, out, backend == 1 ? 2 : 0, threads);
}

/* out (n_keys, n) uint32: jax.random.bits(key_b, (n,)) for each key b */
void jr_bits(const int64_t *keys, int64_t n_keys, int64_t n, uint32_t *out, int threads)
{
    run_parallel(keys, n_keys, n, out, 1, threads);
}

/* out[i] = the normal (backend 0: CPU, 1: GPU) of mantissa bits start + i, for the exhaustive check against the
 * definition */
void jr_normal_of_mantissas(int64_t start, int64_t count, float *out, int backend)
{
    uint32_t bits[BLOCK];
    for (int64_t s = 0; s < count; s += BLOCK) {
        const int m = count - s < BLOCK ? (int)(count - s) : BLOCK;
        for (int i = 0; i < m; i++) bits[i] = (uint32_t)(start + s + i) << 9;
        if (backend == 1) normal_block_of(bits, m, out + s, 1);
        else normal_block_of(bits, m, out + s, 0);
    }
}

/* out (n, 2) uint32: threefry2x32 under key (k0[i], k1[i]) of the counter pair (x0[i], x1[i]), both words (as
 * jax.random.fold_in(key, d) hashes (0, d), and split's keys their index's two words) */
void jr_hash_pairs(const uint32_t *k0, const uint32_t *k1, const uint32_t *x0, const uint32_t *x1, int64_t n,
                   uint32_t *out)
{
    for (int64_t i = 0; i < n; i++) hash_pair(k0[i], k1[i], x0[i], x1[i], out + 2 * i);
}
