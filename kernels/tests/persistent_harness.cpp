// Drives the persistent kernel's per-block body (lstm_persistent.h) on the
// host, block by block and step by step as the grid-wide barrier orders
// them, with the warp's 32 lanes summed in a loop, and compares every output
// with the CPU pointwise loops fed by a plain recurrent GEMM.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "pipelstm/kernels/lstm_persistent.h"
#include "pipelstm/kernels/lstm_pointwise.h"
#include "persistent_tc_reference.h"  // the reference the tensor-core kernels share
#include "persistent_test_support.h"

using namespace pipelstm::kernels;
using testing::Identity;

// The kernel's schedule on the host: `blocks` blocks of `units` units each.
void run_persistent(const PersistentForwardArgs<float>& a, int64_t blocks) {
  const int64_t H = a.hidden, B = a.batch;
  const int64_t units = persistent::units_per_block(H, blocks);
  std::vector<std::vector<float>> slices(blocks);
  for (int64_t g = 0; g < blocks; ++g) {
    const int64_t j0 = g * units, mine = j0 < H ? std::min(units, H - j0) : 0;
    slices[g].resize(mine * 4 * H);
    for (int64_t u = 0; u < mine; ++u)
      for (int k = 0; k < 4; ++k)
        for (int64_t i = 0; i < H; ++i)
          slices[g][persistent::slice_row(u, k) * H + i] = a.w_hh[(k * H + j0 + u) * H + i];
  }
  for (int64_t p = 0; p < a.steps; ++p) {
    const int64_t t = persistent::step_at(p, a.steps, a.reverse);
    for (int64_t g = 0; g < blocks; ++g) {
      const int64_t j0 = g * units, mine = j0 < H ? std::min(units, H - j0) : 0;
      for (int64_t item = 0; item < B * mine; ++item) {
        const int64_t b = item / mine, u = item % mine;
        const float* h_row = persistent::h_prev_row(a, p, b);
        float dot[4];
        for (int k = 0; k < 4; ++k) {
          dot[k] = 0.0f;
          for (int lane = 0; lane < 32; ++lane)
            dot[k] += persistent::partial_dot(&slices[g][persistent::slice_row(u, k) * H], h_row,
                                              H, lane, 32, Identity());
        }
        persistent::finish_unit(a, t, p, b, j0 + u, dot, Identity(), Identity());
      }
    }
  }
}

int main() {
  std::mt19937 rng(0);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  int passed = 0, failed = 0;
  const int64_t sizes[][4] = {{1, 1, 1, 1}, {5, 3, 7, 4}, {4, 2, 33, 8}, {3, 4, 64, 132}, {6, 1, 20, 3}};
  for (const auto& sz : sizes) {
    for (bool reverse : {false, true}) {
      const int64_t T = sz[0], B = sz[1], H = sz[2], blocks = sz[3];
      auto vec = [&](int64_t n) {
        std::vector<float> v(n);
        for (auto& x : v) x = normal(rng);
        return v;
      };
      const auto xg = vec(T * B * 4 * H), w = vec(4 * H * H), h0 = vec(B * H), c0 = vec(B * H);
      const double worst = testing::forward_error(
          xg, w, h0, c0, T, B, H, reverse,
          [&](const PersistentForwardArgs<float>& a) { run_persistent(a, blocks); });
      const bool ok = worst <= 1e-5;
      (ok ? passed : failed)++;
      if (!ok) std::printf("FAIL T=%ld B=%ld H=%ld blocks=%ld reverse=%d: error %g\n", long(T), long(B),
                           long(H), long(blocks), int(reverse), worst);
    }
  }
  std::printf("persistent: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
