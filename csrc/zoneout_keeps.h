// Zoneout's keep weights for every row of a layer direction (gate_math.h's
// zoned): keep_c and keep_h [N, H] with contiguous columns, row r at
// r * stride (0: one row for every r, evaluation's probabilities). The
// step loop (layer_step_loop.h) and the CPU's fused loops apply them inside
// their steps; never with a projection.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace pipelstm {

struct Zoneout {
  at::Tensor keep_c, keep_h;
  int64_t stride = 0;

  // The keep weights of rows from `row` on, into a kernel's argument struct.
  template <typename T, class Args>
  void set(Args& step, int64_t row) const {
    step.keep_c = keep_c.const_data_ptr<T>() + row * stride;
    step.keep_h = keep_h.const_data_ptr<T>() + row * stride;
    step.keep_stride = stride;
  }
};

}  // namespace pipelstm
