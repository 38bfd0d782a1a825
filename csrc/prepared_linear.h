// y = x @ w^T with a weight prepared once and applied many times (every time
// step of a layer).
//
// On the CPU in float32 this uses oneDNN through the ops PyTorch itself
// registers for it (mkldnn::_reorder_linear_weight once, then
// mkldnn::_linear_pointwise per call): with the weight kept in oneDNN's
// blocked layout, the thin per-step GEMMs run much closer to the machine's
// GEMM rate than a plain at::mm, which repacks the weight on every call.
// Elsewhere (float64, CUDA, small GEMMs where oneDNN's per-call overhead
// dominates, torch without oneDNN, oneDNN disabled through
// torch.backends.mkldnn) it is at::mm.
#pragma once

#include <ATen/core/Tensor.h>

namespace pipelstm {

class PreparedLinear {
 public:
  // weight: [out, in]; batch_hint: the usual number of rows of x.
  PreparedLinear(const at::Tensor& weight, int64_t batch_hint);

  // x [rows, in] -> [rows, out] (+ bias [out]), a new tensor.
  at::Tensor operator()(const at::Tensor& x, const at::Tensor& bias = at::Tensor()) const;

  // Same, written into `out` [rows, out].
  void into(at::Tensor& out, const at::Tensor& x) const;

  bool uses_onednn() const { return packed_.defined(); }

 private:
  at::Tensor weight_;
  at::Tensor packed_;  // oneDNN layout; undefined on the at::mm path
};

}  // namespace pipelstm
