// The cluster-resident persistent LSTM forward (lstm_persistent_cluster.h):
// one cluster of up to 16 blocks, each with its slice of w_hh and a copy of
// h_{t-1} in shared memory; each block stores the h it finishes into every
// block's copy (distributed shared memory); a cluster barrier between steps.
#include <cooperative_groups.h>

#include <cstdint>

#include "device_limits.h"
#include "pipelstm/kernels/lstm_persistent_cluster_cuda.h"
#include "pipelstm/kernels/lstm_pointwise_indexing.h"
#include "tc_device.cuh"

namespace pipelstm {
namespace kernels {
namespace {

using namespace tc_device;  // and its cg, Load, Store

template <typename T>
__device__ __forceinline__ unsigned short bits(T v) {
  return *reinterpret_cast<const unsigned short*>(&v);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Hopper's distributed-shared-memory stores and transaction barriers (PTX ISA:
// mapa, st.async, mbarrier with expect-tx / complete-tx).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The same shared-memory address in block `rank` of the cluster.
__device__ __forceinline__ uint32_t peer(uint32_t addr, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(addr), "r"(rank));
  return out;
}

// Stores `value` at `remote` and counts its 4 bytes on the mbarrier `remote_bar` (both in one peer).
__device__ __forceinline__ void store_async(uint32_t remote, uint32_t value, uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [%0], %1, [%2];"
               :: "r"(remote), "r"(value), "r"(remote_bar) : "memory");
}

__device__ __forceinline__ void barrier_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(bar)) : "memory");
}

// This phase completes once this arrival is in and `bytes` have come.
__device__ __forceinline__ void arrive_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;"
               :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void wait_parity(uint64_t* bar, uint32_t parity) {
  asm volatile("{\n"
               ".reg .pred done;\n"
               "WAIT_%=:\n"
               "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra WAIT_%=;\n"
               "}\n" :: "r"(smem_addr(bar)), "r"(parity) : "memory");
}
#endif

