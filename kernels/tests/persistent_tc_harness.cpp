// Drives the persistent tensor-core kernel's per-warp body
// (lstm_persistent_tc.h) on the host: every block's shared-memory slab
// built slot by slot as the kernel stages it, every work item's fragments
// gathered lane by lane through the header's fragment functions, and
// mma.sync replaced by a scalar one written here, independently, from the
// PTX ISA's fragment tables for mma.m16n8k16. Steps run in the order the
// grid barrier imposes; h, c and the activated gates of every step are
// compared with the CPU pointwise loops fed by a plain recurrent GEMM.
// The backward (grad_gates of every step, grad_h0, grad_c0) is checked the
// same way against the CPU pointwise backward loop and a plain GEMM.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "pipelstm/kernels/lstm_persistent_tc.h"
#include "pipelstm/kernels/lstm_pointwise.h"
#include "persistent_tc_reference.h"
#include "persistent_test_support.h"

using namespace pipelstm::kernels;
using testing::backward_args;
using testing::forward_args;
using testing::GradsIn;
using testing::Identity;
using testing::reference_backward;
using testing::reference_forward;
using testing::rel_error;

namespace {

// d += A @ B for one warp, fragments per lane as the PTX ISA lays them out
// for mma.m16n8k16 (16-bit A/B, f32 C/D): groupID g = lane / 4,
// threadID_in_group q = lane % 4;
//   A: a0,a1 (g, 2q..2q+1)  a2,a3 (g+8, 2q..)  a4,a5 (g, 2q+8..)  a6,a7 (g+8, 2q+8..)
//   B: b0,b1 (k = 2q..2q+1, n = g)  b2,b3 (k = 2q+8.., n = g)
//   C: c0,c1 (g, 2q..2q+1)  c2,c3 (g+8, 2q..2q+1)
void mma_m16n8k16(const float (&a)[32][8], const float (&b)[32][4], float (&d)[32][4]) {
  float A[16][16] = {}, B[16][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, q = lane % 4;
    A[g][2 * q] = a[lane][0];
    A[g][2 * q + 1] = a[lane][1];
    A[g + 8][2 * q] = a[lane][2];
    A[g + 8][2 * q + 1] = a[lane][3];
    A[g][2 * q + 8] = a[lane][4];
    A[g][2 * q + 9] = a[lane][5];
    A[g + 8][2 * q + 8] = a[lane][6];
    A[g + 8][2 * q + 9] = a[lane][7];
    B[2 * q][g] = b[lane][0];
    B[2 * q + 1][g] = b[lane][1];
    B[2 * q + 8][g] = b[lane][2];
    B[2 * q + 9][g] = b[lane][3];
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, q = lane % 4;
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * q, 2 * q + 1, 2 * q, 2 * q + 1};
    for (int i = 0; i < 4; ++i) {
      float s = 0.0f;
      for (int k = 0; k < 16; ++k) s += A[rows[i]][k] * B[k][cols[i]];
      d[lane][i] += s;
    }
  }
}

// Each block's slab of plan p, as the kernel stages it: 8 elements per
// 16-byte slot, element i of a slot w_hh[slab_source(p, block, slot, i)] (zero
// where -1).
template <typename Plan>
std::vector<std::vector<float>> stage_slabs(const Plan& p, const float* w_hh) {
  const int64_t slots = tc::slab_slots(p);
  std::vector<std::vector<float>> slab(p.blocks);
  for (int64_t g = 0; g < p.blocks; ++g) {
    slab[g].resize(slots * 8);
    for (int64_t slot = 0; slot < slots; ++slot)
      for (int i = 0; i < 8; ++i) {
        const int64_t src = tc::slab_source(p, g, slot, i);
        slab[g][slot * 8 + i] = src < 0 ? 0.0f : w_hh[src];
      }
  }
  return slab;
}

