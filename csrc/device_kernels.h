// Registers the device-generic op implementations for one dispatch key;
// each backend's TORCH_LIBRARY_IMPL block calls this once.
#pragma once

#include <torch/library.h>

#include "lstm_ops.h"

namespace pipelstm {

inline void register_device_kernels(torch::Library& m) {
  m.impl("lstm_cell_forward", &lstm_cell_forward);
  m.impl("lstm_cell_backward", &lstm_cell_backward);
  m.impl("lstm_layer_forward", &lstm_layer_forward);
  m.impl("lstm_layer_backward", &lstm_layer_backward);
  m.impl("lstm_packed_layer_forward", &lstm_packed_layer_forward);
  m.impl("lstm_packed_layer_backward", &lstm_packed_layer_backward);
}

}  // namespace pipelstm
