// Per-element LSTM gate math, shared by the CPU loops and the CUDA kernels.
//
// Gate order is i, f, g, o as in torch.nn.LSTM. Everything here is a
// header-only __host__ __device__ inline function of scalars, so the exact
// same formulas run on both backends and are unit-tested on the CPU.
//
// Only the elementary functions differ per backend: on the device we use the
// CUDA math library; on the host (float) we use branch-free polynomial
// versions that the compiler can vectorize (libm calls block vectorization).
#pragma once

#include <cstdint>
#include <cstring>
#include <cmath>

#if defined(__CUDACC__)
#define PIPELSTM_HD __host__ __device__ __forceinline__
#else
#define PIPELSTM_HD inline __attribute__((always_inline))
#endif

namespace pipelstm {
namespace math {

template <typename T>
PIPELSTM_HD T select(bool cond, T a, T b) {
  return cond ? a : b;
}

// exp(x) for float on the host, after Cephes' expf: round x/ln2 to n, reduce
// r = x - n*ln2 in two steps, a degree-6 polynomial for exp(r), then scale by
// 2^n through the exponent bits. Relative error about 2 ulp on [-87, 88].
// Outside that range the result is inf above and 0 below (the float range
// ends there), and exp(NaN) is NaN: a saturated gate is exactly 0 or 1, as
// with std::exp, so NaN and inf propagate as in torch.nn.LSTM and a
// saturated gate's derivative s(1 - s) is exactly 0.
PIPELSTM_HD float host_expf(float x) {
  const float lo = -87.3365478515625f, hi = 88.3762626647949f;
  float x0 = x == x ? x : 0.0f;  // the polynomial sees a finite argument
  x0 = x0 > hi ? hi : x0;
  x0 = x0 < lo ? lo : x0;
  // Round to nearest with the 1.5 * 2^23 trick: no floor() call, vectorizes.
  const float shifter = 12582912.0f;
  float t = x0 * 1.44269504088896341f + shifter;
  float n = t - shifter;
  float r = x0 - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t e = static_cast<int32_t>(n) + 127;
  e <<= 23;
  float scale;
  std::memcpy(&scale, &e, sizeof(scale));
  float y = p * scale;
  y = x > hi ? __builtin_inff() : y;
  y = x < lo ? 0.0f : y;
  return x == x ? y : x;
}

// tanh(x) for float on the host, after Cephes' tanhf: an odd polynomial near
// zero (no cancellation), 1 - 2/(exp(2|x|)+1) elsewhere. Both sides are
// computed and one selected, so the loop stays branch-free.
PIPELSTM_HD float host_tanhf(float x) {
  float a = x < 0.0f ? -x : x;
  float z = x * x;
  float small = -5.70498872745e-3f;
  small = small * z + 2.06390887954e-2f;
  small = small * z - 5.37397155531e-2f;
  small = small * z + 1.33314422036e-1f;
  small = small * z - 3.33332819422e-1f;
  small = small * z * x + x;
  float large = 1.0f - 2.0f / (host_expf(2.0f * a) + 1.0f);
  large = x < 0.0f ? -large : large;
  return a < 0.625f ? small : large;
}

// float: the device's own functions on a GPU, the branch-free ones above on
// the host; double: the C library's everywhere.
#if defined(__CUDA_ARCH__)
PIPELSTM_HD float exp(float x) { return ::expf(x); }
PIPELSTM_HD float tanh(float x) { return ::tanhf(x); }
#else
PIPELSTM_HD float exp(float x) { return host_expf(x); }
PIPELSTM_HD float tanh(float x) { return host_tanhf(x); }
#endif
PIPELSTM_HD double exp(double x) { return ::exp(x); }
PIPELSTM_HD double tanh(double x) { return ::tanh(x); }

template <typename T>
PIPELSTM_HD T sigmoid(T x) {
  return T(1) / (T(1) + exp(-x));
}

// The activated gates of one element, and the new cell and hidden values.
template <typename T>
struct CellForward {
  T i, f, g, o;  // activated gates
  T c;           // new cell state
  T h;           // new hidden state (before any projection)
};

// Forward step of one element: pre-activations (i, f, g, o) and the previous
// cell value in, activated gates and the new c and h out.
template <typename T>
PIPELSTM_HD CellForward<T> cell_forward(T pre_i, T pre_f, T pre_g, T pre_o, T c_prev) {
  CellForward<T> r;
  r.i = sigmoid(pre_i);
  r.f = sigmoid(pre_f);
  r.g = tanh(pre_g);
  r.o = sigmoid(pre_o);
  r.c = r.f * c_prev + r.i * r.g;
  r.h = r.o * tanh(r.c);
  return r;
}

// Gradients of one element with respect to the gate pre-activations and the
// previous cell value.
template <typename T>
struct CellBackward {
  T d_i, d_f, d_g, d_o;  // gradients of the pre-activations
  T d_c_prev;
};

// Backward step of one element. grad_h and grad_c are the incoming gradients
// of this step's h and c (grad_c already includes the next step's flow); the
// activated gates, c_prev and the new c come from the forward workspace.
template <typename T>
PIPELSTM_HD CellBackward<T> cell_backward(T grad_h, T grad_c, T i, T f, T g, T o, T c_prev,
                                          T c) {
  const T tanh_c = tanh(c);
  const T dc = grad_c + grad_h * o * (T(1) - tanh_c * tanh_c);
  CellBackward<T> r;
  r.d_i = dc * g * i * (T(1) - i);
  r.d_f = dc * c_prev * f * (T(1) - f);
  r.d_g = dc * i * (T(1) - g * g);
  r.d_o = grad_h * tanh_c * o * (T(1) - o);
  r.d_c_prev = dc * f;
  return r;
}

// Zoneout (Krueger et al. 2016): each unit of c and h keeps its previous
// value with weight `keep` (a 0/1 mask while training, the probability in
// evaluation) and takes the new one with 1 - keep. h is computed from the
// new cell before it is blended, as in the paper.
template <typename T>
PIPELSTM_HD T zoned(T fresh, T prev, T keep) {
  return fresh + keep * (prev - fresh);
}

// Backward step of one element under zoneout with keep weights keep_c,
// keep_h: grad_h and grad_c are the gradients of the blended h and c. The
// new (unblended) cell is recomputed from the gates. The part of grad_h
// that flows straight to the previous h is keep_h * grad_h (the caller's).
template <typename T>
PIPELSTM_HD CellBackward<T> cell_backward_zoneout(T grad_h, T grad_c, T i, T f, T g, T o,
                                                  T c_prev, T keep_c, T keep_h) {
  const T fresh_c = f * c_prev + i * g;
  CellBackward<T> r = cell_backward((T(1) - keep_h) * grad_h, (T(1) - keep_c) * grad_c, i, f, g,
                                    o, c_prev, fresh_c);
  r.d_c_prev += keep_c * grad_c;
  return r;
}

}  // namespace math
}  // namespace pipelstm