// The forward kernel's schedule on the host.
void run_tc_forward(const PersistentForwardArgs<float>& a, int64_t unit_tiles) {
  const tc::ForwardPlan p = tc::make_forward_plan(a.batch, a.hidden, unit_tiles);
  const auto slab = stage_slabs(p, a.w_hh);
  std::vector<float> partial(std::max<int64_t>(tc::partial_floats(p), 1), NAN);
  std::vector<tc::FwdCells> cells(p.blocks * p.pairs * 32);
  for (int64_t pos = 0; pos < a.steps; ++pos) {
    const int64_t t = persistent::step_at(pos, a.steps, a.reverse);
    // Every lane loads its cells' inputs before any block finishes a cell
    // of this step (the earliest the kernel may).
    for (int64_t g = 0; g < p.blocks; ++g)
      for (int64_t pair = 0; pair < p.pairs; ++pair)
        for (int lane = 0; lane < 32; ++lane)
          cells[(g * p.pairs + pair) * 32 + lane] =
              tc::fwd_cells(a, p, g, tc::item_at(p, pair), lane, t, pos, Identity());
    for (int64_t g = 0; g < p.blocks; ++g) {
      std::fill(partial.begin(), partial.end(), NAN);  // a slot not written shows up
      for (int64_t it = 0; it < tc::item_count(p); ++it) {
        const tc::Item w = tc::item_at(p, it);
        float acc[2][32][4] = {};
        for (int64_t kt = w.kt_begin; kt < w.kt_end; ++kt) {
          float af[2][32][8], bf[32][4];
          for (int lane = 0; lane < 32; ++lane) {
            for (int m = 0; m < 2; ++m)
              for (int i = 0; i < 8; ++i)
                af[m][lane][i] = slab[g][tc::slab_slot(p, w.tau, kt, m, lane) * 8 + i];
            for (int i = 0; i < 4; ++i) {
              const tc::BSource s = tc::fwd_b_source(p, w.n_tile, kt, lane, i);
              bf[lane][i] = s.valid ? persistent::h_prev_row(a, pos, s.n)[s.k] : 0.0f;
            }
          }
          mma_m16n8k16(af[0], bf, acc[0]);
          mma_m16n8k16(af[1], bf, acc[1]);
        }
        for (int lane = 0; lane < 32; ++lane) {
          float lane_acc[8];
          for (int e = 0; e < 8; ++e) lane_acc[e] = acc[e / 4][lane][e % 4];
          if (p.slices == 1) {
            tc::fwd_finish(a, cells[(g * p.pairs + w.pair) * 32 + lane], lane, t, lane_acc, Identity());
          } else {
            for (int e = 0; e < 8; ++e)
              partial[tc::partial_index(p, w.slice, w.pair, e, lane)] = lane_acc[e];
          }
        }
      }
      if (p.slices == 1) continue;
      // __syncthreads(), then warp w sums the slices of pair w and finishes
      // it (a pair past the last warp would stay unwritten).
      for (int64_t pair = 0; pair < std::min<int64_t>(p.pairs, tc::kWarps); ++pair) {
        for (int lane = 0; lane < 32; ++lane) {
          float lane_acc[8] = {};
          for (int64_t s = 0; s < p.slices; ++s)
            for (int e = 0; e < 8; ++e) lane_acc[e] += partial[tc::partial_index(p, s, pair, e, lane)];
          tc::fwd_finish(a, cells[(g * p.pairs + pair) * 32 + lane], lane, t, lane_acc, Identity());
        }
      }
    }
  }
}

std::mt19937 rng(0);

