/* Gaussian noise for DP-SGD on the CPU: Philox4x32-10 (Salmon et al., SC 2011) and the
 * Box-Muller transform, 8 (AVX2) or 16 (AVX-512) blocks at a time, parallel over the OpenMP
 * runtime that torch already uses (so the noise runs on the threads torch's own kernels run on).
 *
 * Built and loaded by raydp_hpo/trainables/gaussian_kernel.py, which documents the stream
 * and holds the reference implementation the tests compare this file against.
 *
 * Stream (fixed by the output index only, not by the number of threads or the vector width):
 *   block b (64-bit) has the Philox counter (b mod 2^32, b div 2^32, n0, n1) under the key
 *   (k0, k1); its four output words x0..x3 give two pairs (x0, x1) and (x2, x3);
 *   group g holds the blocks 16g..16g+15 (l = b - 16g) and writes out[64g .. 64g+63]:
 *     out[64g + 32h + l]      = std * sqrt(-2 log u1) * cos(2 pi u2)
 *     out[64g + 32h + 16 + l] = std * sqrt(-2 log u1) * sin(2 pi u2)
 *   with (u1, u2) from the pair h of block l:
 *     u1 = ((x >> 8) + 1) * 2^-24  in (0, 1]  (log u1 is finite; |z| <= sqrt(2 ln 2^24) = 5.77)
 *     u2 =  (x >> 8)      * 2^-24  in [0, 1)
 *   (24-bit uniforms, exact in float32, as ATen's CPU normal_ uses).
 */
#include <immintrin.h>
#include <stdint.h>

/* glibc's libmvec: the AVX2 ("d"), 8-lane, vector-argument variants of logf, cosf, sinf
 * (at most 4 ulp; the names follow the x86-64 vector function ABI). */
__m256 _ZGVdN8v_logf(__m256);
__m256 _ZGVdN8v_cosf(__m256);
__m256 _ZGVdN8v_sinf(__m256);

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* (hi, lo) of the 32x32 -> 64-bit products a * m, lane by lane. */
static inline void mulhilo8(__m256i a, __m256i m, __m256i *hi, __m256i *lo) {
    __m256i even = _mm256_mul_epu32(a, m);
    __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
    *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

/* Ten Philox4x32 rounds on eight counters at once; the key is bumped after each round. */
static inline void philox8(__m256i c[4], uint32_t k0, uint32_t k1) {
    const __m256i m0 = _mm256_set1_epi32((int)PHILOX_M0);
    const __m256i m1 = _mm256_set1_epi32((int)PHILOX_M1);
    for (int r = 0; r < 10; r++) {
        __m256i hi0, lo0, hi1, lo1;
        mulhilo8(c[0], m0, &hi0, &lo0);
        mulhilo8(c[2], m1, &hi1, &lo1);
        __m256i n0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c[1]), _mm256_set1_epi32((int)k0));
        __m256i n2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c[3]), _mm256_set1_epi32((int)k1));
        c[0] = n0;
        c[1] = lo1;
        c[2] = n2;
        c[3] = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
}

/* Half a group with AVX2: the 8 blocks 16g + 8q .. 16g + 8q + 7 (q = 0, 1) into dst, which
 * points at out[64g]. */
static inline void gaussian_half_avx2(uint64_t g, int q, uint32_t k0, uint32_t k1, uint32_t n0,
                                      uint32_t n1, float std, float *dst) {
    uint64_t b = 16 * g + 8 * (uint64_t)q; /* a multiple of 8: the 8 lanes share the high word */
    __m256i c[4];
    c[0] = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)b),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    c[1] = _mm256_set1_epi32((int)(uint32_t)(b >> 32));
    c[2] = _mm256_set1_epi32((int)n0);
    c[3] = _mm256_set1_epi32((int)n1);
    philox8(c, k0, k1);
    const __m256 ulp = _mm256_set1_ps(1.0f / 16777216.0f);
    const __m256 minus_two = _mm256_set1_ps(-2.0f);
    const __m256 two_pi = _mm256_set1_ps(6.28318530717958647692f);
    const __m256 scale = _mm256_set1_ps(std);
    for (int h = 0; h < 2; h++) {
        __m256 top1 = _mm256_cvtepi32_ps(_mm256_srli_epi32(c[2 * h], 8));
        __m256 top2 = _mm256_cvtepi32_ps(_mm256_srli_epi32(c[2 * h + 1], 8));
        __m256 u1 = _mm256_mul_ps(_mm256_add_ps(top1, _mm256_set1_ps(1.0f)), ulp);
        __m256 u2 = _mm256_mul_ps(top2, ulp);
        __m256 radius =
            _mm256_mul_ps(_mm256_sqrt_ps(_mm256_mul_ps(minus_two, _ZGVdN8v_logf(u1))), scale);
        __m256 theta = _mm256_mul_ps(two_pi, u2);
        _mm256_storeu_ps(dst + 32 * h + 8 * q, _mm256_mul_ps(radius, _ZGVdN8v_cosf(theta)));
        _mm256_storeu_ps(dst + 32 * h + 16 + 8 * q, _mm256_mul_ps(radius, _ZGVdN8v_sinf(theta)));
    }
}

