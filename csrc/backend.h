// The backend services that device-generic code uses (the layer ops' shared
// parts, the pipeline's units), each one front door that picks the device's
// own implementation, so that code outside cpu/ and cuda/ never names a
// backend:
//   empty_buffer  an uninitialised tensor for a large result or workspace:
//                 on the CPU from the kept huge-page buffers
//                 (cpu/huge_pages.h), elsewhere at::empty;
//   layer_mm_out, layer_mm, kLayerMath
//                 the layer GEMMs (the CPU's, cpu/gemm_cpu.h; elsewhere
//                 layer_gemm.h's, cuBLAS in the LSTM's TF32 policy on
//                 CUDA), and the three as a LayerMath (layer_math.h) for the
//                 layer ops' shared parts.
// Inside a layer op the dispatcher has chosen the device: the backend's
// layer class gives its own LayerMath there, with no branch.
//   linear, linear_mm_out
//                 a Linear unit's forward and its GEMM: on the CPU the layer
//                 GEMM, elsewhere ATen's, which follows
//                 torch.backends.cuda.matmul.allow_tf32 as nn.Linear does.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "layer_math.h"

namespace pipelstm {
namespace backend {

// An uninitialised tensor of `sizes` and `options` (see above).
at::Tensor empty_buffer(at::IntArrayRef sizes, const at::TensorOptions& options);

// out = a @ b, or out += a @ b with `accumulate` (layer_math.h's contract).
void layer_mm_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate);

// a @ b as a new tensor.
at::Tensor layer_mm(const at::Tensor& a, const at::Tensor& b);

inline constexpr LayerMath kLayerMath{&layer_mm_out, &layer_mm, &empty_buffer};

// x [..., K] @ w.t() + bias as [..., N] (w [N, K], bias optional [N]): on the
// CPU the layer GEMM in float32 (cpu/gemm_cpu.h), at::linear otherwise.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias);

// out = a @ b, or out += a @ b with `accumulate` (out [M, N] with unit column
// stride): on the CPU layer_mm_out, elsewhere at::mm_out / addmm_.
void linear_mm_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                   bool accumulate = false);

}  // namespace backend
}  // namespace pipelstm