template <typename T, cluster::Sync kSync>
__global__ void __launch_bounds__(tc::kThreads, 1)
    cluster_forward_kernel(const PersistentForwardArgs<T> a, const cluster::ClusterPlan c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kAsync = kSync == cluster::Sync::kAsyncStores;
  extern __shared__ uint4 smem[];
  const tc::ForwardPlan& p = c.tiles;
  cg::cluster_group cluster = cg::this_cluster();
  const Block b = start_block(cluster.block_rank(), smem, a.w_hh, p);
  auto* h = reinterpret_cast<unsigned short*>(reinterpret_cast<char*>(smem) + cluster::h_copies_offset(c));
  auto* bar = reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(smem) + cluster::barriers_offset(c));
  const int blocks = static_cast<int>(cluster.num_blocks());
  const Load<T> load;
  const Store<T> store;
  // Every copy's padding is zero for good (no block writes there but
  // zeros); copy 0 starts as h_{-1}, the h the first step reads (h0, or the
  // state a reverse direction starts from).
  const int64_t copy = cluster::h_copy_halves(c);
  for (int64_t i = threadIdx.x; i < c.copies * copy; i += tc::kThreads) {
    const int64_t n = (i % copy) / c.stride, k = (i % copy) % c.stride;
    if (n >= p.batch || k >= p.hidden) {
      h[i] = 0;
    } else if (i < copy) {
      h[i] = bits(persistent::h_prev_row(a, 0, n)[k]);
    }
  }
  if constexpr (kAsync) {
    if (threadIdx.x == 0) {
      for (int i = 0; i < c.copies; ++i) barrier_init(bar + i);
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
  }
  // Every block's copies (and barriers) exist before any block stores into them.
  cluster.sync();

  // Where each warp finishes at most one item a step (the same one every
  // step), a lane loads what its cells read besides the product (the input
  // gates, c_{t-1}) for the next step as soon as it has finished this one,
  // so those loads travel while the block waits for the next h.
  const bool ahead_of_time = p.slices > 1 || tc::item_count(p) <= tc::kWarps;
  tc::FwdCells ahead{};

  for (int64_t pos = 0; pos < a.steps; ++pos) {
    const int64_t t = persistent::step_at(pos, a.steps, a.reverse);
    const int buf = static_cast<int>(pos % c.copies), next = static_cast<int>((pos + 1) % c.copies);
    const bool last = pos == a.steps - 1;  // its h is read by no step
    if constexpr (kAsync) {
      if (threadIdx.x == 0 && !last) arrive_expect(bar + next, static_cast<uint32_t>(cluster::fill_bytes(c)));
      if (pos > 0) wait_parity(bar + buf, static_cast<uint32_t>(((pos - 1) / c.copies) & 1));
      // The last step's K-slice sums are read before this step's are
      // written: the h copies' barrier orders only the lanes that stored.
      if (pos > 0 && p.slices > 1) __syncthreads();
    }
    forward_step<T>(
        p, b,
        [&](const tc::Item& w) {
          return ahead_of_time && pos > 0 ? ahead : tc::fwd_cells(a, p, b.index, w, b.lane, t, pos, load);
        },
        [&](const tc::Item& w, int64_t kt, int r) {
          // Columns k, k + 1 of batch row n (k even): one aligned 32-bit
          // word of this block's copy, padding included.
          const tc::BSource lo = tc::fwd_b_source(p, w.n_tile, kt, b.lane, 2 * r);
          return *reinterpret_cast<const uint32_t*>(h + cluster::h_index(c, buf, lo.n, lo.k));
        },
        [&](const tc::Item& w, const tc::FwdCells& in, const float (&acc)[8]) {
          uint32_t mine0 = 0u, mine1 = 0u;  // this lane's two cells' h: rows n0, n0 + 1 of one unit
          tc::fwd_finish(a, in, b.lane, t, acc, store, [&](int64_t n, int64_t j, T v) {
            if constexpr (kAsync) {
              (n == in.row[0] ? mine0 : mine1) = bits(v);
            } else if (!last) {
              const int64_t at = cluster::h_index(c, next, n, j);
              for (int rank = 0; rank < blocks; ++rank) cluster.map_shared_rank(h, rank)[at] = bits(v);
            }
          });
          if constexpr (kAsync) {
            // The lane 4 up holds the next unit of the same rows: lanes of
            // even groupID store units (j, j + 1) as one word a row.
            const uint32_t up = __shfl_down_sync(0xffffffffu, mine0 | mine1 << 16, 4);
            for (int cell = 0; cell < 2 && !last && !((b.lane >> 2) & 1); ++cell) {
              if (!in.valid[cell]) continue;
              const uint32_t word = (cell == 0 ? mine0 : mine1) | ((up >> (16 * cell)) & 0xffffu) << 16;
              const uint32_t at = smem_addr(h + cluster::h_index(c, next, in.row[cell], in.unit[cell]));
              const uint32_t at_bar = smem_addr(bar + next);
              for (int rank = 0; rank < blocks; ++rank) store_async(peer(at, rank), word, peer(at_bar, rank));
            }
          }
          if (ahead_of_time && !last) {  // c_{t-1} of step pos + 1 is the c this lane just wrote
            ahead = tc::fwd_cells(a, p, b.index, w, b.lane, persistent::step_at(pos + 1, a.steps, a.reverse), pos + 1,
                                  load);
          }
        });
    if constexpr (!kAsync) {
      // Every block's h_t is in every copy before step pos + 1 reads it, and
      // every read of this step's copy (and of `partial`) is done before the
      // next step stores into them.
      cluster.sync();
    }
  }
  if constexpr (kAsync) {
    cluster.sync();  // no block leaves while another may still store into it
  }
#else
  __trap();  // never launched there: the plan answers TcFit::kArchitecture
#endif
}

