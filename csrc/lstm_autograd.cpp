// The autograd formulas of the fused ops whose ATen composition is C++
// (lstm_composite.cpp): the cell, the layer (dense and packed) and the zoneout
// layer, registered under the Autograd key. A forward runs the op below
// autograd and saves what its backward op reads; the backward runs that op,
// or, where the gradient is itself differentiated (create_graph=True),
// differentiates the composition instead. In C++ so that a call costs around
// its kernels what torch's own ops do: a formula registered from Python costs
// tens of microseconds a call, more than a small layer's arithmetic. The
// LayerNorm layer's formula: layernorm_autograd.cpp.
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "op_autograd.h"

namespace pipelstm {
namespace {

using namespace op_autograd;  // NOLINT: the helpers every formula here uses
using LayerGrads = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

// --- the cell ---------------------------------------------------------------

const auto& cell_forward_op() {
  static const auto op = op_handle<Outputs3(const Tensor&, const Tensor&, const Tensor&,
                                            const OptTensor&, const OptTensor&)>(
      "pipelstm::lstm_cell_forward");
  return op;
}

struct CellFunction : public torch::autograd::Function<CellFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& input_gates,
                               const Tensor& hidden_gates, const Tensor& cx, const OptTensor& b_ih,
                               const OptTensor& b_hh, Tensor* workspace) {
    auto [hy, cy, ws] = below_autograd(cell_forward_op(), input_gates, hidden_gates, cx, b_ih, b_hh);
    *workspace = ws;
    no_zero_gradients(ctx);
    ctx->save_for_backward(
        {cx, cy, ws, input_gates, hidden_gates, or_undefined(b_ih), or_undefined(b_hh)});
    return {hy, cy};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const Tensor &cx = s[0], &cy = s[1], &workspace = s[2], &b_ih = s[5], &b_hh = s[6];
    if (at::GradMode::is_enabled()) {
      static const auto composite = op_handle<std::tuple<Tensor, Tensor>(
          const Tensor&, const Tensor&, const Tensor&, const OptTensor&, const OptTensor&)>(
          "pipelstm::lstm_cell_composite");
      const variable_list inputs{s[3], s[4], cx, b_ih, b_hh};
      variable_list g = composed_grads(inputs, [&] {
        auto [hy, c] = composite.call(s[3], s[4], cx, given(b_ih), given(b_hh));
        return variable_list{hy, c};
      }, {grads[0], grads[1]});
      g.emplace_back();  // the workspace's slot
      return g;
    }
    static const auto op = op_handle<std::tuple<Tensor, Tensor>(
        const OptTensor&, const OptTensor&, const Tensor&, const Tensor&, const Tensor&)>(
        "pipelstm::lstm_cell_backward");
    // A bfloat16/float16 call on the CPU gets float32 gradients: the bias
    // gradient is summed from them, then each is rounded to cx's dtype once.
    auto [grad_gates, grad_cx] =
        below_autograd(op, given(grads[0]), given(grads[1]), cx, cy, workspace);
    const Tensor grad_bias =
        b_ih.defined() || b_hh.defined() ? grad_gates.sum(0).to(cx.scalar_type()) : Tensor();
    grad_gates = grad_gates.to(cx.scalar_type());
    return {grad_gates, grad_gates, grad_cx.to(cx.scalar_type()),
            b_ih.defined() ? grad_bias : Tensor(), b_hh.defined() ? grad_bias : Tensor(), Tensor()};
  }
};

Outputs3 cell_forward_autograd(const Tensor& input_gates, const Tensor& hidden_gates, const Tensor& cx,
                      const OptTensor& b_ih, const OptTensor& b_hh) {
  if (!needs_graph({&input_gates, &hidden_gates, &cx, &or_undefined(b_ih), &or_undefined(b_hh)})) {
    return below_autograd(cell_forward_op(), input_gates, hidden_gates, cx, b_ih, b_hh);
  }
  Tensor workspace;
  const variable_list out = CellFunction::apply(input_gates, hidden_gates, cx, b_ih, b_hh, &workspace);
  return {out[0], out[1], workspace};
}

// --- the layer, dense or packed (batch_sizes given) -------------------------

