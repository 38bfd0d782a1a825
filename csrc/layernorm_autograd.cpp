// The LayerNorm LSTM layer op's autograd formula, registered under the
// Autograd key as the other fused ops' are (lstm_autograd.cpp): the forward
// runs the op below autograd and saves what its backward op reads; a
// create_graph=True backward differentiates the layer's composition
// (pipelstm::lstm_layernorm_layer_composite, whose kernel is Python:
// python/pipelstm/layernorm_ops.py).
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "op_autograd.h"

namespace pipelstm {
namespace {

using namespace op_autograd;  // NOLINT: the helpers every formula here uses
using LayerNormGrads = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                  Tensor, Tensor>;

const auto& forward_op() {
  static const auto op = op_handle<Outputs4(
      const Tensor&, const OptTensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
      const OptTensor&, const Tensor&, const Tensor&, const Tensor&, const OptTensor&,
      const OptTensor&, const OptTensor&, bool, double)>("pipelstm::lstm_layernorm_layer_forward");
  return op;
}

// Saved: (input, h0, c0, w_ih, w_hh, bias, gamma_ih, gamma_hh, gamma_c, beta_c,
// keep_c, keep_h, output, workspace, batch_sizes).
variable_list composed_layernorm_grads(const variable_list& s, bool reverse, double eps,
                                       const variable_list& grads) {
  static const auto op = op_handle<Outputs3(
      const Tensor&, const OptTensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
      const OptTensor&, const Tensor&, const Tensor&, const Tensor&, const OptTensor&,
      const OptTensor&, const OptTensor&, bool, double)>("pipelstm::lstm_layernorm_layer_composite");
  // (input, h0, c0, w_ih, w_hh, bias, gamma_ih, gamma_hh, gamma_c, beta_c)
  const variable_list inputs(s.begin(), s.begin() + 10);
  const variable_list g = composed_grads(inputs, [&] {
    auto [output, h_n, c_n] = op.call(s[0], given(s[14]), s[1], s[2], s[3], s[4], given(s[5]), s[6],
                                      s[7], s[8], given(s[9]), given(s[10]), given(s[11]), reverse, eps);
    return variable_list{output, h_n, c_n};
  }, {grads[0], grads[1], grads[2]});
  // -> (input, batch_sizes, h0, c0, w_ih, w_hh, bias, gamma_ih, gamma_hh,
  //     gamma_c, beta_c, keep_c, keep_h, reverse, eps, workspace)
  return {g[0], Tensor(), g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9],
          Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
}

struct LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& input,
                               const OptTensor& batch_sizes, const Tensor& h0, const Tensor& c0,
                               const Tensor& w_ih, const Tensor& w_hh, const OptTensor& bias,
                               const Tensor& gamma_ih, const Tensor& gamma_hh,
                               const Tensor& gamma_c, const OptTensor& beta_c,
                               const OptTensor& keep_c, const OptTensor& keep_h, bool reverse,
                               double eps, Tensor* workspace) {
    auto [output, h_n, c_n, ws] =
        below_autograd(forward_op(), input, batch_sizes, h0, c0, w_ih, w_hh, bias, gamma_ih,
                       gamma_hh, gamma_c, beta_c, keep_c, keep_h, reverse, eps);
    *workspace = ws;
    no_zero_gradients(ctx);
    ctx->save_for_backward({input, h0, c0, w_ih, w_hh, or_undefined(bias), gamma_ih, gamma_hh,
                            gamma_c, or_undefined(beta_c), or_undefined(keep_c),
                            or_undefined(keep_h), output, ws, or_undefined(batch_sizes)});
    ctx->saved_data["reverse"] = reverse;
    ctx->saved_data["eps"] = eps;
    return {output, h_n, c_n};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const bool reverse = ctx->saved_data["reverse"].toBool();
    if (at::GradMode::is_enabled()) {
      return composed_layernorm_grads(s, reverse, ctx->saved_data["eps"].toDouble(), grads);
    }
    static const auto op = op_handle<LayerNormGrads(
        const OptTensor&, const OptTensor&, const OptTensor&, const Tensor&, const OptTensor&,
        const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
        const Tensor&, const OptTensor&, const OptTensor&, const Tensor&, const Tensor&, bool)>(
        "pipelstm::lstm_layernorm_layer_backward");
    auto [grad_input, grad_h0, grad_c0, grad_w_ih, grad_w_hh, grad_bias, grad_gamma_ih,
          grad_gamma_hh, grad_gamma_c, grad_beta_c] =
        below_autograd(op, given(grads[0]), given(grads[1]), given(grads[2]), s[0], given(s[14]),
                       s[1], s[2], s[3], s[4], s[6], s[7], s[8], given(s[10]), given(s[11]), s[12],
                       s[13], reverse);
    return {grad_input, Tensor(), grad_h0, grad_c0, grad_w_ih, grad_w_hh,
            s[5].defined() ? grad_bias : Tensor(), grad_gamma_ih, grad_gamma_hh, grad_gamma_c,
            s[9].defined() ? grad_beta_c : Tensor(), Tensor(), Tensor(), Tensor(), Tensor(),
            Tensor()};
  }
};

Outputs4 layernorm_layer_forward_autograd(const Tensor& input, const OptTensor& batch_sizes,
                                          const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
                                          const Tensor& w_hh, const OptTensor& bias,
                                          const Tensor& gamma_ih, const Tensor& gamma_hh,
                                          const Tensor& gamma_c, const OptTensor& beta_c,
                                          const OptTensor& keep_c, const OptTensor& keep_h,
                                          bool reverse, double eps) {
  if (!needs_graph({&input, &h0, &c0, &w_ih, &w_hh, &or_undefined(bias), &gamma_ih, &gamma_hh,
                    &gamma_c, &or_undefined(beta_c)})) {
    return below_autograd(forward_op(), input, batch_sizes, h0, c0, w_ih, w_hh, bias, gamma_ih,
                          gamma_hh, gamma_c, beta_c, keep_c, keep_h, reverse, eps);
  }
  Tensor workspace;
  const variable_list out =
      LayerNormFunction::apply(input, batch_sizes, h0, c0, w_ih, w_hh, bias, gamma_ih, gamma_hh,
                               gamma_c, beta_c, keep_c, keep_h, reverse, eps, &workspace);
  return {out[0], out[1], out[2], workspace};
}

}  // namespace
}  // namespace pipelstm

TORCH_LIBRARY_IMPL(pipelstm, Autograd, m) {
  m.impl("lstm_layernorm_layer_forward", &pipelstm::layernorm_layer_forward_autograd);
  // No derivative of the backward op: see lstm_autograd.cpp.
  m.impl("lstm_layernorm_layer_backward", torch::autograd::autogradNotImplementedFallback());
}
