#include "pointwise_backend.h"

#include <c10/util/Exception.h>

#include <array>

namespace pipelstm {
namespace {

std::array<PointwiseBackend, static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)>&
table() {
  static std::array<PointwiseBackend,
                    static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)>
      backends;
  return backends;
}

}  // namespace

void register_pointwise_backend(c10::DeviceType device, PointwiseBackend backend) {
  table()[static_cast<size_t>(device)] = backend;
}

const PointwiseBackend& pointwise_backend(c10::DeviceType device) {
  const auto& backend = table()[static_cast<size_t>(device)];
  TORCH_CHECK(backend.forward != nullptr, "pipelstm: no fused LSTM kernels for device type ",
              device, " in this build");
  return backend;
}

}  // namespace pipelstm
