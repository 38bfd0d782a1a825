// The fused CPU step kernels of cpu_recurrent.h, written once over a vector
// type and compiled once per ISA. The including file defines
//   PIPELSTM_ISA   the namespace (and name) of this build
//   PIPELSTM_VEC   floats per vector register
//   PIPELSTM_MR    rows per register tile: 4*MR accumulators + MR
//                  broadcasts + 1 weight vector must fit the register file
// and is compiled with the matching target flags (CMakeLists.txt).
//
// The math is gate_math.h's polynomial exp, lane-wise, in the same order of
// operations; tanh is built on the same exp differently (vtanh).
#include <cstring>
#include <type_traits>
#include <vector>
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

#include "pipelstm/kernels/cpu_recurrent.h"

namespace pipelstm {
namespace kernels {
namespace cpu {
namespace PIPELSTM_ISA {
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

// acc[m][q] += sum_k a[m][k * step] * panel[k][q*V .. q*V+V) for M rows and
// k in [0, depth): the register tile's loop, FMA-bound.
template <int M>
[[gnu::always_inline]] inline void accumulate(vf (&acc)[M][4], const float* const (&a_rows)[MR],
                                              const float* __restrict__ panel, int64_t depth,
                                              int64_t step) {
  const float* a[M];
  for (int m = 0; m < M; ++m) a[m] = a_rows[m];
  for (int64_t kk = 0, off = 0; kk < depth; ++kk, off += step) {
    const float* w = panel + kk * W;
    const vf w0 = *reinterpret_cast<const vf*>(w);
    const vf w1 = *reinterpret_cast<const vf*>(w + V);
    const vf w2 = *reinterpret_cast<const vf*>(w + 2 * V);
    const vf w3 = *reinterpret_cast<const vf*>(w + 3 * V);
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
      const float s = a[m][off];
      acc[m][0] += w0 * s;
      acc[m][1] += w1 * s;
      acc[m][2] += w2 * s;
      acc[m][3] += w3 * s;
    }
  }
}

// The register tile over M rows: acc_io = a @ panel (kZero) or acc_io +=
// a @ panel. Not inlined: inlined into the forward, where more values are
// alive, GCC kept an accumulator on the stack (seen in perf annotate: a
// load and a store in the inner loop). kZero: the accumulators start from
// zero, not from acc_io (a whole depth in one pass: no loads of acc_io, and
// the caller need not clear it).
template <int M, bool kZero>
__attribute__((noinline)) void tile(const float* const (&a_rows)[MR], const float* panel,
                                    int64_t depth, int64_t step, vf (&acc_io)[MR][4]) {
  vf acc[M][4];
  for (int m = 0; m < M; ++m)
    for (int q = 0; q < 4; ++q) acc[m][q] = kZero ? vf{} : acc_io[m][q];
  accumulate<M>(acc, a_rows, panel, depth, step);
  for (int m = 0; m < M; ++m)
    for (int q = 0; q < 4; ++q) acc_io[m][q] = acc[m][q];
}

// The forward's tile with the input projection in the step:
// acc_out[m] = init + x[m] @ panel_x (depth kx) + h[m] @ panel_h (depth kh),
// the accumulators in registers throughout.
template <int M>
__attribute__((noinline)) void tile_in_step(const float* const (&x)[MR], const float* panel_x,
                                            int64_t kx, const float* const (&h)[MR],
                                            const float* panel_h, int64_t kh,
                                            const vf (&init)[4], vf (&acc_out)[MR][4]) {
  vf acc[M][4];
  for (int m = 0; m < M; ++m)
    for (int q = 0; q < 4; ++q) acc[m][q] = init[q];
  accumulate<M>(acc, x, panel_x, kx, 1);
  accumulate<M>(acc, h, panel_h, kh, 1);
  for (int m = 0; m < M; ++m)
    for (int q = 0; q < 4; ++q) acc_out[m][q] = acc[m][q];
}

// f(std::integral_constant<int, rows>) for rows in [1, MR]: a tile's row
// count as a template argument.
template <typename F>
inline void with_rows(int rows, F&& f) {
  switch (rows) {
#define PIPELSTM_ROWS_CASE(n)                                         \
  case n:                                                             \
    if constexpr (n <= MR) f(std::integral_constant<int, n>{});       \
    break;
    PIPELSTM_ROWS_CASE(1)
    PIPELSTM_ROWS_CASE(2)
    PIPELSTM_ROWS_CASE(3)
    PIPELSTM_ROWS_CASE(4)
    PIPELSTM_ROWS_CASE(5)
    PIPELSTM_ROWS_CASE(6)
    PIPELSTM_ROWS_CASE(7)
    PIPELSTM_ROWS_CASE(8)
#undef PIPELSTM_ROWS_CASE
  }
}

template <bool kZero>
inline void tile_any(int rows, const float* const (&a)[MR], const float* panel, int64_t depth,
                     int64_t step, vf (&acc)[MR][4]) {
  with_rows(rows, [&](auto m) { tile<decltype(m)::value, kZero>(a, panel, depth, step, acc); });
}

// Depth of one pass over a panel: its slice (KC x 4V floats, 16 KiB) stays in
// L1 while every row block of a row chunk runs over it; the accumulators of
// the chunk wait in a buffer between slices. Unblocked, a deep panel (the
// backward's 4H at large H) streams from L3 once per row block. A panel of
// at most UNSLICED bytes is not sliced where a's rows are contiguous: it
// stays in L2, and a tile reading it from there runs faster than tiles that
// keep partial sums in a buffer between slices (docs/design/cpu.md, "Blocking").
// A strided a (grad_gates.t() of a weight gradient) is always sliced: a
// slice's lines of a, each shared by the rows of a chunk, then stay in L1
// (unsliced, the weight gradients made a layer's fwd+bwd 6-10 % slower).
#ifndef PIPELSTM_KC_BYTES
#define PIPELSTM_KC_BYTES (16 * 1024)
#endif
constexpr int64_t KC = PIPELSTM_KC_BYTES / (W * sizeof(float));
#ifndef PIPELSTM_RC_ROWS
#define PIPELSTM_RC_ROWS 96
#endif
constexpr int64_t RC = (PIPELSTM_RC_ROWS / MR) * MR;  // rows per chunk
#ifndef PIPELSTM_UNSLICED_BYTES
#define PIPELSTM_UNSLICED_BYTES (256 * 1024)
#endif
constexpr int64_t UNSLICED = PIPELSTM_UNSLICED_BYTES;
#ifndef PIPELSTM_PACK_STRIDED_A
#define PIPELSTM_PACK_STRIDED_A 0  // see gemm_strided
#endif

// Rows of the next block when `left` rows remain: MR, except that a
// remainder just over MR is halved (4 = 2 + 2 rather than 3 + 1 on AVX2): a
// one-row tile has too few accumulators to hide the FMA latency.
inline int block_rows(int64_t left) {
  if (left > MR && left < 2 * MR) return static_cast<int>((left + 1) / 2);
  return static_cast<int>(left < MR ? left : MR);
}

// For rows [row_begin, row_end): acc = a @ panel over the whole depth k, then
// body(row0, rows, acc) for each block of up to MR rows. Row r's element kk
// is row(r)[kk * step].
template <typename RowFn, typename Body>
inline void for_row_blocks(int64_t row_begin, int64_t row_end, const float* panel, int64_t k,
                           int64_t step, RowFn row, Body&& body) {
  vf acc[MR][4];
  const float* a[MR] = {};
  if (k <= KC || (step == 1 && k * W * static_cast<int64_t>(sizeof(float)) <= UNSLICED)) {
    for (int64_t r = row_begin, rows = 0; r < row_end; r += rows) {
      rows = block_rows(row_end - r);
      for (int m = 0; m < rows; ++m) a[m] = row(r + m);
      tile_any<true>(rows, a, panel, k, step, acc);
      body(r, rows, acc);
    }
    return;
  }
  vf partial[RC][4];
  for (int64_t r0 = row_begin; r0 < row_end; r0 += RC) {
    const int64_t r1 = row_end - r0 < RC ? row_end : r0 + RC;
    for (int64_t k0 = 0; k0 < k; k0 += KC) {
      const int64_t depth = k - k0 < KC ? k - k0 : KC;
      for (int64_t r = r0, rows = 0; r < r1; r += rows) {
        rows = block_rows(r1 - r);
        vf (*part)[4] = partial + (r - r0);
        for (int m = 0; m < rows; ++m) a[m] = row(r + m) + k0 * step;
        if (k0 == 0) {
          tile_any<true>(rows, a, panel, depth, step, acc);
        } else {
          for (int m = 0; m < rows; ++m)
            for (int q = 0; q < 4; ++q) acc[m][q] = part[m][q];
          tile_any<false>(rows, a, panel + k0 * W, depth, step, acc);
        }
        if (k0 + depth == k) {
          body(r, rows, acc);
        } else {
          for (int m = 0; m < rows; ++m)
            for (int q = 0; q < 4; ++q) part[m][q] = acc[m][q];
        }
      }
    }
  }
}

static_assert(MR <= 8, "with_rows handles up to 8 rows");

// ---- prefetching -------------------------------------------------------
// A cell reads and writes a few vectors of each of several row-wise arrays
// (the four gates H apart, c, h); the hardware prefetcher does not follow
// so many short streams, and the gates come from memory (the input
// projection wrote them long before). Each cell therefore asks for the
// lines a later panel of the same row will touch (without it, perf
// annotate showed the first load of the gates as the forward's hottest
// instruction).

inline void prefetch_lines(const float* p, int64_t floats) {
  for (int64_t f = 0; f < floats; f += 64 / sizeof(float)) __builtin_prefetch(p + f, 0, 3);
}
inline void prefetch_lines_for_write(float* p, int64_t floats) {
  for (int64_t f = 0; f < floats; f += 64 / sizeof(float)) __builtin_prefetch(p + f, 1, 3);
}

// ---- forward ----------------------------------------------------------

// kInStep: acc holds the whole pre-activations (ForwardStep::input_in_step).
template <bool kFull, bool kInStep>
inline void forward_cell(const ForwardStep& s, int64_t r, int64_t j, int n, const vf (&acc)[4]) {
  const int64_t H = s.hidden;
  float* g = s.gates + r * 4 * H + j;
  if (j + 2 * V < H) {  // two panels ahead: a new line at least every other panel
    const int64_t a = 2 * V;
    for (int q = 0; q < 4; ++q) prefetch_lines_for_write(g + q * H + a, V);
    prefetch_lines(s.c_prev.row(r) + j + a, V);
    prefetch_lines_for_write(s.c + r * H + j + a, V);
    prefetch_lines_for_write(s.h + r * s.ldh + j + a, V);
  }
  vf pre_i = acc[0], pre_f = acc[1], pre_g = acc[2], pre_o = acc[3];
  if (!kInStep) {
    pre_i += load_n<kFull>(g, n);
    pre_f += load_n<kFull>(g + H, n);
    pre_g += load_n<kFull>(g + 2 * H, n);
    pre_o += load_n<kFull>(g + 3 * H, n);
    if (s.bias) {
      pre_i += load_n<kFull>(s.bias + j, n);
      pre_f += load_n<kFull>(s.bias + H + j, n);
      pre_g += load_n<kFull>(s.bias + 2 * H + j, n);
      pre_o += load_n<kFull>(s.bias + 3 * H + j, n);
    }
  }
  const vf c_prev = load_n<kFull>(s.c_prev.row(r) + j, n);
  const vf i = vsigmoid(pre_i);
  const vf f = vsigmoid(pre_f);
  const vf gg = vtanh(pre_g);
  const vf o = vsigmoid(pre_o);
  const vf c = f * c_prev + i * gg;
  const vf h = o * vtanh(c);
  store_n<kFull>(g, i, n);
  store_n<kFull>(g + H, f, n);
  store_n<kFull>(g + 2 * H, gg, n);
  store_n<kFull>(g + 3 * H, o, n);
  store_n<kFull>(s.c + r * H + j, c, n);
  store_n<kFull>(s.h + r * s.ldh + j, h, n);
}

template <bool kInStep>
inline void forward_cells(const ForwardStep& s, int64_t r0, int rows, int64_t j, int n,
                          const vf (&acc)[MR][4]) {
  for (int m = 0; m < rows; ++m) {
    if (n == V) forward_cell<true, kInStep>(s, r0 + m, j, n, acc[m]);
    else forward_cell<false, kInStep>(s, r0 + m, j, n, acc[m]);
  }
}

// Panel p with the input projection in the step. Whole depth, unsliced: the
// caller puts it in the step only where the weights are small (a panel of
// I + P rows of depth stays in L1 or L2).
void forward_panel_in_step(const ForwardStep& s, int64_t p, int64_t j, int n) {
  const int64_t H = s.hidden;
  vf init[4];
  for (int q = 0; q < 4; ++q) {
    init[q] = s.bias == nullptr ? vf{}
              : n == V          ? load_n<true>(s.bias + q * H + j, n)
                                : load_n<false>(s.bias + q * H + j, n);
  }
  const float* panel_x = s.w_x + p * s.kx * W;
  const float* panel_h = s.w + p * s.k * W;
  vf acc[MR][4];
  const float* x[MR] = {};
  const float* h[MR] = {};
  for (int64_t r = 0, rows = 0; r < s.rows; r += rows) {
    rows = block_rows(s.rows - r);
    for (int m = 0; m < rows; ++m) {
      x[m] = s.x + (r + m) * s.ldx;
      h[m] = s.h_prev.row(r + m);
    }
    with_rows(static_cast<int>(rows), [&](auto m) {
      tile_in_step<decltype(m)::value>(x, panel_x, s.kx, h, panel_h, s.k, init, acc);
    });
    forward_cells<true>(s, r, static_cast<int>(rows), j, n, acc);
  }
}

void forward_step(const ForwardStep& s, int64_t panel_begin, int64_t panel_end) {
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    const int64_t j = p * V;
    const int n = static_cast<int>(s.hidden - j < V ? s.hidden - j : V);
    if (s.input_in_step) {
      forward_panel_in_step(s, p, j, n);
      continue;
    }
    const float* panel = s.w + p * s.k * W;
    for_row_blocks(0, s.rows, panel, s.k, 1, [&](int64_t r) { return s.h_prev.row(r); },
                   [&](int64_t r0, int rows, const vf (&acc)[MR][4]) {
                     forward_cells<false>(s, r0, rows, j, n, acc);
                   });
  }
}

// ---- backward ---------------------------------------------------------

template <bool kFull>
inline void backward_cell(const BackwardStep& s, int64_t r, int64_t j, int n, vf grad_h) {
  const int64_t H = s.hidden;
  if (s.grad_out) grad_h += load_n<kFull>(s.grad_out + r * s.ldo + j, n);
  const float* act = s.act + r * 4 * H + j;
  const vf i = load_n<kFull>(act, n);
  const vf f = load_n<kFull>(act + H, n);
  const vf g = load_n<kFull>(act + 2 * H, n);
  const vf o = load_n<kFull>(act + 3 * H, n);
  const vf c_prev = load_n<kFull>(s.c_prev.row(r) + j, n);
  const vf c = load_n<kFull>(s.c + r * H + j, n);
  float* grad_c = s.grad_c + r * H + j;
  const vf tanh_c = vtanh(c);
  const vf dc = load_n<kFull>(grad_c, n) + grad_h * o * (1.0f - tanh_c * tanh_c);
  float* dg = s.grad_gates + r * 4 * H + j;
  store_n<kFull>(dg, dc * g * i * (1.0f - i), n);
  store_n<kFull>(dg + H, dc * c_prev * f * (1.0f - f), n);
  store_n<kFull>(dg + 2 * H, dc * i * (1.0f - g * g), n);
  store_n<kFull>(dg + 3 * H, grad_h * tanh_c * o * (1.0f - o), n);
  store_n<kFull>(grad_c, dc * f, n);
}

// The cells of row r, units [j, j + 4V), from the recurrent gradients acc.
inline void backward_cells(const BackwardStep& s, int64_t r, int64_t j, const vf (&acc)[4]) {
  const int64_t H = s.hidden, next = j + W;
  if (next < H) {  // the next panel's lines of this row
    const int64_t n = H - next < W ? H - next : W;
    for (int q = 0; q < 4; ++q) {
      prefetch_lines(s.act + r * 4 * H + q * H + next, n);
      prefetch_lines_for_write(s.grad_gates + r * 4 * H + q * H + next, n);
    }
    prefetch_lines(s.c_prev.row(r) + next, n);
    prefetch_lines(s.c + r * H + next, n);
    if (s.grad_out) prefetch_lines(s.grad_out + r * s.ldo + next, n);
  }
  for (int q = 0; q < 4; ++q) {
    const int64_t jq = j + q * V;
    if (jq >= s.hidden) return;
    const int n = static_cast<int>(s.hidden - jq < V ? s.hidden - jq : V);
    if (n == V) backward_cell<true>(s, r, jq, n, acc[q]);
    else backward_cell<false>(s, r, jq, n, acc[q]);
  }
}

void backward_step(const BackwardStep& s, int64_t panel_begin, int64_t panel_end) {
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    const int64_t j = p * W;
    const float* panel = s.w + p * s.k * W;
    for_row_blocks(0, s.gemm_rows, panel, s.k, 1, [&](int64_t r) { return s.a + r * s.lda; },
                   [&](int64_t r0, int rows, const vf (&acc)[MR][4]) {
                     for (int m = 0; m < rows; ++m) backward_cells(s, r0 + m, j, acc[m]);
                   });
    // Rows that end at this step: their recurrent gradient is the state's.
    for (int64_t r = s.gemm_rows; r < s.rows; ++r) {
      vf acc[4] = {};
      for (int q = 0; q < 4 && s.state; ++q) {
        const int64_t jq = j + q * V;
        if (jq >= s.hidden) break;
        const int n = static_cast<int>(s.hidden - jq < V ? s.hidden - jq : V);
        acc[q] = n == V ? load_n<true>(s.state + r * s.lds + jq, n)
                        : load_n<false>(s.state + r * s.lds + jq, n);
      }
      backward_cells(s, r, j, acc);
    }
  }
}

// ---- plain GEMM -------------------------------------------------------

template <bool kFull>
inline void gemm_store(const Gemm& s, int64_t r, int64_t j, int n, vf v) {
  if (s.add) v += load_n<kFull>(s.add + r * s.ld_add + j, n);
  store_n<kFull>(s.out + r * s.ldo + j, v, n);
}

// Rows [r0, r0 + rows) of output panel p from the tile's accumulators.
inline void gemm_store_tile(const Gemm& s, int64_t p, int64_t r0, int rows,
                            const vf (&acc)[MR][4]) {
  const int64_t j = p * W;
  for (int m = 0; m < rows; ++m) {
    for (int q = 0; q < 4; ++q) {
      const int64_t jq = j + q * V;
      if (jq >= s.n) break;
      const int n = static_cast<int>(s.n - jq < V ? s.n - jq : V);
      if (n == V) gemm_store<true>(s, r0 + m, jq, n, acc[m][q]);
      else gemm_store<false>(s, r0 + m, jq, n, acc[m][q]);
    }
  }
}

// A whose rows are the columns of a row-major matrix (grad_gates.t() of a
// weight gradient: row r's element kk at rest[r + kk * step]), with a row
// stride of a multiple of 4 KiB (4H floats at H = 256, 512, 1024): read in
// place, each step of a tile takes MR floats from a line of another page.
// With PIPELSTM_PACK_STRIDED_A, each slice of a row chunk (KC x RC floats)
// is first copied to a dense buffer, once for all the panels this call
// runs, whose partial sums wait in a buffer between slices. On a Zen 5,
// 1 thread, grad_gates.t() @ x over T x B = 256..4096 rows, GFLOP/s in
// place -> packed: avx2 build H = 256..1024 76-83 -> 107-115 (H = 64, 128
// and 384, not packed, run at 101-116); avx512 build H = 256 160-165 ->
// 165-169, H = 512 193 -> 189, H = 1024 206-209 -> 199-200, so it packs
// in the avx2 build only (PIPELSTM_PACK_STRIDED_A in its .cpp).
void gemm_strided(const Gemm& s, int64_t panel_begin, int64_t panel_end) {
  static thread_local std::vector<float> slice;
  static thread_local std::vector<vf> partial;  // [panel][RC][4]
  constexpr int64_t LDS = (RC + V - 1) / V * V;  // the slice's row stride
  slice.resize(static_cast<size_t>(KC * LDS));
  partial.resize(static_cast<size_t>((panel_end - panel_begin) * RC * 4));
  for (int64_t r0 = 0; r0 < s.rows; r0 += RC) {
    const int64_t nr = s.rows - r0 < RC ? s.rows - r0 : RC;
    for (int64_t k0 = 0; k0 < s.k; k0 += KC) {
      const int64_t depth = s.k - k0 < KC ? s.k - k0 : KC;
      const float* src = s.a.rest + r0 + k0 * s.a.step;
      // The slice after this one (deeper in this chunk, else the first of
      // the next chunk), asked for now: its lines come in while this one's
      // tiles run.
      const int64_t next_r0 = k0 + KC < s.k ? r0 : r0 + RC, next_k0 = k0 + KC < s.k ? k0 + KC : 0;
      const int64_t next_rows = next_r0 >= s.rows ? 0 : s.rows - next_r0 < RC ? s.rows - next_r0 : RC;
      const int64_t next_depth = s.k - next_k0 < KC ? s.k - next_k0 : KC;
      const float* next = s.a.rest + next_r0 + next_k0 * s.a.step;
      for (int64_t kk = 0; kk < depth; ++kk) {
        if (kk < next_depth && next_rows > 0) prefetch_lines(next + kk * s.a.step, next_rows);
        float* dst = slice.data() + kk * LDS;
        const float* row = src + kk * s.a.step;
        int64_t i = 0;
        for (; i + V <= nr; i += V) store(dst + i, load(row + i));
        const int tail = static_cast<int>(nr - i);
        if (tail > 0) store_n<false>(dst + i, load_n<false>(row + i, tail), tail);
      }
      const bool last = k0 + depth == s.k;
      for (int64_t p = panel_begin; p < panel_end; ++p) {
        const float* panel = s.w + (p * s.k + k0) * W;
        vf (*part)[4] = reinterpret_cast<vf (*)[4]>(partial.data()) + (p - panel_begin) * RC;
        vf acc[MR][4];
        const float* a[MR] = {};
        for (int64_t r = 0, rows = 0; r < nr; r += rows) {
          rows = block_rows(nr - r);
          for (int m = 0; m < rows; ++m) a[m] = slice.data() + r + m;
          if (k0 == 0) {
            tile_any<true>(static_cast<int>(rows), a, panel, depth, LDS, acc);
          } else {
            for (int m = 0; m < rows; ++m)
              for (int q = 0; q < 4; ++q) acc[m][q] = part[r + m][q];
            tile_any<false>(static_cast<int>(rows), a, panel, depth, LDS, acc);
          }
          if (last) {
            gemm_store_tile(s, p, r0 + r, static_cast<int>(rows), acc);
          } else {
            for (int m = 0; m < rows; ++m)
              for (int q = 0; q < 4; ++q) part[r + m][q] = acc[m][q];
          }
        }
      }
    }
  }
}

void gemm(const Gemm& s, int64_t panel_begin, int64_t panel_end) {
  const bool page_strided = s.a.step != 1 && s.a.ld == 1 && s.a.split == 0 &&
                            s.a.step * static_cast<int64_t>(sizeof(float)) % 4096 == 0;
  if (PIPELSTM_PACK_STRIDED_A && page_strided) return gemm_strided(s, panel_begin, panel_end);
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    const float* panel = s.w + p * s.k * W;
    for_row_blocks(0, s.rows, panel, s.k, s.a.step, [&](int64_t r) { return s.a.row(r); },
                   [&](int64_t r0, int rows, const vf (&acc)[MR][4]) {
                     gemm_store_tile(s, p, r0, rows, acc);
                   });
  }
}

