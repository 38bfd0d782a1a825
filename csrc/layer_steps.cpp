#include "layer_steps.h"

#include <ATen/ATen.h>

#include "checks.h"

namespace pipelstm {

LayerSteps dense_steps(int64_t T, int64_t B) {
  LayerSteps s;
  s.batch.assign(T, B);
  s.offset.resize(T);
  for (int64_t t = 0; t < T; ++t) s.offset[t] = t * B;
  s.max_batch = B;
  s.rows = T * B;
  s.dense = true;
  return s;
}

LayerSteps packed_steps(const char* op, const at::Tensor& batch_sizes) {
  TORCH_CHECK(batch_sizes.dim() == 1 && batch_sizes.device().is_cpu() &&
                  batch_sizes.scalar_type() == at::kLong,
              "pipelstm::", op, ": expected `batch_sizes` to be a 1-D int64 CPU tensor, got ",
              batch_sizes.dim(), "-D ", batch_sizes.scalar_type(), " on ", batch_sizes.device());
  TORCH_CHECK(batch_sizes.numel() > 0, "pipelstm::", op,
              ": expected `batch_sizes` with at least one time step");
  const auto sizes = batch_sizes.contiguous();
  const int64_t* b = sizes.const_data_ptr<int64_t>();
  LayerSteps s;
  s.dense = true;
  for (int64_t t = 0; t < sizes.numel(); ++t) {
    TORCH_CHECK(b[t] > 0 && (t == 0 || b[t] <= b[t - 1]), "pipelstm::", op,
                ": expected `batch_sizes` positive and non-increasing, got ", batch_sizes);
    s.batch.push_back(b[t]);
    s.offset.push_back(s.rows);
    s.rows = checked_sum(op, "the sum of `batch_sizes`", s.rows, b[t]);
    s.dense = s.dense && b[t] == b[0];
  }
  s.max_batch = b[0];
  return s;
}

}  // namespace pipelstm
