#include "lstm_ops.h"

#include "op_handle.h"

namespace pipelstm {

std::tuple<Tensor, Tensor, Tensor, Tensor> lstm_layer_forward(
    const Tensor& input, const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
    const Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh, const OptTensor& w_hr,
    bool reverse) {
  static const auto op = op_handle<std::tuple<Tensor, Tensor, Tensor, Tensor>(
      const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const OptTensor&,
      const OptTensor&, const OptTensor&, bool)>("pipelstm::lstm_layer_forward");
  const OpGuard guard(input);  // straight to the backend: no autograd, no autocast
  return op.call(input, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> lstm_packed_layer_forward(
    const Tensor& input, const Tensor& batch_sizes, const Tensor& h0, const Tensor& c0,
    const Tensor& w_ih, const Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh,
    const OptTensor& w_hr, bool reverse) {
  static const auto op = op_handle<std::tuple<Tensor, Tensor, Tensor, Tensor>(
      const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
      const OptTensor&, const OptTensor&, const OptTensor&, bool)>(
      "pipelstm::lstm_packed_layer_forward");
  const OpGuard guard(input);
  return op.call(input, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse);
}

LayerDataGrads lstm_layer_backward_data(const OptTensor& grad_output, const OptTensor& grad_h_n,
                                        const OptTensor& grad_c_n, const Tensor& input,
                                        const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
                                        const Tensor& w_hh, const OptTensor& w_hr,
                                        const Tensor& output, const Tensor& workspace) {
  static const auto op = op_handle<std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>(
      const OptTensor&, const OptTensor&, const OptTensor&, const Tensor&, const Tensor&,
      const Tensor&, const Tensor&, const Tensor&, const OptTensor&, const Tensor&,
      const Tensor&)>("pipelstm::lstm_layer_backward_data");
  const OpGuard guard(input);
  auto [grad_input, grad_h0, grad_c0, grad_gates, grad_h, raw_h] = op.call(
      grad_output, grad_h_n, grad_c_n, input, h0, c0, w_ih, w_hh, w_hr, output, workspace);
  LayerDataGrads d{grad_input, grad_h0, grad_c0, grad_gates, Tensor(), Tensor()};
  if (w_hr.has_value()) {  // else the op returns them empty
    d.grad_h = grad_h;
    d.raw_h = raw_h;
  }
  return d;
}

LayerDataGrads lstm_packed_layer_backward_data(
    const OptTensor& grad_output, const OptTensor& grad_h_n, const OptTensor& grad_c_n,
    const Tensor& input, const Tensor& batch_sizes, const Tensor& h0, const Tensor& c0,
    const Tensor& w_ih, const Tensor& w_hh, const OptTensor& w_hr, const Tensor& output,
    const Tensor& workspace) {
  static const auto op = op_handle<std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>(
      const OptTensor&, const OptTensor&, const OptTensor&, const Tensor&, const Tensor&,
      const Tensor&, const Tensor&, const Tensor&, const Tensor&, const OptTensor&, const Tensor&,
      const Tensor&)>("pipelstm::lstm_packed_layer_backward_data");
  const OpGuard guard(input);
  auto [grad_input, grad_h0, grad_c0, grad_gates, grad_h, raw_h] =
      op.call(grad_output, grad_h_n, grad_c_n, input, batch_sizes, h0, c0, w_ih, w_hh, w_hr,
              output, workspace);
  LayerDataGrads d{grad_input, grad_h0, grad_c0, grad_gates, Tensor(), Tensor()};
  if (w_hr.has_value()) {  // else the op returns them empty
    d.grad_h = grad_h;
    d.raw_h = raw_h;
  }
  return d;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> lstm_zoneout_layer_forward(
    const Tensor& input, const OptTensor& batch_sizes, const Tensor& h0, const Tensor& c0,
    const Tensor& w_ih, const Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh,
    const Tensor& keep_c, const Tensor& keep_h) {
  static const auto op = op_handle<std::tuple<Tensor, Tensor, Tensor, Tensor>(
      const Tensor&, const OptTensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
      const OptTensor&, const OptTensor&, const Tensor&, const Tensor&, bool)>(
      "pipelstm::lstm_zoneout_layer_forward");
  const OpGuard guard(input);
  return op.call(input, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, keep_c, keep_h, /*reverse=*/false);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> lstm_zoneout_layer_backward(
    const OptTensor& grad_output, const OptTensor& grad_h_n, const OptTensor& grad_c_n,
    const Tensor& input, const OptTensor& batch_sizes, const Tensor& h0, const Tensor& c0,
    const Tensor& w_ih, const Tensor& w_hh, const Tensor& keep_c, const Tensor& keep_h,
    const Tensor& output, const Tensor& workspace) {
  static const auto op = op_handle<std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>(
      const OptTensor&, const OptTensor&, const OptTensor&, const Tensor&, const OptTensor&,
      const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
      const Tensor&, const Tensor&, bool)>("pipelstm::lstm_zoneout_layer_backward");
  const OpGuard guard(input);
  return op.call(grad_output, grad_h_n, grad_c_n, input, batch_sizes, h0, c0, w_ih, w_hh, keep_c,
                 keep_h, output, workspace, /*reverse=*/false);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> lstm_layernorm_layer_forward(
    const Tensor& input, const OptTensor& batch_sizes, const Tensor& h0, const Tensor& c0,
    const LayerNormWeights& w, double eps, const OptTensor& keep_c, const OptTensor& keep_h) {
  static const auto op = op_handle<std::tuple<Tensor, Tensor, Tensor, Tensor>(
      const Tensor&, const OptTensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
      const OptTensor&, const Tensor&, const Tensor&, const Tensor&, const OptTensor&,
      const OptTensor&, const OptTensor&, bool, double)>("pipelstm::lstm_layernorm_layer_forward");
  const OpGuard guard(input);
  return op.call(input, batch_sizes, h0, c0, w.w_ih, w.w_hh, w.bias, w.gamma_ih, w.gamma_hh,
                 w.gamma_c, w.beta_c, keep_c, keep_h, /*reverse=*/false, eps);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>
lstm_layernorm_layer_backward(const OptTensor& grad_output, const OptTensor& grad_h_n,
                              const OptTensor& grad_c_n, const Tensor& input,
                              const OptTensor& batch_sizes, const Tensor& h0, const Tensor& c0,
                              const LayerNormWeights& w, const Tensor& output, const Tensor& workspace,
                              const OptTensor& keep_c, const OptTensor& keep_h) {
  static const auto op = op_handle<
      std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>(
          const OptTensor&, const OptTensor&, const OptTensor&, const Tensor&, const OptTensor&,
          const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
          const Tensor&, const OptTensor&, const OptTensor&, const Tensor&, const Tensor&, bool)>(
      "pipelstm::lstm_layernorm_layer_backward");
  const OpGuard guard(input);
  return op.call(grad_output, grad_h_n, grad_c_n, input, batch_sizes, h0, c0, w.w_ih, w.w_hh,
                 w.gamma_ih, w.gamma_hh, w.gamma_c, keep_c, keep_h, output, workspace,
                 /*reverse=*/false);
}

}  // namespace pipelstm
