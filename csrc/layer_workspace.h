// What a layer op's backends compute into: the workspace's parts as views,
// the forward's and backward's results, and typed row pointers for the
// kernels' arguments.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "layer_geometry.h"
#include "layer_math.h"
#include "layer_steps.h"

namespace pipelstm {

// The workspace's parts (layer_geometry.h), each [rows, width].
struct Workspace {
  at::Tensor gates, cells, raw_h;  // activated gates, c of each step, h before projection

  Workspace(const at::Tensor& ws, int64_t rows, const LayerGeometry& s) {
    const int64_t H = s.hidden;
    gates = ws.narrow(0, 0, rows * s.gates()).view({rows, s.gates()});
    cells = ws.narrow(0, s.cells_offset(rows), rows * H).view({rows, H});
    if (s.projected) raw_h = ws.narrow(0, s.raw_h_offset(rows), rows * H).view({rows, H});
  }
};

struct ForwardResult {
  at::Tensor output, h_n, c_n, workspace;  // output and workspace by rows
};

struct BackwardResult {
  at::Tensor grad_input, grad_h0, grad_c0, grad_w_ih, grad_w_hh, grad_bias, grad_w_hr;
};

// A forward's results, allocated (the large ones by `math`) and uninitialised.
inline ForwardResult new_forward_result(const LayerSteps& steps, const LayerGeometry& s,
                                        const at::TensorOptions& opts, const LayerMath& math) {
  ForwardResult r;
  r.workspace = math.empty({s.workspace_numel(steps.rows)}, opts);
  r.output = math.empty({steps.rows, s.out}, opts);
  r.h_n = at::empty({steps.max_batch, s.out}, opts);
  r.c_n = at::empty({steps.max_batch, s.hidden}, opts);
  return r;
}

// b_ih + b_hh, either alone, or an undefined tensor without biases.
inline at::Tensor summed_bias(const std::optional<at::Tensor>& b_ih,
                              const std::optional<at::Tensor>& b_hh) {
  if (b_ih.has_value() && b_hh.has_value()) return *b_ih + *b_hh;
  if (b_ih.has_value()) return *b_ih;
  return b_hh.has_value() ? *b_hh : at::Tensor();
}

// Row `row` of a [rows, width] tensor.
template <typename T>
const T* row_of(const at::Tensor& t, int64_t row, int64_t width) {
  return t.const_data_ptr<T>() + row * width;
}
template <typename T>
T* mutable_row_of(const at::Tensor& t, int64_t row, int64_t width) {
  return t.mutable_data_ptr<T>() + row * width;
}

// Typed data of an optional tensor, or null.
template <typename T>
const T* data_or_null(const at::Tensor& t) {
  return t.defined() ? t.const_data_ptr<T>() : nullptr;
}

}  // namespace pipelstm