static void gaussian_group_avx2(uint64_t g, uint32_t k0, uint32_t k1, uint32_t n0,
                                uint32_t n1, float std, float *dst) {
    gaussian_half_avx2(g, 0, k0, k1, n0, n1, std, dst);
    gaussian_half_avx2(g, 1, k0, k1, n0, n1, std, dst);
}

/* The same group with AVX-512F: 16 blocks per vector (the same values, up to libmvec's
 * AVX2 and AVX-512 variants rounding differently in the last bits). */
#define AVX512 __attribute__((target("avx512f")))

AVX512 __m512 _ZGVeN16v_logf(__m512);
AVX512 __m512 _ZGVeN16v_cosf(__m512);
AVX512 __m512 _ZGVeN16v_sinf(__m512);

AVX512 static inline void mulhilo16(__m512i a, __m512i m, __m512i *hi, __m512i *lo) {
    __m512i even = _mm512_mul_epu32(a, m);
    __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
    *lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
    *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

AVX512 static inline void philox16(__m512i c[4], uint32_t k0, uint32_t k1) {
    const __m512i m0 = _mm512_set1_epi32((int)PHILOX_M0);
    const __m512i m1 = _mm512_set1_epi32((int)PHILOX_M1);
    for (int r = 0; r < 10; r++) {
        __m512i hi0, lo0, hi1, lo1;
        mulhilo16(c[0], m0, &hi0, &lo0);
        mulhilo16(c[2], m1, &hi1, &lo1);
        __m512i n0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c[1]), _mm512_set1_epi32((int)k0));
        __m512i n2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c[3]), _mm512_set1_epi32((int)k1));
        c[0] = n0;
        c[1] = lo1;
        c[2] = n2;
        c[3] = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
}

AVX512 static void gaussian_group_avx512(uint64_t g, uint32_t k0, uint32_t k1, uint32_t n0,
                                         uint32_t n1, float std, float *dst) {
    uint64_t b = 16 * g; /* a multiple of 16: the 16 lanes share the high word */
    __m512i c[4];
    c[0] = _mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)b),
                            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                                              15));
    c[1] = _mm512_set1_epi32((int)(uint32_t)(b >> 32));
    c[2] = _mm512_set1_epi32((int)n0);
    c[3] = _mm512_set1_epi32((int)n1);
    philox16(c, k0, k1);
    const __m512 ulp = _mm512_set1_ps(1.0f / 16777216.0f);
    const __m512 minus_two = _mm512_set1_ps(-2.0f);
    const __m512 two_pi = _mm512_set1_ps(6.28318530717958647692f);
    const __m512 scale = _mm512_set1_ps(std);
    for (int h = 0; h < 2; h++) {
        __m512 top1 = _mm512_cvtepi32_ps(_mm512_srli_epi32(c[2 * h], 8));
        __m512 top2 = _mm512_cvtepi32_ps(_mm512_srli_epi32(c[2 * h + 1], 8));
        __m512 u1 = _mm512_mul_ps(_mm512_add_ps(top1, _mm512_set1_ps(1.0f)), ulp);
        __m512 u2 = _mm512_mul_ps(top2, ulp);
        __m512 radius =
            _mm512_mul_ps(_mm512_sqrt_ps(_mm512_mul_ps(minus_two, _ZGVeN16v_logf(u1))), scale);
        __m512 theta = _mm512_mul_ps(two_pi, u2);
        _mm512_storeu_ps(dst + 32 * h, _mm512_mul_ps(radius, _ZGVeN16v_cosf(theta)));
        _mm512_storeu_ps(dst + 32 * h + 16, _mm512_mul_ps(radius, _ZGVeN16v_sinf(theta)));
    }
}

typedef void (*group_fn)(uint64_t, uint32_t, uint32_t, uint32_t, uint32_t, float, float *);

/* out[0..n) <- the stream above; threads: how many OpenMP threads may share the work;
 * wide: 1 for the AVX-512F groups (the caller has checked the CPU), 0 for AVX2. */
void raydp_philox_gaussian(float *out, int64_t n, uint32_t k0, uint32_t k1, uint32_t n0,
                           uint32_t n1, float std, int threads, int wide) {
    group_fn group = wide ? gaussian_group_avx512 : gaussian_group_avx2;
    int64_t full = n / 64;
    int64_t i;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && full >= 128)
    for (i = 0; i < full; i++) {
        group((uint64_t)i, k0, k1, n0, n1, std, out + 64 * i);
    }
    if (full * 64 < n) {
        float tail[64];
        group((uint64_t)full, k0, k1, n0, n1, std, tail);
        for (int64_t j = full * 64; j < n; j++) {
            out[j] = tail[j - full * 64];
        }
    }
}

/* One Philox4x32-10 block, for the known-answer tests: out = philox(ctr, key). */
void raydp_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    __m256i c[4];
    for (int w = 0; w < 4; w++) {
        c[w] = _mm256_set1_epi32((int)ctr[w]);
    }
    philox8(c, key[0], key[1]);
    for (int w = 0; w < 4; w++) {
        out[w] = (uint32_t)_mm256_cvtsi256_si32(c[w]);
    }
}
