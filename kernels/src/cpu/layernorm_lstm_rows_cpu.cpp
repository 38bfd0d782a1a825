// CPU loops of the LayerNorm LSTM's row kernels (layernorm_lstm_rows.h).
//
// Each row is a few passes over its 4H pre-activations and H cells that the
// compiler vectorizes (the gate math of gate_math.h is branch-free for
// float): the sums of a normalisation, then the values that use them. The
// float entry points are compiled for several instruction sets at once
// (cpu_clones.h).
#include <cmath>
#include <type_traits>

#include "cpu_clones.h"
#include "pipelstm/kernels/flag_dispatch.h"
#include "pipelstm/kernels/gate_math.h"
#include "pipelstm/kernels/layernorm_lstm_rows.h"

namespace pipelstm {
namespace kernels {
namespace {

// x [n] normalised in place (two passes for the moments, so a large mean
// costs no precision); returns 1 / sqrt(var + eps).
template <typename T>
PIPELSTM_HD T normalise(T* __restrict__ x, int64_t n, T eps) {
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) sum += x[j];
  const T mean = sum / T(n);
  T var = 0;
#pragma omp simd reduction(+ : var)
  for (int64_t j = 0; j < n; ++j) var += (x[j] - mean) * (x[j] - mean);
  const T rstd = T(1) / std::sqrt(var / T(n) + eps);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) x[j] = (x[j] - mean) * rstd;
  return rstd;
}

// grad [n] of x_hat becomes that of x (x_hat = (x - mean) * rstd).
template <typename T>
PIPELSTM_HD void normalise_backward(T* __restrict__ grad, const T* __restrict__ x_hat, int64_t n,
                                    T rstd) {
  T s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
  for (int64_t j = 0; j < n; ++j) {
    s1 += grad[j];
    s2 += grad[j] * x_hat[j];
  }
  const T m1 = s1 / T(n), m2 = s2 / T(n);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) grad[j] = rstd * (grad[j] - m1 - x_hat[j] * m2);
}

template <typename T>
PIPELSTM_HD void norm_rows(T* x, T* rstd, int64_t n, T eps, int64_t b0, int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) rstd[b] = normalise(x + b * n, n, eps);
}

template <typename T>
PIPELSTM_HD void norm_backward_rows(T* grad, const T* x_hat, const T* rstd, int64_t n, int64_t b0,
                                    int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) normalise_backward(grad + b * n, x_hat + b * n, n, rstd[b]);
}

