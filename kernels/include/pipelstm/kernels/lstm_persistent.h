// The persistent recurrent forward kernel: one launch for a whole sequence.
//
// For small batches the per-step recurrent GEMM is tiny and the time loop is
// bound by launch latency (see `python -m pipelstm.bench floors`). This
// kernel keeps each block's slice of w_hh in shared memory for all steps:
// block g owns hidden units [g * units, (g + 1) * units) and, every step,
// computes their four gate pre-activations for the whole batch from h_{t-1},
// applies the shared gate math, and writes h_t, c_t and the activated gates;
// a grid-wide barrier (cooperative groups) separates the steps.
//
// Layouts as in lstm_pointwise.h; input_gates is the input projection of
// every step with both biases, [T, B, 4H]. No projection (w_hr).
#pragma once

#include <cstdint>

#include "pipelstm/kernels/gate_math.h"

namespace pipelstm {
namespace kernels {

template <typename T>
struct PersistentForwardArgs {
  const T* input_gates = nullptr;  // [T, B, 4H]
  const T* w_hh = nullptr;         // [4H, H]
  const T* h0 = nullptr;           // [B, H]
  const T* c0 = nullptr;           // [B, H]
  T* output = nullptr;             // [T, B, H]: h of every step
  T* act_gates = nullptr;          // [T, B, 4H]: activated gates (workspace); may alias
                                   // input_gates (each element is read, then written, by
                                   // one thread)
  T* cells = nullptr;              // [T, B, H]: c of every step (workspace)
  int64_t steps = 0, batch = 0, hidden = 0;
  bool reverse = false;
};

namespace persistent {

// Shared-memory slice of w_hh for `units` hidden units, in float: row
// (u * 4 + k) holds w_hh[k * H + j0 + u, :].
PIPELSTM_HD int64_t slice_row(int64_t u, int k) { return u * 4 + k; }

inline int64_t slice_bytes(int64_t units, int64_t hidden) {
  return units * 4 * hidden * static_cast<int64_t>(sizeof(float));
}

// Hidden units per block for `blocks` blocks.
inline int64_t units_per_block(int64_t hidden, int64_t blocks) {
  return (hidden + blocks - 1) / blocks;
}

// The step processed at position p.
PIPELSTM_HD int64_t step_at(int64_t p, int64_t steps, bool reverse) {
  return reverse ? steps - 1 - p : p;
}

// One lane's share of the dot product of a slice row and an h row: elements
// lane, lane + lanes, ... The device sums the lanes of a warp with shuffles;
// the host harness sums them in a loop.
template <typename T, typename Load>
PIPELSTM_HD float partial_dot(const float* w_row, const T* h_row, int64_t hidden, int lane,
                              int lanes, Load load) {
  float acc = 0.0f;
  for (int64_t i = lane; i < hidden; i += lanes) acc += w_row[i] * load(h_row[i]);
  return acc;
}

// What the gate math of hidden unit j of batch row b at step position p
// (step t) reads besides the recurrent product: the input projection of
// its four gates and the cell it starts from.
struct UnitInputs {
  float gates[4];
  float c_prev;
};

template <typename T, typename Load>
PIPELSTM_HD UnitInputs unit_inputs(const PersistentForwardArgs<T>& a, int64_t t, int64_t p,
                                   int64_t b, int64_t j, Load load) {
  const int64_t H = a.hidden, B = a.batch;
  const int64_t g0 = (t * B + b) * 4 * H + j;
  const int64_t prev = p == 0 ? -1 : step_at(p - 1, a.steps, a.reverse);
  UnitInputs in;
  for (int k = 0; k < 4; ++k) in.gates[k] = load(a.input_gates[g0 + k * H]);
  in.c_prev = prev < 0 ? load(a.c0[b * H + j]) : load(a.cells[(prev * B + b) * H + j]);
  return in;
}

// The gate math of that unit, given its inputs and the four recurrent dot
// products; writes h, c and the activated gates.
template <typename T, typename Store>
PIPELSTM_HD T finish_unit(const PersistentForwardArgs<T>& a, int64_t t, int64_t b, int64_t j,
                          const UnitInputs& in, const float (&dot)[4], Store store) {
  const int64_t H = a.hidden, B = a.batch;
  const int64_t g0 = (t * B + b) * 4 * H + j;
  const auto r = math::cell_forward(in.gates[0] + dot[0], in.gates[1] + dot[1],
                                    in.gates[2] + dot[2], in.gates[3] + dot[3], in.c_prev);
  a.act_gates[g0] = store(r.i);
  a.act_gates[g0 + H] = store(r.f);
  a.act_gates[g0 + 2 * H] = store(r.g);
  a.act_gates[g0 + 3 * H] = store(r.o);
  a.cells[(t * B + b) * H + j] = store(r.c);
  const T h = store(r.h);
  a.output[(t * B + b) * H + j] = h;
  return h;
}

template <typename T, typename Load, typename Store>
PIPELSTM_HD T finish_unit(const PersistentForwardArgs<T>& a, int64_t t, int64_t p, int64_t b,
                          int64_t j, const float (&dot)[4], Load load, Store store) {
  return finish_unit(a, t, b, j, unit_inputs(a, t, p, b, j, load), dot, store);
}

// The h row that step position p of batch row b starts from.
template <typename T>
PIPELSTM_HD const T* h_prev_row(const PersistentForwardArgs<T>& a, int64_t p, int64_t b) {
  if (p == 0) return a.h0 + b * a.hidden;
  const int64_t prev = step_at(p - 1, a.steps, a.reverse);
  return a.output + (prev * a.batch + b) * a.hidden;
}

}  // namespace persistent


}  // namespace kernels
}  // namespace pipelstm
