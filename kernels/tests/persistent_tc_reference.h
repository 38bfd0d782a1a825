// The references the persistent kernels are checked against: the step loop
// as the layer op runs it, a plain recurrent GEMM (accumulated in double)
// and the CPU pointwise loops per step. `round` is applied to every value a
// step stores (h, c, the activated gates; grad_gates and grad_c) before the
// next step reads it: the identity for the host harness, a round trip
// through fp16/bf16 where a 16-bit kernel stores its results in 16 bits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "pipelstm/kernels/lstm_persistent_tc.h"
#include "pipelstm/kernels/lstm_pointwise.h"

namespace pipelstm {
namespace kernels {
namespace testing {

struct NoRounding {
  float operator()(float v) const { return v; }
};

template <typename Round = NoRounding>
void reference_forward(const PersistentForwardArgs<float>& a, Round round = Round()) {
  const int64_t H = a.hidden, B = a.batch;
  std::vector<float> gates(B * 4 * H);
  for (int64_t pos = 0; pos < a.steps; ++pos) {
    const int64_t t = persistent::step_at(pos, a.steps, a.reverse);
    for (int64_t b = 0; b < B; ++b) {
      const float* h = persistent::h_prev_row(a, pos, b);
      for (int64_t r = 0; r < 4 * H; ++r) {
        double acc = 0;
        for (int64_t i = 0; i < H; ++i) acc += double(a.w_hh[r * H + i]) * h[i];
        gates[b * 4 * H + r] = a.input_gates[(t * B + b) * 4 * H + r] + float(acc);
      }
    }
    const int64_t prev = pos == 0 ? -1 : persistent::step_at(pos - 1, a.steps, a.reverse);
    PointwiseForwardArgs<float> s;
    s.gates = gates.data();
    s.c_prev = prev < 0 ? a.c0 : a.cells + prev * B * H;
    s.act_gates = a.act_gates + t * B * 4 * H;
    s.c = a.cells + t * B * H;
    s.h = a.output + t * B * H;
    s.batch = B;
    s.hidden = H;
    pointwise_forward_cpu<float>(s, 0, B);
    for (int64_t i = 0; i < B * 4 * H; ++i) s.act_gates[i] = round(s.act_gates[i]);
    for (int64_t i = 0; i < B * H; ++i) {
      s.c[i] = round(s.c[i]);
      s.h[i] = round(s.h[i]);
    }
  }
}

template <typename Round = NoRounding>
void reference_backward(const PersistentBackwardArgs<float>& a, Round round = Round()) {
  const int64_t H = a.hidden, B = a.batch, T = a.steps;
  std::vector<float> grad_h_rec(B * H, 0.0f), grad_h(B * H);
  for (int64_t i = 0; i < B * H; ++i) {
    if (a.grad_h_n) grad_h_rec[i] = a.grad_h_n[i];
    a.grad_c0[i] = a.grad_c_n ? a.grad_c_n[i] : 0.0f;
  }
  for (int64_t pos = T - 1; pos >= 0; --pos) {
    const int64_t t = persistent::step_at(pos, T, a.reverse);
    const int64_t prev = pos == 0 ? -1 : persistent::step_at(pos - 1, T, a.reverse);
    for (int64_t i = 0; i < B * H; ++i)
      grad_h[i] = grad_h_rec[i] + (a.grad_output ? a.grad_output[t * B * H + i] : 0.0f);
    PointwiseBackwardArgs<float> s;
    s.grad_h = grad_h.data();
    s.grad_c = a.grad_c0;
    s.act_gates = a.act_gates + t * B * 4 * H;
    s.c_prev = prev < 0 ? a.c0 : a.cells + prev * B * H;
    s.c = a.cells + t * B * H;
    s.grad_gates = a.grad_gates + t * B * 4 * H;
    s.grad_c_prev = a.grad_c0;
    s.batch = B;
    s.hidden = H;
    pointwise_backward_cpu<float>(s, 0, B);
    for (int64_t i = 0; i < B * 4 * H; ++i) s.grad_gates[i] = round(s.grad_gates[i]);
    for (int64_t i = 0; i < B * H; ++i) a.grad_c0[i] = round(a.grad_c0[i]);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < H; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < 4 * H; ++k)
          acc += double(s.grad_gates[b * 4 * H + k]) * a.w_hh[k * H + j];
        grad_h_rec[b * H + j] = float(acc);
      }
  }
  for (int64_t i = 0; i < B * H; ++i) a.grad_h0[i] = round(grad_h_rec[i]);
}

}  // namespace testing
}  // namespace kernels
}  // namespace pipelstm
