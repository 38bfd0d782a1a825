// Two-valued random masks from a counter-based stream: element i is `below`
// where the top 24 bits of word i of the Philox4x32-10 stream (seed,
// stream) fall below `threshold` (u_i < p for threshold = ceil(p 2^24), the
// resolution of torch.rand's float32), else `above`. Word i is what ATen's
// philox_engine(seed, stream) returns on its i-th call, so any split of the
// elements over threads gives the same mask.
#pragma once

#include <cstdint>

namespace pipelstm {
namespace kernels {

// The threshold of probability p in [0, 1].
uint32_t bernoulli_threshold(double p);

// Elements [begin, end) of the mask into out[begin, end). T: float, double,
// or uint16_t holding float16 or bfloat16 bits.
template <typename T>
void bernoulli_mask_cpu(uint64_t seed, uint64_t stream, uint32_t threshold, T below, T above, T* out,
                        int64_t begin, int64_t end);

}  // namespace kernels
}  // namespace pipelstm