// ---- packing ----------------------------------------------------------
//
// A panel is [k][W]: row kk holds, for W output columns, the weight each
// takes from input kk. pack_gates and pack_rows gather it from W rows of
// a row-major [n, k] weight, one float of each per panel row: V x V blocks
// (V source rows, V inputs) are transposed in registers, each source run
// read and each panel row written a vector at a time. One float at a time
// (a load and a store each), packing w_hh took a quarter of a forward at
// H = 1024, B = 1, T = 32 on a Zen 5 (perf).

// Rows lo and hi = lo + B of a V x V block, their off-diagonal B-wide
// blocks swapped: after the stages B = V/2, ..., 1 (over every pair of
// rows that differ in bit B) the block is transposed. Each output is one
// two-source permutation.
template <int B>
inline void swap_off_diagonal(vf& lo, vf& hi) {
  vu take_lo, take_hi;
  for (int j = 0; j < V; ++j) {
    take_lo[j] = (j & B) ? V + j - B : j;
    take_hi[j] = (j & B) ? V + j : j + B;
  }
  const vf a = __builtin_shuffle(lo, hi, take_lo);
  hi = __builtin_shuffle(lo, hi, take_hi);
  lo = a;
}

template <int B>
inline void transpose(vf (&r)[V]) {
  for (int i = 0; i < V; ++i)
    if ((i & B) == 0) swap_off_diagonal<B>(r[i], r[i + B]);
  if constexpr (B > 1) transpose<B / 2>(r);
}

