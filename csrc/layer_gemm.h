// The GEMMs of an LSTM layer op on every device but the CPU (whose own are
// cpu/gemm_cpu.h's):
//   CUDA float32: in the precision nn.LSTM's cuDNN path uses, which follows
//     torch.backends.cudnn.allow_tf32 (on by default): TF32 tensor cores
//     where it allows them, exact float32 where it does not, whatever
//     torch.backends.cuda.matmul.allow_tf32 says (that switch is nn.Linear's,
//     and the pipeline's Linear units follow it). cuBLAS is called with the
//     compute type itself (cuda/float32_gemm_cuda.cpp): ATen's at::mm reads
//     the matmul switch, a process-wide flag that another thread may be
//     relying on at the same time;
//   every other dtype and device: at::mm.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace pipelstm {

// Whether an LSTM layer's GEMMs of `dtype` on `device` use TF32: float32 on
// CUDA while torch.backends.cudnn.allow_tf32 (cuDNN's RNN precision) allows it.
bool layer_gemm_tf32(c10::DeviceType device, c10::ScalarType dtype);

// out = a @ b, or out += a @ b with `accumulate`; out [M, N], a [M, K] and
// b [K, N] with any strides.
void layer_mm_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                  bool accumulate = false);

// a @ b as a new tensor.
at::Tensor layer_mm(const at::Tensor& a, const at::Tensor& b);

// A device's float32 GEMM with layer_mm_out's contract, in TF32 or exact
// as `tf32` says; the CUDA build registers one at load time.
using Float32Gemm = void (*)(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                             bool accumulate, bool tf32);
void register_float32_gemm(c10::DeviceType device, Float32Gemm gemm);

}  // namespace pipelstm
