// The zoneout layer ops' kernels, once for every backend: one direction of
// one layer, dense ([T, B, I]) or packed (batch_sizes given), with each
// step's c and h blended with the previous ones by keep weights
// (gate_math.h's zoned), applied inside the steps: by the step loop of
// layer_step_loop.h, or by a backend's own path where it has one (the CPU's
// fused loops):
//   static ForwardResult zoneout_forward(steps, geometry, x, h0, c0, w_ih,
//       w_hh, b_ih, b_hh, reverse, zoneout);
//   static LayerDataGrads zoneout_backward_data(steps, geometry, grad_output,
//       grad_h_n, grad_c_n, x, h0, c0, w_ih, w_hh, workspace, reverse, zoneout);
// The weight gradients are layer_weight_grads.h's GEMMs over all steps, as
// for the plain layer.
// Registered by register_lstm_ops (layer_ops.h); schemas in registration.cpp.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

#include "checks.h"
#include "layer_checks.h"
#include "layer_step_loop.h"
#include "zoneout_keeps.h"
#include "layer_steps.h"
#include "layer_weight_grads.h"
#include "lstm_ops.h"

namespace pipelstm {

// keep_c and keep_h as the step loop's rows: each [rows, H] (or the
// output's [T, B, H]) of the input's dtype and device, or such a tensor
// expanded from one row (evaluation's constant weights: read in place).
inline Zoneout zoneout_rows(const char* op, const Tensor& input, const Tensor& keep_c,
                            const Tensor& keep_h, int64_t rows, int64_t H) {
  Zoneout z;
  const auto as_rows = [&](const char* name, const Tensor& keep) {
    check_same_kind(op, name, keep, "input", input);
    TORCH_CHECK(keep.dim() >= 1 && keep.size(-1) == H && keep.numel() == rows * H, "pipelstm::", op,
                ": expected `", name, "` with ", rows, " rows of ", H,
                " keep weights (the output's shape without projection), got shape ", keep.sizes());
    bool one_row = keep.stride(-1) == 1;
    for (int64_t d = 0; d + 1 < keep.dim(); ++d) one_row = one_row && (keep.stride(d) == 0 || keep.size(d) == 1);
    return one_row ? keep.as_strided({rows, H}, {0, 1}) : keep.contiguous().view({rows, H});
  };
  z.keep_c = as_rows("keep_c", keep_c);
  z.keep_h = as_rows("keep_h", keep_h);
  if (z.keep_c.stride(0) != z.keep_h.stride(0)) {  // one stride for both
    z.keep_c = z.keep_c.contiguous();
    z.keep_h = z.keep_h.contiguous();
  }
  z.stride = z.keep_c.stride(0);
  return z;
}

// The steps of a dense ([T, B, I]) or packed ([rows, I], batch_sizes) input.
inline LayerSteps zoneout_steps(const char* op, const Tensor& input,
                                const OptTensor& batch_sizes) {
  if (batch_sizes.has_value()) return packed_input_steps(op, input, *batch_sizes);
  check_dim(op, "input", input, 3, "[T, B, I]");
  TORCH_CHECK(input.size(0) > 0, "pipelstm::", op,
              ": expected `input` with at least one time step, got ", input.sizes());
  checked_product(op, "T x B", {input.size(0), input.size(1)});
  return dense_steps(input.size(0), input.size(1));
}

// The kernels' C++ signatures, which every backend's must have (the
// dispatcher refuses a second kernel of another; register_lstm_ops checks).
using ZoneoutForwardKernel = std::tuple<Tensor, Tensor, Tensor, Tensor> (*)(
    const Tensor&, const OptTensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
    const OptTensor&, const OptTensor&, const Tensor&, const Tensor&, bool);
using ZoneoutBackwardKernel = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> (*)(
    const OptTensor&, const OptTensor&, const OptTensor&, const Tensor&, const OptTensor&,
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
    const Tensor&, const Tensor&, bool);

template <class Backend>
std::tuple<Tensor, Tensor, Tensor, Tensor> zoneout_layer_forward(
    const Tensor& input, const OptTensor& batch_sizes, const Tensor& h0, const Tensor& c0,
    const Tensor& w_ih, const Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh,
    const Tensor& keep_c, const Tensor& keep_h, bool reverse) {
  constexpr const char* op = "lstm_zoneout_layer_forward";
  const OpGuard guard(input);
  const LayerSteps steps = zoneout_steps(op, input, batch_sizes);
  const LayerGeometry s =
      check_weights(op, input, steps.rows, steps.max_batch, h0, c0, w_ih, w_hh, std::nullopt);
  check_biases(op, input, s, b_ih, b_hh);
  const Zoneout z = zoneout_rows(op, input, keep_c, keep_h, steps.rows, s.hidden);
  const Tensor x = input.contiguous().view({steps.rows, s.input});
  ForwardResult r;
  if constexpr (requires { &Backend::zoneout_forward; }) {
    r = Backend::zoneout_forward(steps, s, x, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse, z);
  } else {
    r = step_loop_forward<Backend>(steps, s, x, h0, c0, w_ih, w_hh, b_ih, b_hh, std::nullopt, reverse, &z);
  }
  Tensor output = batch_sizes.has_value() ? r.output : r.output.view({input.size(0), input.size(1), s.out});
  return {output, r.h_n, r.c_n, r.workspace};
}

template <class Backend>
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> zoneout_layer_backward(
    const OptTensor& grad_output, const OptTensor& grad_h_n, const OptTensor& grad_c_n,
    const Tensor& input, const OptTensor& batch_sizes, const Tensor& h0, const Tensor& c0,
    const Tensor& w_ih, const Tensor& w_hh, const Tensor& keep_c, const Tensor& keep_h,
    const Tensor& output, const Tensor& workspace, bool reverse) {
  constexpr const char* op = "lstm_zoneout_layer_backward";
  const OpGuard guard(input);
  LayerSteps steps;
  LayerGeometry s;
  Tensor x, out;
  OptTensor grad_out = grad_output;
  if (batch_sizes.has_value()) {
    auto p = packed_backward(op, grad_output, grad_h_n, grad_c_n, input, *batch_sizes, h0, c0, w_ih,
                             w_hh, std::nullopt, output, workspace);
    steps = std::move(p.steps);
    s = p.s;
    x = input.contiguous();
    out = output;
  } else {
    DenseBackward a = dense_backward(op, grad_output, grad_h_n, grad_c_n, input, h0, c0, w_ih, w_hh,
                                     std::nullopt, output, workspace);
    steps = dense_steps(a.T, a.B);
    s = a.s;
    x = a.x;
    out = a.out;
    grad_out = a.grad_out;
  }
  const Zoneout z = zoneout_rows(op, input, keep_c, keep_h, steps.rows, s.hidden);
  LayerDataGrads d;
  if constexpr (requires { &Backend::zoneout_backward_data; }) {
    d = Backend::zoneout_backward_data(steps, s, grad_out, grad_h_n, grad_c_n, x, h0, c0, w_ih, w_hh, workspace,
                                       reverse, z);
  } else {
    d = step_loop_backward_data<Backend>(steps, s, grad_out, grad_h_n, grad_c_n, x, h0, c0, w_ih, w_hh,
                                         std::nullopt, workspace, reverse, &z);
  }
  BackwardResult r = with_weight_grads(steps, d, x, h0, out, reverse, Backend::kMath);
  Tensor grad_input = batch_sizes.has_value() ? r.grad_input : r.grad_input.view(input.sizes());
  return {grad_input, r.grad_h0, r.grad_c0, r.grad_w_ih, r.grad_w_hh, r.grad_bias};
}

}  // namespace pipelstm
