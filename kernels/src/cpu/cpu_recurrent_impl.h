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
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu_tile_impl.h"
#include "cpu_vector_math_impl.h"
#include "pipelstm/kernels/cpu_recurrent.h"

namespace pipelstm::kernels::cpu::PIPELSTM_ISA {
namespace {

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
  vf c = f * c_prev + i * gg;
  vf h = o * vtanh(c);
  store_n<kFull>(g, i, n);
  store_n<kFull>(g + H, f, n);
  store_n<kFull>(g + 2 * H, gg, n);
  store_n<kFull>(g + 3 * H, o, n);
  if (s.keep.on()) {  // zoneout: h from the new cell, then both blended
    const vf keep_c = load_n<kFull>(s.keep.c_row(r) + j, n);
    const vf keep_h = load_n<kFull>(s.keep.h_row(r) + j, n);
    c += keep_c * (c_prev - c);
    h += keep_h * (load_n<kFull>(s.h_prev.row(r) + j, n) - h);
  }
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

// The cell's backward under zoneout (gate_math.h's cell_backward_zoneout):
// grad_h is the gradient of the blended h without the carry yet.
template <bool kFull>
inline void backward_cell_zoneout(const BackwardStep& s, int64_t r, int64_t j, int n, vf grad_h,
                                  vf i, vf f, vf g, vf o, vf c_prev) {
  const int64_t H = s.hidden;
  float* carry = s.carry + r * H + j;
  float* grad_c = s.grad_c + r * H + j;
  grad_h += load_n<kFull>(carry, n);
  const vf keep_c = load_n<kFull>(s.keep.c_row(r) + j, n);
  const vf keep_h = load_n<kFull>(s.keep.h_row(r) + j, n);
  const vf gc = load_n<kFull>(grad_c, n);
  const vf fresh_h = (1.0f - keep_h) * grad_h;
  const vf tanh_c = vtanh(f * c_prev + i * g);
  const vf dc = (1.0f - keep_c) * gc + fresh_h * o * (1.0f - tanh_c * tanh_c);
  float* dg = s.grad_gates + r * 4 * H + j;
  store_n<kFull>(dg, dc * g * i * (1.0f - i), n);
  store_n<kFull>(dg + H, dc * c_prev * f * (1.0f - f), n);
  store_n<kFull>(dg + 2 * H, dc * i * (1.0f - g * g), n);
  store_n<kFull>(dg + 3 * H, fresh_h * tanh_c * o * (1.0f - o), n);
  store_n<kFull>(grad_c, dc * f + keep_c * gc, n);
  store_n<kFull>(carry, keep_h * grad_h, n);
}

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
  if (s.keep.on()) {
    backward_cell_zoneout<kFull>(s, r, j, n, grad_h, i, f, g, o, c_prev);
    return;
  }
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

}  // namespace pipelstm::kernels::cpu::PIPELSTM_ISA