std::vector<float> random_vec(int64_t n) {
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

// One forward case; returns whether every output matches.
bool check_forward(int64_t T, int64_t B, int64_t H, int64_t unit_tiles, bool reverse) {
  const auto xg = random_vec(T * B * 4 * H), h0 = random_vec(B * H), c0 = random_vec(B * H);
  auto w = random_vec(4 * H * H);
  for (auto& x : w) x /= std::sqrt(float(H));  // keeps the gates out of saturation
  const double worst = testing::forward_error(
      xg, w, h0, c0, T, B, H, reverse,
      [&](const PersistentForwardArgs<float>& a) { run_tc_forward(a, unit_tiles); });
  const tc::ForwardPlan p = tc::make_forward_plan(B, H, unit_tiles);
  const bool ok = worst <= 1e-5;
  if (!ok)
    std::printf("FAIL forward T=%ld B=%ld H=%ld unit_tiles=%ld (blocks %ld, slices %ld) reverse=%d: "
                "error %g\n", long(T), long(B), long(H), long(unit_tiles), long(p.blocks),
                long(p.slices), int(reverse), worst);
  return ok;
}

// The backward kernel's schedule on the host: positions in reverse, each
// block's items through the slab and fragments, the K slices meeting in the
// partial buffer, then the cell backward (or grad_h0 in the last phase).
void run_tc_backward(const PersistentBackwardArgs<float>& a, int64_t unit_tiles) {
  const tc::BackwardPlan p = tc::make_backward_plan(a.batch, a.hidden, unit_tiles);
  const auto slab = stage_slabs(p, a.w_hh);
  std::vector<float> partial(std::max<int64_t>(tc::bwd_partial_floats(p), 1));
  std::vector<tc::BwdCells> cells(p.blocks * p.pairs * 32);
  for (int64_t pos = a.steps - 1; pos >= -1; --pos) {
    const int64_t t = pos < 0 ? -1 : persistent::step_at(pos, a.steps, a.reverse);
    // As in the forward: every lane's inputs before any block finishes.
    for (int64_t g = 0; g < p.blocks && pos >= 0; ++g)
      for (int64_t pair = 0; pair < p.pairs; ++pair)
        for (int lane = 0; lane < 32; ++lane)
          cells[(g * p.pairs + pair) * 32 + lane] =
              tc::bwd_cells(a, p, g, tc::item_at(p, pair), lane, t, pos, Identity());
    for (int64_t g = 0; g < p.blocks; ++g) {
      std::vector<float> sum(p.pairs * 32 * 4, 0.0f);  // per (pair, lane): the summed slices
      if (pos < a.steps - 1) {
        std::fill(partial.begin(), partial.end(), NAN);
        for (int64_t it = 0; it < p.pairs * p.slices; ++it) {
          const tc::Item w = tc::item_at(p, it);
          float acc[32][4] = {};
          for (int64_t kt = w.kt_begin; kt < w.kt_end; ++kt) {
            float af[32][8], bf[32][4];
            for (int lane = 0; lane < 32; ++lane) {
              for (int i = 0; i < 8; ++i)
                af[lane][i] = slab[g][tc::bwd_slab_slot(p, w.tau, kt, lane) * 8 + i];
              for (int i = 0; i < 4; ++i) {
                const tc::BSource s = tc::bwd_b_source(p, w.n_tile, kt, lane, i);
                bf[lane][i] = s.valid ? tc::bwd_b_row(a, pos, s.n)[s.k] : 0.0f;
              }
            }
            mma_m16n8k16(af, bf, acc);
          }
          for (int lane = 0; lane < 32; ++lane)
            for (int e = 0; e < 4; ++e) {
              if (p.slices == 1) sum[(w.pair * 32 + lane) * 4 + e] = acc[lane][e];
              else partial[tc::bwd_partial_index(p, w.slice, w.pair, e, lane)] = acc[lane][e];
            }
        }
        if (p.slices > 1)
          for (int64_t pair = 0; pair < p.pairs; ++pair)
            for (int lane = 0; lane < 32; ++lane)
              for (int e = 0; e < 4; ++e)
                for (int64_t s = 0; s < p.slices; ++s)
                  sum[(pair * 32 + lane) * 4 + e] += partial[tc::bwd_partial_index(p, s, pair, e, lane)];
      }
      // With K split, warp w finishes pair w (a pair past the last warp
      // would stay unwritten).
      const int64_t finished = p.slices > 1 ? std::min<int64_t>(p.pairs, tc::kWarps) : p.pairs;
      for (int64_t pair = 0; pair < finished; ++pair) {
        const tc::Item w = tc::item_at(p, pair);
        for (int lane = 0; lane < 32; ++lane) {
          float acc[4];
          for (int e = 0; e < 4; ++e) acc[e] = sum[(pair * 32 + lane) * 4 + e];
          if (pos >= 0) tc::bwd_finish(a, cells[(g * p.pairs + pair) * 32 + lane], t, pos, acc, Identity());
          else tc::bwd_write_h0(a, p, g, w, lane, acc, Identity());
        }
      }
    }
  }
}

// One backward case on a real forward workspace (from the reference
// forward); `optional` selects which of grad_output, grad_h_n, grad_c_n exist.
bool check_backward(int64_t T, int64_t B, int64_t H, int64_t unit_tiles, bool reverse,
                    int optional) {
  const auto xg = random_vec(T * B * 4 * H), h0 = random_vec(B * H), c0 = random_vec(B * H);
  auto w = random_vec(4 * H * H);
  for (auto& x : w) x /= std::sqrt(float(H));
  std::vector<float> out(T * B * H), act(T * B * 4 * H), cells(T * B * H);
  const PersistentForwardArgs<float> f = forward_args(
      xg.data(), w.data(), h0.data(), c0.data(), out.data(), act.data(), cells.data(), T, B, H,
      reverse);
  reference_forward(f);
  const auto go = random_vec(T * B * H), ghn = random_vec(B * H), gcn = random_vec(B * H);
  std::vector<float> gg[2], gh0[2], gc0[2];
  for (int run = 0; run < 2; ++run) {
    gg[run].assign(T * B * 4 * H, NAN);
    gh0[run].assign(B * H, NAN);
    gc0[run].assign(B * H, NAN);
    const GradsIn<float> in{optional & 1 ? go.data() : nullptr,
                            optional & 2 ? ghn.data() : nullptr,
                            optional & 4 ? gcn.data() : nullptr};
    const PersistentBackwardArgs<float> a =
        backward_args(f, in, gg[run].data(), gh0[run].data(), gc0[run].data());
    if (run == 0) run_tc_backward(a, unit_tiles); else reference_backward(a);
  }
  const double worst = std::max({rel_error(gg[0], gg[1]), rel_error(gh0[0], gh0[1]),
                                 rel_error(gc0[0], gc0[1])});
  const tc::BackwardPlan p = tc::make_backward_plan(B, H, unit_tiles);
  const bool ok = worst <= 1e-5;
  if (!ok)
    std::printf("FAIL backward T=%ld B=%ld H=%ld unit_tiles=%ld (blocks %ld, slices %ld) reverse=%d "
                "optional=%d: error %g\n", long(T), long(B), long(H), long(unit_tiles),
                long(p.blocks), long(p.slices), int(reverse), optional, worst);
  return ok;
}

}  // namespace

