// Drives the cluster forward's indexing (lstm_persistent_cluster.h) on the
// host, over many shapes and cluster sizes:
//   - every (batch row, hidden unit) is finished by exactly one lane of one
//     block of the cluster (the tensor-core plan's items and fwd_cells);
//   - an h copy filled as the kernel fills it (padding zero, then each
//     finished h stored at h_index of the next buffer; with st.async, the
//     lanes of even groupID storing units (j, j + 1) as one word, counted
//     against fill_bytes) gives every lane's B fragment the h values the
//     product needs: h[n][k], zero past B or H;
//   - a warp's B fragment loads from a copy hit 32 different banks;
//   - the shared memory fits where smallest_cluster says it does, and the
//     h copies do not overlap the slab or the partial sums.
// The product and the cell math are the tensor-core kernel's, checked by
// persistent_tc_harness.cpp.
#include <cstdio>
#include <set>
#include <utility>
#include <vector>

#include "pipelstm/kernels/lstm_persistent_cluster.h"

using namespace pipelstm::kernels;

namespace {

int failures = 0;

void check(bool ok, const char* what, int64_t B, int64_t H, int64_t blocks) {
  if (!ok) {
    ++failures;
    std::printf("FAIL %s (B=%lld H=%lld blocks=%lld)\n", what, static_cast<long long>(B),
                static_cast<long long>(H), static_cast<long long>(blocks));
  }
}

// `copies` copies of `halves` halves each, row n at n * stride: the padding
// (rows past B, columns past width) zero for good, the rest -1 (not stored).
std::vector<float> empty_copies(int64_t copies, int64_t halves, int64_t stride, int64_t B, int64_t width) {
  std::vector<float> copy(copies * halves, -1.0f);
  for (int64_t i = 0; i < copies * halves; ++i) {
    const int64_t n = (i % halves) / stride, k = (i % halves) % stride;
    if (n >= B || k >= width) copy[i] = 0.0f;
  }
  return copy;
}

struct FragmentCheck {
  bool right = true;          // every lane's B fragment reads what was stored
  bool conflict_free = true;  // a warp's loads hit 32 banks
};

// Every lane's B fragment (`source(n_tile, kt, lane, e)` of its elements e)
// read from `copy` at index(n, k): one aligned word of columns k, k + 1
// holding want(n, k), zero where the element is not valid.
template <class Source, class Index, class Want>
FragmentCheck check_fragments(int64_t n_tiles, int64_t k_tiles, Source source, Index index,
                              const std::vector<float>& copy, Want want) {
  FragmentCheck r;
  for (int64_t n_tile = 0; n_tile < n_tiles; ++n_tile) {
    for (int64_t kt = 0; kt < k_tiles; ++kt) {
      for (int e = 0; e < 4; e += 2) {
        std::set<int64_t> banks;
        for (int lane = 0; lane < tc::kLanes; ++lane) {
          const tc::BSource lo = source(n_tile, kt, lane, e), hi = source(n_tile, kt, lane, e + 1);
          const int64_t at = index(lo.n, lo.k);
          r.right = r.right && at % 2 == 0 && hi.n == lo.n && hi.k == lo.k + 1;
          r.right = r.right && copy[at] == (lo.valid ? want(lo.n, lo.k) : 0.0f) &&
                    copy[at + 1] == (hi.valid ? want(hi.n, hi.k) : 0.0f);
          banks.insert((at / 2) % 32);
        }
        r.conflict_free = r.conflict_free && banks.size() == 32;
      }
    }
  }
  return r;
}

// f(block, item, lane) for every lane of every item that finishes cells: one
// item of a split pair finishes it.
template <class Plan, class F>
void for_each_finishing_lane(const Plan& p, F f) {
  for (int64_t block = 0; block < p.blocks; ++block) {
    for (int64_t it = 0; it < tc::item_count(p); ++it) {
      const tc::Item w = tc::item_at(p, it);
      if (w.slice != 0 && p.slices > 1) continue;
      for (int lane = 0; lane < tc::kLanes; ++lane) f(block, w, lane);
    }
  }
}

// The (batch row, unit) of a forward lane's cell 0 or 1.
std::pair<int64_t, int64_t> fwd_cell(const tc::ForwardPlan& p, int64_t block, const tc::Item& w, int lane,
                                     int cell) {
  const tc::Coord home = tc::c_elem(lane, cell);
  return {w.n_tile * tc::kTileN + home.col,
          (block * p.unit_tiles + w.tau) * tc::kUnitsPerTile + tc::fwd_row(0, home.row).unit};
}

bool each_once(const std::vector<int>& finished) {
  for (int v : finished) {
    if (v != 1) return false;
  }
  return true;
}

void check_shape(int64_t B, int64_t H, int64_t blocks, cluster::Sync sync) {
  const cluster::ClusterPlan c = cluster::make_cluster_plan(B, H, blocks, sync);
  const bool async = sync == cluster::Sync::kAsyncStores;
  const tc::ForwardPlan& p = c.tiles;
  check(p.blocks <= blocks, "no more blocks than asked for", B, H, blocks);

  // Coverage: each (n, j) finished once, in the cluster's blocks.
  std::vector<int> finished(B * H, 0);
  float acc_h = 0.0f;  // each cell's h: a value only it has
  std::vector<float> h(B * H, 0.0f);
  std::vector<float> copy = empty_copies(c.copies, cluster::h_copy_halves(c), c.stride, B, H);
  for_each_finishing_lane(p, [&](int64_t block, const tc::Item& w, int lane) {
    for (int cell = 0; cell < 2; ++cell) {
      const auto [n, j] = fwd_cell(p, block, w, lane, cell);
      if (j >= H || n >= B) continue;
      ++finished[n * H + j];
      h[n * H + j] = acc_h += 1.0f;
      if (!async) copy[cluster::h_index(c, 1, n, j)] = h[n * H + j];  // what every block stores
    }
  });
  if (async) {  // after the step: the word stores of the even-groupID lanes
    int64_t bytes = 0;
    for_each_finishing_lane(p, [&](int64_t block, const tc::Item& w, int lane) {
      if ((lane >> 2) & 1) return;
      for (int cell = 0; cell < 2; ++cell) {
        const auto [n, j] = fwd_cell(p, block, w, lane, cell);
        if (j >= H || n >= B) continue;
        const int64_t at = cluster::h_index(c, 1, n, j);
        check(j % 2 == 0 && at % 2 == 0, "a pair's word is aligned", B, H, blocks);
        copy[at] = h[n * H + j];
        copy[at + 1] = j + 1 < H ? h[n * H + j + 1] : 0.0f;  // the lane 4 up's cell, or zero
        bytes += 4;
      }
    });
    check(bytes == cluster::fill_bytes(c), "the stores bring fill_bytes", B, H, blocks);
  }
  check(each_once(finished), "every cell finished exactly once", B, H, blocks);

  // The B fragments read from buffer 1 what the cells stored.
  const FragmentCheck read = check_fragments(
      p.n_tiles, p.k_tiles, [&](int64_t nt, int64_t kt, int lane, int e) { return tc::fwd_b_source(p, nt, kt, lane, e); },
      [&](int64_t n, int64_t k) { return cluster::h_index(c, 1, n, k); }, copy,
      [&](int64_t n, int64_t k) { return h[n * H + k]; });
  check(read.right, "B fragments read the stored h (zero padding)", B, H, blocks);
  check(read.conflict_free, "a warp's B loads hit 32 banks", B, H, blocks);

  // Layout: the copies start past the slab and the partial sums, aligned.
  const int64_t offset = cluster::h_copies_offset(c);
  check(offset % 16 == 0 && offset == tc::forward_smem_bytes(p), "h copies after the slab and partials", B, H,
        blocks);
  check(cluster::barriers_offset(c) >= offset + c.copies * cluster::h_copy_halves(c) * 2 &&
            cluster::barriers_offset(c) % 16 == 0,
        "the barriers after the copies, aligned", B, H, blocks);
  check(cluster::cluster_smem_bytes(c) >= cluster::barriers_offset(c) + (async ? 8 * c.copies : 0),
        "room for the barriers", B, H, blocks);
}

// The backward: every (batch row, unit) finished once; a copy filled as the
// kernel fills it (each cell's four gate gradients at gates_index of
// columns j, H + j, 2H + j, 3H + j) gives every B fragment grad_gates[n][k],
// zero past B or 4H; conflict-free loads; the layout.
void check_backward_shape(int64_t B, int64_t H, int64_t blocks) {
  const cluster::BackwardClusterPlan c = cluster::make_backward_cluster_plan(B, H, blocks);
  const tc::BackwardPlan& p = c.tiles;
  check(p.blocks <= blocks, "backward: no more blocks than asked for", B, H, blocks);
  std::vector<int> finished(B * H, 0);
  std::vector<float> gates(B * 4 * H, 0.0f);
  std::vector<float> copy = empty_copies(2, cluster::copy_halves(c), c.stride, B, 4 * H);
  float value = 0.0f;
  for_each_finishing_lane(p, [&](int64_t block, const tc::Item& w, int lane) {
    for (int i = 0; i < 4; ++i) {
      const tc::Cell cell = tc::bwd_cell(p, block, w, lane, i);
      if (!cell.valid) continue;
      ++finished[cell.b * H + cell.j];
      for (int k = 0; k < 4; ++k) {
        gates[cell.b * 4 * H + k * H + cell.j] = value += 1.0f;
        copy[cluster::gates_index(c, 1, cell.b, k * H + cell.j)] = value;
      }
    }
  });
  check(each_once(finished), "backward: every cell finished exactly once", B, H, blocks);
  const FragmentCheck read = check_fragments(
      p.n_tiles, p.k_tiles, [&](int64_t nt, int64_t kt, int lane, int e) { return tc::bwd_b_source(p, nt, kt, lane, e); },
      [&](int64_t n, int64_t k) { return cluster::gates_index(c, 1, n, k); }, copy,
      [&](int64_t n, int64_t k) { return gates[n * 4 * H + k]; });
  check(read.right, "backward: B fragments read the stored grad_gates (zero padding)", B, H, blocks);
  check(read.conflict_free, "backward: a warp's B loads hit 32 banks", B, H, blocks);
  check(cluster::copies_offset(c) % 16 == 0 && cluster::copies_offset(c) == tc::backward_smem_bytes(p) &&
            cluster::cluster_smem_bytes(c) >= cluster::copies_offset(c) + 2 * cluster::copy_halves(c) * 2,
        "backward: the copies after the slab and partials", B, H, blocks);
}

}  // namespace

