#include "layer_checks.h"

#include <utility>

#include "checks.h"

namespace pipelstm {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

LayerGeometry check_weights(const char* op, const Tensor& input, int64_t rows, int64_t batch,
                            const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
                            const Tensor& w_hh, const OptTensor& w_hr) {
  check_dim(op, "w_ih", w_ih, 2, "[4H, I]");
  check_supported_dtype(op, "input", input);
  LayerGeometry s{};
  s.input = input.size(-1);
  TORCH_CHECK(w_ih.size(0) % 4 == 0 && w_ih.size(0) > 0, "pipelstm::", op,
              ": expected `w_ih` of shape [4H, I] with H > 0, got ", w_ih.sizes());
  s.hidden = w_ih.size(0) / 4;
  s.projected = w_hr.has_value();
  if (s.projected) {
    check_dim(op, "w_hr", *w_hr, 2, "[P, H]");
    s.out = w_hr->size(0);
    check_shape(op, "w_hr", *w_hr, {s.out, s.hidden});
    check_same_kind(op, "w_hr", *w_hr, "input", input);
  } else {
    s.out = s.hidden;
  }
  check_shape(op, "w_ih", w_ih, {4 * s.hidden, s.input});
  check_shape(op, "w_hh", w_hh, {4 * s.hidden, s.out});
  check_shape(op, "h0", h0, {batch, s.out});
  check_shape(op, "c0", c0, {batch, s.hidden});
  check_same_kind(op, "w_ih", w_ih, "input", input);
  check_same_kind(op, "w_hh", w_hh, "input", input);
  check_same_kind(op, "h0", h0, "input", input);
  check_same_kind(op, "c0", c0, "input", input);
  checked_product(op, "the workspace, rows x H x 6,", {rows, s.hidden, 6});
  return s;
}

void check_biases(const char* op, const Tensor& input, const LayerGeometry& s,
                  const OptTensor& b_ih, const OptTensor& b_hh) {
  for (const auto& [name, bias] : {std::pair{"b_ih", &b_ih}, std::pair{"b_hh", &b_hh}}) {
    if (bias->has_value()) {
      check_shape(op, name, **bias, {4 * s.hidden});
      check_same_kind(op, name, **bias, "input", input);
    }
  }
}

void check_grads(const char* op, const Tensor& input, const LayerGeometry& s, int64_t rows,
                 int64_t batch, const Tensor& output, const OptTensor& grad_output,
                 const OptTensor& grad_h_n, const OptTensor& grad_c_n, const Tensor& workspace) {
  const auto& out_sizes = output.sizes();
  check_same_kind(op, "output", output, "input", input);
  check_shape(op, "workspace", workspace, {s.workspace_numel(rows)});
  check_same_kind(op, "workspace", workspace, "input", input);
  if (grad_output.has_value()) {
    TORCH_CHECK(grad_output->sizes() == out_sizes, "pipelstm::", op,
                ": expected `grad_output` of shape ", out_sizes, ", got ", grad_output->sizes());
    check_same_kind(op, "grad_output", *grad_output, "input", input);
  }
  if (grad_h_n.has_value()) {
    check_shape(op, "grad_h_n", *grad_h_n, {batch, s.out});
    check_same_kind(op, "grad_h_n", *grad_h_n, "input", input);
  }
  if (grad_c_n.has_value()) {
    check_shape(op, "grad_c_n", *grad_c_n, {batch, s.hidden});
    check_same_kind(op, "grad_c_n", *grad_c_n, "input", input);
  }
}

LayerSteps packed_input_steps(const char* op, const Tensor& input, const Tensor& batch_sizes) {
  check_dim(op, "input", input, 2, "[rows, I] (PackedSequence.data)");
  LayerSteps steps = packed_steps(op, batch_sizes);
  TORCH_CHECK(input.size(0) == steps.rows, "pipelstm::", op, ": expected `input` with ",
              steps.rows, " rows (the sum of `batch_sizes`), got ", input.size(0));
  return steps;
}

DenseBackward dense_backward(const char* op, const OptTensor& grad_output,
                             const OptTensor& grad_h_n, const OptTensor& grad_c_n,
                             const Tensor& input, const Tensor& h0, const Tensor& c0,
                             const Tensor& w_ih, const Tensor& w_hh, const OptTensor& w_hr,
                             const Tensor& output, const Tensor& workspace) {
  check_dim(op, "input", input, 3, "[T, B, I]");
  const int64_t T = input.size(0), B = input.size(1);
  const int64_t rows = checked_product(op, "T x B", {T, B});
  const LayerGeometry s = check_weights(op, input, rows, B, h0, c0, w_ih, w_hh, w_hr);
  check_shape(op, "output", output, {T, B, s.out});
  check_grads(op, input, s, T * B, B, output, grad_output, grad_h_n, grad_c_n, workspace);
  return {T, B, s,
          grad_output.has_value() ? OptTensor(grad_output->reshape({T * B, s.out})) : std::nullopt,
          input.contiguous().view({T * B, s.input}), output.reshape({T * B, s.out})};
}

PackedBackward packed_backward(const char* op, const OptTensor& grad_output,
                               const OptTensor& grad_h_n, const OptTensor& grad_c_n,
                               const Tensor& input, const Tensor& batch_sizes, const Tensor& h0,
                               const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
                               const OptTensor& w_hr, const Tensor& output,
                               const Tensor& workspace) {
  LayerSteps steps = packed_input_steps(op, input, batch_sizes);
  const LayerGeometry s =
      check_weights(op, input, steps.rows, steps.max_batch, h0, c0, w_ih, w_hh, w_hr);
  check_shape(op, "output", output, {steps.rows, s.out});
  check_grads(op, input, s, steps.rows, steps.max_batch, output, grad_output, grad_h_n, grad_c_n,
              workspace);
  return {std::move(steps), s};
}

}  // namespace pipelstm
