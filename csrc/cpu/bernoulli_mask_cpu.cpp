#include "bernoulli_mask_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/bit_cast.h>
#include <torch/library.h>

#include <type_traits>

#include "pipelstm/kernels/bernoulli_mask.h"

namespace pipelstm {
namespace cpu {

at::Tensor bernoulli_mask(uint64_t seed, uint64_t stream, at::IntArrayRef size, double p, double below,
                          double above, at::ScalarType dtype) {
  TORCH_CHECK(p >= 0.0 && p <= 1.0, "pipelstm::bernoulli_mask: expected p in [0, 1], got ", p);
  at::Tensor mask = at::empty(size, at::TensorOptions().dtype(dtype));
  const uint32_t threshold = kernels::bernoulli_threshold(p);
  constexpr int64_t kGrain = 16384;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "pipelstm_bernoulli_mask", [&] {
    // The kernels take float16 and bfloat16 as their bits.
    using bits_t = std::conditional_t<sizeof(scalar_t) == 2, uint16_t, scalar_t>;
    const auto lo = c10::bit_cast<bits_t>(static_cast<scalar_t>(below));
    const auto hi = c10::bit_cast<bits_t>(static_cast<scalar_t>(above));
    auto* out = reinterpret_cast<bits_t*>(mask.mutable_data_ptr<scalar_t>());
    at::parallel_for(0, mask.numel(), kGrain, [&](int64_t begin, int64_t end) {
      kernels::bernoulli_mask_cpu<bits_t>(seed, stream, threshold, lo, hi, out, begin, end);
    });
  });
  return mask;
}

namespace {

at::Tensor bernoulli_mask_op(const at::Tensor& seed, at::IntArrayRef size, double p, double below,
                             double above, at::ScalarType dtype) {
  TORCH_CHECK(seed.dim() == 0 && seed.scalar_type() == at::kLong,
              "pipelstm::bernoulli_mask: expected `seed` to be a 0-dim int64 tensor, got a ", seed.dim(),
              "-D ", seed.scalar_type(), " tensor");
  return bernoulli_mask(static_cast<uint64_t>(seed.item<int64_t>()), 0, size, p, below, above, dtype);
}

}  // namespace
}  // namespace cpu
}  // namespace pipelstm

TORCH_LIBRARY_IMPL(pipelstm, CPU, m) { m.impl("bernoulli_mask", pipelstm::cpu::bernoulli_mask_op); }