const auto& layer_forward_op() {
  static const auto op = op_handle<Outputs4(const Tensor&, const Tensor&, const Tensor&,
                                            const Tensor&, const Tensor&, const OptTensor&,
                                            const OptTensor&, const OptTensor&, bool)>(
      "pipelstm::lstm_layer_forward");
  return op;
}

const auto& packed_layer_forward_op() {
  static const auto op = op_handle<Outputs4(
      const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
      const OptTensor&, const OptTensor&, const OptTensor&, bool)>(
      "pipelstm::lstm_packed_layer_forward");
  return op;
}

Outputs4 run_layer(const Tensor& input, const OptTensor& batch_sizes, const Tensor& h0,
                   const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh, const OptTensor& b_ih,
                   const OptTensor& b_hh, const OptTensor& w_hr, bool reverse) {
  if (batch_sizes.has_value()) {
    return below_autograd(packed_layer_forward_op(), input, *batch_sizes, h0, c0, w_ih, w_hh, b_ih,
                          b_hh, w_hr, reverse);
  }
  return below_autograd(layer_forward_op(), input, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse);
}

variable_list composed_layer_grads(const variable_list& s, const Tensor& batch_sizes, bool reverse,
                                   const variable_list& grads) {
  // (input, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr) as the composition takes them
  const variable_list inputs{s[0], s[1], s[2], s[3], s[4], s[8], s[9], s[5]};
  const auto composite = [&] {
    Outputs3 out;
    if (batch_sizes.defined()) {
      static const auto op = op_handle<Outputs3(
          const Tensor&, at::IntArrayRef, const Tensor&, const Tensor&, const Tensor&,
          const Tensor&, const OptTensor&, const OptTensor&, const OptTensor&, bool)>(
          "pipelstm::lstm_packed_layer_composite");
      out = op.call(s[0], sizes_of(batch_sizes), s[1], s[2], s[3], s[4], given(s[8]), given(s[9]),
                    given(s[5]), reverse);
    } else {
      static const auto op = op_handle<Outputs3(
          const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
          const OptTensor&, const OptTensor&, const OptTensor&, bool)>(
          "pipelstm::lstm_layer_composite");
      out = op.call(s[0], s[1], s[2], s[3], s[4], given(s[8]), given(s[9]), given(s[5]), reverse);
    }
    return variable_list{std::get<0>(out), std::get<1>(out), std::get<2>(out)};
  };
  const variable_list g = composed_grads(inputs, composite, {grads[0], grads[1], grads[2]});
  // -> (input, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse, workspace)
  return {g[0], Tensor(), g[1], g[2], g[3], g[4], g[5], g[6], g[7], Tensor(), Tensor()};
}

struct LayerFunction : public torch::autograd::Function<LayerFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& input,
                               const OptTensor& batch_sizes, const Tensor& h0, const Tensor& c0,
                               const Tensor& w_ih, const Tensor& w_hh, const OptTensor& b_ih,
                               const OptTensor& b_hh, const OptTensor& w_hr, bool reverse,
                               Tensor* workspace) {
    auto [output, h_n, c_n, ws] =
        run_layer(input, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse);
    *workspace = ws;
    no_zero_gradients(ctx);
    ctx->save_for_backward({input, h0, c0, w_ih, w_hh, or_undefined(w_hr), output, ws,
                            or_undefined(b_ih), or_undefined(b_hh), or_undefined(batch_sizes)});
    ctx->saved_data["reverse"] = reverse;
    return {output, h_n, c_n};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const Tensor &input = s[0], &h0 = s[1], &c0 = s[2], &w_ih = s[3], &w_hh = s[4], &w_hr = s[5];
    const Tensor &output = s[6], &workspace = s[7], &b_ih = s[8], &b_hh = s[9], &batch_sizes = s[10];
    const bool reverse = ctx->saved_data["reverse"].toBool();
    if (at::GradMode::is_enabled()) return composed_layer_grads(s, batch_sizes, reverse, grads);

    const OptTensor g_out = given(grads[0]), g_h = given(grads[1]), g_c = given(grads[2]);
    LayerGrads g;
    if (batch_sizes.defined()) {
      static const auto op = op_handle<LayerGrads(
          const OptTensor&, const OptTensor&, const OptTensor&, const Tensor&, const Tensor&,
          const Tensor&, const Tensor&, const Tensor&, const Tensor&, const OptTensor&,
          const Tensor&, const Tensor&, bool)>("pipelstm::lstm_packed_layer_backward");
      g = below_autograd(op, g_out, g_h, g_c, input, batch_sizes, h0, c0, w_ih, w_hh, given(w_hr),
                         output, workspace, reverse);
    } else {
      static const auto op = op_handle<LayerGrads(
          const OptTensor&, const OptTensor&, const OptTensor&, const Tensor&, const Tensor&,
          const Tensor&, const Tensor&, const Tensor&, const OptTensor&, const Tensor&,
          const Tensor&, bool)>("pipelstm::lstm_layer_backward");
      g = below_autograd(op, g_out, g_h, g_c, input, h0, c0, w_ih, w_hh, given(w_hr), output,
                         workspace, reverse);
    }
    auto& [grad_input, grad_h0, grad_c0, grad_w_ih, grad_w_hh, grad_bias, grad_w_hr] = g;
    return {grad_input, Tensor(), grad_h0, grad_c0, grad_w_ih, grad_w_hh,
            b_ih.defined() ? grad_bias : Tensor(), b_hh.defined() ? grad_bias : Tensor(),
            w_hr.defined() ? grad_w_hr : Tensor(), Tensor(), Tensor()};
  }
};