int main() {
  int passed = 0, failed = 0;
  // {T, B, H, unit tiles per block}: tails in B (not a multiple of 8) and in
  // H (not a multiple of 8 or 16), one and several N-tiles, K split in 1 to
  // 8 slices, several unit tiles per block and a last block with fewer.
  const int64_t forward[][4] = {{1, 1, 1, 1},   {3, 1, 16, 1},  {4, 3, 7, 1},   {3, 8, 33, 1},
                                {5, 9, 20, 1},  {3, 17, 40, 2}, {2, 64, 24, 1}, {4, 5, 72, 3},
                                {3, 2, 130, 2}, {2, 13, 48, 4}, {6, 1, 256, 1}};
  for (const auto& s : forward)
    for (bool reverse : {false, true})
      (check_forward(s[0], s[1], s[2], s[3], reverse) ? passed : failed)++;
  // Backward: M-tiles of 16 units, K = 4H; every combination of the
  // optional gradients on some shape.
  const int64_t backward[][4] = {{1, 1, 1, 1},  {3, 3, 7, 1},  {4, 8, 16, 1}, {3, 9, 33, 2},
                                 {2, 17, 20, 1}, {3, 5, 100, 3}, {2, 64, 48, 2}, {5, 2, 256, 1}};
  int optional = 7;
  for (const auto& s : backward)
    for (bool reverse : {false, true}) {
      (check_backward(s[0], s[1], s[2], s[3], reverse, optional) ? passed : failed)++;
      optional = (optional + 3) % 8;
    }
  std::printf("persistent tensor-core: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
