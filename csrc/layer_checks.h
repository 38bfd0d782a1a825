// The argument checks of the layer ops, shared by every backend: each
// raises before any work, naming the op, the argument and what was expected
// (python/pipelstm/fake_kernels.py makes the same checks for tracing).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "layer_geometry.h"
#include "layer_steps.h"

namespace pipelstm {

// Checks the weights and states against `input` ([rows, I] or [T, B, I];
// `batch` sequences, `rows` steps of all sequences together) and returns
// the sizes; the workspace's size (the largest the op computes) fits int64.
LayerGeometry check_weights(const char* op, const at::Tensor& input, int64_t rows, int64_t batch,
                            const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& w_ih,
                            const at::Tensor& w_hh, const std::optional<at::Tensor>& w_hr);

// The optional biases are [4H] of the input's dtype and device.
void check_biases(const char* op, const at::Tensor& input, const LayerGeometry& s,
                  const std::optional<at::Tensor>& b_ih, const std::optional<at::Tensor>& b_hh);

// The backward ops' forward results and the optional output gradients.
void check_grads(const char* op, const at::Tensor& input, const LayerGeometry& s, int64_t rows,
                 int64_t batch, const at::Tensor& output,
                 const std::optional<at::Tensor>& grad_output,
                 const std::optional<at::Tensor>& grad_h_n,
                 const std::optional<at::Tensor>& grad_c_n, const at::Tensor& workspace);

// The steps of a PackedSequence whose data is `input` ([rows, I]).
LayerSteps packed_input_steps(const char* op, const at::Tensor& input,
                              const at::Tensor& batch_sizes);

// The checks of the dense backward ops, and their tensors as rows.
struct DenseBackward {
  int64_t T, B;
  LayerGeometry s;
  std::optional<at::Tensor> grad_out;
  at::Tensor x, out;
};

DenseBackward dense_backward(const char* op, const std::optional<at::Tensor>& grad_output,
                             const std::optional<at::Tensor>& grad_h_n,
                             const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input,
                             const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& w_ih,
                             const at::Tensor& w_hh, const std::optional<at::Tensor>& w_hr,
                             const at::Tensor& output, const at::Tensor& workspace);

// The checks of the packed backward ops (the data is already rows): the
// steps of `batch_sizes` and the sizes.
struct PackedBackward {
  LayerSteps steps;
  LayerGeometry s;
};

PackedBackward packed_backward(const char* op, const std::optional<at::Tensor>& grad_output,
                               const std::optional<at::Tensor>& grad_h_n,
                               const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input,
                               const at::Tensor& batch_sizes, const at::Tensor& h0,
                               const at::Tensor& c0, const at::Tensor& w_ih, const at::Tensor& w_hh,
                               const std::optional<at::Tensor>& w_hr, const at::Tensor& output,
                               const at::Tensor& workspace);

}  // namespace pipelstm
