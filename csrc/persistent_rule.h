// Which layer calls run the persistent recurrent kernels (the CUDA
// backend's sequence_forward / sequence_backward): PIPELSTM_PERSISTENT
// where set (1: wherever they fit; 0: never), else the sizes at which they
// were measured faster than the step loop (both graphed as the library
// chooses; docs/design/cuda.md, "Where they run: the measured rule"). The rule
// is device-neutral so that a CPU build can test it.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>

#include "settings.h"

namespace pipelstm {

// The largest batch the persistent kernels take at all.
constexpr int64_t kPersistentMaxBatch = 64;

// The measured rule: tensor cores (float16, bfloat16) over long sequences of
// small batches and hidden sizes, where one launch for the whole sequence
// saves more than the kernel loses to the per-step GEMM on cuBLAS. Shorter
// sequences and larger batches or hidden sizes measured slower or even.
constexpr int64_t kPersistentMinSteps = 500;
constexpr int64_t kPersistentRuleMaxBatch = 8;
constexpr int64_t kPersistentRuleMaxHidden = 512;

inline bool persistent_pays(at::ScalarType dtype, int64_t steps, int64_t batch, int64_t hidden) {
  const bool tensor_cores = dtype == at::kHalf || dtype == at::kBFloat16;
  return tensor_cores && steps >= kPersistentMinSteps && batch <= kPersistentRuleMaxBatch &&
         hidden <= kPersistentRuleMaxHidden;
}

// Whether a layer call of these sizes tries the persistent kernels (they
// may still decline a shape they do not fit).
inline bool use_persistent(at::ScalarType dtype, int64_t steps, int64_t batch, int64_t hidden) {
  if (batch > kPersistentMaxBatch) return false;
  const std::optional<bool> chosen = settings::persistent();
  return chosen.has_value() ? *chosen : persistent_pays(dtype, steps, batch, hidden);
}

}  // namespace pipelstm
