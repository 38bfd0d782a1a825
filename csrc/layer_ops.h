// The layer ops' kernels, once for every backend: the checks, the dense or
// packed rows, then the backend's own core. Each backend registers
// `layer_forward<ItsLayer>` and the rest under its dispatch key
// (cpu/lstm_layer_cpu.cpp, cuda/lstm_layer_cuda.cpp); the schemas are in
// registration.cpp.
//
// `Backend` (with the step-loop members of layer_step_loop.h) has, over the
// rows of `steps` (x [N, I], output [N, P]):
//   static ForwardResult forward(steps, geometry, x, h0, c0, w_ih, w_hh,
//                                b_ih, b_hh, w_hr, reverse);
//   static LayerDataGrads backward_data(steps, geometry, grad_output,
//       grad_h_n, grad_c_n, x, h0, c0, w_ih, w_hh, w_hr, workspace, reverse);
//   static BackwardResult backward(steps, geometry, grad_output, grad_h_n,
//       grad_c_n, x, h0, c0, w_ih, w_hh, w_hr, output, workspace, reverse);
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>
#include <type_traits>

#include <torch/library.h>

#include "checks.h"
#include "cell_ops.h"
#include "layer_checks.h"
#include "layer_steps.h"
#include "layer_weight_grads.h"
#include "layer_workspace.h"
#include "lstm_ops.h"
#include "zoneout_layer_ops.h"

