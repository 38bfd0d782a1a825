// The device pieces the persistent tensor-core kernels share (the grid
// kernels of lstm_persistent_tc.cu, the cluster kernels of
// lstm_persistent_cluster.cu): one mma tile, staging a block's weight slab,
// a step's product over the block's items, the K-tile loop with its loads
// batched ahead of the mma, a forward step and the backward's positions,
// each kernel giving where its B fragments come from, how it finishes a
// cell and how it separates the steps.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include <cooperative_groups.h>

#include "pipelstm/kernels/lstm_persistent_tc.h"
#include "pipelstm/kernels/lstm_pointwise_indexing.h"

namespace pipelstm {
namespace kernels {
namespace tc_device {

namespace cg = cooperative_groups;

using indexing::Load;
using indexing::Store;

// d[0..3] += A @ B for one 16 x 8 x 16 tile (fragments as in lstm_persistent_tc.h),
// A and B of type `ab` ("f16" or "bf16").
#define PIPELSTM_TC_MMA(ab)                                                             \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." ab "." ab ".f32 "             \
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"     \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                        \
               : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1))

template <typename T>
__device__ __forceinline__ void mma(float* d, const uint4& a, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // never launched there: the plan answers TcFit::kArchitecture
#else
  if constexpr (std::is_same_v<T, __half>) {
    PIPELSTM_TC_MMA("f16");
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "the tensor-core kernels take fp16 or bf16");
    PIPELSTM_TC_MMA("bf16");
  }
#endif
}

#undef PIPELSTM_TC_MMA

// Stages a block's weights once, before its first step: slot by slot, two
// 16-bit elements per register, the lower index in the low half (as
// mma.sync reads them); source(slot, i) is the index into w_hh of element i
// of a slot, or -1 for the zero padding of the tails.
template <typename T, typename Source>
__device__ __forceinline__ void stage_slab(uint4* slab, const T* w_hh, int64_t slots,
                                           Source source) {
  const auto* w_bits = reinterpret_cast<const unsigned short*>(w_hh);
  for (int64_t slot = threadIdx.x; slot < slots; slot += tc::kThreads) {
    uint32_t reg[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t lo = source(slot, 2 * r);
      const int64_t hi = source(slot, 2 * r + 1);
      reg[r] = (lo < 0 ? 0u : static_cast<uint32_t>(w_bits[lo])) |
               (hi < 0 ? 0u : static_cast<uint32_t>(w_bits[hi]) << 16);
    }
    slab[slot] = make_uint4(reg[0], reg[1], reg[2], reg[3]);
  }
  __syncthreads();
}

// What a block of a persistent tensor-core kernel works from: its place in
// the grid or cluster, its slab of w_hh in shared memory, the K-slice sums
// after the slab, and this thread's warp and lane.
struct Block {
  int64_t index;
  const uint4* slab;
  float* partial;
  int warp;
  int lane;
};

// Stages block `index`'s slab of plan p's weights (tc::slab_source) into
// smem and gives the Block that works from it.
template <typename T, typename Plan>
__device__ __forceinline__ Block start_block(int64_t index, uint4* smem, const T* w_hh, const Plan& p) {
  const int64_t slots = tc::slab_slots(p);
  stage_slab(smem, w_hh, slots, [&](int64_t slot, int i) { return tc::slab_source(p, index, slot, i); });
  return {index, smem, reinterpret_cast<float*>(smem + slots), static_cast<int>(threadIdx.x / tc::kLanes),
          static_cast<int>(threadIdx.x % tc::kLanes)};
}

// One step's product of a block, either direction: warp `warp` runs items
// warp, warp + kWarps, ... (a pair's K slice each); product(item, acc) adds
// the slice's mma tiles into the N accumulators of this lane. With one slice
// a pair's sums go to finish(item, cells, acc) at once; with several they
// meet in shared memory (`partial`, at partial_index(slice, pair, e)) and
// one warp per pair sums them and finishes. cells(item) loads what the
// finish reads besides the product; it is called before the product, so
// that its loads travel with the product's.
template <int N, typename PartialIndex, typename Cells, typename Product, typename Finish>
__device__ __forceinline__ void step_product(const tc::TilePlan& p, int warp, float* partial,
                                             PartialIndex partial_index, Cells cells,
                                             Product product, Finish finish) {
  const int64_t items = tc::item_count(p);
  if (p.slices == 1) {
    for (int64_t it = warp; it < items; it += tc::kWarps) {
      const tc::Item w = tc::item_at(p, it);
      const auto in = cells(w);
      float acc[N] = {};
      product(w, acc);
      finish(w, in, acc);
    }
    return;
  }
  // K is split only where a block has at most kWarps / 2 pairs
  // (tc::make_tile_plan), so warp `warp` finishes pair `warp`, if any.
  const bool finishes = warp < p.pairs;
  const tc::Item mine = tc::item_at(p, finishes ? warp : 0);
  decltype(cells(mine)) in{};
  if (finishes) in = cells(mine);
  for (int64_t it = warp; it < items; it += tc::kWarps) {
    const tc::Item w = tc::item_at(p, it);
    float acc[N] = {};
    product(w, acc);
#pragma unroll
    for (int e = 0; e < N; ++e) partial[partial_index(w.slice, w.pair, e)] = acc[e];
  }
  __syncthreads();  // every slice's partial sums are in shared memory
  if (!finishes) return;
  float acc[N] = {};
  for (int64_t s = 0; s < p.slices; ++s) {
#pragma unroll
    for (int e = 0; e < N; ++e) acc[e] += partial[partial_index(s, mine.pair, e)];
  }
  finish(mine, in, acc);
}

// Independent accumulator sets per item: consecutive K-tiles add into
// alternate sets, summed at the end, so a warp's mma do not wait for one
// another's results one by one.
constexpr int kChains = 2;

// The mma tiles of an item's K-tiles: load_b(kt, r) gives register r of the
// lane's B fragment of K-tile kt, mma_at(kt, chain, b0, b1) adds that tile's
// product into accumulator set `chain` (kt's position modulo kChains). The B
// fragments of up to kLoadDepth K-tiles are loaded before the first of
// their mma, so that their round trips to L2 overlap: ptxas does not move
// these loads above an earlier tile's mma, and one load per tile issued
// after it would cost a round trip each.
template <typename LoadB, typename MmaAt>
__device__ __forceinline__ void product_in_chunks(const tc::Item& w, LoadB load_b,
                                                  MmaAt mma_at) {
  static_assert(tc::kLoadDepth % kChains == 0, "a chunk starts on chain 0");
  for (int64_t k0 = w.kt_begin; k0 < w.kt_end; k0 += tc::kLoadDepth) {
    uint32_t b[tc::kLoadDepth][2];
#pragma unroll
    for (int c = 0; c < tc::kLoadDepth; ++c) {
      const bool in_range = k0 + c < w.kt_end;
      b[c][0] = in_range ? load_b(k0 + c, 0) : 0u;
      b[c][1] = in_range ? load_b(k0 + c, 1) : 0u;
    }
#pragma unroll
    for (int c = 0; c < tc::kLoadDepth; ++c) {
      if (k0 + c < w.kt_end) mma_at(k0 + c, c % kChains, b[c][0], b[c][1]);
    }
  }
}

// acc = the sum of the kChains accumulator sets.
template <int N>
__device__ __forceinline__ void sum_chains(const float (&part)[kChains][N], float (&acc)[N]) {
#pragma unroll
  for (int e = 0; e < N; ++e) {
    acc[e] = part[0][e];
#pragma unroll
    for (int c = 1; c < kChains; ++c) acc[e] += part[c][e];
  }
}

// An item's product into acc, N / 4 M-tiles (the forward's two, the
// backward's one): the B fragment register r of its K-tile kt from
// load_b(kt, r), the A fragment of M-tile m from the block's slab at
// a_slot(kt, m).
template <typename T, int N, typename LoadB, typename ASlot>
__device__ __forceinline__ void item_product(const tc::Item& w, const uint4* slab, LoadB load_b,
                                             ASlot a_slot, float (&acc)[N]) {
  float part[kChains][N] = {};
  product_in_chunks(w, load_b, [&](int64_t kt, int chain, uint32_t b0, uint32_t b1) {
#pragma unroll
    for (int m = 0; m < N / 4; ++m) mma<T>(part[chain] + 4 * m, slab[a_slot(kt, m)], b0, b1);
  });
  sum_chains(part, acc);
}

// Step pos of a forward: the block's product of h_{t-1} (register r of a B
// fragment: load_b(item, kt, r)) with its weights, then finish(item, cells,
// acc) of each of its pairs, where cells(item) gives the item's
// tc::FwdCells of this step.
template <typename T, typename Cells, typename LoadB, typename Finish>
__device__ __forceinline__ void forward_step(const tc::ForwardPlan& p, const Block& b, Cells cells,
                                             LoadB load_b, Finish finish) {
  step_product<8>(
      p, b.warp, b.partial,
      [&](int64_t slice, int64_t pair, int e) { return tc::partial_index(p, slice, pair, e, b.lane); },
      cells,
      [&](const tc::Item& w, float (&acc)[8]) {
        item_product<T>(
            w, b.slab, [&](int64_t kt, int r) { return load_b(w, kt, r); },
            [&](int64_t kt, int m) { return tc::slab_slot(p, w.tau, kt, m, b.lane); }, acc);
      },
      finish);
}

// Positions steps - 1 .. -1 of a backward: the first finishes its cells
// from the incoming gradients alone; each later one takes the product of
// the grad_gates the one before it wrote (load_b(pos, item, kt, r)) and
// finishes its cells (finish(pos, t, cells, acc)), or at -1 writes grad_h0.
// sync() separates two positions.
template <typename T, typename CellLoad, typename CellStore, typename LoadB, typename Finish,
          typename Sync>
__device__ __forceinline__ void backward_positions(const PersistentBackwardArgs<T>& a,
                                                   const tc::BackwardPlan& p, const Block& b,
                                                   const CellLoad& load,
                                                   const CellStore& store, LoadB load_b,
                                                   Finish finish, Sync sync) {
  for (int64_t pos = a.steps - 1; pos >= -1; --pos) {
    const int64_t t = pos < 0 ? -1 : persistent::step_at(pos, a.steps, a.reverse);
    if (pos == a.steps - 1) {  // no product yet: grad_h_n is the recurrent gradient
      for (int64_t pair = b.warp; pair < p.pairs; pair += tc::kWarps) {
        const float acc[4] = {0.f, 0.f, 0.f, 0.f};
        const tc::BwdCells in = tc::bwd_cells(a, p, b.index, tc::item_at(p, pair), b.lane, t, pos, load);
        finish(pos, t, in, acc);
      }
      sync();
      continue;
    }
    step_product<4>(
        p, b.warp, b.partial,
        [&](int64_t slice, int64_t pair, int e) {
          return tc::bwd_partial_index(p, slice, pair, e, b.lane);
        },
        [&](const tc::Item& w) {  // the grad_h0 phase (pos -1) finishes no cell
          return pos < 0 ? tc::BwdCells{} : tc::bwd_cells(a, p, b.index, w, b.lane, t, pos, load);
        },
        [&](const tc::Item& w, float (&acc)[4]) {
          item_product<T>(
              w, b.slab, [&](int64_t kt, int r) { return load_b(pos, w, kt, r); },
              [&](int64_t kt, int) { return tc::bwd_slab_slot(p, w.tau, kt, b.lane); }, acc);
        },
        [&](const tc::Item& w, const tc::BwdCells& in, const float (&acc)[4]) {
          if (pos >= 0) finish(pos, t, in, acc);
          else tc::bwd_write_h0(a, p, b.index, w, b.lane, acc, store);
        });
    if (pos >= 0) sync();  // this position's grad_gates before the next product
  }
}

}  // namespace tc_device
}  // namespace kernels
}  // namespace pipelstm
