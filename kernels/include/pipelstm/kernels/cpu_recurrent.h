// The CPU time step of an LSTM layer as fused float32 kernels: plain
// pointers and sizes, no framework.
//
// Each step's recurrent GEMM runs on weights packed once per call into
// panels, and the pointwise work of the step is done on the GEMM's
// accumulators while they are still in registers:
//
//   forward   gates[r, g*H + j] += h_prev[r, :] . w_hh[g*H + j, :] (or, with
//             the input projection in the step, gates = bias + x[r, :] .
//             w_ih[g*H + j, :] + that), then the cell: activated gates, c
//             and h written for every (r, j)
//   backward  grad_h[r, j] = grad_gates_next[r, :] . w_hh[:, j] (+ grad_out),
//             then the cell's backward: grad_gates and grad_c written
//
// A forward panel holds V hidden units of all four gates (V = the vector
// width), so one tile of accumulators is the i, f, g and o pre-activations
// of the same units: the cell needs nothing else. A plain panel holds 4V
// consecutive output columns.
//
// Work is split by panels: a step's panels may run on different threads in
// any order (each call takes a range), and every step reads what the whole
// previous step wrote, so the caller synchronises between steps.
//
// Three builds of the same source (cpu_recurrent_impl.h): AVX-512, AVX2+FMA
// and a portable one; the best the CPU has is picked at first use, capped by
// the environment variable PIPELSTM_CPU_ISA (avx512 | avx2 | generic).
#pragma once

#include <cstdint>
#include <string>

#include "pipelstm/kernels/keep_weights.h"

namespace pipelstm {
namespace kernels {
namespace cpu {

// Rows [0, split) at first + r*ld, rows [split, ...) at rest + r*ld: a step
// whose rows continue from the previous step (first) or start from the
// initial state (rest) alike. A row's element kk is at row(r)[kk * step]:
// step 1 but for Gemm's a, where a transposed matrix is read in place
// (ld 1, step its row stride) instead of being copied.
struct RowSource {
  const float* first = nullptr;
  const float* rest = nullptr;
  int64_t split = 0;
  int64_t ld = 0;
  int64_t step = 1;

  const float* row(int64_t r) const { return (r < split ? first : rest) + r * ld; }
};

struct ForwardStep {
  int64_t rows = 0;
  int64_t hidden = 0;   // H
  int64_t k = 0;        // width of h_prev (H, or P with a projection)
  RowSource h_prev;     // [rows, k]
  const float* w = nullptr;  // w_hh [4H, k] through pack_gates
  // The input projection in the step (input_in_step): the pre-activations
  // start from bias + x @ w_ih^T in the registers, and gates is only
  // written. Otherwise gates holds them, computed beforehand.
  bool input_in_step = false;
  const float* x = nullptr;     // [rows, ldx]: the step's input (the first kx columns)
  int64_t ldx = 0;
  int64_t kx = 0;               // I
  const float* w_x = nullptr;   // w_ih [4H, kx] through pack_gates
  float* gates = nullptr;    // [rows, 4H]: the input's pre-activations in (but
                             // with input_in_step), the activated gates out
  const float* bias = nullptr;  // optional [4H], added to the pre-activations
  RowSource c_prev;          // [rows, H]
  float* c = nullptr;        // [rows, H] out
  float* h = nullptr;        // [rows, ldh] out (the first H columns)
  int64_t ldh = 0;
  // Zoneout, with keep on: c and h blended with c_prev and h_prev (k = H)
  // by the keep weights.
  KeepWeights<float> keep;
};

struct BackwardStep {
  int64_t rows = 0;
  int64_t hidden = 0;         // H
  int64_t k = 0;              // GEMM depth: 4H (or P with a projection)
  int64_t gemm_rows = 0;      // rows [0, gemm_rows) take a @ w ...
  const float* a = nullptr;   // [gemm_rows, lda]
  int64_t lda = 0;
  const float* w = nullptr;   // [k, H] through pack_cols
  const float* state = nullptr;  // ... the others this [rows, lds] (null: zero)
  int64_t lds = 0;
  const float* grad_out = nullptr;  // optional [rows, ldo], added
  int64_t ldo = 0;
  const float* act = nullptr;  // [rows, 4H] activated gates
  RowSource c_prev;            // [rows, H]
  const float* c = nullptr;    // [rows, H]
  float* grad_c = nullptr;     // [rows, H]: grad of c in, grad of c_prev out
  float* grad_gates = nullptr; // [rows, 4H] out
  // Zoneout, with keep on (see ForwardStep): c is the blended cell, and
  // carry [rows, H] holds the part of h's gradient that the next step sent
  // straight back (added to grad_h), then this step's, keep_h * grad_h.
  KeepWeights<float> keep;
  float* carry = nullptr;
};

// out[r, :n] = a[r, :k] @ w (+ add[r, :n])
struct Gemm {
  int64_t rows = 0;
  int64_t n = 0;
  int64_t k = 0;
  RowSource a;
  const float* w = nullptr;  // through pack_cols or pack_rows
  const float* add = nullptr;  // optional
  int64_t ld_add = 0;
  float* out = nullptr;
  int64_t ldo = 0;
};

struct RecurrentKernels {
  const char* isa = nullptr;  // "avx512", "avx2" or "generic"
  int64_t vec = 0;            // floats per vector (V)

