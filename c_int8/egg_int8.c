/* Integer EGGROLL in C: nano-egg's QEggRoll noiser and EGG model (spec/int8.py states every op), the project's own
 * code. C99, built with -O2 -fwrapv (int32 arithmetic wraps as XLA's does) into a shared library that c_int8/__init__.py
 * calls through ctypes.
 *
 * Inputs the caller provides:
 *   lut     (2^23,) int8: int8(normal * 16) of JAX's float32 normal for every value of bits >> 9. Computing JAX's
 *           normal bit for bit needs XLA's float32 erfinv polynomial step by step; this library takes the table
 *           from Python (jax_reference.int8.model.normal_lut or torch_impl.random.normal_table) instead. A standalone
 *           build would need its own port of that polynomial (not done here). NULL is fine where no table noise is
 *           drawn: int8_noise=xorshift with evolving=matrices (every leaf is a matrix or frozen).
 *   tkey    (2,) uint32: the table key's words, (0, seed).
 *   keys    (10 L + 3, 2) uint32: the leaves' ES keys in flatten order, a stacked leaf's L slices one after another
 *           (c_int8 derives them with this library's threefry: split(key, n)[i] = fold_in(key, i) = threefry(key; 0, i)).
 *   cfg     int32 [d, L, sigma_shift, noise_reuse, use_clt, mode, seed base]: mode 0 is nano-egg; its bits switch
 *           on egg.c's departures one aspect at a time (MODE_* below; the seed base feeds the xorshift noise).
 *   params  int8, every leaf in flatten order, each leaf C-contiguous (stacked leaves: (L, ...)).
 * Noise of one member (int32): per leaf and slice, low rank [A (a entries, the member's sign applied), B (b)],
 * full rank E (m entries).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define FIXED_POINT 4
#define MAXV 127
#define VOCAB 256
#define TABLE_SIZE (1u << 30)
#define TABLE_MASK (TABLE_SIZE - 1u)
#define LUT_SHIFT 9
#define HASH_MULT 0x45d9f3bu
#define NLEAF 13
#define NSTACKED 10
#define CLS_PARAM 0
#define CLS_MM 1
#define CLS_EMB 2
#define LOG2_SIZE (1 << 28)
#define LOGMAX_PLUS_1 8

/* egg.c's departures (ljubomirj/egg.c full_trained_egg-cpumulti.c, read for facts), one bit per aspect */
#define MODE_XORSHIFT 1      /* int8_noise=xorshift: a matrix's factors from xorshift32, A first, sign(bit0) U{0..31},
                                seeded step_seed + pair + 100 l + k (k: Wf 1, Uf 2, Wh 3, Uh 4, mlp.0 5, mlp.1 6;
                                the head step_seed + pair + 999), step_seed = base ^ (epoch * 0x9e3779b9) */
#define MODE_FIXED160 2      /* vote_threshold=fixed160: +1 where Z > 160, -1 where Z < -160 (Z = 0 never moves) */
#define MODE_MATRICES 4      /* evolving=matrices: embedding, biases and norm weights get no noise, no update */
#define MODE_FIXED_SHIFT 8   /* out_shift=fixed: x W^T >> 8 (in = d) or >> 9 (in = 4 d), not // (16 isqrt(in)) */
#define MODE_LN_TRUNC 16     /* ln_division=trunc: (x w) / mean truncating, mean = max(sum |x|, 1) / d, 0 -> 1 */
#define MODE_MITCHELL 32     /* log2=mitchell: ll = z[target] - (16 k + linear 4-bit mantissa - 64) of the sum */
#define MODE_NO_RESET 64     /* state_reset=never: the recurrent state is never zeroed */
/* egg.c's structure where the portable full_trained_egg-cpumulti.c departs beyond the seven aspects */
#define MODE_NESTED_CLIP 128 /* gate_clip=nested: a gate is clip(clip(W x + U s) + bias), not one clip of the sum */
#define MODE_NO_MLP 256      /* mlp=off: the forward runs no ln2 and no MLP (a block's output is the GRU's residual
                                sum; the MLP matrices still take their noise and votes) */