Outputs4 layer_autograd(const Tensor& input, const OptTensor& batch_sizes, const Tensor& h0,
               const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh, const OptTensor& b_ih,
               const OptTensor& b_hh, const OptTensor& w_hr, bool reverse) {
  if (!needs_graph({&input, &h0, &c0, &w_ih, &w_hh, &or_undefined(b_ih), &or_undefined(b_hh),
                    &or_undefined(w_hr)})) {
    return run_layer(input, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse);
  }
  Tensor workspace;
  const variable_list out = LayerFunction::apply(input, batch_sizes, h0, c0, w_ih, w_hh, b_ih,
                                                 b_hh, w_hr, reverse, &workspace);
  return {out[0], out[1], out[2], workspace};
}

Outputs4 layer_forward_autograd(const Tensor& input, const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
                       const Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh,
                       const OptTensor& w_hr, bool reverse) {
  return layer_autograd(input, std::nullopt, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse);
}

Outputs4 packed_layer_forward_autograd(const Tensor& input, const Tensor& batch_sizes, const Tensor& h0,
                              const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
                              const OptTensor& b_ih, const OptTensor& b_hh, const OptTensor& w_hr,
                              bool reverse) {
  return layer_autograd(input, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse);
}

// --- the zoneout layer --------------------------------------------------------

const auto& zoneout_forward_op() {
  static const auto op = op_handle<Outputs4(
      const Tensor&, const OptTensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
      const OptTensor&, const OptTensor&, const Tensor&, const Tensor&, bool)>(
      "pipelstm::lstm_zoneout_layer_forward");
  return op;
}

// Saved: (input, h0, c0, w_ih, w_hh, keep_c, keep_h, output, workspace,
// batch_sizes, b_ih, b_hh).
variable_list composed_zoneout_grads(const variable_list& s, bool reverse,
                                     const variable_list& grads) {
  static const auto op = op_handle<Outputs3(
      const Tensor&, at::OptionalIntArrayRef, const Tensor&, const Tensor&, const Tensor&,
      const Tensor&, const OptTensor&, const OptTensor&, const Tensor&, const Tensor&, bool)>(
      "pipelstm::lstm_zoneout_layer_composite");
  const std::optional<std::vector<int64_t>> sizes =
      s[9].defined() ? std::optional(sizes_of(s[9])) : std::nullopt;
  const at::OptionalIntArrayRef rows = sizes ? at::OptionalIntArrayRef(*sizes) : at::OptionalIntArrayRef();
  // (input, h0, c0, w_ih, w_hh, b_ih, b_hh) as the composition takes them
  const variable_list inputs{s[0], s[1], s[2], s[3], s[4], s[10], s[11]};
  const variable_list g = composed_grads(inputs, [&] {
    auto [output, h_n, c_n] = op.call(s[0], rows, s[1], s[2], s[3], s[4], given(s[10]),
                                      given(s[11]), s[5], s[6], reverse);
    return variable_list{output, h_n, c_n};
  }, {grads[0], grads[1], grads[2]});
  // -> (input, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, keep_c, keep_h, reverse, workspace)
  return {g[0], Tensor(), g[1], g[2], g[3], g[4], g[5], g[6], Tensor(), Tensor(), Tensor(), Tensor()};
}