namespace pipelstm {

// A backward as its two parts: Backend::backward_data, then every weight
// gradient as one GEMM over all steps (layer_weight_grads.h).
template <class Backend>
BackwardResult backward_in_two_parts(const LayerSteps& steps, const LayerGeometry& s,
                                     const OptTensor& grad_output, const OptTensor& grad_h_n,
                                     const OptTensor& grad_c_n, const Tensor& x, const Tensor& h0,
                                     const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
                                     const OptTensor& w_hr, const Tensor& output,
                                     const Tensor& workspace, bool reverse) {
  const LayerDataGrads d = Backend::backward_data(steps, s, grad_output, grad_h_n, grad_c_n, x, h0,
                                                  c0, w_ih, w_hh, w_hr, workspace, reverse);
  return with_weight_grads(steps, d, x, h0, output, reverse, Backend::kMath);
}

template <class Backend>
std::tuple<Tensor, Tensor, Tensor, Tensor> layer_forward(
    const Tensor& input, const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
    const Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh, const OptTensor& w_hr,
    bool reverse) {
  constexpr const char* op = "lstm_layer_forward";
  const OpGuard guard(input);
  check_dim(op, "input", input, 3, "[T, B, I]");
  const int64_t T = input.size(0), B = input.size(1);
  TORCH_CHECK(T > 0, "pipelstm::", op, ": expected `input` with at least one time step, got ",
              input.sizes());
  const int64_t rows = checked_product(op, "T x B", {T, B});
  const LayerGeometry s = check_weights(op, input, rows, B, h0, c0, w_ih, w_hh, w_hr);
  check_biases(op, input, s, b_ih, b_hh);
  const auto x = input.contiguous().view({T * B, s.input});
  auto r = Backend::forward(dense_steps(T, B), s, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse);
  return {r.output.view({T, B, s.out}), r.h_n, r.c_n, r.workspace};
}

template <class Backend>
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> layer_backward(
    const OptTensor& grad_output, const OptTensor& grad_h_n, const OptTensor& grad_c_n,
    const Tensor& input, const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
    const Tensor& w_hh, const OptTensor& w_hr, const Tensor& output, const Tensor& workspace,
    bool reverse) {
  const OpGuard guard(input);
  const DenseBackward a = dense_backward("lstm_layer_backward", grad_output, grad_h_n, grad_c_n,
                                         input, h0, c0, w_ih, w_hh, w_hr, output, workspace);
  auto r = Backend::backward(dense_steps(a.T, a.B), a.s, a.grad_out, grad_h_n, grad_c_n, a.x, h0,
                             c0, w_ih, w_hh, w_hr, a.out, workspace, reverse);
  return {r.grad_input.view({a.T, a.B, a.s.input}), r.grad_h0, r.grad_c0, r.grad_w_ih, r.grad_w_hh,
          r.grad_bias, r.grad_w_hr};
}

// The internal op behind lstm_layer_backward_data (lstm_ops.h): grad_h and
// raw_h are empty without a projection.
template <class Backend>
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> layer_backward_data(
    const OptTensor& grad_output, const OptTensor& grad_h_n, const OptTensor& grad_c_n,
    const Tensor& input, const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
    const Tensor& w_hh, const OptTensor& w_hr, const Tensor& output, const Tensor& workspace) {
  const OpGuard guard(input);
  const DenseBackward a = dense_backward("lstm_layer_backward_data", grad_output, grad_h_n,
                                         grad_c_n, input, h0, c0, w_ih, w_hh, w_hr, output, workspace);
  LayerDataGrads d = Backend::backward_data(dense_steps(a.T, a.B), a.s, a.grad_out, grad_h_n,
                                            grad_c_n, a.x, h0, c0, w_ih, w_hh, w_hr, workspace,
                                            /*reverse=*/false);
  const auto or_empty = [&](const Tensor& t) { return t.defined() ? t : at::empty({0}, input.options()); };
  return {d.grad_input.view({a.T, a.B, a.s.input}), d.grad_h0, d.grad_c0, d.grad_gates,
          or_empty(d.grad_h), or_empty(d.raw_h)};
}

template <class Backend>
std::tuple<Tensor, Tensor, Tensor, Tensor> packed_layer_forward(
    const Tensor& input, const Tensor& batch_sizes, const Tensor& h0, const Tensor& c0,
    const Tensor& w_ih, const Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh,
    const OptTensor& w_hr, bool reverse) {
  constexpr const char* op = "lstm_packed_layer_forward";
  const OpGuard guard(input);
  const LayerSteps steps = packed_input_steps(op, input, batch_sizes);
  const LayerGeometry s =
      check_weights(op, input, steps.rows, steps.max_batch, h0, c0, w_ih, w_hh, w_hr);
  check_biases(op, input, s, b_ih, b_hh);
  auto r = Backend::forward(steps, s, input.contiguous(), h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr,
                            reverse);
  return {r.output, r.h_n, r.c_n, r.workspace};
}

template <class Backend>
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> packed_layer_backward(
    const OptTensor& grad_output, const OptTensor& grad_h_n, const OptTensor& grad_c_n,
    const Tensor& input, const Tensor& batch_sizes, const Tensor& h0, const Tensor& c0,
    const Tensor& w_ih, const Tensor& w_hh, const OptTensor& w_hr, const Tensor& output,
    const Tensor& workspace, bool reverse) {
  const OpGuard guard(input);
  const auto [steps, s] = packed_backward("lstm_packed_layer_backward", grad_output, grad_h_n,
                                          grad_c_n, input, batch_sizes, h0, c0, w_ih, w_hh, w_hr,
                                          output, workspace);
  auto r = Backend::backward(steps, s, grad_output, grad_h_n, grad_c_n, input.contiguous(), h0,
                             c0, w_ih, w_hh, w_hr, output, workspace, reverse);
  return {r.grad_input, r.grad_h0, r.grad_c0, r.grad_w_ih, r.grad_w_hh, r.grad_bias,
          r.grad_w_hr};
}

// The internal op behind lstm_packed_layer_backward_data (lstm_ops.h): the
// data part of packed_layer_backward; grad_h and raw_h are empty without a
// projection.
template <class Backend>
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> packed_layer_backward_data(
    const OptTensor& grad_output, const OptTensor& grad_h_n, const OptTensor& grad_c_n,
    const Tensor& input, const Tensor& batch_sizes, const Tensor& h0, const Tensor& c0,
    const Tensor& w_ih, const Tensor& w_hh, const OptTensor& w_hr, const Tensor& output,
    const Tensor& workspace) {
  const OpGuard guard(input);
  const auto [steps, s] = packed_backward("lstm_packed_layer_backward_data", grad_output, grad_h_n,
                                          grad_c_n, input, batch_sizes, h0, c0, w_ih, w_hh, w_hr,
                                          output, workspace);
  LayerDataGrads d = Backend::backward_data(steps, s, grad_output, grad_h_n, grad_c_n,
                                            input.contiguous(), h0, c0, w_ih, w_hh, w_hr,
                                            workspace, /*reverse=*/false);
  const auto or_empty = [&](const Tensor& t) { return t.defined() ? t : at::empty({0}, input.options()); };
  return {d.grad_input, d.grad_h0, d.grad_c0, d.grad_gates, or_empty(d.grad_h), or_empty(d.raw_h)};
}

// Every layer op's kernel for `Backend` as the generic templates above; a
// backend that wraps some of them (the CPU's float32 compute for 16-bit
// dtypes) lists its own in a struct of the same members.
template <class Backend>
struct LayerOps {
  static constexpr auto cell_forward = &pipelstm::cell_forward<Backend>;
  static constexpr auto cell_backward = &pipelstm::cell_backward<Backend>;
  static constexpr auto layer_forward = &pipelstm::layer_forward<Backend>;
  static constexpr auto layer_backward = &pipelstm::layer_backward<Backend>;
  static constexpr auto layer_backward_data = &pipelstm::layer_backward_data<Backend>;
  static constexpr auto packed_layer_forward = &pipelstm::packed_layer_forward<Backend>;
  static constexpr auto packed_layer_backward = &pipelstm::packed_layer_backward<Backend>;
  static constexpr auto packed_layer_backward_data = &pipelstm::packed_layer_backward_data<Backend>;
  static constexpr auto zoneout_layer_forward = &pipelstm::zoneout_layer_forward<Backend>;
  static constexpr auto zoneout_layer_backward = &pipelstm::zoneout_layer_backward<Backend>;
};

// The one list of the layer ops a backend implements (their schemas are in
// registration.cpp), called by each backend's TORCH_LIBRARY_IMPL block for
// its own dispatch key with its `Ops` (LayerOps<ItsLayer> or its own).
template <class Ops>
void register_lstm_ops(torch::Library& m) {
  static_assert(std::is_same_v<std::remove_const_t<decltype(Ops::zoneout_layer_forward)>, ZoneoutForwardKernel> &&
                    std::is_same_v<std::remove_const_t<decltype(Ops::zoneout_layer_backward)>,
                                   ZoneoutBackwardKernel>,
                "a zoneout kernel's C++ signature differs from zoneout_layer_ops.h's");
  m.impl("lstm_cell_forward", Ops::cell_forward);
  m.impl("lstm_cell_backward", Ops::cell_backward);
  m.impl("lstm_layer_forward", Ops::layer_forward);
  m.impl("lstm_layer_backward", Ops::layer_backward);
  m.impl("lstm_layer_backward_data", Ops::layer_backward_data);
  m.impl("lstm_packed_layer_forward", Ops::packed_layer_forward);
  m.impl("lstm_packed_layer_backward", Ops::packed_layer_backward);
  m.impl("lstm_packed_layer_backward_data", Ops::packed_layer_backward_data);
  m.impl("lstm_zoneout_layer_forward", Ops::zoneout_layer_forward);
  m.impl("lstm_zoneout_layer_backward", Ops::zoneout_layer_backward);
}

}  // namespace pipelstm
