// Which layer calls replay their time loop as a CUDA graph where
// PIPELSTM_CUDA_GRAPHS is unset (graph_replay.h): where a step's launches,
// not its recurrent GEMM (B x H x 4H), set the time. Tensor cores finish
// the GEMM sooner, so their bound is higher: float16 and bfloat16, and
// float32 whose GEMMs use TF32 (layer_gemm.h). Above the bounds a graph
// only holds its memory pool (docs/design/cuda.md, "The time loop as a CUDA
// graph"). Device-neutral so that a CPU build can test it.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace pipelstm {

// B * H * H up to which a graph pays: without tensor cores, and with them.
constexpr double kGraphMaxWork = 0x1p26;
constexpr double kGraphMaxWorkTensorCores = 0x1p28;

// `tf32`: whether the layer's float32 GEMMs run as TF32.
inline bool graph_pays(at::ScalarType dtype, bool tf32, int64_t batch, int64_t hidden) {
  const double work = static_cast<double>(batch) * static_cast<double>(hidden) * static_cast<double>(hidden);
  const bool tensor_cores = dtype == at::kHalf || dtype == at::kBFloat16 || (dtype == at::kFloat && tf32);
  return work <= (tensor_cores ? kGraphMaxWorkTensorCores : kGraphMaxWork);
}

}  // namespace pipelstm