struct ZoneoutFunction : public torch::autograd::Function<ZoneoutFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& input,
                               const OptTensor& batch_sizes, const Tensor& h0, const Tensor& c0,
                               const Tensor& w_ih, const Tensor& w_hh, const OptTensor& b_ih,
                               const OptTensor& b_hh, const Tensor& keep_c, const Tensor& keep_h,
                               bool reverse, Tensor* workspace) {
    auto [output, h_n, c_n, ws] = below_autograd(
        zoneout_forward_op(), input, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, keep_c, keep_h, reverse);
    *workspace = ws;
    no_zero_gradients(ctx);
    ctx->save_for_backward({input, h0, c0, w_ih, w_hh, keep_c, keep_h, output, ws,
                            or_undefined(batch_sizes), or_undefined(b_ih), or_undefined(b_hh)});
    ctx->saved_data["reverse"] = reverse;
    return {output, h_n, c_n};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const bool reverse = ctx->saved_data["reverse"].toBool();
    if (at::GradMode::is_enabled()) return composed_zoneout_grads(s, reverse, grads);
    static const auto op = op_handle<std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>(
        const OptTensor&, const OptTensor&, const OptTensor&, const Tensor&, const OptTensor&,
        const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
        const Tensor&, const Tensor&, bool)>("pipelstm::lstm_zoneout_layer_backward");
    auto [grad_input, grad_h0, grad_c0, grad_w_ih, grad_w_hh, grad_bias] = below_autograd(
        op, given(grads[0]), given(grads[1]), given(grads[2]), s[0], given(s[9]), s[1], s[2], s[3],
        s[4], s[5], s[6], s[7], s[8], reverse);
    return {grad_input, Tensor(), grad_h0, grad_c0, grad_w_ih, grad_w_hh,
            s[10].defined() ? grad_bias : Tensor(), s[11].defined() ? grad_bias : Tensor(), Tensor(),
            Tensor(), Tensor(), Tensor()};
  }
};

Outputs4 zoneout_layer_forward_autograd(const Tensor& input, const OptTensor& batch_sizes, const Tensor& h0,
                               const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
                               const OptTensor& b_ih, const OptTensor& b_hh, const Tensor& keep_c,
                               const Tensor& keep_h, bool reverse) {
  if (!needs_graph({&input, &h0, &c0, &w_ih, &w_hh, &or_undefined(b_ih), &or_undefined(b_hh)})) {
    return below_autograd(zoneout_forward_op(), input, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh,
                          keep_c, keep_h, reverse);
  }
  Tensor workspace;
  const variable_list out = ZoneoutFunction::apply(input, batch_sizes, h0, c0, w_ih, w_hh, b_ih,
                                                   b_hh, keep_c, keep_h, reverse, &workspace);
  return {out[0], out[1], out[2], workspace};
}

}  // namespace
}  // namespace pipelstm

TORCH_LIBRARY_IMPL(pipelstm, Autograd, m) {
  m.impl("lstm_cell_forward", &pipelstm::cell_forward_autograd);
  m.impl("lstm_layer_forward", &pipelstm::layer_forward_autograd);
  m.impl("lstm_packed_layer_forward", &pipelstm::packed_layer_forward_autograd);
  m.impl("lstm_zoneout_layer_forward", &pipelstm::zoneout_layer_forward_autograd);
  // The backward ops have no derivative (a create_graph=True backward
  // differentiates the composition instead): differentiating one called
  // directly is an error, never a silent zero.
  for (const char* name : {"lstm_cell_backward", "lstm_layer_backward", "lstm_packed_layer_backward",
                           "lstm_zoneout_layer_backward"}) {
    m.impl(name, torch::autograd::autogradNotImplementedFallback());
  }
}