int main() {
  int shapes = 0;
  for (int64_t B : {1, 2, 7, 8, 9, 16, 33, 64}) {
    for (int64_t H : {1, 7, 8, 40, 100, 256, 264, 512}) {
      for (int64_t blocks : {2, 3, 4, 8, 16}) {
        for (cluster::Sync sync : {cluster::Sync::kClusterBarrier, cluster::Sync::kAsyncStores}) {
          check_shape(B, H, blocks, sync);
          ++shapes;
        }
      }
    }
  }
  for (int64_t B : {1, 3, 8, 9, 33, 64}) {
    for (int64_t H : {1, 5, 16, 40, 100, 256, 264, 512}) {
      for (int64_t blocks : {2, 3, 4, 8, 16}) {
        check_backward_shape(B, H, blocks);
        ++shapes;
      }
    }
  }
  // The smallest cluster whose blocks fit 227 KiB of shared memory (Hopper's
  // opt-in limit): H = 256 fits in 4 blocks, H = 512 needs 16, H = 1024 none.
  const int64_t limit = 227 * 1024;
  const bool smallest = cluster::smallest_cluster(8, 256, 16, limit) == 4 &&
                        cluster::smallest_cluster(8, 512, 16, limit) == 16 &&
                        cluster::smallest_cluster(8, 1024, 16, limit) == 0 &&
                        cluster::cluster_smem_bytes(cluster::make_cluster_plan(8, 512, 16)) <= limit &&
                        cluster::cluster_smem_bytes(cluster::make_cluster_plan(8, 512, 8)) > limit &&
                        cluster::smallest_cluster(8, 512, 16, limit, cluster::Sync::kAsyncStores) == 16 &&
                        cluster::smallest_cluster(8, 256, 16, limit, cluster::Sync::kAsyncStores) == 4;
  check(smallest, "smallest_cluster at H = 256, 512, 1024", 8, 0, 16);
  const bool smallest_backward = cluster::smallest_backward_cluster(8, 256, 16, limit) == 4 &&
                                 cluster::smallest_backward_cluster(8, 512, 16, limit) == 16 &&
                                 cluster::smallest_backward_cluster(8, 1024, 16, limit) == 0;
  check(smallest_backward, "smallest_backward_cluster at H = 256, 512, 1024", 8, 0, 16);
  std::printf("cluster harness: %d shapes, %d failures\n", shapes, failures);
  return failures == 0 ? 0 : 1;
}
