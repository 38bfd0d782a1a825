// The LayerNorm LSTM layer ops on the CPU (float32 and float64): the loop
// of layernorm_layer_loop.h on the CPU's row loops, split over ATen's
// threads, and its GEMMs (the recurrent operand packed once for every step).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <tuple>

#include "../layernorm_layer_loop.h"
#include "gemm_cpu.h"
#include "layer_math_cpu.h"
#include "pipelstm/kernels/layernorm_lstm_rows.h"

namespace pipelstm {
namespace {

using layernorm::mut;
using layernorm::ptr;

// f(begin, end) over rows [0, n) on ATen's threads.
template <class F>
void over_rows(int64_t n, int64_t width, F&& f) {
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(width, 1));
  at::parallel_for(0, n, grain, f);
}

// Over all rows, the column sums of a * b, of a * b2 (if given) and of a
// (gains' and biases' gradients) in one pass with no temporaries. The
// threads split the columns, so each sum's order is the same on any number
// of threads.
std::tuple<Tensor, Tensor, Tensor> column_sums(const Tensor& a, const Tensor& b, const OptTensor& b2) {
  const int64_t rows = a.size(0), width = a.size(1);
  Tensor ab = at::zeros({width}, a.options()), ab2 = at::zeros({b2.has_value() ? width : 0}, a.options());
  Tensor sum = at::zeros({width}, a.options());
  constexpr int64_t kColumns = 64;
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "pipelstm_column_sums", [&] {
    const scalar_t* pa = ptr<scalar_t>(a);
    const scalar_t* pb = ptr<scalar_t>(b);
    const scalar_t* pb2 = b2.has_value() ? ptr<scalar_t>(*b2) : nullptr;
    at::parallel_for(0, (width + kColumns - 1) / kColumns, 1, [&](int64_t block0, int64_t block1) {
      const int64_t j0 = block0 * kColumns, j1 = std::min(width, block1 * kColumns);
      scalar_t* sab = mut<scalar_t>(ab) + j0;
      scalar_t* sab2 = pb2 != nullptr ? mut<scalar_t>(ab2) + j0 : nullptr;
      scalar_t* ssum = mut<scalar_t>(sum) + j0;
      const int64_t n = j1 - j0;
      for (int64_t r = 0; r < rows; ++r) {
        const scalar_t* ra = pa + r * width + j0;
        const scalar_t* rb = pb + r * width + j0;
        for (int64_t j = 0; j < n; ++j) {
          sab[j] += ra[j] * rb[j];
          ssum[j] += ra[j];
        }
        if (pb2 != nullptr) {
          const scalar_t* rb2 = pb2 + r * width + j0;
          for (int64_t j = 0; j < n; ++j) sab2[j] += ra[j] * rb2[j];
        }
      }
    });
  });
  return {ab, ab2, sum};
}

struct CpuLayerNorm {
  static constexpr const LayerMath& kMath = cpu::kLayerMath;

  static cpu::PackedOperand recurrent(const Tensor& w, int64_t rows) { return cpu::pack_operand(w, rows); }
  static void recurrent_mm_out(const Tensor& out, const Tensor& a, const cpu::PackedOperand& w, bool accumulate) {
    cpu::packed_mm_out(out, a, w, accumulate);
  }

  template <typename T>
  static void layer_norm_rows(T* x, T* rstd, int64_t n, T eps, int64_t rows) {
    over_rows(rows, n, [&](int64_t b0, int64_t b1) { kernels::layer_norm_rows<T>(x, rstd, n, eps, b0, b1); });
  }
  template <typename T>
  static void layer_norm_backward_rows(T* grad, const T* x_hat, const T* rstd, int64_t n, int64_t rows) {
    over_rows(rows, n, [&](int64_t b0, int64_t b1) {
      kernels::layer_norm_backward_rows<T>(grad, x_hat, rstd, n, b0, b1);
    });
  }
  template <typename T>
  static void step_forward(const kernels::LayerNormStepForwardArgs<T>& a) {
    over_rows(a.batch, 8 * a.hidden,
              [&](int64_t b0, int64_t b1) { kernels::layernorm_step_forward_rows<T>(a, b0, b1); });
  }
  template <typename T>
  static void step_backward(const kernels::LayerNormStepBackwardArgs<T>& a) {
    over_rows(a.batch, 8 * a.hidden,
              [&](int64_t b0, int64_t b1) { kernels::layernorm_step_backward_rows<T>(a, b0, b1); });
  }
  static std::tuple<Tensor, Tensor, Tensor> column_sums(const Tensor& a, const Tensor& b, const OptTensor& b2) {
    return pipelstm::column_sums(a, b, b2);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(pipelstm, CPU, m) {
  m.impl("lstm_layernorm_layer_forward", &layernorm::layernorm_forward<CpuLayerNorm>);
  m.impl("lstm_layernorm_layer_backward", &layernorm::layernorm_backward<CpuLayerNorm>);
}

}  // namespace pipelstm
