#include "backend.h"

#include <ATen/ATen.h>

#include "cpu/gemm_cpu.h"
#include "cpu/huge_pages.h"
#include "layer_gemm.h"

namespace pipelstm {
namespace backend {

at::Tensor empty_buffer(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return options.device().is_cpu() ? cpu::empty_huge(sizes, options) : at::empty(sizes, options);
}

void layer_mm_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate) {
  if (out.device().is_cpu()) {
    cpu::layer_mm_out(out, a, b, accumulate);
  } else {
    pipelstm::layer_mm_out(out, a, b, accumulate);
  }
}

at::Tensor layer_mm(const at::Tensor& a, const at::Tensor& b) {
  return a.device().is_cpu() ? at::mm(a, b) : pipelstm::layer_mm(a, b);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  return x.device().is_cpu() ? cpu::linear(x, w, bias) : at::linear(x, w, bias);
}

void linear_mm_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                   bool accumulate) {
  if (out.device().is_cpu()) {
    cpu::layer_mm_out(out, a, b, accumulate);
    return;
  }
  at::Tensor& o = const_cast<at::Tensor&>(out);
  if (accumulate) {
    o.addmm_(a, b);
  } else {
    at::mm_out(o, a, b);
  }
}

}  // namespace backend
}  // namespace pipelstm
