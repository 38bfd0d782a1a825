// CUDA kernels of the fused LSTM pointwise step.
//
// Each kernel is a grid-stride loop over work items; the per-item body lives
// in lstm_pointwise_indexing.h so the host harness can test the indexing
// without a GPU. Optional pointers become template flags so the loop has no
// branches, and the 16-byte vector path is chosen on the host.
#include "pipelstm/kernels/lstm_pointwise_cuda.h"

#include <type_traits>

#include "pipelstm/kernels/lstm_pointwise_indexing.h"

namespace pipelstm {
namespace kernels {
namespace {

using indexing::kBlockSize;

// The grid-stride loop around one work-item body (indexing::forward_item or
// indexing::backward_item, with its template flags fixed): item(a, i) for
// every i < items.
template <auto item, typename Args>
__global__ void __launch_bounds__(kBlockSize) items_kernel(const Args a, int64_t items) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < items; i += stride) {
    item(a, i);
  }
}

// Launches items_kernel<item> over the VEC-wide work items of a's
// [batch, hidden] on the capped grid.
template <auto item, int VEC, typename Args>
void launch_items(const Args& a, cudaStream_t stream) {
  const int64_t items = indexing::num_items<VEC>(a.batch, a.hidden);
  const dim3 grid(static_cast<unsigned>(indexing::grid_blocks(items)));
  items_kernel<item><<<grid, kBlockSize, 0, stream>>>(a, items);
}

// Calls f(std::integral_constant<bool, b>{}): runtime flag to template flag.
template <typename F>
void with_flag(bool b, F&& f) {
  if (b) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

template <typename T, int VEC>
void launch_forward(const PointwiseForwardArgs<T>& a, cudaStream_t stream) {
  if (a.keep_c != nullptr) {
    launch_items<&indexing::forward_item<T, VEC, false, false, false, true>, VEC>(a, stream);
    return;
  }
  with_flag(a.hidden_gates != nullptr, [&](auto hid) {
    with_flag(a.bias_ih != nullptr, [&](auto bih) {
      with_flag(a.bias_hh != nullptr, [&](auto bhh) {
        launch_items<&indexing::forward_item<T, VEC, decltype(hid)::value, decltype(bih)::value,
                                             decltype(bhh)::value>,
                     VEC>(a, stream);
      });
    });
  });
}

template <typename T, int VEC>
void launch_backward(const PointwiseBackwardArgs<T>& a, cudaStream_t stream) {
  with_flag(a.grad_h != nullptr, [&](auto gh) {
    with_flag(a.grad_out != nullptr, [&](auto go) {
      with_flag(a.grad_c != nullptr, [&](auto gc) {
        if (a.keep_c != nullptr) {
          launch_items<&indexing::backward_item<T, VEC, decltype(gh)::value, decltype(go)::value,
                                                decltype(gc)::value, true>,
                       VEC>(a, stream);
          return;
        }
        launch_items<&indexing::backward_item<T, VEC, decltype(gh)::value, decltype(go)::value,
                                              decltype(gc)::value>,
                     VEC>(a, stream);
      });
    });
  });
}

template <typename T>
constexpr int kVec = 16 / sizeof(T);  // one 16-byte access per tensor per item

}  // namespace

template <typename T>
cudaError_t pointwise_forward_cuda(const PointwiseForwardArgs<T>& a, cudaStream_t stream) {
  if (a.batch <= 0 || a.hidden <= 0) return cudaSuccess;  // an empty grid is a launch error
  if (indexing::can_vectorize<T, kVec<T>>(a)) {
    launch_forward<T, kVec<T>>(a, stream);
  } else {
    launch_forward<T, 1>(a, stream);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t pointwise_backward_cuda(const PointwiseBackwardArgs<T>& a, cudaStream_t stream) {
  if (a.batch <= 0 || a.hidden <= 0) return cudaSuccess;
  if (indexing::can_vectorize<T, kVec<T>>(a)) {
    launch_backward<T, kVec<T>>(a, stream);
  } else {
    launch_backward<T, 1>(a, stream);
  }
  return cudaGetLastError();
}

// Both entry points for storage type T.
#define PIPELSTM_INSTANTIATE_POINTWISE(T)                                                       \
  template cudaError_t pointwise_forward_cuda<T>(const PointwiseForwardArgs<T>&, cudaStream_t); \
  template cudaError_t pointwise_backward_cuda<T>(const PointwiseBackwardArgs<T>&, cudaStream_t);

PIPELSTM_INSTANTIATE_POINTWISE(float)
PIPELSTM_INSTANTIATE_POINTWISE(__half)
PIPELSTM_INSTANTIATE_POINTWISE(__nv_bfloat16)
PIPELSTM_INSTANTIATE_POINTWISE(double)

#undef PIPELSTM_INSTANTIATE_POINTWISE

}  // namespace kernels
}  // namespace pipelstm
