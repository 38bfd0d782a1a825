// The register tiles of the fused CPU step kernels (cpu_recurrent_impl.h):
// an MR-row tile of a @ panel in registers, the slicing of a panel's depth
// so that a slice stays in L1, and the walk over blocks of rows. Included by
// cpu_recurrent_impl.h only, after cpu_vector_math_impl.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "cpu_vector_math_impl.h"

namespace pipelstm::kernels::cpu::PIPELSTM_ISA {
namespace {

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

}  // namespace
}  // namespace pipelstm::kernels::cpu::PIPELSTM_ISA
