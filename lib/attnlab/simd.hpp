// The vector of one instruction set, picked by the flags of the translation unit that includes
// this header: AVX-512 (16 lanes), AVX2 + FMA (8 lanes) or plain C++ (1 lane). Only
// kernels_isa.cpp includes it, once per path; the kernels there are written once against these
// few functions. Internal: not installed. Everything has internal linkage (see kernels_isa.cpp
// for why that matters).
#pragma once

#include <cstddef>

#if defined(__AVX512F__) || defined(__AVX2__)
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps(), which it then reports as
// uninitialised (GCC bug 105593, fixed in 12.3): silenced for the header's own lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
#endif

namespace attnlab::kernels::simd {
namespace {

constexpr float kInf = __builtin_inff();

#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512BW__) && defined(__AVX512VL__)

using vec = __m512;
constexpr std::size_t kWidth = 16;
// GEMM register block: 6 rows x 4 vectors = 24 accumulators, 4 rows of B, of 32 registers;
// the A element is broadcast from memory inside the FMA.
constexpr std::size_t kBlockRows = 6, kBlockVecs = 4;

inline __mmask16 first(std::size_t n) {
  return static_cast<__mmask16>((1u << n) - 1u);
}
inline vec load(const float* p) {
  return _mm512_loadu_ps(p);
}
/// Lanes [0, n) from p, the others `fill` (nothing past p + n is touched).
inline vec load(const float* p, std::size_t n, vec fill) {
  return _mm512_mask_loadu_ps(fill, first(n), p);
}
inline void store(float* p, vec v) {
  _mm512_storeu_ps(p, v);
}
inline void store(float* p, vec v, std::size_t n) {
  _mm512_mask_storeu_ps(p, first(n), v);
}
inline vec splat(float x) {
  return _mm512_set1_ps(x);
}
inline vec add(vec a, vec b) {
  return _mm512_add_ps(a, b);
}
inline vec sub(vec a, vec b) {
  return _mm512_sub_ps(a, b);
}
inline vec mul(vec a, vec b) {
  return _mm512_mul_ps(a, b);
}
inline vec max(vec a, vec b) {
  return _mm512_max_ps(a, b);
}
inline vec min(vec a, vec b) {
  return _mm512_min_ps(a, b);
}
inline vec div(vec a, vec b) {
  return _mm512_div_ps(a, b);
}
/// Lanes where x < limit take a, the others b.
inline vec where_below(vec x, float limit, vec a, vec b) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(limit), _CMP_LT_OQ), b, a);
}
inline vec fma(vec a, vec b, vec c) {
  return _mm512_fmadd_ps(a, b, c);
}
inline float reduce_add(vec v) {
  return _mm512_reduce_add_ps(v);
}
inline float reduce_max(vec v) {
  return _mm512_reduce_max_ps(v);
}
inline vec round(vec v) {
  return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
/// p · 2^whole (whole an integer in [-126, 127]), 0 in the lanes where x < below.
inline vec scale_pow2(vec p, vec whole, vec x, float below) {
  return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, splat(below), _CMP_NLT_UQ), p, whole);
}
/// d[c * ldd + j] = s[j * lds + c] for a 16 x 16 block: pairs, then quads, then 128-bit lanes.
inline void transpose_block(const float* s, std::size_t lds, float* d, std::size_t ldd) {
  vec r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = load(s + i * lds);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 16; i += 8)
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xDD);
    }
  for (int j = 0; j < 8; ++j) {
    store(d + j * ldd, _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88));
    store(d + (j + 8) * ldd, _mm512_shuffle_f32x4(t[j], t[j + 8], 0xDD));
  }
}

#elif defined(__AVX2__) && defined(__FMA__)

using vec = __m256;
constexpr std::size_t kWidth = 8;
// 6 rows x 2 vectors = 12 accumulators, 2 rows of B and a broadcast, of 16 registers.
constexpr std::size_t kBlockRows = 6, kBlockVecs = 2;