/* T[e][f]: the least n with n^16 >= 2^(16 e + f) (spec.int8.LOG2_THRESHOLDS, checked equal by the tests) */
static const int32_t LOG2_THR[29][16] = {
    {1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2},
    {2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4},
    {4, 5, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 8, 8, 8},
    {8, 9, 9, 10, 10, 10, 11, 11, 12, 12, 13, 13, 14, 15, 15, 16},
    {16, 17, 18, 19, 20, 20, 21, 22, 23, 24, 25, 26, 27, 29, 30, 31},
    {32, 34, 35, 37, 39, 40, 42, 44, 46, 48, 50, 52, 54, 57, 59, 62},
    {64, 67, 70, 73, 77, 80, 83, 87, 91, 95, 99, 104, 108, 113, 118, 123},
    {128, 134, 140, 146, 153, 159, 166, 174, 182, 190, 198, 207, 216, 225, 235, 246},
    {256, 268, 280, 292, 305, 318, 332, 347, 363, 379, 395, 413, 431, 450, 470, 491},
    {512, 535, 559, 584, 609, 636, 664, 694, 725, 757, 790, 825, 862, 900, 940, 981},
    {1024, 1070, 1117, 1167, 1218, 1272, 1328, 1387, 1449, 1513, 1580, 1650, 1723, 1799, 1879, 1962},
    {2048, 2139, 2234, 2333, 2436, 2544, 2656, 2774, 2897, 3025, 3159, 3299, 3445, 3597, 3757, 3923},
    {4096, 4278, 4467, 4665, 4871, 5087, 5312, 5548, 5793, 6050, 6317, 6597, 6889, 7194, 7513, 7845},
    {8192, 8555, 8934, 9329, 9742, 10174, 10624, 11095, 11586, 12099, 12634, 13194, 13778, 14388, 15025, 15690},
    {16384, 17110, 17867, 18658, 19484, 20347, 21248, 22189, 23171, 24197, 25268, 26387, 27555, 28775, 30049, 31379},
    {32768, 34219, 35734, 37316, 38968, 40694, 42495, 44377, 46341, 48393, 50536, 52773, 55109, 57549, 60097, 62758},
    {65536, 68438, 71468, 74632, 77936, 81387, 84990, 88753, 92682, 96786, 101071, 105546, 110218, 115098, 120194, 125515},
    {131072, 136876, 142936, 149264, 155872, 162773, 169980, 177505, 185364, 193571, 202141, 211091, 220436, 230196, 240388, 251030},
    {262144, 273751, 285871, 298527, 311744, 325546, 339959, 355010, 370728, 387142, 404282, 422181, 440872, 460391, 480775, 502060},
    {524288, 547501, 571741, 597054, 623488, 651092, 679918, 710020, 741456, 774283, 808563, 844361, 881744, 920782, 961549, 1004120},
    {1048576, 1095001, 1143481, 1194107, 1246975, 1302183, 1359835, 1420040, 1482911, 1548565, 1617126, 1688722, 1763488, 1841564, 1923097, 2008240},
    {2097152, 2190001, 2286961, 2388213, 2493949, 2604365, 2719670, 2840080, 2965821, 3097129, 3234251, 3377444, 3526976, 3683128, 3846194, 4016480},
    {4194304, 4380002, 4573921, 4776426, 4987897, 5208730, 5439340, 5680160, 5931642, 6194258, 6468502, 6754887, 7053951, 7366256, 7692388, 8032959},
    {8388608, 8760004, 9147842, 9552852, 9975793, 10417459, 10878679, 11360319, 11863284, 12388516, 12937003, 13509773, 14107901, 14732511, 15384775, 16065918},
    {16777216, 17520007, 18295684, 19105703, 19951585, 20834917, 21757358, 22720638, 23726567, 24777032, 25874005, 27019545, 28215802, 29465022, 30769550, 32131835},
    {33554432, 35040014, 36591368, 38211406, 39903170, 41669834, 43514715, 45441276, 47453133, 49554063, 51748009, 54039089, 56431604, 58930044, 61539100, 64263669},
    {67108864, 70080028, 73182736, 76422812, 79806339, 83339668, 87029430, 90882552, 94906266, 99108125, 103496017, 108078177, 112863207, 117860088, 123078200, 128527337},
    {134217728, 140160055, 146365471, 152845624, 159612678, 166679335, 174058859, 181765103, 189812532, 198216250, 206992034, 216156354, 225726413, 235720175, 246156399, 257054674},
    {268435456, 280320109, 292730941, 305691247, 319225355, 333358669, 348117718, 363530206, 379625063, 396432500, 413984067, 432312707, 451452826, 471440350, 492312797, 514109347}
};

/* ------------------------------------------------------------------------------------------- threefry2x32, keys */
static inline uint32_t rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

static void threefry(uint32_t k0, uint32_t k1, uint32_t x0, uint32_t x1, uint32_t *y0, uint32_t *y1) {
    static const int rot[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};
    uint32_t ks[3] = {k0, k1, k0 ^ k1 ^ 0x1BD11BDAu};
    int i, j;
    x0 += ks[0];
    x1 += ks[1];
    for (i = 0; i < 5; i++) {
        for (j = 0; j < 4; j++) {
            x0 += x1;
            x1 = rotl32(x1, rot[i % 2][j]) ^ x0;
        }
        x0 += ks[(i + 1) % 3];
        x1 += ks[(i + 2) % 3] + (uint32_t)(i + 1);
    }
    *y0 = x0;
    *y1 = x1;
}

void egg_threefry2x32(uint32_t k0, uint32_t k1, const uint32_t *x0, const uint32_t *x1, uint32_t *y0, uint32_t *y1,
                      int64_t n) {
    int64_t i;
    for (i = 0; i < n; i++) threefry(k0, k1, x0[i], x1[i], &y0[i], &y1[i]);
}

/* ------------------------------------------------------------------------------------------- the noise table */
int32_t egg_pair_hash(int32_t x) {
    uint32_t t = (uint32_t)(x >> 16) ^ (uint32_t)x;          /* >> of a signed int32: arithmetic */
    return (int32_t)(t * HASH_MULT);                           /* int32 product, wrapping */
}

uint32_t egg_window_start(uint32_t word0, int32_t pair) {
    return (word0 ^ (uint32_t)egg_pair_hash(pair)) & TABLE_MASK;
}

uint32_t egg_clamp_start(uint32_t start, int64_t n) {
    uint32_t last = (uint32_t)(TABLE_SIZE - (uint64_t)n);
    return start < last ? start : last;
}

static inline int8_t table_entry(const int8_t *lut, uint32_t tk0, uint32_t tk1, uint32_t j) {
    uint32_t y0, y1;
    threefry(tk0, tk1, 0u, j, &y0, &y1);
    return lut[(y0 ^ y1) >> LUT_SHIFT];
}

void egg_table_entries(const int8_t *lut, const uint32_t *tkey, const uint32_t *counters, int64_t n, int8_t *out) {
    int64_t i;
    for (i = 0; i < n; i++) out[i] = table_entry(lut, tkey[0], tkey[1], counters[i]);
}

