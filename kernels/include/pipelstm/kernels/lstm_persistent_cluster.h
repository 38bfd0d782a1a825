// The cluster-resident persistent LSTM forward (Hopper, sm_90): the geometry
// and the shared-memory layout as plain __host__ __device__ functions, for a
// host harness (kernels/tests/persistent_cluster_harness.cpp).
//
// The tensor-core kernel of lstm_persistent_tc.h runs one block per unit
// slice over the whole GPU, reads h_{t-1} from L2 at every step and waits
// at a grid-wide barrier between steps. Here the whole recurrence runs in
// one thread-block cluster (up to 16 blocks on one GPC): each block keeps
// its slice of w_hh in shared memory as before, and also a copy of all of
// h_{t-1} [B, H]; finishing its cells, it stores their h into the copy of
// every block of the cluster (distributed shared memory), and a cluster
// barrier, far cheaper than a grid barrier, separates the steps. No step
// reads h from L2. The copies are double-buffered by step parity: step t
// reads buffer t % 2 and writes buffer (t + 1) % 2, so one barrier a step
// orders both the writes before the reads and the reads before the
// overwrites.
//
// The tiles, the weight slab, the items and the cell math are the
// tensor-core kernel's (tc::ForwardPlan with cluster-many blocks).
//
// Two ways to separate the steps (Sync):
//   kClusterBarrier: plain stores into the peers' copies, then one cluster
//     barrier a step; two copies, double-buffered by step parity.
//   kAsyncStores: each h pair is stored into every peer with st.async,
//     which counts its bytes on the receiving block's mbarrier for that
//     copy; a block waits only on its own mbarrier, for the bytes of the
//     whole h. Three copies, step s reading copy s % 3: when any block stores
//     step s's h (into copy (s + 1) % 3), every warp of every block has
//     finished step s - 1 (its h is what that block waited for), so no one
//     still reads the copy (s - 1) % 3 = (s + 2) % 3 that step s + 1 will
//     fill. No barrier a step.
#pragma once

#include <cstdint>

#include "pipelstm/kernels/lstm_persistent_tc.h"

