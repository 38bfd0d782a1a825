// The CUDA backend's LayerMath (layer_math.h): layer_gemm.h's GEMMs (cuBLAS
// in the LSTM's TF32 policy) and ATen's caching allocator. Every CUDA layer
// op computes with this one.
#pragma once

#include <ATen/ATen.h>

#include "../layer_gemm.h"
#include "../layer_math.h"

namespace pipelstm {
namespace cuda {

inline constexpr LayerMath kLayerMath{
    &layer_mm_out, &layer_mm,
    [](at::IntArrayRef sizes, const at::TensorOptions& options) { return at::empty(sizes, options); }};

}  // namespace cuda
}  // namespace pipelstm
