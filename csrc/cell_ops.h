// The single-step ops' kernels, once for every backend: thin checks around
// one call of the backend's pointwise step (`Backend` as in
// layer_step_loop.h), registered by each backend under its dispatch key.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

#include "checks.h"
#include "layer_workspace.h"
#include "lstm_ops.h"
#include "pipelstm/kernels/lstm_pointwise.h"

namespace pipelstm {

template <class Backend>
std::tuple<Tensor, Tensor, Tensor> cell_forward(const Tensor& input_gates,
                                                const Tensor& hidden_gates, const Tensor& cx,
                                                const OptTensor& b_ih, const OptTensor& b_hh) {
  constexpr const char* op = "lstm_cell_forward";
  const OpGuard guard(cx);
  check_dim(op, "input_gates", input_gates, 2, "[B, 4H]");
  check_dim(op, "cx", cx, 2, "[B, H]");
  const int64_t B = cx.size(0), H = cx.size(1);
  checked_product(op, "the gates, B x 4 x H,", {B, 4, H});
  check_shape(op, "input_gates", input_gates, {B, 4 * H});
  check_shape(op, "hidden_gates", hidden_gates, {B, 4 * H});
  check_supported_dtype(op, "cx", cx);
  check_same_kind(op, "input_gates", input_gates, "cx", cx);
  check_same_kind(op, "hidden_gates", hidden_gates, "cx", cx);
  for (const auto& [name, bias] : {std::pair{"b_ih", &b_ih}, std::pair{"b_hh", &b_hh}}) {
    if (bias->has_value()) {
      check_shape(op, name, **bias, {4 * H});
      check_same_kind(op, name, **bias, "cx", cx);
    }
  }

  const Tensor gi = input_gates.contiguous(), gh = hidden_gates.contiguous();
  const Tensor c_prev = cx.contiguous();
  const Tensor bi = b_ih.has_value() ? b_ih->contiguous() : Tensor();
  const Tensor bh = b_hh.has_value() ? b_hh->contiguous() : Tensor();
  Tensor hy = at::empty({B, H}, cx.options());
  Tensor cy = at::empty({B, H}, cx.options());
  Tensor workspace = at::empty({B, 4 * H}, cx.options());
  if (B > 0 && H > 0) {
    Backend::dispatch_types(cx.scalar_type(), [&](auto zero) {
      using scalar_t = decltype(zero);
      kernels::PointwiseForwardArgs<scalar_t> a;
      a.gates = gi.const_data_ptr<scalar_t>();
      a.hidden_gates = gh.const_data_ptr<scalar_t>();
      a.c_prev = c_prev.const_data_ptr<scalar_t>();
      a.act_gates = workspace.mutable_data_ptr<scalar_t>();
      a.c = cy.mutable_data_ptr<scalar_t>();
      a.h = hy.mutable_data_ptr<scalar_t>();
      a.bias_ih = data_or_null<scalar_t>(bi);
      a.bias_hh = data_or_null<scalar_t>(bh);
      a.batch = B;
      a.hidden = H;
      Backend::step_forward(a);
    });
  }
  return {hy, cy, workspace};
}

template <class Backend>
std::tuple<Tensor, Tensor> cell_backward(const OptTensor& grad_hy, const OptTensor& grad_cy,
                                         const Tensor& cx, const Tensor& cy,
                                         const Tensor& workspace) {
  constexpr const char* op = "lstm_cell_backward";
  const OpGuard guard(cx);
  check_dim(op, "cx", cx, 2, "[B, H]");
  const int64_t B = cx.size(0), H = cx.size(1);
  checked_product(op, "the gates, B x 4 x H,", {B, 4, H});
  check_supported_dtype(op, "cx", cx);
  check_shape(op, "cy", cy, {B, H});
  check_shape(op, "workspace", workspace, {B, 4 * H});
  check_same_kind(op, "cy", cy, "cx", cx);
  check_same_kind(op, "workspace", workspace, "cx", cx);
  for (const auto& [name, grad] : {std::pair{"grad_hy", &grad_hy}, std::pair{"grad_cy", &grad_cy}}) {
    if (grad->has_value()) {
      check_shape(op, name, **grad, {B, H});
      check_same_kind(op, name, **grad, "cx", cx);
    }
  }

  const Tensor gh = grad_hy.has_value() ? grad_hy->contiguous() : Tensor();
  const Tensor gc = grad_cy.has_value() ? grad_cy->contiguous() : Tensor();
  const Tensor c_prev = cx.contiguous(), c = cy.contiguous(), act = workspace.contiguous();
  Tensor grad_gates = at::empty({B, 4 * H}, cx.options());
  Tensor grad_cx = at::empty({B, H}, cx.options());
  if (B > 0 && H > 0) {
    Backend::dispatch_types(cx.scalar_type(), [&](auto zero) {
      using scalar_t = decltype(zero);
      kernels::PointwiseBackwardArgs<scalar_t> a;
      a.grad_h = data_or_null<scalar_t>(gh);
      a.grad_c = data_or_null<scalar_t>(gc);
      a.act_gates = act.const_data_ptr<scalar_t>();
      a.c_prev = c_prev.const_data_ptr<scalar_t>();
      a.c = c.const_data_ptr<scalar_t>();
      a.grad_gates = grad_gates.mutable_data_ptr<scalar_t>();
      a.grad_c_prev = grad_cx.mutable_data_ptr<scalar_t>();
      a.batch = B;
      a.hidden = H;
      Backend::step_backward(a);
    });
  }
  return {grad_gates, grad_cx};
}

}  // namespace pipelstm