template <typename T, bool kBias, bool kBeta, bool kZoneout>
PIPELSTM_HD void forward_rows(const LayerNormStepForwardArgs<T>& a, int64_t b0, int64_t b1) {
  const int64_t H = a.hidden, G = 4 * H;
  const T* __restrict__ g_ih = a.gamma_ih;
  const T* __restrict__ g_hh = a.gamma_hh;
  const T* __restrict__ g_c = a.gamma_c;
  for (int64_t b = b0; b < b1; ++b) {
    T* __restrict__ r = a.r + b * G;
    const T* __restrict__ xh = a.x_hat + b * G;
    const T* __restrict__ cp = a.c_prev + b * H;
    T* __restrict__ act = a.act + b * G;
    T* __restrict__ c = a.c + b * H;
    T* __restrict__ ch = a.c_hat + b * H;
    T* __restrict__ tn = a.tanh_n + b * H;
    T* __restrict__ h = a.h + b * H;
    const T* __restrict__ hp = kZoneout ? a.h_prev + b * H : nullptr;
    const T* __restrict__ kc = kZoneout ? a.keep.c_row(b) : nullptr;
    const T* __restrict__ kh = kZoneout ? a.keep.h_row(b) : nullptr;
    a.r_rstd[b] = normalise(r, G, a.eps);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < H; ++j) {
      T p[4];
      for (int k = 0; k < 4; ++k) {
        p[k] = g_ih[k * H + j] * xh[k * H + j] + g_hh[k * H + j] * r[k * H + j];
        if constexpr (kBias) p[k] += a.bias[k * H + j];
      }
      const T i = math::sigmoid(p[0]), f = math::sigmoid(p[1]), g = math::tanh(p[2]),
              o = math::sigmoid(p[3]);
      act[j] = i;
      act[H + j] = f;
      act[2 * H + j] = g;
      act[3 * H + j] = o;
      const T fresh = f * cp[j] + i * g;
      ch[j] = fresh;  // normalised below
      sum += fresh;
    }
    const T mean = sum / T(H);
    T var = 0;
#pragma omp simd reduction(+ : var)
    for (int64_t j = 0; j < H; ++j) var += (ch[j] - mean) * (ch[j] - mean);
    const T rc = T(1) / std::sqrt(var / T(H) + a.eps);
    a.c_rstd[b] = rc;
#pragma omp simd
    for (int64_t j = 0; j < H; ++j) {
      const T fresh = ch[j];
      const T hat = (fresh - mean) * rc;
      ch[j] = hat;
      T n = g_c[j] * hat;
      if constexpr (kBeta) n += a.beta_c[j];
      const T t = math::tanh(n);
      tn[j] = t;
      const T h_fresh = act[3 * H + j] * t;
      if constexpr (kZoneout) {
        c[j] = math::zoned(fresh, cp[j], kc[j]);
        h[j] = math::zoned(h_fresh, hp[j], kh[j]);
      } else {
        c[j] = fresh;
        h[j] = h_fresh;
      }
    }
  }
}

template <typename T, bool kGradOut, bool kZoneout>
PIPELSTM_HD void backward_rows(const LayerNormStepBackwardArgs<T>& a, int64_t b0, int64_t b1) {
  const int64_t H = a.hidden, G = 4 * H;
  const T* __restrict__ g_hh = a.gamma_hh;
  const T* __restrict__ g_c = a.gamma_c;
  for (int64_t b = b0; b < b1; ++b) {
    const T* __restrict__ rh = a.r_hat + b * G;
    const T* __restrict__ cp = a.c_prev + b * H;
    const T* __restrict__ act = a.act + b * G;
    const T* __restrict__ ch = a.c_hat + b * H;
    const T* __restrict__ tn = a.tanh_n + b * H;
    const T* __restrict__ go = kGradOut ? a.grad_out + b * H : nullptr;
    T* __restrict__ gh = a.grad_h + b * H;
    T* __restrict__ gc = a.grad_c + b * H;
    T* __restrict__ ga = a.grad_a + b * G;
    T* __restrict__ gr = a.grad_r + b * G;
    T* __restrict__ gn = a.grad_n + b * H;
    const T* __restrict__ kc = kZoneout ? a.keep.c_row(b) : nullptr;
    const T* __restrict__ kh = kZoneout ? a.keep.h_row(b) : nullptr;
    // The gradient of tanh's argument, and the sums of the cell's normalisation.
    T s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
    for (int64_t j = 0; j < H; ++j) {
      T dh = gh[j];
      if constexpr (kGradOut) dh += go[j];
      if constexpr (kZoneout) dh *= T(1) - kh[j];
      const T t = tn[j];
      const T dn = dh * act[3 * H + j] * (T(1) - t * t);
      gn[j] = dn;
      const T d_hat = dn * g_c[j];
      s1 += d_hat;
      s2 += d_hat * ch[j];
    }
    const T m1 = s1 / T(H), m2 = s2 / T(H), rc = a.c_rstd[b];
    // The gates, c_prev's gradient, and the sums of the recurrent normalisation.
    T q1 = 0, q2 = 0;
#pragma omp simd reduction(+ : q1, q2)
    for (int64_t j = 0; j < H; ++j) {
      T dh = gh[j];
      if constexpr (kGradOut) dh += go[j];
      T dc = gc[j], carry = T(0);
      if constexpr (kZoneout) {
        gh[j] = kh[j] * dh;  // straight to h_prev
        dh *= T(1) - kh[j];
        carry = kc[j] * dc;
        dc *= T(1) - kc[j];
      }
      dc += rc * (gn[j] * g_c[j] - m1 - ch[j] * m2);
      const T i = act[j], f = act[H + j], g = act[2 * H + j], o = act[3 * H + j];
      T d[4];
      d[0] = dc * g * i * (T(1) - i);
      d[1] = dc * cp[j] * f * (T(1) - f);
      d[2] = dc * i * (T(1) - g * g);
      d[3] = dh * tn[j] * o * (T(1) - o);
      gc[j] = dc * f + carry;
      for (int k = 0; k < 4; ++k) {
        ga[k * H + j] = d[k];
        const T dr = d[k] * g_hh[k * H + j];
        gr[k * H + j] = dr;
        q1 += dr;
        q2 += dr * rh[k * H + j];
      }
    }
    const T n1 = q1 / T(G), n2 = q2 / T(G), rr = a.r_rstd[b];
#pragma omp simd
    for (int64_t j = 0; j < G; ++j) gr[j] = rr * (gr[j] - n1 - rh[j] * n2);
  }
}

