// Random two-valued masks drawn on the CPU by all of ATen's intra-op
// threads (kernels/.../bernoulli_mask.h): each element `below` with
// probability p, else `above`; the mask depends on (seed, stream) alone,
// never on the thread count. torch.rand's Mersenne Twister draws serially,
// which costs a zoneout layer a good part of its step time.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace pipelstm {
namespace cpu {

at::Tensor bernoulli_mask(uint64_t seed, uint64_t stream, at::IntArrayRef size, double p, double below,
                          double above, at::ScalarType dtype);

}  // namespace cpu
}  // namespace pipelstm
