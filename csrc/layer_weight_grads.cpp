// The weight part of a layer's backward: every weight gradient as one GEMM
// over all steps, from the data part's gate gradients. Device-generic: the
// GEMMs and buffers are the caller's `math` (layer_math.h).
#include "layer_weight_grads.h"

#include <ATen/ATen.h>

#include "checks.h"
#include "lstm_ops.h"

namespace pipelstm {

// Dense: one GEMM over the steps that follow another (plain views) plus one
// for h0. Packed: gather, one GEMM.
void recurrent_weight_grad(const LayerSteps& steps, const Tensor& grad_gates,
                           const Tensor& output, const Tensor& h0, bool reverse,
                           const Tensor& grad, bool add, const LayerMath& math) {
  const int64_t T = steps.steps(), B = steps.max_batch;
  if (steps.dense) {
    const int64_t first = LayerSteps::step_at(0, T, reverse);
    math.mm_out(grad, grad_gates.narrow(0, first * B, B).t(), h0, add);
    if (T > 1) {
      const int64_t rest = (T - 1) * B;
      const Tensor dg = reverse ? grad_gates.narrow(0, 0, rest) : grad_gates.narrow(0, B, rest);
      const Tensor h = reverse ? output.narrow(0, B, rest) : output.narrow(0, 0, rest);
      math.mm_out(grad, dg.t(), h, /*accumulate=*/true);
    }
    return;
  }
  Tensor h_prev = at::empty({steps.rows, output.size(1)}, output.options());
  int64_t prev = -1;
  for (int64_t p = 0; p < T; ++p) {
    const int64_t t = LayerSteps::step_at(p, T, reverse);
    const int64_t rows = steps.batch[t], cont = steps.continuing(p, reverse);
    Tensor dst = h_prev.narrow(0, steps.offset[t], rows);
    if (cont > 0) dst.narrow(0, 0, cont).copy_(output.narrow(0, steps.offset[prev], cont));
    if (rows > cont) dst.narrow(0, cont, rows - cont).copy_(h0.narrow(0, cont, rows - cont));
    prev = t;
  }
  math.mm_out(grad, grad_gates.t(), h_prev, add);
}

void add_weight_grads(const LayerSteps& steps, const LayerDataGrads& d, const Tensor& x,
                      const Tensor& h0, const Tensor& output, bool reverse,
                      LayerWeightGrads& acc, const LayerMath& math) {
  const bool add = acc.w_ih.defined();
  if (!add) {
    acc.w_ih = math.empty({d.grad_gates.size(1), x.size(1)}, x.options());
    acc.w_hh = math.empty({d.grad_gates.size(1), h0.size(1)}, h0.options());
  }
  math.mm_out(acc.w_ih, d.grad_gates.t(), x, add);
  recurrent_weight_grad(steps, d.grad_gates, output, h0.contiguous(), reverse, acc.w_hh, add, math);
  if (add) {
    acc.bias.add_(d.grad_gates.sum(0));
  } else {
    acc.bias = d.grad_gates.sum(0);
  }
  if (!d.grad_h.defined()) {
    if (!add) acc.w_hr = at::empty({0}, x.options());
  } else {
    if (!add) acc.w_hr = at::empty({d.grad_h.size(1), d.raw_h.size(1)}, x.options());
    math.mm_out(acc.w_hr, d.grad_h.t(), d.raw_h, add);
  }
}

BackwardResult with_weight_grads(const LayerSteps& steps, const LayerDataGrads& d,
                                 const Tensor& x, const Tensor& h0, const Tensor& output,
                                 bool reverse, const LayerMath& math) {
  LayerWeightGrads w;
  add_weight_grads(steps, d, x, h0, output.contiguous(), reverse, w, math);
  return {d.grad_input, d.grad_h0, d.grad_c0, w.w_ih, w.w_hh, w.bias, w.w_hr};
}

void lstm_layer_add_weight_grads(const LayerDataGrads& grads, const Tensor& input, const Tensor& h0,
                                 const Tensor& output, LayerWeightGrads& acc, const LayerMath& math) {
  constexpr const char* op = "lstm_layer_weight_grads";
  const OpGuard guard(input);
  check_dim(op, "input", input, 3, "[T, B, I]");
  const int64_t T = input.size(0), B = input.size(1);
  TORCH_CHECK(grads.grad_gates.dim() == 2 && grads.grad_gates.size(0) == T * B,
              "pipelstm::", op, ": expected grad_gates of ", T * B, " rows, got ",
              grads.grad_gates.sizes());
  TORCH_CHECK(output.dim() == 3 && output.size(0) == T && output.size(1) == B,
              "pipelstm::", op, ": expected output [", T, ", ", B, ", P], got ", output.sizes());
  add_weight_grads(dense_steps(T, B), grads, input.contiguous().view({T * B, -1}), h0,
                   output.contiguous().view({T * B, -1}), /*reverse=*/false, acc, math);
}

}  // namespace pipelstm
