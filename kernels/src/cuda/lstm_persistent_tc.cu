// The persistent tensor-core LSTM forward and backward (lstm_persistent_tc.h):
// one cooperative launch per sequence, each block's slice of w_hh resident in
// shared memory in mma fragment order, mma.sync m16n8k16 per step, the cell
// math on the accumulators, a grid-wide barrier between steps.
#include <cooperative_groups.h>

#include <cstdint>
#include <type_traits>

#include "device_limits.h"
#include "pipelstm/kernels/lstm_persistent_tc_cuda.h"
#include "pipelstm/kernels/lstm_pointwise_indexing.h"
#include "tc_device.cuh"

namespace pipelstm {
namespace kernels {
namespace {

using namespace tc_device;  // and its cg, Load, Store

// Register r (0 or 1) of a lane's B fragment: elements 2r (low half) and
// 2r + 1 (high half), consecutive columns k, k + 1 of one h row. h_{t-1}
// was written by other blocks before the last grid barrier: read through L2
// (__ldcg), never from a line this SM's L1 might hold from earlier.
template <typename T>
__device__ __forceinline__ uint32_t load_b(const PersistentForwardArgs<T>& a,
                                           const tc::ForwardPlan& p, int64_t pos,
                                           const tc::Item& w, int64_t kt, int lane, int r,
                                           bool paired) {
  const tc::BSource lo = tc::fwd_b_source(p, w.n_tile, kt, lane, 2 * r);
  if (!lo.valid) return 0u;  // then the high element is out of range too
  const tc::BSource hi = tc::fwd_b_source(p, w.n_tile, kt, lane, 2 * r + 1);
  const auto* row =
      reinterpret_cast<const unsigned short*>(persistent::h_prev_row(a, pos, lo.n));
  if (paired) return __ldcg(reinterpret_cast<const unsigned int*>(row + lo.k));
  uint32_t v = __ldcg(row + lo.k);
  if (hi.valid) v |= static_cast<uint32_t>(__ldcg(row + hi.k)) << 16;
  return v;
}

// `paired`: H is even and h0 / output are 4-byte aligned, so both elements of
// a B register are one aligned 32-bit load.
template <typename T>
__global__ void __launch_bounds__(tc::kThreads, 1)
    tc_forward_kernel(const PersistentForwardArgs<T> a, const tc::ForwardPlan p,
                      const bool paired) {
  extern __shared__ uint4 smem[];
  const Block b = start_block(blockIdx.x, smem, a.w_hh, p);
  cg::grid_group grid = cg::this_grid();
  const Load<T> load;
  const Store<T> store;

  for (int64_t pos = 0; pos < a.steps; ++pos) {
    const int64_t t = persistent::step_at(pos, a.steps, a.reverse);
    forward_step<T>(
        p, b,
        [&](const tc::Item& w) { return tc::fwd_cells(a, p, b.index, w, b.lane, t, pos, load); },
        [&](const tc::Item& w, int64_t kt, int r) { return load_b(a, p, pos, w, kt, b.lane, r, paired); },
        [&](const tc::Item&, const tc::FwdCells& in, const float (&acc)[8]) {
          tc::fwd_finish(a, in, b.lane, t, acc, store);
        });
    // h_t and c_t of every unit are visible to every block before step
    // pos + 1; the barrier also orders this step's reads of `partial` before
    // the next step's writes.
    grid.sync();
  }
}

// Register r of a lane's backward B fragment: gate columns k, k + 1 (k
// even, 4H even: both in range or neither) of a grad_gates row written by
// other blocks before the last grid barrier, read through L2.
template <typename T>
__device__ __forceinline__ uint32_t load_bwd_b(const PersistentBackwardArgs<T>& a,
                                               const tc::BackwardPlan& p, int64_t pos,
                                               const tc::Item& w, int64_t kt, int lane, int r,
                                               bool paired) {
  const tc::BSource lo = tc::bwd_b_source(p, w.n_tile, kt, lane, 2 * r);
  if (!lo.valid) return 0u;
  const auto* row = reinterpret_cast<const unsigned short*>(tc::bwd_b_row(a, pos, lo.n));
  if (paired) return __ldcg(reinterpret_cast<const unsigned int*>(row + lo.k));
  return static_cast<uint32_t>(__ldcg(row + lo.k)) |
         static_cast<uint32_t>(__ldcg(row + lo.k + 1)) << 16;
}

// Positions steps - 1 .. 0 run the cell backward, position -1 writes
// grad_h0; every position but the first takes the product of the grad_gates
// the previous position wrote. `paired`: grad_gates is 4-byte aligned.
template <typename T>
__global__ void __launch_bounds__(tc::kThreads, 1)
    tc_backward_kernel(const PersistentBackwardArgs<T> a, const tc::BackwardPlan p,
                       const bool paired) {
  extern __shared__ uint4 smem[];
  const Block b = start_block(blockIdx.x, smem, a.w_hh, p);
  cg::grid_group grid = cg::this_grid();
  const Load<T> load;
  const Store<T> store;

  backward_positions(
      a, p, b, load, store,
      [&](int64_t pos, const tc::Item& w, int64_t kt, int r) {
        return load_bwd_b(a, p, pos, w, kt, b.lane, r, paired);
      },
      [&](int64_t pos, int64_t t, const tc::BwdCells& in, const float (&acc)[4]) {
        tc::bwd_finish(a, in, t, pos, acc, store);
      },
      [&] { grid.sync(); });
}

bool aligned4(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 4 == 0; }

// Whether `blocks` blocks of `kernel` with `smem` bytes each fit on the
// device at once; sets the kernel's shared-memory limit on the way.
cudaError_t check_fit(const void* kernel, int64_t smem, int64_t blocks,
                      const DeviceLimits& limits, TcFit* fit) {
  if (smem > limits.smem_per_block) {
    *fit = TcFit::kSharedMemory;
    return cudaSuccess;
  }
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  int per_sm = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, tc::kThreads,
                                                      static_cast<size_t>(smem));
  if (err != cudaSuccess) return err;
  *fit = per_sm * limits.multiprocessors >= blocks ? TcFit::kFits : TcFit::kCoResidency;
  return cudaSuccess;
}

// The checks both directions share before the geometry; *limits is set
// where *fit is still kFits.
cudaError_t check_shape(int64_t batch, int64_t hidden, int64_t unit_tiles, int device,
                        DeviceLimits* limits, TcFit* fit) {
  *fit = TcFit::kBadShape;
  if (batch <= 0 || hidden <= 0 || unit_tiles < 0) return cudaSuccess;
  if (batch > tc::kMaxBatch) {
    *fit = TcFit::kBatchTooLarge;
    return cudaSuccess;
  }
  const cudaError_t err = device_limits(device, limits);
  if (err != cudaSuccess) return err;
  if (limits->major < 8) {
    *fit = TcFit::kArchitecture;
    return cudaSuccess;
  }
  *fit = limits->cooperative ? TcFit::kFits : TcFit::kNoCooperativeLaunch;
  return cudaSuccess;
}

// The plan of one direction on `device`: the shape checks both directions
// share, the unit tiles per block (default_tiles(hidden, SMs) where 0), the
// plan (make(batch, hidden, unit_tiles)) and whether its blocks, with
// smem_bytes(plan) each, are resident at once.
template <typename Plan>
cudaError_t plan_for(const void* kernel, int64_t batch, int64_t hidden, int64_t unit_tiles,
                     int device, int64_t (*default_tiles)(int64_t, int64_t),
                     Plan (*make)(int64_t, int64_t, int64_t), int64_t (*smem_bytes)(const Plan&),
                     Plan* plan, TcFit* fit) {
  DeviceLimits limits;
  const cudaError_t err = check_shape(batch, hidden, unit_tiles, device, &limits, fit);
  if (err != cudaSuccess || *fit != TcFit::kFits) return err;
  if (unit_tiles == 0) unit_tiles = default_tiles(hidden, limits.multiprocessors);
  *plan = make(batch, hidden, unit_tiles);
  return check_fit(kernel, smem_bytes(*plan), plan->blocks, limits, fit);
}

// One cooperative launch of `kernel` (args, plan, paired) over its plan
// (plan_of) on the current device; nothing runs for a plan that does not
// fit, nor for zero steps (which fit only where steps_zero_fits).
template <typename Args, typename Plan>
cudaError_t launch(void* kernel, const Args& args, int64_t unit_tiles, bool steps_zero_fits,
                   bool paired,
                   cudaError_t (*plan_of)(int64_t, int64_t, int64_t, int, Plan*, TcFit*),
                   int64_t (*smem_bytes)(const Plan&), cudaStream_t stream, TcFit* fit) {
  *fit = TcFit::kBadShape;
  if (args.steps < 0 || (args.steps == 0 && !steps_zero_fits)) return cudaSuccess;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  Plan plan;
  err = plan_of(args.batch, args.hidden, unit_tiles, device, &plan, fit);
  if (err != cudaSuccess || *fit != TcFit::kFits || args.steps == 0) return err;
  Args a = args;
  void* params[] = {&a, &plan, &paired};
  return cudaLaunchCooperativeKernel(kernel, dim3(static_cast<unsigned>(plan.blocks)),
                                     dim3(tc::kThreads), params,
                                     static_cast<size_t>(smem_bytes(plan)), stream);
}

}  // namespace

const char* tc_fit_message(TcFit fit) {
  switch (fit) {
    case TcFit::kFits:
      return "the persistent tensor-core kernel fits";
    case TcFit::kBadShape:
      return "batch, hidden and unit tiles per block must be positive and steps non-negative";
    case TcFit::kBatchTooLarge:
      return "the persistent tensor-core kernel takes a batch of at most 64";
    case TcFit::kArchitecture:
      return "the persistent tensor-core kernel needs compute capability 8.0 or newer";
    case TcFit::kNoCooperativeLaunch:
      return "the device cannot launch cooperative kernels";
    case TcFit::kSharedMemory:
      return "a block's slice of w_hh does not fit in shared memory";
    case TcFit::kCoResidency:
      return "not every block of the persistent tensor-core kernel can be resident at once";
  }
  return "unknown TcFit value";
}

template <typename T>
cudaError_t tc_persistent_forward_plan(int64_t batch, int64_t hidden, int64_t unit_tiles,
                                       int device, tc::ForwardPlan* plan, TcFit* fit) {
  return plan_for(reinterpret_cast<const void*>(tc_forward_kernel<T>), batch, hidden, unit_tiles,
                  device, &tc::default_unit_tiles, &tc::make_forward_plan,
                  &tc::forward_smem_bytes, plan, fit);
}

template <typename T>
cudaError_t tc_persistent_forward_cuda(const PersistentForwardArgs<T>& args, int64_t unit_tiles,
                                       cudaStream_t stream, TcFit* fit) {
  return launch(reinterpret_cast<void*>(tc_forward_kernel<T>), args, unit_tiles,
                /*steps_zero_fits=*/true,
                args.hidden % 2 == 0 && aligned4(args.h0) && aligned4(args.output),
                &tc_persistent_forward_plan<T>, &tc::forward_smem_bytes, stream, fit);
}

template <typename T>
cudaError_t tc_persistent_backward_plan(int64_t batch, int64_t hidden, int64_t unit_tiles,
                                        int device, tc::BackwardPlan* plan, TcFit* fit) {
  return plan_for(reinterpret_cast<const void*>(tc_backward_kernel<T>), batch, hidden,
                  unit_tiles, device, &tc::default_backward_unit_tiles, &tc::make_backward_plan,
                  &tc::backward_smem_bytes, plan, fit);
}

template <typename T>
cudaError_t tc_persistent_backward_cuda(const PersistentBackwardArgs<T>& args,
                                        int64_t unit_tiles, cudaStream_t stream, TcFit* fit) {
  return launch(reinterpret_cast<void*>(tc_backward_kernel<T>), args, unit_tiles,
                /*steps_zero_fits=*/false, aligned4(args.grad_gates),
                &tc_persistent_backward_plan<T>, &tc::backward_smem_bytes, stream, fit);
}

// The four entry points for storage type T.
#define PIPELSTM_INSTANTIATE_TC(T)                                                               \
  template cudaError_t tc_persistent_forward_plan<T>(int64_t, int64_t, int64_t, int,             \
                                                     tc::ForwardPlan*, TcFit*);                  \
  template cudaError_t tc_persistent_forward_cuda<T>(const PersistentForwardArgs<T>&, int64_t,   \
                                                     cudaStream_t, TcFit*);                      \
  template cudaError_t tc_persistent_backward_plan<T>(int64_t, int64_t, int64_t, int,            \
                                                      tc::BackwardPlan*, TcFit*);                \
  template cudaError_t tc_persistent_backward_cuda<T>(const PersistentBackwardArgs<T>&, int64_t, \
                                                      cudaStream_t, TcFit*);

PIPELSTM_INSTANTIATE_TC(__half)
PIPELSTM_INSTANTIATE_TC(__nv_bfloat16)

#undef PIPELSTM_INSTANTIATE_TC

}  // namespace kernels
}  // namespace pipelstm
