// The whole-batch GEMMs of a layer (the input projection of all steps, the
// input gradient, the weight gradients) on the fused kernels' packed-panel
// GEMM where that is faster than ATen's BLAS.
//
// torch's CPU builds call MKL's sgemm for at::mm, and MKL takes its AVX-512
// code only on Intel CPUs: on AMD CPUs the kernels' avx512 and avx2 builds
// both run faster than MKL (docs/cpu.md, "GEMM backend").
// PIPELSTM_CPU_GEMM picks: `aten` (at::mm always), `own` (the kernels
// always), `auto` or unset (the kernels where their ISA is avx512 or avx2,
// the CPU is not Intel's and a has at least 4 rows, else at::mm).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace pipelstm {
namespace cpu {

// out = a @ b, or out += a @ b with `accumulate`. out [M, N] with unit
// column stride; a [M, K] and b [K, N] with any strides. Tensors that are
// not CPU float32 go to at::mm_out / addmm_.
void layer_mm_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                  bool accumulate = false);

// b [K, N] packed once for many products with it (a step loop's recurrent
// weight): the kernels' panels for products of `rows` rows wherever the
// kernels are a vector build (PIPELSTM_CPU_GEMM=auto; on every vendor's CPU,
// as the fused loops' steps), else nothing (packed_mm_out then calls
// layer_mm_out).
struct PackedOperand {
  at::Tensor b;
  at::Tensor panels;  // undefined: not packed
};
PackedOperand pack_operand(const at::Tensor& b, int64_t rows);

// layer_mm_out(out, a, b.b, accumulate) on b's panels, packed once.
void packed_mm_out(const at::Tensor& out, const at::Tensor& a, const PackedOperand& b,
                   bool accumulate = false);

// x [..., K] @ w.t() + bias as [..., N] (w [N, K]): a Linear's forward on
// layer_mm_out for CPU float32, at::linear for the CPU's other dtypes.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias);

// What layer_mm_out runs on CPU float32 now for 4 rows and more: "own"
// or "aten". Raises if
// PIPELSTM_CPU_GEMM is not one of aten, own, auto.
const char* gemm_backend();

}  // namespace cpu
}  // namespace pipelstm
