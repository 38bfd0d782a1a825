// The persistent recurrent forward kernel (lstm_persistent.h): one
// cooperative launch per sequence, w_hh slices resident in shared memory,
// a grid-wide barrier between steps.
#include <cooperative_groups.h>

#include "device_limits.h"
#include "pipelstm/kernels/lstm_persistent_cuda.h"
#include "pipelstm/kernels/lstm_pointwise_indexing.h"

namespace pipelstm {
namespace kernels {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kWarp = 32;

using indexing::Load;
using indexing::Store;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    persistent_forward_kernel(const PersistentForwardArgs<T> a, const int64_t units) {
  extern __shared__ float slice[];  // [units * 4, H]
  cg::grid_group grid = cg::this_grid();
  const int64_t H = a.hidden, B = a.batch;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * units;
  const int64_t mine = j0 < H ? (H - j0 < units ? H - j0 : units) : 0;
  const Load<T> load;
  const Store<T> store;

  for (int64_t e = threadIdx.x; e < mine * 4 * H; e += blockDim.x) {
    const int64_t row = e / H, i = e - row * H;
    const int64_t u = row / 4;
    const int k = static_cast<int>(row - u * 4);
    slice[row * H + i] = load(a.w_hh[(k * H + j0 + u) * H + i]);
  }
  __syncthreads();

  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  for (int64_t p = 0; p < a.steps; ++p) {
    const int64_t t = persistent::step_at(p, a.steps, a.reverse);
    for (int64_t item = warp; item < B * mine; item += warps) {
      const int64_t b = item / mine, u = item - b * mine;
      const T* h_row = persistent::h_prev_row(a, p, b);
      float dot[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        float v = persistent::partial_dot(slice + persistent::slice_row(u, k) * H, h_row, H,
                                          lane, kWarp, load);
#pragma unroll
        for (int offset = kWarp / 2; offset > 0; offset /= 2) {
          v += __shfl_xor_sync(0xffffffffu, v, offset);
        }
        dot[k] = v;
      }
      if (lane == 0) persistent::finish_unit(a, t, p, b, j0 + u, dot, load, store);
    }
    grid.sync();  // h_t and c_t of every unit are visible before step p + 1
  }
}

struct LaunchShape {
  int blocks = 0;
  int64_t units = 0;
  size_t smem = 0;
};

template <typename T>
cudaError_t launch_shape(int64_t hidden, int device, LaunchShape* shape, bool* fits) {
  DeviceLimits limits;
  cudaError_t err = device_limits(device, &limits);
  if (err != cudaSuccess) return err;
  *fits = false;
  if (!limits.cooperative || hidden <= 0) return cudaSuccess;
  shape->units = persistent::units_per_block(hidden, limits.multiprocessors);
  shape->blocks = static_cast<int>((hidden + shape->units - 1) / shape->units);
  shape->smem = static_cast<size_t>(persistent::slice_bytes(shape->units, hidden));
  if (static_cast<int64_t>(shape->smem) > limits.smem_per_block) return cudaSuccess;
  err = cudaFuncSetAttribute(persistent_forward_kernel<T>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(shape->smem));
  if (err != cudaSuccess) return err;
  int per_sm = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_forward_kernel<T>,
                                                      kThreads, shape->smem);
  if (err != cudaSuccess) return err;
  *fits = per_sm * limits.multiprocessors >= shape->blocks;
  return cudaSuccess;
}

}  // namespace

template <typename T>
bool persistent_forward_fits(int64_t hidden, int device) {
  LaunchShape shape;
  bool fits = false;
  return launch_shape<T>(hidden, device, &shape, &fits) == cudaSuccess && fits;
}

template <typename T>
cudaError_t persistent_forward_cuda(const PersistentForwardArgs<T>& args, cudaStream_t stream) {
  if (args.steps <= 0 || args.batch <= 0 || args.hidden <= 0) return cudaSuccess;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  LaunchShape shape;
  bool fits = false;
  err = launch_shape<T>(args.hidden, device, &shape, &fits);
  if (err != cudaSuccess) return err;
  if (!fits) return cudaErrorCooperativeLaunchTooLarge;
  PersistentForwardArgs<T> a = args;
  int64_t units = shape.units;
  void* params[] = {&a, &units};
  return cudaLaunchCooperativeKernel(reinterpret_cast<void*>(persistent_forward_kernel<T>),
                                     dim3(shape.blocks), dim3(kThreads), params, shape.smem,
                                     stream);
}

// Both entry points for storage type T.
#define PIPELSTM_INSTANTIATE_PERSISTENT(T)                \
  template bool persistent_forward_fits<T>(int64_t, int); \
  template cudaError_t persistent_forward_cuda<T>(const PersistentForwardArgs<T>&, cudaStream_t);

PIPELSTM_INSTANTIATE_PERSISTENT(float)
PIPELSTM_INSTANTIATE_PERSISTENT(__half)
PIPELSTM_INSTANTIATE_PERSISTENT(__nv_bfloat16)

#undef PIPELSTM_INSTANTIATE_PERSISTENT

}  // namespace kernels
}  // namespace pipelstm
