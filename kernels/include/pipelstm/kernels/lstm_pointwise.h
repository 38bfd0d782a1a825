// The fused LSTM pointwise step: plain pointers and sizes, no framework.
//
// Layouts (all row-major and dense, rows = batch):
//   gates  [B, 4H]  per row the four gate blocks i | f | g | o, each H wide
//   c, h   [B, H]
// Pointer arguments that the comments call "optional" may be null.
#pragma once

#include <cstdint>

#include "pipelstm/kernels/keep_weights.h"

namespace pipelstm {
namespace kernels {

template <typename T>
struct PointwiseForwardArgs {
  const T* gates = nullptr;         // [B, 4H] pre-activations
  const T* hidden_gates = nullptr;  // optional [B, 4H], added to gates
  const T* bias_ih = nullptr;       // optional [4H]
  const T* bias_hh = nullptr;       // optional [4H]
  const T* c_prev = nullptr;        // [B, H]
  T* act_gates = nullptr;           // [B, 4H] out: activated gates; may alias gates
  T* c = nullptr;                   // [B, H] out: new cell state
  T* h = nullptr;                   // [B, H] out: new hidden state
  // Zoneout, with keep on: c and h blended with c_prev and h_prev by the
  // keep weights. Only without hidden_gates and biases.
  const T* h_prev = nullptr;        // [B, H]
  KeepWeights<T> keep;
  int64_t batch = 0;
  int64_t hidden = 0;
};

template <typename T>
struct PointwiseBackwardArgs {
  const T* grad_h = nullptr;     // optional [B, H]: gradient of this step's h
  const T* grad_out = nullptr;   // optional: a second gradient of this step's h, added to
                                 // grad_h; row b at grad_out + b * grad_out_stride
  int64_t grad_out_stride = 0;   // 0: one row for every b (an expanded gradient)
  const T* grad_c = nullptr;     // optional [B, H]: gradient of this step's c
  const T* act_gates = nullptr;  // [B, 4H] activated gates from the forward
  const T* c_prev = nullptr;     // [B, H]
  const T* c = nullptr;          // [B, H] this step's cell state
  T* grad_gates = nullptr;       // [B, 4H] out: gradient of the pre-activations
  T* grad_c_prev = nullptr;      // [B, H] out; may alias grad_c
  // Zoneout, with keep on (see PointwiseForwardArgs): c is the blended
  // cell, and grad_h_prev gets keep.h times the total gradient of h (the
  // part that flows straight to the previous h); it may alias grad_h.
  KeepWeights<T> keep;
  T* grad_h_prev = nullptr;      // [B, H] out, with keep on
  int64_t batch = 0;
  int64_t hidden = 0;
};

// CPU: process rows [row_begin, row_end). The caller splits the batch over
// threads; each call is independent. Instantiated for float and double.
template <typename T>
void pointwise_forward_cpu(const PointwiseForwardArgs<T>& args, int64_t row_begin,
                           int64_t row_end);

template <typename T>
void pointwise_backward_cpu(const PointwiseBackwardArgs<T>& args, int64_t row_begin,
                            int64_t row_end);

}  // namespace kernels
}  // namespace pipelstm