/* TABLE[c : c + n], c = min(start, 2^30 - n) */
void egg_window(const int8_t *lut, const uint32_t *tkey, uint32_t start, int64_t n, int8_t *out) {
    uint32_t c = egg_clamp_start(start, n);
    int64_t i;
    for (i = 0; i < n; i++) out[i] = table_entry(lut, tkey[0], tkey[1], c + (uint32_t)i);
}

/* ------------------------------------------------------------------------------------------- integer helpers */
static inline int32_t clip(int32_t v) { return v < -MAXV ? -MAXV : (v > MAXV ? MAXV : v); }

static inline int32_t floordiv(int32_t a, int32_t b) {      /* b > 0 */
    int32_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

static int32_t isqrt32(int64_t n) {
    int64_t r = (int64_t)sqrt((double)n);
    while (r * r > n) r--;
    while ((r + 1) * (r + 1) <= n) r++;
    return (int32_t)r;
}

int32_t egg_out_divisor(int32_t in) { return (1 << FIXED_POINT) * isqrt32(in); }

int32_t egg_ln_divide(int32_t numerator, int32_t m) {
    int32_t v = (int16_t)(uint16_t)(uint32_t)numerator;        /* the int16 view (two's complement) */
    if (m == 0) return v == 0 ? -1 : -2;
    return clip(floordiv(v, m));
}

static int32_t EXP2[256];
static int exp2_ready = 0;

static void exp2_init(void) {
    int i;
    if (exp2_ready) return;
    for (i = 0; i < 256; i++) EXP2[i] = (int32_t)(exp2(i / 16.0) * 16.0);
    exp2_ready = 1;
}

int32_t egg_exp2_entry(int32_t i) { exp2_init(); return EXP2[i & 255]; }

int32_t egg_log2_threshold(int32_t e, int32_t f) { return LOG2_THR[e][f]; }

/* LOG2[k] = int32(log2((k + 1) / 16) * 16), exactly (spec.int8.log2_entry) */
int32_t egg_log2_entry(int32_t k) {
    int32_t n = k + 1, e = 0, m, f;
    while ((n >> (e + 1)) != 0) e++;
    m = 16 * e;
    for (f = 1; f < 16; f++) m += n >= LOG2_THR[e][f];
    return (n >= 16 || (n & (n - 1)) == 0) ? m - 64 : m - 63;
}

/* egg.c's log2: 16 k + the mantissa's top 4 bits below the leading one (linear), - 64; 0 for x <= 0 */
int32_t egg_log2_mitchell(int32_t x) {
    int32_t k = 0, frac;
    if (x <= 0) return 0;
    while ((x >> (k + 1)) != 0) k++;
    frac = k >= 4 ? (x - (1 << k)) >> (k - 4) : (x - (1 << k)) << (4 - k);
    return (k << 4) + frac - 64;
}

/* ll = z[target] - LOG2[sum_v EXP2[z_v] - 1], z = logits + 128 (mitchell: z[target] - log2_mitchell(sum)) */
static int32_t ll_mode(const int8_t *logits, int32_t target, int mitchell) {
    int32_t sum = 0;
    int v;
    exp2_init();
    for (v = 0; v < VOCAB; v++) sum += EXP2[logits[v] + 128];
    return (logits[target] + 128) - (mitchell ? egg_log2_mitchell(sum) : egg_log2_entry(sum - 1));
}

int32_t egg_log_likelihood(const int8_t *logits, int32_t target) { return ll_mode(logits, target, 0); }
int32_t egg_log_likelihood_mitchell(const int8_t *logits, int32_t target) { return ll_mode(logits, target, 1); }

/* ------------------------------------------------------------------------------------------- the model's layout */
typedef struct {
    int d, L, ss, reuse, clt, mode;
    uint32_t base;
    int frozen[NLEAF];
    const int8_t *lut;
    uint32_t tk0, tk1;
    const uint32_t *keys;
    int cls[NLEAF], a[NLEAF], b[NLEAF], nsl[NLEAF];
    int64_t psz[NLEAF], poff[NLEAF], nsz[NLEAF], noff[NLEAF], koff[NLEAF];
    int64_t ptotal, ntotal, nkeys;
} Model;

enum { UF, UH, WF, WH, BF, BH, LN1, LN2, MLP0, MLP1, EMB, HEAD, LNOUT };

static void model_init(Model *M, const int32_t *cfg, const int8_t *lut, const uint32_t *tkey, const uint32_t *keys) {
    int d = cfg[0], i;
    int64_t p = 0, n = 0, k = 0;
    M->d = d; M->L = cfg[1]; M->ss = cfg[2]; M->reuse = cfg[3]; M->clt = cfg[4];
    M->mode = cfg[5]; M->base = (uint32_t)cfg[6];
    M->lut = lut; M->keys = keys;
    M->tk0 = tkey ? tkey[0] : 0u; M->tk1 = tkey ? tkey[1] : 0u;
    for (i = 0; i < NLEAF; i++) {
        int cls, a, b;
        if (i <= WH) { cls = CLS_MM; a = d; b = d; }
        else if (i <= LN2 || i == LNOUT) { cls = CLS_PARAM; a = d; b = 1; }
        else if (i == MLP0) { cls = CLS_MM; a = 4 * d; b = d; }
        else if (i == MLP1) { cls = CLS_MM; a = d; b = 4 * d; }
        else if (i == EMB) { cls = CLS_EMB; a = VOCAB; b = d; }
        else { cls = CLS_MM; a = VOCAB; b = d; }                   /* head (256, d) */
        M->cls[i] = cls; M->a[i] = a; M->b[i] = b;
        M->frozen[i] = (M->mode & MODE_MATRICES) && cls != CLS_MM;
        M->nsl[i] = i < NSTACKED ? M->L : 1;
        M->psz[i] = (int64_t)a * b;
        M->nsz[i] = cls == CLS_PARAM ? a : a + b;
        M->poff[i] = p; M->noff[i] = n; M->koff[i] = k;
        p += M->psz[i] * M->nsl[i]; n += M->nsz[i] * M->nsl[i]; k += M->nsl[i];
    }
    M->ptotal = p; M->ntotal = n; M->nkeys = k;
}

int64_t egg_param_count(const int32_t *cfg) { Model M; model_init(&M, cfg, 0, 0, 0); return M.ptotal; }
int64_t egg_noise_count(const int32_t *cfg) { Model M; model_init(&M, cfg, 0, 0, 0); return M.ntotal; }
int64_t egg_key_count(const int32_t *cfg) { Model M; model_init(&M, cfg, 0, 0, 0); return M.nkeys; }

static int32_t true_epoch(const Model *M, int32_t epoch) { return M->reuse == 0 ? 0 : epoch / M->reuse; }

static int64_t window_len(const Model *M, int leaf) {
    return M->cls[leaf] == CLS_PARAM ? 2 * (int64_t)M->a[leaf] : (int64_t)M->a[leaf] + M->b[leaf];
}

/* the clamped start of leaf `leaf` slice l for (epoch, thread) */
static uint32_t leaf_start(const Model *M, int leaf, int l, int32_t epoch, int32_t thread) {
    const uint32_t *k = M->keys + 2 * (M->koff[leaf] + l);
    uint32_t w0, w1;
    threefry(k[0], k[1], 0u, (uint32_t)true_epoch(M, epoch), &w0, &w1);     /* key_data(fold_in(k, te)) */
    return egg_clamp_start(egg_window_start(w0, thread >> 1), window_len(M, leaf));
}

/* every clamped start of one member: (nkeys,) in key order */
void egg_window_starts(const int32_t *cfg, const uint32_t *keys, int32_t epoch, int32_t thread, uint32_t *out) {
    Model M;
    int i, l;
    model_init(&M, cfg, 0, 0, keys);
    for (i = 0; i < NLEAF; i++)
        for (l = 0; l < M.nsl[i]; l++) out[M.koff[i] + l] = leaf_start(&M, i, l, epoch, thread);
}

static uint32_t xorshift32(uint32_t *state) {
    uint32_t x = *state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    *state = x;
    return x;
}

/* egg.c's noise value: sign from bit 0 (1: +), magnitude bits 1..5 */
static int32_t xorshift_value(uint32_t *state) {
    uint32_t r = xorshift32(state);
    return (r & 1u ? 1 : -1) * (int32_t)((r >> 1) & 31u);
}

static const int XORSHIFT_K[NLEAF] = {2, 4, 1, 3, 0, 0, 0, 0, 5, 6, 0, 999, 0};   /* Uf, Uh, Wf, Wh, .., mlp, head */

uint32_t egg_xorshift_seed(uint32_t base, int32_t epoch, int32_t pair, int32_t leaf, int32_t l) {
    uint32_t step_seed = base ^ ((uint32_t)epoch * 0x9e3779b9u);
    return step_seed + (uint32_t)pair + (leaf == HEAD ? 0u : 100u * (uint32_t)l) + (uint32_t)XORSHIFT_K[leaf];
}

/* one leaf slice's noise for (epoch, thread) into out (nsz entries) */
static void leaf_noise(const Model *M, int leaf, int l, int32_t epoch, int32_t thread, int8_t *w, int32_t *out) {
    uint32_t c;
    int64_t n = window_len(M, leaf), i;
    int32_t s = (thread % 2 == 0) ? 1 : -1;
    int a = M->a[leaf], b = M->b[leaf];
    if ((M->mode & MODE_XORSHIFT) && M->cls[leaf] == CLS_MM) {
        uint32_t rng = egg_xorshift_seed(M->base, epoch, thread >> 1, leaf, l);
        for (i = 0; i < a; i++) out[i] = s * xorshift_value(&rng);        /* A first */
        for (i = 0; i < b; i++) out[a + i] = xorshift_value(&rng);
        return;
    }
    c = leaf_start(M, leaf, l, epoch, thread);
    for (i = 0; i < n; i++) w[i] = table_entry(M->lut, M->tk0, M->tk1, c + (uint32_t)i);
    if (M->cls[leaf] == CLS_PARAM) {
        for (i = 0; i < a; i++) out[i] = s * ((int32_t)w[2 * i] * (int32_t)w[2 * i + 1]);
    } else {
        for (i = 0; i < a; i++) out[i] = s * (int32_t)w[b + i];       /* A: after B in the window, signed */
        for (i = 0; i < b; i++) out[a + i] = w[i];                   /* B first */
    }
}

/* every leaf's noise of one member; a frozen leaf's (evolving=matrices) is zero: it is never read, and drawing it
 * would read the table (so xorshift with evolving=matrices runs without the look-up) */
static void member_noise(const Model *M, int32_t epoch, int32_t thread, int8_t *w, int32_t *noise) {
    int i, l;
    for (i = 0; i < NLEAF; i++) {
        if (M->frozen[i]) {
            memset(noise + M->noff[i], 0, (size_t)(M->nsz[i] * M->nsl[i]) * sizeof(int32_t));
            continue;
        }
        for (l = 0; l < M->nsl[i]; l++)
            leaf_noise(M, i, l, epoch, thread, w, noise + M->noff[i] + l * M->nsz[i]);
    }
}

static int64_t max_window(const Model *M) {
    int64_t best = 0;
    int i;
    for (i = 0; i < NLEAF; i++) if (window_len(M, i) > best) best = window_len(M, i);
    return best;
}

void egg_member_noise(const int32_t *cfg, const int8_t *lut, const uint32_t *tkey, const uint32_t *keys,
                      int32_t epoch, int32_t thread, int32_t *noise) {
    Model M;
    int8_t *w;
    model_init(&M, cfg, lut, tkey, keys);
    w = (int8_t *)malloc((size_t)max_window(&M));
    member_noise(&M, epoch, thread, w, noise);
    free(w);
}

/* ------------------------------------------------------------------------------------------- the ops */
/* clip((x W^T [+ ((x B) A^T) >> (4 + ss)]) // (16 isqrt(in))): W (out, in) int8; A (out), B (in) int32 or NULL */
static void mm_div(const int8_t *W, int32_t out, int32_t in, const int8_t *x, const int32_t *A, const int32_t *B,
                   int32_t ss, int32_t div, int8_t *y) {
    int32_t xb = 0, o, i;
    if (A) for (i = 0; i < in; i++) xb += (int32_t)x[i] * B[i];
    for (o = 0; o < out; o++) {
        const int8_t *row = W + (int64_t)o * in;
        int32_t acc = 0;
        for (i = 0; i < in; i++) acc += (int32_t)x[i] * (int32_t)row[i];
        if (A) acc += (xb * A[o]) >> (FIXED_POINT + ss);
        y[o] = (int8_t)clip(floordiv(acc, div));        /* div a power of 2: the same as acc >> log2(div) */
    }
}

void egg_mm(const int8_t *W, int32_t out, int32_t in, const int8_t *x, const int32_t *A, const int32_t *B,
            int32_t ss, int8_t *y) {
    mm_div(W, out, in, x, A, B, ss, egg_out_divisor(in), y);
}

/* E[tok] [then clip(E[tok] + ((A[tok] B^T) >> (4 + ss)))]: E (vocab, d) */
void egg_emb(const int8_t *E, int32_t d, int32_t tok, const int32_t *A, const int32_t *B, int32_t ss, int8_t *y) {
    int32_t j;
    for (j = 0; j < d; j++) {
        int32_t v = E[(int64_t)tok * d + j];
        y[j] = (int8_t)(A ? clip(v + ((A[tok] * B[j]) >> (FIXED_POINT + ss))) : v);
    }
}

/* P [then clip(P + (E >> (4 + ss)))] */
void egg_param(const int8_t *P, int32_t m, const int32_t *E, int32_t ss, int8_t *y) {
    int32_t i;
    for (i = 0; i < m; i++) y[i] = (int8_t)(E ? clip(P[i] + (E[i] >> (FIXED_POINT + ss))) : P[i]);
}

/* DIV[max(sum |x|, 1) // d][x * w]; trunc (egg.c): clip((x w) / mean) truncating, a zero mean taken as 1 */
static void ln_mode(const int8_t *x, const int8_t *w, int32_t d, int trunc, int8_t *y) {
    int32_t sum = 0, m, j;
    for (j = 0; j < d; j++) sum += x[j] < 0 ? -(int32_t)x[j] : x[j];
    m = (sum > 1 ? sum : 1) / d;
    if (trunc && m == 0) m = 1;
    for (j = 0; j < d; j++)
        y[j] = (int8_t)(trunc ? clip(((int32_t)x[j] * w[j]) / m) : egg_ln_divide((int32_t)x[j] * w[j], m));
}

void egg_ln(const int8_t *x, const int8_t *w, int32_t d, int8_t *y) { ln_mode(x, w, d, 0, y); }
void egg_ln_trunc(const int8_t *x, const int8_t *w, int32_t d, int8_t *y) { ln_mode(x, w, d, 1, y); }

/* clip(a + b [+ c]) in int32; c may be NULL */
void egg_clipped_add(const int8_t *a, const int8_t *b, const int8_t *c, int64_t n, int8_t *y) {
    int64_t i;
    for (i = 0; i < n; i++) y[i] = (int8_t)clip((int32_t)a[i] + b[i] + (c ? c[i] : 0));
}

/* ------------------------------------------------------------------------------------------- the model's ops */
/* the leaf's params / noise of slice l (noise NULL: noise off) */
#define PSLICE(M, P, leaf, l) ((P) + (M)->poff[leaf] + (int64_t)(l) * (M)->psz[leaf])
#define NSLICE(M, N, leaf, l) \
    ((N) && !(M)->frozen[leaf] ? (N) + (M)->noff[leaf] + (int64_t)(l) * (M)->nsz[leaf] : (const int32_t *)0)

static void op_mm(const Model *M, const int8_t *P, const int32_t *N, int leaf, int l, const int8_t *x, int8_t *y) {
    const int32_t *A = NSLICE(M, N, leaf, l);
    int32_t in = M->b[leaf];
    int32_t div = (M->mode & MODE_FIXED_SHIFT) ? (in == 4 * M->d ? 1 << 9 : 1 << 8) : egg_out_divisor(in);
    mm_div(PSLICE(M, P, leaf, l), M->a[leaf], in, x, A, A ? A + M->a[leaf] : 0, M->ss, div, y);
}

static void op_param(const Model *M, const int8_t *P, const int32_t *N, int leaf, int l, int8_t *y) {
    egg_param(PSLICE(M, P, leaf, l), M->a[leaf], NSLICE(M, N, leaf, l), M->ss, y);
}

static void op_ln(const Model *M, const int8_t *P, const int32_t *N, int leaf, int l, const int8_t *x, int8_t *y) {
    int8_t w[1024];
    op_param(M, P, N, leaf, l, w);
    ln_mode(x, w, M->d, (M->mode & MODE_LN_TRUNC) != 0, y);
}

static void op_emb(const Model *M, const int8_t *P, const int32_t *N, int32_t tok, int8_t *y) {
    const int32_t *A = NSLICE(M, N, EMB, 0);
    egg_emb(PSLICE(M, P, EMB, 0), M->d, tok, A, A ? A + VOCAB : 0, M->ss, y);
}

/* a GRU gate's sum: clip(a + b + bias) (nano-egg) or clip(clip(a + b) + bias) (gate_clip=nested) */
static void gate_add(const Model *M, const int8_t *a, const int8_t *b, const int8_t *bias, int d, int8_t *y) {
    if (M->mode & MODE_NESTED_CLIP) {
        egg_clipped_add(a, b, 0, d, y);
        egg_clipped_add(y, bias, 0, d, y);
    } else {
        egg_clipped_add(a, b, bias, d, y);
    }
}

/* nano-egg's GRU on layer l: f, gated, cand and the new state (returned as s_new) */
static void op_gru(const Model *M, const int8_t *P, const int32_t *N, int l, const int8_t *x, const int8_t *s,
                   int8_t *f, int8_t *gated, int8_t *cand, int8_t *s_new) {
    int d = M->d, j;
    int8_t t1[1024], t2[1024], t3[1024];
    op_mm(M, P, N, WF, l, x, t1);
    op_mm(M, P, N, UF, l, s, t2);
    op_param(M, P, N, BF, l, t3);
    gate_add(M, t1, t2, t3, d, f);
    for (j = 0; j < d; j++) gated[j] = (int8_t)((((int32_t)f[j] + MAXV) * s[j]) >> LOGMAX_PLUS_1);
    op_mm(M, P, N, WH, l, x, t1);
    op_mm(M, P, N, UH, l, gated, t2);
    op_param(M, P, N, BH, l, t3);
    gate_add(M, t1, t2, t3, d, cand);
    for (j = 0; j < d; j++) {
        int8_t step = (int8_t)((((int32_t)f[j] + MAXV) * ((int32_t)cand[j] - s[j])) >> LOGMAX_PLUS_1);
        s_new[j] = (int8_t)(s[j] + step);             /* int8 + int8, as int8: the exact sum is in [-127, 127] */
    }
}

static void op_mlp(const Model *M, const int8_t *P, const int32_t *N, int l, const int8_t *x, int8_t *hidden,
                   int8_t *y) {
    op_mm(M, P, N, MLP0, l, x, hidden);
    op_mm(M, P, N, MLP1, l, hidden, y);
}

/* egg.c's init (full_trained_egg-cpumulti.c's main): ONE xorshift32 stream from `seed` (egg.c: 42), each value
 * xorshift_value (sign(bit 0) * bits 1..5), filling in egg.c's order: the embedding (256 x d), the head (256 x d),
 * then per layer l: Wf, Uf, Wh, Uh (d x d), mlp.0 (4d x d), mlp.1 (d x 4d), each row-major; biases 0, every norm
 * weight 16. P: the flat params (flatten order) */
void egg_xorshift_init(const int32_t *cfg, uint32_t seed, int8_t *P) {
    static const int order[6] = {WF, UF, WH, UH, MLP0, MLP1};
    Model M;
    uint32_t rng = seed;
    int64_t i;
    int l, g;
    model_init(&M, cfg, 0, 0, 0);
    memset(P, 0, (size_t)M.ptotal);
    for (i = 0; i < M.psz[EMB]; i++) PSLICE(&M, P, EMB, 0)[i] = (int8_t)xorshift_value(&rng);
    for (i = 0; i < M.psz[HEAD]; i++) PSLICE(&M, P, HEAD, 0)[i] = (int8_t)xorshift_value(&rng);
    for (l = 0; l < M.L; l++)
        for (g = 0; g < 6; g++)
            for (i = 0; i < M.psz[order[g]]; i++) PSLICE(&M, P, order[g], l)[i] = (int8_t)xorshift_value(&rng);
    for (l = 0; l < M.L; l++)
        for (i = 0; i < M.d; i++) PSLICE(&M, P, LN1, l)[i] = PSLICE(&M, P, LN2, l)[i] = 16;
    for (i = 0; i < M.d; i++) PSLICE(&M, P, LNOUT, 0)[i] = 16;
}

/* the exported model-level ops (noise NULL: noise off); d <= 256 */
void egg_op_mm(const int32_t *cfg, const int8_t *P, const int32_t *N, int32_t leaf, int32_t l, const int8_t *x,
               int8_t *y) {
    Model M; model_init(&M, cfg, 0, 0, 0); op_mm(&M, P, N, leaf, l, x, y);
}
void egg_op_param(const int32_t *cfg, const int8_t *P, const int32_t *N, int32_t leaf, int32_t l, int8_t *y) {
    Model M; model_init(&M, cfg, 0, 0, 0); op_param(&M, P, N, leaf, l, y);
}
void egg_op_ln(const int32_t *cfg, const int8_t *P, const int32_t *N, int32_t leaf, int32_t l, const int8_t *x,
               int8_t *y) {
    Model M; model_init(&M, cfg, 0, 0, 0); op_ln(&M, P, N, leaf, l, x, y);
}
void egg_op_emb(const int32_t *cfg, const int8_t *P, const int32_t *N, int32_t tok, int8_t *y) {
    Model M; model_init(&M, cfg, 0, 0, 0); op_emb(&M, P, N, tok, y);
}
/* out: f, gated, cand, new state (4 d) */
void egg_op_gru(const int32_t *cfg, const int8_t *P, const int32_t *N, int32_t l, const int8_t *x, const int8_t *s,
                int8_t *out) {
    Model M; int d = cfg[0];
    model_init(&M, cfg, 0, 0, 0); op_gru(&M, P, N, l, x, s, out, out + d, out + 2 * d, out + 3 * d);
}
/* out: hidden (4 d), then y (d) */
void egg_op_mlp(const int32_t *cfg, const int8_t *P, const int32_t *N, int32_t l, const int8_t *x, int8_t *out) {
    Model M; model_init(&M, cfg, 0, 0, 0); op_mlp(&M, P, N, l, x, out, out + 4 * cfg[0]);
}

/* ------------------------------------------------------------------------------------------- the forward */
/* per-token trace width (int32): emb d, L x (ln1, f, gated, cand, state, att, ln2 d; mlp.0 4d; mlp, out d),
 * ln_out d, logits 256, ll 1 */
int64_t egg_trace_width(const int32_t *cfg) { return (int64_t)cfg[0] * (2 + 13 * cfg[1]) + VOCAB + 1; }

/* one token: logits; state S (L, d) updated in place; tr (trace row) may be NULL */
static void forward(const Model *M, const int8_t *P, const int32_t *N, int32_t tok, int8_t *S, int8_t *logits,
                    int32_t *tr) {
    int d = M->d, l, j;
    int8_t x[256], u[256], f[256], g[256], c[256], sn[256], y[256], v[256], h[1024], mo[256], out[256];
#define TRACE(arr, n) do { if (tr) { for (j = 0; j < (n); j++) *tr++ = (arr)[j]; } } while (0)
    op_emb(M, P, N, tok, x);
    TRACE(x, d);
    for (l = 0; l < M->L; l++) {
        int8_t *s = S + (int64_t)l * d;
        op_ln(M, P, N, LN1, l, x, u);
        op_gru(M, P, N, l, u, s, f, g, c, sn);
        memcpy(s, sn, (size_t)d);
        egg_clipped_add(sn, x, 0, d, y);
        if (M->mode & MODE_NO_MLP) {              /* egg.c cpumulti: no ln2, no MLP (traced as zeros) */
            memset(v, 0, (size_t)d); memset(h, 0, (size_t)(4 * d)); memset(mo, 0, (size_t)d);
            memcpy(out, y, (size_t)d);
        } else {
            op_ln(M, P, N, LN2, l, y, v);
            op_mlp(M, P, N, l, v, h, mo);
            egg_clipped_add(mo, y, 0, d, out);
        }
        TRACE(u, d); TRACE(f, d); TRACE(g, d); TRACE(c, d); TRACE(sn, d); TRACE(y, d); TRACE(v, d);
        TRACE(h, 4 * d); TRACE(mo, d); TRACE(out, d);
        memcpy(x, out, (size_t)d);
    }
    op_ln(M, P, N, LNOUT, 0, x, u);
    op_mm(M, P, N, HEAD, 0, u, logits);
    TRACE(u, d);
    TRACE(logits, VOCAB);
#undef TRACE
}

/* one member over T tokens: the summed ll; S (L, d) carried in place; the state zeroed before an input byte 0 */
static int32_t member(const Model *M, const int8_t *P, const int32_t *N, const int32_t *tokens, int32_t T, int8_t *S,
                      int32_t *trace, int64_t width) {
    int32_t t, score = 0, ll;
    int8_t logits[VOCAB];
    for (t = 0; t < T; t++) {
        int32_t *tr = trace ? trace + t * width : 0;
        if (tokens[t] == 0 && !(M->mode & MODE_NO_RESET)) memset(S, 0, (size_t)M->L * M->d);
        forward(M, P, N, tokens[t], S, logits, tr);
        ll = ll_mode(logits, tokens[t + 1], (M->mode & MODE_MITCHELL) != 0);
        if (tr) tr[width - 1] = ll;
        score += ll;
    }
    return score;
}

/* a member's run with its own noise (noise_on 0: noise off), every intermediate into trace (T, width) or NULL;
 * tokens (T + 1,); S (L, d) in place; returns the score */
int32_t egg_member(const int32_t *cfg, const int8_t *lut, const uint32_t *tkey, const uint32_t *keys,
                   const int8_t *P, int32_t epoch, int32_t thread, int32_t noise_on, const int32_t *tokens, int32_t T,
                   int8_t *S, int32_t *trace) {
    Model M;
    int32_t *noise = 0, score;
    int8_t *w = 0;
    model_init(&M, cfg, lut, tkey, keys);
    if (noise_on) {
        noise = (int32_t *)malloc((size_t)M.ntotal * sizeof(int32_t));
        w = (int8_t *)malloc((size_t)max_window(&M));
        member_noise(&M, epoch, thread, w, noise);
    }
    score = member(&M, P, noise, tokens, T, S, trace, egg_trace_width(cfg));
    free(noise); free(w);
    return score;
}

/* the population: member m is thread m on tokens (pop, T + 1); states (pop, L, d) in place; scores (pop,) */
void egg_population_scores(const int32_t *cfg, const int8_t *lut, const uint32_t *tkey, const uint32_t *keys,
                           const int8_t *P, int32_t epoch, int32_t pop, const int32_t *tokens, int32_t T,
                           int8_t *states, int32_t *scores) {
    Model M;
    int32_t *noise, m;
    int8_t *w;
    model_init(&M, cfg, lut, tkey, keys);
    noise = (int32_t *)malloc((size_t)M.ntotal * sizeof(int32_t));
    w = (int8_t *)malloc((size_t)max_window(&M));
    for (m = 0; m < pop; m++) {
        member_noise(&M, epoch, m, w, noise);
        scores[m] = member(&M, P, noise, tokens + (int64_t)m * (T + 1), T, states + (int64_t)m * M.L * M.d, 0, 0);
    }
    free(noise); free(w);
}

/* validation: rows (n, len) each from a zero state with noise off; scores (n,) */
void egg_validation_scores(const int32_t *cfg, const int8_t *P, int32_t n, const int32_t *rows, int32_t len,
                           int32_t *scores) {
    Model M;
    int32_t r;
    int8_t S[16 * 1024];
    model_init(&M, cfg, 0, 0, 0);
    for (r = 0; r < n; r++) {
        memset(S, 0, (size_t)M.L * M.d);
        scores[r] = member(&M, P, 0, rows + (int64_t)r * len, len - 1, S, 0, 0);
    }
}

/* ------------------------------------------------------------------------------------------- fitness, votes, update */
void egg_fitness(const int32_t *scores, int32_t pop, int8_t *f) {
    int32_t k;
    for (k = 0; k < pop / 2; k++) {
        int32_t diff = scores[2 * k] - scores[2 * k + 1];
        f[k] = (int8_t)((diff > 0) - (diff < 0));
    }
}

static inline int32_t sgn(int32_t v) { return (v > 0) - (v < 0); }

/* Z (param count, int32, flatten order): sum_k f_k N_k over the pairs, each with thread 2k's (+) noise */
void egg_votes(const int32_t *cfg, const int8_t *lut, const uint32_t *tkey, const uint32_t *keys, int32_t epoch,
               const int8_t *f, int32_t pairs, int32_t *Z) {
    Model M;
    int32_t *nz, k, i, j;
    int8_t *w;
    int leaf, l;
    model_init(&M, cfg, lut, tkey, keys);
    nz = (int32_t *)malloc((size_t)(max_window(&M) + VOCAB) * sizeof(int32_t));
    w = (int8_t *)malloc((size_t)max_window(&M));
    memset(Z, 0, (size_t)M.ptotal * sizeof(int32_t));
    for (leaf = 0; leaf < NLEAF; leaf++) {
        int a = M.a[leaf], b = M.b[leaf];
        for (l = 0; l < M.nsl[leaf] && !M.frozen[leaf]; l++) {
            int32_t *z = Z + M.poff[leaf] + (int64_t)l * M.psz[leaf];
            for (k = 0; k < pairs; k++) {
                int32_t fk = f[k];
                if (fk == 0) continue;                              /* adds 0 */
                leaf_noise(&M, leaf, l, epoch, 2 * k, w, nz);
                if (M.cls[leaf] == CLS_PARAM) {
                    for (i = 0; i < a; i++) z[i] += fk * (M.clt ? nz[i] : sgn(nz[i]));
                } else {
                    const int32_t *A = nz, *B = nz + a;
                    for (i = 0; i < a; i++) {
                        int32_t fa = fk * (M.clt ? A[i] : sgn(A[i]));
                        int32_t *zr = z + (int64_t)i * b;
                        if (M.clt) for (j = 0; j < b; j++) zr[j] += fa * B[j];
                        else for (j = 0; j < b; j++) zr[j] += fa * sgn(B[j]);
                    }
                }
            }
        }
    }
    free(nz); free(w);
}

/* P' = clip(P if |Z| * 16 < thr * isqrt(pairs) * (256 if use_clt else 1) else P + (Z > 0 ? 1 : -1)) */
void egg_apply_votes(const int8_t *P, const int32_t *Z, int64_t n, int32_t thr, int32_t pairs, int32_t use_clt,
                     int8_t *out) {
    int32_t bound = thr * isqrt32(pairs) * (use_clt ? 256 : 1);
    int64_t i;
    for (i = 0; i < n; i++) {
        int32_t z = Z[i], az = z < 0 ? -z : z, p = P[i];
        out[i] = (int8_t)clip(az * (1 << FIXED_POINT) < bound ? p : (z > 0 ? p + 1 : p - 1));
    }
}

/* the update under cfg's mode: frozen leaves kept; fixed160: +-1 where |Z| > 160 (saturating), else the z-test */
void egg_apply_votes_mode(const int32_t *cfg, const int8_t *P, const int32_t *Z, int32_t thr, int32_t pairs,
                          int8_t *out) {
    Model M;
    int leaf;
    int64_t i;
    model_init(&M, cfg, 0, 0, 0);
    for (leaf = 0; leaf < NLEAF; leaf++) {
        int64_t off = M.poff[leaf], n = M.psz[leaf] * M.nsl[leaf];
        if (M.frozen[leaf]) memcpy(out + off, P + off, (size_t)n);
        else if (M.mode & MODE_FIXED160)
            for (i = off; i < off + n; i++)
                out[i] = (int8_t)clip(Z[i] > 160 ? P[i] + 1 : (Z[i] < -160 ? P[i] - 1 : P[i]));
        else egg_apply_votes(P + off, Z + off, n, thr, pairs, M.clt, out + off);
    }
}

/* one ES epoch: scores (pop,), states in place, fitness (pop/2,), Z (param count), P_new (param count) */
void egg_epoch(const int32_t *cfg, const int8_t *lut, const uint32_t *tkey, const uint32_t *keys, const int8_t *P,
               int32_t epoch, int32_t thr, int32_t pop, const int32_t *tokens, int32_t T, int8_t *states,
               int32_t *scores, int8_t *f, int32_t *Z, int8_t *P_new) {
    Model M;
    model_init(&M, cfg, lut, tkey, keys);
    egg_population_scores(cfg, lut, tkey, keys, P, epoch, pop, tokens, T, states, scores);
    egg_fitness(scores, pop, f);
    egg_votes(cfg, lut, tkey, keys, epoch, f, pop / 2, Z);
    egg_apply_votes_mode(cfg, P, Z, thr, pop / 2, P_new);
}
