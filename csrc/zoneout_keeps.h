// Zoneout's keep weights for every row of a layer direction (gate_math.h's
// zoned): keep_c and keep_h [N, H] with contiguous columns, row r at
// r * stride (0: one row for every r, evaluation's probabilities). The
// step loop (layer_step_loop.h) and the CPU's fused loops apply them inside
// their steps; never with a projection.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "pipelstm/kernels/keep_weights.h"

namespace pipelstm {

struct Zoneout {
  at::Tensor keep_c, keep_h;
  int64_t stride = 0;

  // The keep weights of rows from `row` on, as a kernel reads them.
  template <typename T>
  kernels::KeepWeights<T> from_row(int64_t row) const {
    return kernels::KeepWeights<T>{keep_c.const_data_ptr<T>(), keep_h.const_data_ptr<T>(), stride}.from_row(row);
  }
};

}  // namespace pipelstm