// The backward in one cluster (BackwardClusterPlan): positions steps - 1
// .. 0 run the cell backward and store their grad_gates into every block's
// copy; every position but the first takes the product of the copy the
// position before it filled; position -1 writes grad_h0.
template <typename T>
__global__ void __launch_bounds__(tc::kThreads, 1)
    cluster_backward_kernel(const PersistentBackwardArgs<T> a, const cluster::BackwardClusterPlan c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ uint4 smem[];
  const tc::BackwardPlan& p = c.tiles;
  cg::cluster_group cluster = cg::this_cluster();
  const Block b = start_block(cluster.block_rank(), smem, a.w_hh, p);
  auto* g = reinterpret_cast<unsigned short*>(reinterpret_cast<char*>(smem) + cluster::copies_offset(c));
  const int blocks = static_cast<int>(cluster.num_blocks());
  const Load<T> load;
  const Store<T> store;
  const int64_t copy = cluster::copy_halves(c);
  for (int64_t i = threadIdx.x; i < 2 * copy; i += tc::kThreads) {  // the padding: zero for good
    const int64_t n = (i % copy) / c.stride, k = (i % copy) % c.stride;
    if (n >= p.batch || k >= 4 * a.hidden) g[i] = 0;
  }
  cluster.sync();

  // Stores a cell's gate gradients into copy `buf` of every block.
  const auto broadcast = [&](int buf, int64_t n, int64_t j, T d_i, T d_f, T d_g, T d_o) {
    const T d[4] = {d_i, d_f, d_g, d_o};
    for (int rank = 0; rank < blocks; ++rank) {
      unsigned short* peer = cluster.map_shared_rank(g, rank);
#pragma unroll
      for (int k = 0; k < 4; ++k) peer[cluster::gates_index(c, buf, n, k * a.hidden + j)] = bits(d[k]);
    }
  };

  // Position pos stores its grad_gates into copy pos & 1 and reads the
  // product's from copy (pos + 1) & 1, which the position before filled.
  backward_positions(
      a, p, b, load, store,
      [&](int64_t pos, const tc::Item& w, int64_t kt, int r) {
        const tc::BSource lo = tc::bwd_b_source(p, w.n_tile, kt, b.lane, 2 * r);
        const int read = static_cast<int>((pos + 1) & 1);
        return *reinterpret_cast<const uint32_t*>(g + cluster::gates_index(c, read, lo.n, lo.k));
      },
      [&](int64_t pos, int64_t t, const tc::BwdCells& in, const float (&acc)[4]) {
        tc::bwd_finish(a, in, t, pos, acc, store, [&](int64_t n, int64_t j, T i, T f, T gg, T o) {
          broadcast(static_cast<int>(pos & 1), n, j, i, f, gg, o);
        });
      },
      // A position's grad_gates are in every copy before the next product
      // reads them, and its product's reads are done before the next
      // position stores into the copy they read.
      [&] { cluster.sync(); });
#else
  __trap();  // never launched there: the plan answers TcFit::kArchitecture
#endif
}

// The launch of one cluster of `blocks` blocks with `smem` bytes each
// (`attr`, which it points to, must outlive it).
cudaLaunchConfig_t cluster_config(int64_t blocks, int64_t smem, cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(tc::kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(smem);
  config.stream = stream;
  *attr = {};
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = static_cast<unsigned>(blocks);
  attr->val.clusterDim.y = attr->val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  return config;
}

// Sets `kernel`'s shared-memory and cluster-size limits and asks whether the
// device can hold its cluster at once.
cudaError_t check_cluster(const void* kernel, int64_t blocks, int64_t smem, TcFit* fit) {
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err == cudaSuccess && blocks > 8) {  // above the portable size
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  }
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config = cluster_config(blocks, smem, nullptr, &attr);
  int clusters = 0;
  err = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
  if (err != cudaSuccess) return err;
  *fit = clusters >= 1 ? TcFit::kFits : TcFit::kCoResidency;
  return cudaSuccess;
}

template <typename T>
auto* kernel_for(cluster::Sync sync) {
  return sync == cluster::Sync::kAsyncStores ? cluster_forward_kernel<T, cluster::Sync::kAsyncStores>
                                              : cluster_forward_kernel<T, cluster::Sync::kClusterBarrier>;
}

// The checks both directions make before the geometry: sets *fit, and
// *limits where it is still kFits.
cudaError_t check_shape(int64_t batch, int64_t hidden, int64_t blocks, int device, DeviceLimits* limits,
                        TcFit* fit) {
  *fit = TcFit::kBadShape;
  if (batch <= 0 || hidden <= 0 || blocks < 0 || blocks > cluster::kMaxCluster || blocks == 1) {
    return cudaSuccess;
  }
  if (batch > tc::kMaxBatch) {
    *fit = TcFit::kBatchTooLarge;
    return cudaSuccess;
  }
  const cudaError_t err = device_limits(device, limits);
  if (err != cudaSuccess) return err;
  *fit = limits->major < 9 ? TcFit::kArchitecture : TcFit::kFits;
  return cudaSuccess;
}

}  // namespace

