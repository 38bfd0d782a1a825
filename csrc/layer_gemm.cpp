#include "layer_gemm.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <array>

namespace pipelstm {
namespace {

std::array<Float32Gemm, static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)>&
float32_gemms() {
  static std::array<Float32Gemm,
                    static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)>
      gemms{};
  return gemms;
}

}  // namespace

void register_float32_gemm(c10::DeviceType device, Float32Gemm gemm) {
  float32_gemms()[static_cast<size_t>(device)] = gemm;
}

bool layer_gemm_tf32(c10::DeviceType device, c10::ScalarType dtype) {
  return device == c10::DeviceType::CUDA && dtype == at::kFloat &&
         at::globalContext().allowTF32CuDNN(at::Float32Op::RNN);
}

void layer_mm_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                  bool accumulate) {
  TORCH_CHECK(out.dim() == 2 && a.dim() == 2 && b.dim() == 2 && a.size(0) == out.size(0) &&
                  b.size(1) == out.size(1) && a.size(1) == b.size(0),
              "pipelstm: layer GEMM shapes ", out.sizes(), " = ", a.sizes(), " @ ", b.sizes());
  const c10::DeviceType device = out.device().type();
  const Float32Gemm own = float32_gemms()[static_cast<size_t>(device)];
  if (own != nullptr && out.scalar_type() == at::kFloat) {
    own(out, a, b, accumulate, layer_gemm_tf32(device, at::kFloat));
    return;
  }
  TORCH_CHECK(!layer_gemm_tf32(device, out.scalar_type()), "pipelstm: this build has no float32 GEMM for ",
              out.device(), " that follows torch.backends.cudnn.allow_tf32");
  at::Tensor& o = const_cast<at::Tensor&>(out);
  if (accumulate) {
    o.addmm_(a, b);
  } else {
    at::mm_out(o, a, b);
  }
}

at::Tensor layer_mm(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
  layer_mm_out(out, a, b);
  return out;
}

}  // namespace pipelstm
