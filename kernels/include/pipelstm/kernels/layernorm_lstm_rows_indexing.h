// The LayerNorm LSTM's row kernels (layernorm_lstm_rows.h) as a CUDA block
// runs them: one block a row, thread `rank` of `threads` taking the columns
// rank, rank + threads, ... of it. A kernel is a few phases, each ending in
// a sum over the block of what every thread returns (the block's reduction
// on the GPU; the host harness adds the threads' parts), and the next phase
// reads those sums. The same functions run in both, so the harness checks
// the device's indexing and formulas against the CPU rows.
//
// A thread writes only the columns it owns: in a step, column j of the H
// cells and the four pre-activation columns j, H + j, 2H + j, 3H + j; over a
// whole row, its strided columns. It reads other threads' columns only in
// the first phase of a kernel, before any write of the row.
#pragma once

#include <cmath>
#include <cstdint>

#include "pipelstm/kernels/gate_math.h"
#include "pipelstm/kernels/layernorm_lstm_rows.h"

namespace pipelstm {
namespace kernels {
namespace layernorm_indexing {

// Two sums a phase hands on.
template <typename T>
struct Sums {
  T first = T(0), second = T(0);
};

template <typename T>
PIPELSTM_HD T rstd_of(T deviation, int64_t n, T eps) {
#if defined(__CUDA_ARCH__)
  return T(1) / sqrt(deviation / T(n) + eps);
#else
  return T(1) / std::sqrt(deviation / T(n) + eps);
#endif
}

// A whole row x [n] (layer_norm_rows): its sum, then that of the squared
// deviations from its mean, then the row normalised in place.
template <typename T>
PIPELSTM_HD T row_sum(const T* x, int64_t n, int rank, int threads) {
  T s = T(0);
  for (int64_t j = rank; j < n; j += threads) s += x[j];
  return s;
}

template <typename T>
PIPELSTM_HD T row_deviation(const T* x, int64_t n, T mean, int rank, int threads) {
  T s = T(0);
  for (int64_t j = rank; j < n; j += threads) s += (x[j] - mean) * (x[j] - mean);
  return s;
}

template <typename T>
PIPELSTM_HD void row_normalise(T* x, int64_t n, T mean, T rstd, int rank, int threads) {
  for (int64_t j = rank; j < n; j += threads) x[j] = (x[j] - mean) * rstd;
}

// Its backward (layer_norm_backward_rows): the sums of grad and of
// grad * x_hat, then grad made that of the row before normalisation.
template <typename T>
PIPELSTM_HD Sums<T> row_grad_sums(const T* grad, const T* x_hat, int64_t n, int rank, int threads) {
  Sums<T> s;
  for (int64_t j = rank; j < n; j += threads) {
    s.first += grad[j];
    s.second += grad[j] * x_hat[j];
  }
  return s;
}

template <typename T>
PIPELSTM_HD void row_grad_apply(T* grad, const T* x_hat, int64_t n, T rstd, Sums<T> sums, int rank,
                                int threads) {
  const T m1 = sums.first / T(n), m2 = sums.second / T(n);
  for (int64_t j = rank; j < n; j += threads) grad[j] = rstd * (grad[j] - m1 - x_hat[j] * m2);
}

// A step's forward on row b. Before it: the sums of r's row (row_sum,
// row_deviation over 4H). forward_gates normalises the thread's r columns,
// writes the gates and the new cell (into c_hat) and returns its part of the
// cell's sum; cell_deviation the part of its squared deviations;
// forward_finish the rest, and rank 0 both rows' rstd.
template <typename T, bool kBias>
PIPELSTM_HD T forward_gates(const LayerNormStepForwardArgs<T>& a, int64_t b, T r_mean, T r_rstd, int rank,
                            int threads) {
  const int64_t H = a.hidden, G = 4 * H;
  T* r = a.r + b * G;
  const T* xh = a.x_hat + b * G;
  const T* cp = a.c_prev + b * H;
  T* act = a.act + b * G;
  T* ch = a.c_hat + b * H;
  T sum = T(0);
  for (int64_t j = rank; j < H; j += threads) {
    T p[4];
    for (int k = 0; k < 4; ++k) {
      const T r_hat = (r[k * H + j] - r_mean) * r_rstd;
      r[k * H + j] = r_hat;
      p[k] = a.gamma_ih[k * H + j] * xh[k * H + j] + a.gamma_hh[k * H + j] * r_hat;
      if constexpr (kBias) p[k] += a.bias[k * H + j];
    }
    const T i = math::sigmoid(p[0]), f = math::sigmoid(p[1]), g = math::tanh(p[2]), o = math::sigmoid(p[3]);
    act[j] = i;
    act[H + j] = f;
    act[2 * H + j] = g;
    act[3 * H + j] = o;
    const T fresh = f * cp[j] + i * g;
    ch[j] = fresh;
    sum += fresh;
  }
  return sum;
}

template <typename T>
PIPELSTM_HD T cell_deviation(const LayerNormStepForwardArgs<T>& a, int64_t b, T mean, int rank, int threads) {
  return row_deviation(a.c_hat + b * a.hidden, a.hidden, mean, rank, threads);
}

template <typename T, bool kBeta, bool kZoneout>
PIPELSTM_HD void forward_finish(const LayerNormStepForwardArgs<T>& a, int64_t b, T c_mean, T c_rstd, T r_rstd,
                                int rank, int threads) {
  const int64_t H = a.hidden;
  const T* cp = a.c_prev + b * H;
  const T* o = a.act + b * 4 * H + 3 * H;
  T* ch = a.c_hat + b * H;
  for (int64_t j = rank; j < H; j += threads) {
    const T fresh = ch[j];
    const T hat = (fresh - c_mean) * c_rstd;
    ch[j] = hat;
    T n = a.gamma_c[j] * hat;
    if constexpr (kBeta) n += a.beta_c[j];
    const T t = math::tanh(n);
    a.tanh_n[b * H + j] = t;
    const T h_fresh = o[j] * t;
    if constexpr (kZoneout) {
      a.c[b * H + j] = math::zoned(fresh, cp[j], a.keep.c_row(b)[j]);
      a.h[b * H + j] = math::zoned(h_fresh, a.h_prev[b * H + j], a.keep.h_row(b)[j]);
    } else {
      a.c[b * H + j] = fresh;
      a.h[b * H + j] = h_fresh;
    }
  }
  if (rank == 0) {
    a.r_rstd[b] = r_rstd;
    a.c_rstd[b] = c_rstd;
  }
}

// A step's backward on row b: backward_cell writes the gradient of tanh's
// argument and returns the parts of the cell normalisation's two sums;
// backward_gates the gates', c_prev's (and under zoneout h_prev's direct
// part) and the unnormalised grad_r, returning the parts of the recurrent
// normalisation's sums; backward_recurrent normalises grad_r.
template <typename T, bool kGradOut>
PIPELSTM_HD T grad_h_of(const LayerNormStepBackwardArgs<T>& a, int64_t b, int64_t j) {
  const int64_t H = a.hidden;
  T dh = a.grad_h[b * H + j];
  if constexpr (kGradOut) dh += a.grad_out[b * H + j];
  return dh;
}

template <typename T, bool kGradOut, bool kZoneout>
PIPELSTM_HD Sums<T> backward_cell(const LayerNormStepBackwardArgs<T>& a, int64_t b, int rank, int threads) {
  const int64_t H = a.hidden;
  const T* o = a.act + b * 4 * H + 3 * H;
  Sums<T> s;
  for (int64_t j = rank; j < H; j += threads) {
    T dh = grad_h_of<T, kGradOut>(a, b, j);
    if constexpr (kZoneout) dh *= T(1) - a.keep.h_row(b)[j];
    const T t = a.tanh_n[b * H + j];
    const T dn = dh * o[j] * (T(1) - t * t);
    a.grad_n[b * H + j] = dn;
    const T d_hat = dn * a.gamma_c[j];
    s.first += d_hat;
    s.second += d_hat * a.c_hat[b * H + j];
  }
  return s;
}

template <typename T, bool kGradOut, bool kZoneout>
PIPELSTM_HD Sums<T> backward_gates(const LayerNormStepBackwardArgs<T>& a, int64_t b, Sums<T> cell, int rank,
                                   int threads) {
  const int64_t H = a.hidden, G = 4 * H;
  const T m1 = cell.first / T(H), m2 = cell.second / T(H), rc = a.c_rstd[b];
  const T* act = a.act + b * G;
  const T* rh = a.r_hat + b * G;
  T* ga = a.grad_a + b * G;
  T* gr = a.grad_r + b * G;
  Sums<T> s;
  for (int64_t j = rank; j < H; j += threads) {
    T dh = grad_h_of<T, kGradOut>(a, b, j);
    T dc = a.grad_c[b * H + j], carry = T(0);
    if constexpr (kZoneout) {
      const T kh = a.keep.h_row(b)[j], kc = a.keep.c_row(b)[j];
      a.grad_h[b * H + j] = kh * dh;  // straight to h_prev
      dh *= T(1) - kh;
      carry = kc * dc;
      dc *= T(1) - kc;
    }
    dc += rc * (a.grad_n[b * H + j] * a.gamma_c[j] - m1 - a.c_hat[b * H + j] * m2);
    const T i = act[j], f = act[H + j], g = act[2 * H + j], o = act[3 * H + j];
    T d[4];
    d[0] = dc * g * i * (T(1) - i);
    d[1] = dc * a.c_prev[b * H + j] * f * (T(1) - f);
    d[2] = dc * i * (T(1) - g * g);
    d[3] = dh * a.tanh_n[b * H + j] * o * (T(1) - o);
    a.grad_c[b * H + j] = dc * f + carry;
    for (int k = 0; k < 4; ++k) {
      ga[k * H + j] = d[k];
      const T dr = d[k] * a.gamma_hh[k * H + j];
      gr[k * H + j] = dr;
      s.first += dr;
      s.second += dr * rh[k * H + j];
    }
  }
  return s;
}

template <typename T>
PIPELSTM_HD void backward_recurrent(const LayerNormStepBackwardArgs<T>& a, int64_t b, Sums<T> recurrent, int rank,
                                    int threads) {
  const int64_t H = a.hidden, G = 4 * H;
  const T n1 = recurrent.first / T(G), n2 = recurrent.second / T(G), rr = a.r_rstd[b];
  const T* rh = a.r_hat + b * G;
  T* gr = a.grad_r + b * G;
  for (int64_t j = rank; j < H; j += threads) {
    for (int k = 0; k < 4; ++k) gr[k * H + j] = rr * (gr[k * H + j] - n1 - rh[k * H + j] * n2);
  }
}

}  // namespace layernorm_indexing
}  // namespace kernels
}  // namespace pipelstm