namespace pipelstm {
namespace kernels {
namespace cluster {

constexpr int64_t kMaxCluster = 16;  // blocks: the largest (non-portable) cluster size of sm_90

// The launch of one call: `tiles` is the tensor-core forward plan with
// `tiles.blocks` = the cluster's size.
enum class Sync : int { kClusterBarrier = 0, kAsyncStores = 1 };

struct ClusterPlan {
  tc::ForwardPlan tiles;
  int64_t rows = 0;    // batch rows of an h copy: the N-tiles' (zero padding past B)
  int64_t stride = 0;  // halves between two rows of an h copy
  int copies = 2;      // h copies: 2 (kClusterBarrier) or 3 (kAsyncStores)
  Sync sync = Sync::kClusterBarrier;
};

// A row of an h copy holds the K-tiles' columns (zero padding past H) and
// 8 more halves, so that the 8 batch rows a warp's B fragment load reads
// start in 8 different 4-bank groups: conflict-free.
PIPELSTM_HD int64_t h_stride(int64_t k_tiles) { return k_tiles * tc::kTileK + 8; }

// `blocks` blocks, each with the same number of unit tiles (a multiple of
// 8 units: an h pair (j, j + 1), j even, is one block's).
PIPELSTM_HD ClusterPlan make_cluster_plan(int64_t batch, int64_t hidden, int64_t blocks,
                                          Sync sync = Sync::kClusterBarrier) {
  ClusterPlan c;
  const int64_t unit_tiles = tc::ceil_div(tc::ceil_div(hidden, tc::kUnitsPerTile), blocks);
  c.tiles = tc::make_forward_plan(batch, hidden, unit_tiles);
  c.rows = c.tiles.n_tiles * tc::kTileN;
  c.stride = h_stride(c.tiles.k_tiles);
  c.sync = sync;
  c.copies = sync == Sync::kAsyncStores ? 3 : 2;
  return c;
}

// Halves of one h copy.
PIPELSTM_HD int64_t h_copy_halves(const ClusterPlan& c) { return c.rows * c.stride; }

// Shared memory of a block: the weight slab, the K slices' partial sums
// (a multiple of 1 KiB), then the h copies, from this byte on, then (with
// kAsyncStores) one 8-byte mbarrier a copy.
PIPELSTM_HD int64_t h_copies_offset(const ClusterPlan& c) {
  return tc::slab_slots(c.tiles) * 16 + tc::partial_floats(c.tiles) * 4;
}

PIPELSTM_HD int64_t barriers_offset(const ClusterPlan& c) {
  return h_copies_offset(c) + (c.copies * h_copy_halves(c) * 2 + 15) / 16 * 16;
}

PIPELSTM_HD int64_t cluster_smem_bytes(const ClusterPlan& c) {
  return barriers_offset(c) + (c.sync == Sync::kAsyncStores ? 16 * ((c.copies * 8 + 15) / 16) : 0);
}

// kAsyncStores: the bytes one step's stores bring to each block's copy:
// every batch row's h as pairs of columns (j, j + 1), j even (the pair past
// an odd H brings a zero into the padding).
PIPELSTM_HD int64_t fill_bytes(const ClusterPlan& c) {
  return c.tiles.batch * tc::ceil_div(c.tiles.hidden, 2) * 4;
}

// The half of buffer `buf` holding column k of batch row n of h.
PIPELSTM_HD int64_t h_index(const ClusterPlan& c, int buf, int64_t n, int64_t k) {
  return buf * h_copy_halves(c) + n * c.stride + k;
}

// The smallest cluster (2 .. max_blocks blocks, powers of two, then
// max_blocks) whose blocks' shared memory fits `smem_limit` bytes, or 0.
// Fewer blocks leave more of the GPU to other work; the per-step product of
// a small batch is short either way.
inline int64_t smallest_cluster(int64_t batch, int64_t hidden, int64_t max_blocks, int64_t smem_limit,
                                Sync sync = Sync::kClusterBarrier) {
  for (int64_t blocks = 2;; blocks *= 2) {
    if (blocks > max_blocks) blocks = max_blocks;
    if (cluster_smem_bytes(make_cluster_plan(batch, hidden, blocks, sync)) <= smem_limit) return blocks;
    if (blocks == max_blocks) return 0;
  }
}

// ---- Backward: grad_h^T = w_hh^T @ grad_gates^T in one cluster ----
//
// As the tensor-core backward (tc::BackwardPlan: blocks own M-tiles of 16
// units, K runs over the 4H gate rows), with cluster-many blocks, each
// keeping a copy of the grad_gates [B, 4H] of the position processed last:
// a block finishing its cells stores their four gate gradients into every
// block's copy, and one cluster barrier a position separates the positions.
// Position pos stores into copy pos % 2 and its product reads copy
// (pos + 1) % 2, written at the position before it; the grad_h0 phase
// (pos -1) reads copy 0.
struct BackwardClusterPlan {
  tc::BackwardPlan tiles;
  int64_t rows = 0;    // batch rows of a copy (the N-tiles')
  int64_t stride = 0;  // halves between two rows: the 4H columns' K-tiles, then 8 (conflict-free loads)
};

PIPELSTM_HD BackwardClusterPlan make_backward_cluster_plan(int64_t batch, int64_t hidden, int64_t blocks) {
  BackwardClusterPlan c;
  const int64_t unit_tiles = tc::ceil_div(tc::ceil_div(hidden, tc::kTileM), blocks);
  c.tiles = tc::make_backward_plan(batch, hidden, unit_tiles);
  c.rows = c.tiles.n_tiles * tc::kTileN;
  c.stride = h_stride(c.tiles.k_tiles);
  return c;
}

PIPELSTM_HD int64_t copy_halves(const BackwardClusterPlan& c) { return c.rows * c.stride; }

PIPELSTM_HD int64_t copies_offset(const BackwardClusterPlan& c) {
  return tc::slab_slots(c.tiles) * 16 + tc::bwd_partial_floats(c.tiles) * 4;
}

PIPELSTM_HD int64_t cluster_smem_bytes(const BackwardClusterPlan& c) {
  return copies_offset(c) + (2 * copy_halves(c) * 2 + 15) / 16 * 16;
}

// The half of copy `buf` holding gate column k (0 .. 4H) of batch row n.
PIPELSTM_HD int64_t gates_index(const BackwardClusterPlan& c, int buf, int64_t n, int64_t k) {
  return buf * copy_halves(c) + n * c.stride + k;
}

// The smallest backward cluster that fits, as smallest_cluster.
inline int64_t smallest_backward_cluster(int64_t batch, int64_t hidden, int64_t max_blocks, int64_t smem_limit) {
  for (int64_t blocks = 2;; blocks *= 2) {
    if (blocks > max_blocks) blocks = max_blocks;
    if (cluster_smem_bytes(make_backward_cluster_plan(batch, hidden, blocks)) <= smem_limit) return blocks;
    if (blocks == max_blocks) return 0;
  }
}

}  // namespace cluster
}  // namespace kernels
}  // namespace pipelstm
