// What the persistent kernels' checks share beyond the references
// (persistent_tc_reference.h): the kernels' argument structs filled from
// their buffers in one call, the relative error the host harnesses report,
// a forward compared with the reference's, and a pass-through load/store.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "persistent_tc_reference.h"
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

// The largest rel_error of a forward run by run_kernel(args) against the
// reference forward on the same inputs, over output, act_gates and cells
// (each side's buffers start as NaN, so a value never written shows up).
template <typename RunKernel>
double forward_error(const std::vector<float>& xg, const std::vector<float>& w,
                     const std::vector<float>& h0, const std::vector<float>& c0, int64_t T,
                     int64_t B, int64_t H, bool reverse, RunKernel run_kernel) {
  std::vector<float> out[2], act[2], cells[2];
  for (int run = 0; run < 2; ++run) {
    out[run].assign(T * B * H, NAN);
    act[run].assign(T * B * 4 * H, NAN);
    cells[run].assign(T * B * H, NAN);
    const PersistentForwardArgs<float> a =
        forward_args(xg.data(), w.data(), h0.data(), c0.data(), out[run].data(),
                     act[run].data(), cells[run].data(), T, B, H, reverse);
    if (run == 0) run_kernel(a); else reference_forward(a);
  }
  return std::max({rel_error(out[0], out[1]), rel_error(act[0], act[1]),
                   rel_error(cells[0], cells[1])});
}

}  // namespace testing
}  // namespace kernels
}  // namespace pipelstm