  // Panels, and the floats of `panels` packed panels of depth k.
  int64_t gate_panels(int64_t hidden) const { return (hidden + vec - 1) / vec; }
  int64_t plain_panels(int64_t n) const { return (n + 4 * vec - 1) / (4 * vec); }
  int64_t packed_size(int64_t panels, int64_t k) const { return panels * k * 4 * vec; }

  // Each packs the panels [panel_begin, panel_end) (of gate_panels or
  // plain_panels): disjoint ranges may be packed on different threads.
  // w [4H, k] row-major, for ForwardStep.
  void (*pack_gates)(const float* w, int64_t hidden, int64_t k, float* out, int64_t panel_begin,
                     int64_t panel_end) = nullptr;
  // B[k][n] = w[n][k] for w [n, k] row-major (x @ w^T), for Gemm.
  void (*pack_rows)(const float* w, int64_t n, int64_t k, float* out, int64_t panel_begin,
                    int64_t panel_end) = nullptr;
  // B[k][n] = w[k][n] for w [k, n] row-major (x @ w), for Gemm and BackwardStep.
  void (*pack_cols)(const float* w, int64_t k, int64_t n, float* out, int64_t panel_begin,
                    int64_t panel_end) = nullptr;

  // dst[i * ldd + j] = src[j * lds + i] for i < n, j < m: the rows of a
  // transposed operand (grad_gates.t()) made dense, for Gemm. Null in
  // builds whose gemm packs such operands itself.
  void (*transpose)(const float* src, int64_t lds, int64_t n, int64_t m, float* dst,
                    int64_t ldd) = nullptr;

  // Each computes the panels [panel_begin, panel_end) for all rows.
  void (*forward_step)(const ForwardStep& s, int64_t panel_begin, int64_t panel_end) = nullptr;
  void (*backward_step)(const BackwardStep& s, int64_t panel_begin, int64_t panel_end) = nullptr;
  void (*gemm)(const Gemm& s, int64_t panel_begin, int64_t panel_end) = nullptr;

  // The core's FMA peak for this build's vectors, for benchmarks: kFmaChains
  // independent chains acc = acc * a + b, `iterations` FMAs each, on
  // registers only (iterations * kFmaChains * vec * 2 FLOP). Returns the
  // sum of the chains' lanes, chain c starting from c.
  float (*fma_loop)(int64_t iterations, float a, float b) = nullptr;
};

// Enough independent chains to keep two FMA units with a latency of four
// cycles busy, few enough for the 16 registers of AVX2.
constexpr int kFmaChains = 12;

// The kernels of the widest ISA this CPU runs, no wider than `cap`
// (avx512, avx2, generic; native or empty: no cap). Null, with the reason
// in *error, if `cap` names no known ISA.
const RecurrentKernels* widest_kernels(const std::string& cap, std::string* error);

// The kernels of one ISA if this CPU runs it (tests and benchmarks), else null.
const RecurrentKernels* recurrent_kernels_for(const std::string& isa);

}  // namespace cpu
}  // namespace kernels
}  // namespace pipelstm