// Panel rows [0, k) of one panel from its W source rows (null: zeros).
inline void gather_panel(const float* const (&src)[W], int64_t k, float* panel) {
  const int64_t whole = k - k % V;
  for (int64_t k0 = 0; k0 < whole; k0 += V) {
    for (int q = 0; q < 4; ++q) {
      vf r[V];
      for (int v = 0; v < V; ++v) r[v] = src[q * V + v] != nullptr ? load(src[q * V + v] + k0) : vf{};
      transpose<V / 2>(r);
      for (int v = 0; v < V; ++v) store(panel + (k0 + v) * W + q * V, r[v]);
    }
  }
  for (int c = 0; c < W; ++c) {  // the last k % V inputs
    float* dst = panel + c;
    for (int64_t kk = whole; kk < k; ++kk) dst[kk * W] = src[c] != nullptr ? src[c][kk] : 0.0f;
  }
}

void pack_gates(const float* w, int64_t hidden, int64_t k, float* out, int64_t panel_begin,
                int64_t panel_end) {
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    const float* src[W];
    for (int g = 0; g < 4; ++g) {
      for (int v = 0; v < V; ++v) {
        const int64_t j = p * V + v;
        src[g * V + v] = j < hidden ? w + (g * hidden + j) * k : nullptr;
      }
    }
    gather_panel(src, k, out + p * k * W);
  }
}

