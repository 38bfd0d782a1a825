// The CPU's LayerMath (layer_math.h): float32's GEMMs on the fused kernels'
// or ATen's, as gemm_cpu.h picks, the rest on at::mm, and buffers from the
// kept huge-page mappings (huge_pages.h). Every CPU layer op computes with
// this one.
#pragma once

#include <ATen/ATen.h>

#include "../layer_math.h"
#include "gemm_cpu.h"
#include "huge_pages.h"

namespace pipelstm {
namespace cpu {

inline constexpr LayerMath kLayerMath{
    &layer_mm_out, [](const at::Tensor& a, const at::Tensor& b) { return at::mm(a, b); }, &empty_huge};

}  // namespace cpu
}  // namespace pipelstm
