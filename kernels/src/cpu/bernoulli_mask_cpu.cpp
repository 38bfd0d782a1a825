#include "pipelstm/kernels/bernoulli_mask.h"

#include <algorithm>
#include <cmath>

#include "cpu_clones.h"

namespace pipelstm {
namespace kernels {
namespace {

// ATen's philox_engine constants (ATen/core/PhiloxRNGEngine.h).
constexpr uint64_t kKeyStepA = 0x9E3779B9, kKeyStepB = 0xBB67AE85;
constexpr uint64_t kMultiplierA = 0xD2511F53, kMultiplierB = 0xCD9E8D57;
constexpr uint64_t kLow = 0xFFFFFFFFu;
constexpr int kRounds = 10;
// Philox blocks (4 words each) a pass: the lanes of the vectorised rounds.
constexpr int64_t kBlocks = 16;
constexpr int64_t kWords = 4 * kBlocks;

// Words 4 b .. 4 b + 3 of `out`: the Philox block at counter
// (first + b, stream) under key `seed`. The 32-bit words sit in 64-bit lanes
// so that each round's 32 x 32 -> 64 products vectorise (cpu_clones.h: the
// words are the same in each clone).
PIPELSTM_CPU_CLONES void philox_blocks(uint64_t seed, uint64_t stream, uint64_t first, uint32_t (&out)[kWords]) {
  uint64_t c0[kBlocks], c1[kBlocks], c2[kBlocks], c3[kBlocks];
  for (int64_t b = 0; b < kBlocks; ++b) {
    const uint64_t n = first + static_cast<uint64_t>(b);
    c0[b] = n & kLow;
    c1[b] = n >> 32;
    c2[b] = stream & kLow;
    c3[b] = stream >> 32;
  }
  uint64_t k0 = seed & kLow, k1 = seed >> 32;
  for (int round = 0; round < kRounds; ++round) {
#pragma omp simd
    for (int64_t b = 0; b < kBlocks; ++b) {
      const uint64_t p0 = kMultiplierA * c0[b], p1 = kMultiplierB * c2[b];
      const uint64_t n0 = (p1 >> 32) ^ c1[b] ^ k0, n2 = (p0 >> 32) ^ c3[b] ^ k1;
      c1[b] = p1 & kLow;
      c3[b] = p0 & kLow;
      c0[b] = n0;
      c2[b] = n2;
    }
    k0 = (k0 + kKeyStepA) & kLow;
    k1 = (k1 + kKeyStepB) & kLow;
  }
  for (int64_t b = 0; b < kBlocks; ++b) {
    out[4 * b] = static_cast<uint32_t>(c0[b]);
    out[4 * b + 1] = static_cast<uint32_t>(c1[b]);
    out[4 * b + 2] = static_cast<uint32_t>(c2[b]);
    out[4 * b + 3] = static_cast<uint32_t>(c3[b]);
  }
}

}  // namespace

uint32_t bernoulli_threshold(double p) {
  return static_cast<uint32_t>(std::min(std::ceil(p * 16777216.0), 16777216.0));
}

template <typename T>
void bernoulli_mask_cpu(uint64_t seed, uint64_t stream, uint32_t threshold, T below, T above, T* out,
                        int64_t begin, int64_t end) {
  uint32_t words[kWords];
  for (int64_t pass = begin / kWords; pass * kWords < end; ++pass) {
    philox_blocks(seed, stream, static_cast<uint64_t>(pass * kBlocks), words);
    const int64_t first = std::max(begin, pass * kWords), last = std::min(end, (pass + 1) * kWords);
    for (int64_t i = first; i < last; ++i) out[i] = (words[i - pass * kWords] >> 8) < threshold ? below : above;
  }
}

template void bernoulli_mask_cpu<float>(uint64_t, uint64_t, uint32_t, float, float, float*, int64_t, int64_t);
template void bernoulli_mask_cpu<double>(uint64_t, uint64_t, uint32_t, double, double, double*, int64_t,
                                         int64_t);
template void bernoulli_mask_cpu<uint16_t>(uint64_t, uint64_t, uint32_t, uint16_t, uint16_t, uint16_t*, int64_t,
                                           int64_t);

}  // namespace kernels
}  // namespace pipelstm
