// Zoneout's keep weights, as every kernel that applies them reads them
// (gate_math.h's zoned blends the new c and h with the previous ones by
// these weights): c and h [rows, H] with contiguous columns, row r at
// r * stride (0: one row for every r, evaluation's probabilities). A call
// without zoneout leaves c null.
#pragma once

#include <cstdint>

#include "pipelstm/kernels/gate_math.h"

namespace pipelstm {
namespace kernels {

template <typename T>
struct KeepWeights {
  const T* c = nullptr;
  const T* h = nullptr;
  int64_t stride = 0;

  PIPELSTM_HD bool on() const { return c != nullptr; }
  PIPELSTM_HD const T* c_row(int64_t r) const { return c + r * stride; }
  PIPELSTM_HD const T* h_row(int64_t r) const { return h + r * stride; }
  // The weights as a call over rows [row, ...) reads them: its row 0 is `row`.
  PIPELSTM_HD KeepWeights from_row(int64_t row) const { return {c_row(row), h_row(row), stride}; }
};

}  // namespace kernels
}  // namespace pipelstm