inline __m256i first(std::size_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline vec load(const float* p) {
  return _mm256_loadu_ps(p);
}
inline vec load(const float* p, std::size_t n, vec fill) {
  const __m256i m = first(n);
  return _mm256_blendv_ps(fill, _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
}
inline void store(float* p, vec v) {
  _mm256_storeu_ps(p, v);
}
inline void store(float* p, vec v, std::size_t n) {
  _mm256_maskstore_ps(p, first(n), v);
}
inline vec splat(float x) {
  return _mm256_set1_ps(x);
}
inline vec add(vec a, vec b) {
  return _mm256_add_ps(a, b);
}
inline vec sub(vec a, vec b) {
  return _mm256_sub_ps(a, b);
}
inline vec mul(vec a, vec b) {
  return _mm256_mul_ps(a, b);
}
inline vec max(vec a, vec b) {
  return _mm256_max_ps(a, b);
}
inline vec min(vec a, vec b) {
  return _mm256_min_ps(a, b);
}
inline vec div(vec a, vec b) {
  return _mm256_div_ps(a, b);
}
/// Lanes where x < limit take a, the others b.
inline vec where_below(vec x, float limit, vec a, vec b) {
  return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, _mm256_set1_ps(limit), _CMP_LT_OQ));
}
inline vec fma(vec a, vec b, vec c) {
  return _mm256_fmadd_ps(a, b, c);
}
inline float reduce_add(vec v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline float reduce_max(vec v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
inline vec round(vec v) {
  return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
/// d[c * ldd + j] = s[j * lds + c] for an 8 x 8 block.
inline void transpose_block(const float* s, std::size_t lds, float* d, std::size_t ldd) {
  vec r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = load(s + i * lds);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {
    store(d + j * ldd, _mm256_permute2f128_ps(r[j], r[j + 4], 0x20));
    store(d + (j + 4) * ldd, _mm256_permute2f128_ps(r[j], r[j + 4], 0x31));
  }
}
inline vec scale_pow2(vec p, vec whole, vec x, float below) {
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(whole), _mm256_set1_epi32(127)), 23);
  const vec under = _mm256_cmp_ps(x, splat(below), _CMP_LT_OQ);
  return _mm256_andnot_ps(under, mul(p, _mm256_castsi256_ps(bits)));
}

#else  // plain C++: one lane, the compiler's own code for the baseline

using vec = float;
constexpr std::size_t kWidth = 1;
constexpr std::size_t kBlockRows = 4, kBlockVecs = 4;

inline vec load(const float* p) {
  return *p;
}
inline vec load(const float* p, std::size_t, vec) {
  return *p;
}  // never a partial lane
inline void store(float* p, vec v) {
  *p = v;
}
inline void store(float* p, vec v, std::size_t) {
  *p = v;
}
inline vec splat(float x) {
  return x;
}
inline vec add(vec a, vec b) {
  return a + b;
}
inline vec sub(vec a, vec b) {
  return a - b;
}
inline vec mul(vec a, vec b) {
  return a * b;
}
inline vec max(vec a, vec b) {
  return a > b ? a : b;
}
inline vec min(vec a, vec b) {
  return a < b ? a : b;
}
inline vec div(vec a, vec b) {
  return a / b;
}
/// Lanes where x < limit take a, the others b.
inline vec where_below(vec x, float limit, vec a, vec b) {
  return x < limit ? a : b;
}
inline vec fma(vec a, vec b, vec c) {
  return a * b + c;
}
inline float reduce_add(vec v) {
  return v;
}
inline float reduce_max(vec v) {
  return v;
}
inline void transpose_block(const float* s, std::size_t, float* d, std::size_t) {
  *d = *s;
}

#endif

/// |v| lane by lane.
inline vec abs(vec v) {
  return max(v, sub(splat(0.0f), v));
}

/// 2^x for one float; below -126 (including -inf) exactly 0.
inline float exp2_one(float x) {
  return x < -126.0f ? 0.0f : __builtin_exp2f(x);
}

/// 2^v lane by lane; lanes below -126 (including -inf) give exactly 0.
inline vec exp2(vec v) {
#if defined(__AVX2__)
  // 2^v = 2^round(v) · 2^f, |f| <= 1/2; 2^f by a degree-6 polynomial (least squares on
  // Chebyshev nodes, relative weight): 1.04e-7 relative error in float arithmetic, as the
  // degree-7 Taylor series it replaced (0.99e-7), one FMA less.
  constexpr float c[] = {1.0f,           0.693147182f,   0.240226462f,  0.0555032901f,
                         0.00961851981f, 0.00133998599f, 0.00015337576f};
  const vec x = min(max(v, splat(-126.0f)), splat(127.0f));
  const vec whole = round(x);
  const vec f = sub(x, whole);
  vec p = splat(c[6]);
  for (int d = 5; d >= 0; --d) p = fma(p, f, splat(c[d]));
  return scale_pow2(p, whole, v, -126.0f);
#else
  return exp2_one(v);
#endif
}

}  // namespace
}  // namespace attnlab::kernels::simd