void pack_rows(const float* w, int64_t n, int64_t k, float* out, int64_t panel_begin,
               int64_t panel_end) {
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    const float* src[W];
    for (int c = 0; c < W; ++c) {
      const int64_t col = p * W + c;
      src[c] = col < n ? w + col * k : nullptr;
    }
    gather_panel(src, k, out + p * k * W);
  }
}

void pack_cols(const float* w, int64_t k, int64_t n, float* out, int64_t panel_begin,
               int64_t panel_end) {
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    float* panel = out + p * k * W;
    const int64_t col = p * W;
    const int64_t width = n - col < W ? n - col : W;
    for (int64_t kk = 0; kk < k; ++kk) {
      std::memcpy(panel + kk * W, w + kk * n + col, sizeof(float) * width);
      std::memset(panel + kk * W + width, 0, sizeof(float) * (W - width));
    }
  }
}

// V x V blocks transposed in registers (one vector load per source row,
// one store per destination row), the edges a float at a time.
void transpose_rows(const float* src, int64_t lds, int64_t n, int64_t m, float* dst, int64_t ldd) {
  const int64_t n_whole = n - n % V, m_whole = m - m % V;
  for (int64_t i0 = 0; i0 < n_whole; i0 += V) {
    for (int64_t j0 = 0; j0 < m_whole; j0 += V) {
      vf r[V];
      for (int v = 0; v < V; ++v) r[v] = load(src + (j0 + v) * lds + i0);
      transpose<V / 2>(r);
      for (int v = 0; v < V; ++v) store(dst + (i0 + v) * ldd + j0, r[v]);
    }
    for (int64_t i = i0; i < i0 + V; ++i)
      for (int64_t j = m_whole; j < m; ++j) dst[i * ldd + j] = src[j * lds + i];
  }
  for (int64_t i = n_whole; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) dst[i * ldd + j] = src[j * lds + i];
}

