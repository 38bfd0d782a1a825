// CPU loops of the fused LSTM pointwise step.
//
// Each row (batch element) is one pass over H columns that the compiler
// vectorizes: the gate math in gate_math.h is branch-free for float. The
// float entry points are compiled for several instruction sets at once
// (target_clones) and the best one is picked when the library loads, so the
// binary runs on any x86-64 and still uses AVX-512 where it exists.
#include "pipelstm/kernels/lstm_pointwise.h"

#include "cpu_clones.h"
#include "pipelstm/kernels/flag_dispatch.h"
#include "pipelstm/kernels/gate_math.h"

namespace pipelstm {
namespace kernels {
namespace {

// kZoneout: c and h blended by the keep weights (only without hidden gates
// and biases, as the layers call it).
template <typename T, bool kHiddenGates, bool kBiasIh, bool kBiasHh, bool kZoneout = false>
PIPELSTM_HD void forward_rows(const PointwiseForwardArgs<T>& a, int64_t row_begin,
                              int64_t row_end) {
  const int64_t H = a.hidden;
  for (int64_t b = row_begin; b < row_end; ++b) {
    const T* __restrict__ pre = a.gates + b * 4 * H;
    const T* __restrict__ hid = kHiddenGates ? a.hidden_gates + b * 4 * H : nullptr;
    const T* __restrict__ c_prev = a.c_prev + b * H;
    T* act = a.act_gates + b * 4 * H;  // may alias `pre`: read before write
    T* __restrict__ c = a.c + b * H;
    T* __restrict__ h = a.h + b * H;
    const T* __restrict__ h_prev = kZoneout ? a.h_prev + b * H : nullptr;
    const T* __restrict__ keep_c = kZoneout ? a.keep.c_row(b) : nullptr;
    const T* __restrict__ keep_h = kZoneout ? a.keep.h_row(b) : nullptr;
#pragma omp simd
    for (int64_t j = 0; j < H; ++j) {
      T p[4];
      for (int k = 0; k < 4; ++k) {
        T v = pre[k * H + j];
        if constexpr (kHiddenGates) v += hid[k * H + j];
        if constexpr (kBiasIh) v += a.bias_ih[k * H + j];
        if constexpr (kBiasHh) v += a.bias_hh[k * H + j];
        p[k] = v;
      }
      auto r = math::cell_forward(p[0], p[1], p[2], p[3], c_prev[j]);
      if constexpr (kZoneout) {  // h from the new cell, then both blended
        r.h = math::zoned(r.h, h_prev[j], keep_h[j]);
        r.c = math::zoned(r.c, c_prev[j], keep_c[j]);
      }
      act[j] = r.i;
      act[H + j] = r.f;
      act[2 * H + j] = r.g;
      act[3 * H + j] = r.o;
      c[j] = r.c;
      h[j] = r.h;
    }
  }
}

// kZoneout: the backward of forward_rows' (grad_h_prev may alias grad_h).
template <typename T, bool kGradH, bool kGradOut, bool kGradC, bool kZoneout = false>
PIPELSTM_HD void backward_rows(const PointwiseBackwardArgs<T>& a, int64_t row_begin,
                               int64_t row_end) {
  const int64_t H = a.hidden;
  for (int64_t b = row_begin; b < row_end; ++b) {
    const T* gh = kGradH ? a.grad_h + b * H : nullptr;  // may alias grad_h_prev
    const T* __restrict__ go = kGradOut ? a.grad_out + b * a.grad_out_stride : nullptr;
    const T* gc = kGradC ? a.grad_c + b * H : nullptr;  // may alias grad_c_prev
    const T* __restrict__ act = a.act_gates + b * 4 * H;
    const T* __restrict__ c_prev = a.c_prev + b * H;
    const T* __restrict__ c = a.c + b * H;
    T* __restrict__ dg = a.grad_gates + b * 4 * H;
    T* dc_prev = a.grad_c_prev + b * H;
    T* dh_prev = kZoneout ? a.grad_h_prev + b * H : nullptr;
    const T* __restrict__ keep_c = kZoneout ? a.keep.c_row(b) : nullptr;
    const T* __restrict__ keep_h = kZoneout ? a.keep.h_row(b) : nullptr;
#pragma omp simd
    for (int64_t j = 0; j < H; ++j) {
      const T grad_h = kGradH ? (kGradOut ? gh[j] + go[j] : gh[j]) : (kGradOut ? go[j] : T(0));
      const T grad_c = kGradC ? gc[j] : T(0);
      math::CellBackward<T> r;
      if constexpr (kZoneout) {
        r = math::cell_backward_zoneout(grad_h, grad_c, act[j], act[H + j], act[2 * H + j],
                                        act[3 * H + j], c_prev[j], keep_c[j], keep_h[j]);
        dh_prev[j] = keep_h[j] * grad_h;
      } else {
        r = math::cell_backward(grad_h, grad_c, act[j], act[H + j], act[2 * H + j],
                                act[3 * H + j], c_prev[j], c[j]);
      }
      dg[j] = r.d_i;
      dg[H + j] = r.d_f;
      dg[2 * H + j] = r.d_g;
      dg[3 * H + j] = r.d_o;
      dc_prev[j] = r.d_c_prev;
    }
  }
}

template <typename T>
PIPELSTM_HD void forward_dispatch(const PointwiseForwardArgs<T>& a, int64_t b0, int64_t b1) {
  if (a.keep.on()) return forward_rows<T, false, false, false, true>(a, b0, b1);
  with_flags([&](auto hid, auto bih, auto bhh)
                 PIPELSTM_FLAGS_INLINE { forward_rows<T, hid, bih, bhh>(a, b0, b1); },
             a.hidden_gates != nullptr, a.bias_ih != nullptr, a.bias_hh != nullptr);
}

template <typename T>
PIPELSTM_HD void backward_dispatch(const PointwiseBackwardArgs<T>& a, int64_t b0, int64_t b1) {
  with_flags([&](auto gh, auto go, auto gc, auto zoned)
                 PIPELSTM_FLAGS_INLINE { backward_rows<T, gh, go, gc, zoned>(a, b0, b1); },
             a.grad_h != nullptr, a.grad_out != nullptr, a.grad_c != nullptr, a.keep.on());
}

}  // namespace

PIPELSTM_CPU_ROWS_ENTRY(pointwise_forward_cpu, PointwiseForwardArgs, forward_dispatch)
PIPELSTM_CPU_ROWS_ENTRY(pointwise_backward_cpu, PointwiseBackwardArgs, backward_dispatch)

}  // namespace kernels
}  // namespace pipelstm
