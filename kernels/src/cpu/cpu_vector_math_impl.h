// The vector types and the lane-wise math of the fused CPU step kernels
// (cpu_recurrent_impl.h): loads and stores of whole and partial vectors,
// NaN-keeping min and max, and the gates' exp, tanh and sigmoid. Included
// by cpu_recurrent_impl.h only, within one ISA's build (PIPELSTM_ISA,
// PIPELSTM_VEC, PIPELSTM_MR defined).
#pragma once

#include <cstdint>
#include <cstring>
#if defined(__x86_64__) || defined(__i386__)
// GCC 12 warns that _mm512_min_ps and _mm512_max_ps read an uninitialized
// value: the "undefined" pass-through vector of their unmasked form, which
// the instruction never reads (a false positive of GCC 12).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include "pipelstm/kernels/gate_math.h"

namespace pipelstm::kernels::cpu::PIPELSTM_ISA {
namespace {

constexpr int V = PIPELSTM_VEC;
constexpr int MR = PIPELSTM_MR;
constexpr int W = 4 * V;  // floats per packed row of a panel

typedef float vf __attribute__((vector_size(V * sizeof(float))));
typedef float vf_unaligned __attribute__((vector_size(V * sizeof(float)), aligned(4)));
typedef uint32_t vu __attribute__((vector_size(V * sizeof(float))));  // a vf's bits

inline vf splat(float s) {
  vf v;
  for (int l = 0; l < V; ++l) v[l] = s;  // a broadcast (vf{} + s would add -0.0 + 0.0)
  return v;
}
inline vf load(const float* p) { return *reinterpret_cast<const vf_unaligned*>(p); }
inline void store(float* p, vf v) { *reinterpret_cast<vf_unaligned*>(p) = v; }

// The first n lanes (0 < n <= V); the rest read as zero, never touched.
template <bool kFull>
inline vf load_n(const float* p, int n) {
  if constexpr (kFull) return load(p);
  vf v = {};
  std::memcpy(&v, p, sizeof(float) * n);
  return v;
}
template <bool kFull>
inline void store_n(float* p, vf v, int n) {
  if constexpr (kFull) return store(p, v);
  std::memcpy(p, &v, sizeof(float) * n);
}

// vmin = a < b ? a : b and vmax = a > b ? a : b, lane-wise: x86's min and
// max exactly, the second operand where either is NaN. Written as the
// comparison, GCC makes a compare and a blend of it (two instructions, and
// on AVX-512 a mask register between them); the intrinsic is one. With it
// a vector cell took 60 cycles instead of 70 on a Zen 5 (avx512, in L1).
#if defined(__AVX512F__) && PIPELSTM_VEC == 16
inline vf vmin(vf a, vf b) { return (vf)_mm512_min_ps((__m512)a, (__m512)b); }
inline vf vmax(vf a, vf b) { return (vf)_mm512_max_ps((__m512)a, (__m512)b); }
#elif defined(__AVX__) && PIPELSTM_VEC == 8
inline vf vmin(vf a, vf b) { return (vf)_mm256_min_ps((__m256)a, (__m256)b); }
inline vf vmax(vf a, vf b) { return (vf)_mm256_max_ps((__m256)a, (__m256)b); }
#elif defined(__SSE__) && PIPELSTM_VEC == 4
inline vf vmin(vf a, vf b) { return (vf)_mm_min_ps((__m128)a, (__m128)b); }
inline vf vmax(vf a, vf b) { return (vf)_mm_max_ps((__m128)a, (__m128)b); }
#else
inline vf vmin(vf a, vf b) { return a < b ? a : b; }
inline vf vmax(vf a, vf b) { return a > b ? a : b; }
#endif

// The argument of exp clamped to [lo, hi], a NaN kept: min and max return
// their second operand where either is NaN, so x goes second (and comes out
// NaN, which then reaches every result it touches).
inline vf clamp_keep_nan(vf x, vf lo, vf hi) { return vmax(lo, vmin(hi, x)); }

// gate_math.h's host_expf polynomial, lane-wise, for the gates only:
// exp_parts<kNegate> gives exp(y), y = -x if kNegate else x, as 2^n (1 + q):
// `scale` = 2^n, and q = exp(r) - 1 for the reduced r, which keeps its
// relative accuracy where r is near 0 (vtanh needs that). y is clamped to
// [kExpLo, hi]. With hi = kExpHi, n <= 127 and the result stays finite; with
// hi = kExpInfHi every y above kExpHi (but within an ulp of it) gets
// n = 128, whose scale is +inf, as host_expf's result there. Below kExpLo
// the result is exp(kExpLo), not host_expf's 0: the gates only add 1 to it
// or subtract 1 from it (vsigmoid, vtanh), where both round alike.
//
// Against host_expf: the same reduction and polynomial, so the same n, q
// and scale for every y in [kExpLo, kExpHi] (but where y / ln 2 is exactly
// halfway between integers, if ever); the shifter's low bits hold n + 127,
// so the exponent bits are t's bits moved up (no conversion to int), and
// the negation of a sigmoid's argument goes into the reduction. A vector
// cell takes 15 % fewer cycles than with clamp-then-blend and an int
// conversion per exp (83 -> 71 on a Zen 5 with AVX-512, its operands in
// L1: the cell is bound by the FP pipes' throughput).
constexpr float kExpLo = -87.3365478515625f;
constexpr float kExpHi = 88.3762626647949f;  // round(hi / ln 2) = 127
constexpr float kExpInfHi = 88.9f;           // round(hi / ln 2) = 128

template <bool kNegate>
inline vf exp_parts(vf x, float hi, vf& scale) {
  constexpr float sign = kNegate ? -1.0f : 1.0f;
  const vf xc = kNegate ? clamp_keep_nan(x, splat(-hi), splat(-kExpLo))
                        : clamp_keep_nan(x, splat(kExpLo), splat(hi));
  // 1.5 * 2^23 + 127: t rounds y / ln 2 to an integer n, and t's last
  // mantissa bits are n + 127 (1..255 for n in [-126, 128]).
  const vf shifter = splat(12583039.0f);
  const vf t = xc * (sign * 1.44269504088896341f) + shifter;
  const vf n = t - shifter;
  vf r = sign * xc - n * 0.693359375f;  // n * 0.693359375 is exact: one rounding
  r = r - n * -2.12194440e-4f;
  vf p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  scale = (vf)((vu)t << 23);  // the bits, as float; a NaN's give 0, and q is NaN
  return p * r * r + r;
}

// tanh(x) = expm1(2x) / (expm1(2x) + 2), with expm1(2x) = 2^n (1 + q) - 1
// = 2^n q + (2^n - 1) from exp_parts: near 0 (n = 0) that is q itself, so
// no second polynomial for small |x| is needed (gate_math.h's host_tanhf
// computes one and blends: some 20 more operations per vector; the cell
// takes two tanh per unit, the backward one). Within 2 ulp of tanh in
// float64 over |x| in [1e-8, 12] (1 ulp for host_tanhf's form); beyond the
// clamp exactly +-1, and a NaN stays a NaN.
inline vf vtanh(vf x) {
  vf scale;
  const vf q = exp_parts<false>(2.0f * x, kExpHi, scale);
  const vf em1 = scale * q + (scale - 1.0f);
  return em1 / (em1 + 2.0f);
}

// 1 / (1 + exp(-x)): exactly 0 where exp(-x) is inf (x below -88.3763),
// as with host_expf: gradients through a saturated gate are then exactly 0,
// as nn.LSTM's (an inf input gives the same NaN pattern); exactly 1 above
// 87.34. Bitwise host_expf's gate for every x but a NaN (whose payload may
// differ) and the one float just below -kExpHi (4e-39 for 0; checked on
// 19M inputs against the clamp-then-blend form).
inline vf vsigmoid(vf x) {
  vf scale;
  const vf q = exp_parts<true>(x, kExpInfHi, scale);
  return 1.0f / (1.0f + (q + 1.0f) * scale);
}

}  // namespace
}  // namespace pipelstm::kernels::cpu::PIPELSTM_ISA
