// What the persistent kernels' checks share beyond the references
// (persistent_tc_reference.h): the kernels' argument structs filled from
// their buffers in one call, the relative error the host harnesses report
// and a pass-through load/store.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "pipelstm/kernels/lstm_persistent_tc.h"

namespace pipelstm {
namespace kernels {
namespace testing {

struct Identity {
  float operator()(float v) const { return v; }
};

// One forward over the given buffers (layouts as PersistentForwardArgs).
template <typename T>
PersistentForwardArgs<T> forward_args(const T* input_gates, const T* w_hh, const T* h0,
                                      const T* c0, T* output, T* act_gates, T* cells,
                                      int64_t steps, int64_t batch, int64_t hidden,
                                      bool reverse) {
  // Field by field, in the struct's order.
  return {input_gates, w_hh, h0, c0, output, act_gates, cells, steps, batch, hidden, reverse};
}

// The gradients a backward reads (each optional one may be null).
template <typename T>
struct GradsIn {
  const T* grad_output = nullptr;
  const T* grad_h_n = nullptr;
  const T* grad_c_n = nullptr;
};

// One backward of the forward `f` (its weights, c0 and workspace) over the
// given gradient buffers.
template <typename T>
PersistentBackwardArgs<T> backward_args(const PersistentForwardArgs<T>& f, GradsIn<T> in,
                                        T* grad_gates, T* grad_h0, T* grad_c0) {
  return {in.grad_output, in.grad_h_n, in.grad_c_n, f.w_hh,   f.c0,    f.act_gates, f.cells,
          grad_gates,     grad_h0,     grad_c0,     f.steps, f.batch, f.hidden,    f.reverse};
}

// max |got - want| / max(1, |want|) over the elements; a NaN in `got` (a
// value never written) is infinite.
inline double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::isnan(got[i]) ? INFINITY
                                               : std::fabs(double(got[i]) - want[i]) /
                                                     std::max(1.0, std::fabs(double(want[i]))));
  return worst;
}

}  // namespace testing
}  // namespace kernels
}  // namespace pipelstm
