// The weight gradients of a layer direction (layer_weight_grads.cpp), for
// every backend's backward and for the pipeline's deferred weight part,
// with the GEMMs and buffers of `math` (layer_math.h).
#pragma once

#include <ATen/core/Tensor.h>

#include "layer_math.h"
#include "layer_steps.h"
#include "layer_workspace.h"
#include "lstm_ops.h"

namespace pipelstm {

// grad (+)= sum over steps of grad_gates_t^T @ h_prev_t, where h_prev_t is
// the hidden state each row of step t started from (output's rows, or h0):
// `add` adds into grad, else overwrites it. output and h0 contiguous.
void recurrent_weight_grad(const LayerSteps& steps, const at::Tensor& grad_gates,
                           const at::Tensor& output, const at::Tensor& h0, bool reverse,
                           const at::Tensor& grad, bool add, const LayerMath& math);

// The weight gradients of `d`'s steps (x [N, I] and output [N, P] by rows,
// h0 the initial state), one GEMM each, into `acc`: added to what it holds
// where acc.w_ih is defined (the GEMMs accumulate in place), else into new
// buffers.
void add_weight_grads(const LayerSteps& steps, const LayerDataGrads& d, const at::Tensor& x,
                      const at::Tensor& h0, const at::Tensor& output, bool reverse,
                      LayerWeightGrads& acc, const LayerMath& math);

// The backward's results: `d`'s data gradients and the weight gradients.
BackwardResult with_weight_grads(const LayerSteps& steps, const LayerDataGrads& d,
                                 const at::Tensor& x, const at::Tensor& h0,
                                 const at::Tensor& output, bool reverse, const LayerMath& math);

}  // namespace pipelstm
