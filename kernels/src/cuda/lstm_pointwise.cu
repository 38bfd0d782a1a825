// CUDA kernels of the fused LSTM pointwise step.
//
// Each kernel is a grid-stride loop over work items; the per-item body lives
// in lstm_pointwise_indexing.h so the host harness can test the indexing
// without a GPU. Optional pointers become template flags so the loop has no
// branches, and the 16-byte vector path is chosen on the host.
#include "pipelstm/kernels/lstm_pointwise_cuda.h"

#include "pipelstm/kernels/flag_dispatch.h"
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

template <typename T, int VEC>
void launch_forward(const PointwiseForwardArgs<T>& a, cudaStream_t stream) {
  if (a.keep.on()) {
    launch_items<&indexing::forward_item<T, VEC, false, false, false, true>, VEC>(a, stream);
    return;
  }
  with_flags(
      [&](auto hid, auto bih, auto bhh) {
        launch_items<&indexing::forward_item<T, VEC, decltype(hid)::value, decltype(bih)::value,
                                             decltype(bhh)::value>,
                     VEC>(a, stream);
      },
      a.hidden_gates != nullptr, a.bias_ih != nullptr, a.bias_hh != nullptr);
}

template <typename T, int VEC>
void launch_backward(const PointwiseBackwardArgs<T>& a, cudaStream_t stream) {
  with_flags(
      [&](auto gh, auto go, auto gc, auto zoned) {
        launch_items<&indexing::backward_item<T, VEC, decltype(gh)::value, decltype(go)::value,
                                              decltype(gc)::value, decltype(zoned)::value>,
                     VEC>(a, stream);
      },
      a.grad_h != nullptr, a.grad_out != nullptr, a.grad_c != nullptr, a.keep.on());
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