template <typename T>
PIPELSTM_HD void forward_dispatch(const LayerNormStepForwardArgs<T>& a, int64_t b0, int64_t b1) {
  with_flags([&](auto bias, auto beta, auto zoned)
                 PIPELSTM_FLAGS_INLINE { forward_rows<T, bias, beta, zoned>(a, b0, b1); },
             a.bias != nullptr, a.beta_c != nullptr, a.keep.on());
}

template <typename T>
PIPELSTM_HD void backward_dispatch(const LayerNormStepBackwardArgs<T>& a, int64_t b0, int64_t b1) {
  with_flags([&](auto out, auto zoned) PIPELSTM_FLAGS_INLINE { backward_rows<T, out, zoned>(a, b0, b1); },
             a.grad_out != nullptr, a.keep.on());
}

PIPELSTM_CPU_CLONES void norm_rows_f32(float* x, float* rstd, int64_t n, float eps, int64_t b0,
                                       int64_t b1) {
  norm_rows(x, rstd, n, eps, b0, b1);
}

PIPELSTM_CPU_CLONES void norm_backward_rows_f32(float* grad, const float* x_hat, const float* rstd,
                                                int64_t n, int64_t b0, int64_t b1) {
  norm_backward_rows(grad, x_hat, rstd, n, b0, b1);
}

}  // namespace

// float through the clones above, double as written.
template <typename T>
void layer_norm_rows(T* x, T* rstd, int64_t n, T eps, int64_t b0, int64_t b1) {
  float_through_clones<T>(norm_rows_f32, norm_rows<T>, x, rstd, n, eps, b0, b1);
}

template <typename T>
void layer_norm_backward_rows(T* grad, const T* x_hat, const T* rstd, int64_t n, int64_t b0, int64_t b1) {
  float_through_clones<T>(norm_backward_rows_f32, norm_backward_rows<T>, grad, x_hat, rstd, n, b0, b1);
}

PIPELSTM_CPU_ROWS_ENTRY(layernorm_step_forward_rows, LayerNormStepForwardArgs, forward_dispatch)
PIPELSTM_CPU_ROWS_ENTRY(layernorm_step_backward_rows, LayerNormStepBackwardArgs, backward_dispatch)

#define PIPELSTM_LAYERNORM_ROWS(T)                                                        \
  template void layer_norm_rows<T>(T*, T*, int64_t, T, int64_t, int64_t);                 \
  template void layer_norm_backward_rows<T>(T*, const T*, const T*, int64_t, int64_t, int64_t);
PIPELSTM_LAYERNORM_ROWS(float)
PIPELSTM_LAYERNORM_ROWS(double)
#undef PIPELSTM_LAYERNORM_ROWS

}  // namespace kernels
}  // namespace pipelstm