float fma_loop(int64_t iterations, float a, float b) {
  vf acc[kFmaChains];
  for (int c = 0; c < kFmaChains; ++c) acc[c] = splat(static_cast<float>(c));
  const vf va = splat(a), vb = splat(b);
  for (int64_t n = 0; n < iterations; ++n) {
#pragma GCC unroll 12
    for (int c = 0; c < kFmaChains; ++c) acc[c] = acc[c] * va + vb;  // one FMA (-ffp-contract=fast)
  }
  float sum = 0.0f;
  for (int c = 0; c < kFmaChains; ++c) {
    for (int l = 0; l < V; ++l) sum += acc[c][l];
  }
  return sum;
}

}  // namespace

const RecurrentKernels& kernels() {
  static const RecurrentKernels k = [] {
    RecurrentKernels r;
#define PIPELSTM_STR2(x) #x
#define PIPELSTM_STR(x) PIPELSTM_STR2(x)
    r.isa = PIPELSTM_STR(PIPELSTM_ISA);
#undef PIPELSTM_STR
#undef PIPELSTM_STR2
    r.vec = V;
    r.pack_gates = &pack_gates;
    r.pack_rows = &pack_rows;
    r.pack_cols = &pack_cols;
    r.forward_step = &forward_step;
    r.backward_step = &backward_step;
    r.gemm = &gemm;
    r.fma_loop = &fma_loop;
    // Where the kernel packs page-strided slices itself (gemm_strided), the
    // caller gets no transpose and leaves a in place.
    r.transpose = PIPELSTM_PACK_STRIDED_A ? nullptr : &transpose_rows;
    return r;
  }();
  return k;
}

}  // namespace PIPELSTM_ISA
}  // namespace cpu
}  // namespace kernels
}  // namespace pipelstm
