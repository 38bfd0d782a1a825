// The row kernels of the LayerNorm LSTM (Ba et al. 2016, arXiv 1607.06450):
// per row, layer normalisation of the recurrent pre-activations and of the
// new cell, fused with the gates (and zoneout where keep weights are given).
// The caller runs the GEMMs and the input projections' normalisation
// (layer_norm_rows) and splits each step into runs of rows with the same
// previous state. Plain pointers and sizes, no framework; rows are dense
// (row stride 4H or H), pointers at the run's first row.
//
//   a    = gamma_ih * LN(x W_ih^T) + gamma_hh * LN(h_prev W_hh^T) + bias
//   c'   = sigmoid(a_f) * c_prev + sigmoid(a_i) * tanh(a_g)
//   h'   = sigmoid(a_o) * tanh(gamma_c * LN(c') + beta_c)
//   c, h = c', h' (zoneout: blended with c_prev, h_prev by the keep weights)
//
// where LN(v) = (v - mean(v)) / sqrt(var(v) + eps) over the row (4H wide for
// the pre-activations, H for the cell), as torch.nn.LayerNorm without its
// affine part.
#pragma once

#include <cstdint>

#include "pipelstm/kernels/keep_weights.h"

namespace pipelstm {
namespace kernels {

template <typename T>
struct LayerNormStepForwardArgs {
  const T* gamma_ih = nullptr;  // [4H]
  const T* gamma_hh = nullptr;  // [4H]
  const T* bias = nullptr;      // optional [4H]
  const T* gamma_c = nullptr;   // [H]
  const T* beta_c = nullptr;    // optional [H]
  const T* x_hat = nullptr;     // [B, 4H] the normalised input projections
  T* r = nullptr;               // [B, 4H] in: h_prev W_hh^T; out: its normalisation
  T* r_rstd = nullptr;          // [B] out: 1 / sqrt(var + eps) of each row of r
  const T* c_prev = nullptr;    // [B, H]
  T* act = nullptr;             // [B, 4H] out: activated gates i | f | g | o
  T* c = nullptr;               // [B, H] out: the cell carried on (blended under zoneout)
  T* c_hat = nullptr;           // [B, H] out: the normalised new cell
  T* tanh_n = nullptr;          // [B, H] out: tanh(gamma_c * c_hat + beta_c)
  T* c_rstd = nullptr;          // [B] out
  T* h = nullptr;               // [B, H] out: the hidden state carried on
  // Zoneout, with keep on.
  const T* h_prev = nullptr;    // [B, H]
  KeepWeights<T> keep;
  int64_t batch = 0;
  int64_t hidden = 0;
  T eps = T(0);
};

template <typename T>
struct LayerNormStepBackwardArgs {
  const T* gamma_hh = nullptr;    // [4H]
  const T* gamma_c = nullptr;     // [H]
  const T* r_hat = nullptr;       // [B, 4H] as the forward left r
  const T* r_rstd = nullptr;      // [B]
  const T* c_prev = nullptr;      // [B, H]
  const T* act = nullptr;         // [B, 4H]
  const T* c_hat = nullptr;       // [B, H]
  const T* tanh_n = nullptr;      // [B, H]
  const T* c_rstd = nullptr;      // [B]
  const T* grad_out = nullptr;    // optional [B, H]: the output's gradient at this step
  T* grad_h = nullptr;            // [B, H] in: the gradient of h from the next step;
                                  // out (zoneout only): the part that goes to h_prev directly
  T* grad_c = nullptr;            // [B, H] in: the gradient of c from the next step; out: of c_prev
  T* grad_a = nullptr;            // [B, 4H] out: of the pre-activations a
  T* grad_r = nullptr;            // [B, 4H] out: of h_prev W_hh^T
  T* grad_n = nullptr;            // [B, H] out: of gamma_c * c_hat + beta_c
  KeepWeights<T> keep;            // zoneout, as in the forward
  int64_t batch = 0;
  int64_t hidden = 0;
};

// Rows [row_begin, row_end) of x [rows, n] normalised in place, each row's
// 1 / sqrt(var + eps) into rstd[row].
template <typename T>
void layer_norm_rows(T* x, T* rstd, int64_t n, T eps, int64_t row_begin, int64_t row_end);

// The backward of layer_norm_rows, in place: rows of grad [rows, n] hold
// the gradient of the normalised rows x_hat and become that of the rows
// before normalisation.
template <typename T>
void layer_norm_backward_rows(T* grad, const T* x_hat, const T* rstd, int64_t n, int64_t row_begin,
                              int64_t row_end);

// Rows [row_begin, row_end) of one step's run (args' pointers at row 0).
template <typename T>
void layernorm_step_forward_rows(const LayerNormStepForwardArgs<T>& a, int64_t row_begin,
                                 int64_t row_end);
template <typename T>
void layernorm_step_backward_rows(const LayerNormStepBackwardArgs<T>& a, int64_t row_begin,
                                  int64_t row_end);

}  // namespace kernels
}  // namespace pipelstm