template <typename T>
cudaError_t cluster_forward_plan(int64_t batch, int64_t hidden, int64_t blocks, cluster::Sync sync, int device,
                                 cluster::ClusterPlan* plan, TcFit* fit) {
  DeviceLimits limits;
  const cudaError_t err = check_shape(batch, hidden, blocks, device, &limits, fit);
  if (err != cudaSuccess || *fit != TcFit::kFits) return err;
  const int64_t n = blocks ? blocks
                           : cluster::smallest_cluster(batch, hidden, cluster::kMaxCluster, limits.smem_per_block,
                                                       sync);
  cluster::ClusterPlan c = cluster::make_cluster_plan(batch, hidden, n ? n : cluster::kMaxCluster, sync);
  if (c.tiles.blocks == 1) {
    // All units in one block: no peer to store into, and st.async wants one
    // (compute-sanitizer: "Cluster needs to have at least 2 blocks").
    c = cluster::make_cluster_plan(batch, hidden, 1, cluster::Sync::kClusterBarrier);
  }
  if (n == 0 || cluster::cluster_smem_bytes(c) > limits.smem_per_block) {
    *fit = TcFit::kSharedMemory;
    return cudaSuccess;
  }
  *plan = c;
  return check_cluster(reinterpret_cast<const void*>(kernel_for<T>(c.sync)), c.tiles.blocks,
                       cluster::cluster_smem_bytes(c), fit);
}

template <typename T>
cudaError_t cluster_forward_cuda(const PersistentForwardArgs<T>& args, int64_t blocks, cluster::Sync sync,
                                 cudaStream_t stream, TcFit* fit) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  cluster::ClusterPlan c;
  err = cluster_forward_plan<T>(args.batch, args.hidden, blocks, sync, device, &c, fit);
  if (err != cudaSuccess || *fit != TcFit::kFits || args.steps == 0) return err;
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config = cluster_config(c.tiles.blocks, cluster::cluster_smem_bytes(c), stream, &attr);
  return cudaLaunchKernelEx(&config, kernel_for<T>(c.sync), args, c);
}

template <typename T>
cudaError_t cluster_backward_plan(int64_t batch, int64_t hidden, int64_t blocks, int device,
                                  cluster::BackwardClusterPlan* plan, TcFit* fit) {
  DeviceLimits limits;
  const cudaError_t err = check_shape(batch, hidden, blocks, device, &limits, fit);
  if (err != cudaSuccess || *fit != TcFit::kFits) return err;
  const int64_t n =
      blocks ? blocks : cluster::smallest_backward_cluster(batch, hidden, cluster::kMaxCluster, limits.smem_per_block);
  const cluster::BackwardClusterPlan c =
      cluster::make_backward_cluster_plan(batch, hidden, n ? n : cluster::kMaxCluster);
  if (n == 0 || cluster::cluster_smem_bytes(c) > limits.smem_per_block) {
    *fit = TcFit::kSharedMemory;
    return cudaSuccess;
  }
  *plan = c;
  return check_cluster(reinterpret_cast<const void*>(cluster_backward_kernel<T>), c.tiles.blocks,
                       cluster::cluster_smem_bytes(c), fit);
}

template <typename T>
cudaError_t cluster_backward_cuda(const PersistentBackwardArgs<T>& args, int64_t blocks, cudaStream_t stream,
                                  TcFit* fit) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (args.steps <= 0) {
    *fit = TcFit::kBadShape;
    return cudaSuccess;
  }
  cluster::BackwardClusterPlan c;
  err = cluster_backward_plan<T>(args.batch, args.hidden, blocks, device, &c, fit);
  if (err != cudaSuccess || *fit != TcFit::kFits) return err;
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config = cluster_config(c.tiles.blocks, cluster::cluster_smem_bytes(c), stream, &attr);
  return cudaLaunchKernelEx(&config, cluster_backward_kernel<T>, args, c);
}

#define PIPELSTM_INSTANTIATE_CLUSTER(T)                                                          \
  template cudaError_t cluster_forward_plan<T>(int64_t, int64_t, int64_t, cluster::Sync, int,   \
                                               cluster::ClusterPlan*, TcFit*);                   \
  template cudaError_t cluster_forward_cuda<T>(const PersistentForwardArgs<T>&, int64_t,         \
                                               cluster::Sync, cudaStream_t, TcFit*);              \
  template cudaError_t cluster_backward_plan<T>(int64_t, int64_t, int64_t, int,                  \
                                                cluster::BackwardClusterPlan*, TcFit*);           \
  template cudaError_t cluster_backward_cuda<T>(const PersistentBackwardArgs<T>&, int64_t,        \
                                                cudaStream_t, TcFit*);

PIPELSTM_INSTANTIATE_CLUSTER(__half)
PIPELSTM_INSTANTIATE_CLUSTER(__nv_bfloat16)

#undef PIPELSTM_INSTANTIATE_CLUSTER

}  // namespace kernels
}  // namespace pipelstm
