#include "zoneout_keeps.h"

#include <ATen/ATen.h>

#include "../../cpu/bernoulli_mask_cpu.h"

namespace pipelstm::pipeline {

std::pair<Tensor, Tensor> zoneout_masks(uint64_t seed, int64_t rows, int64_t H, double p_c, double p_h,
                                        const Tensor& like) {
  if (like.is_cpu()) {  // every thread draws (the serial at::rand would cost a step's time)
    return {cpu::bernoulli_mask(seed, 0, {rows, H}, p_c, 1.0, 0.0, like.scalar_type()),
            cpu::bernoulli_mask(seed, 1, {rows, H}, p_h, 1.0, 0.0, like.scalar_type())};
  }
  at::Generator g = seeded_generator(like.device(), seed);
  const auto options = like.options().dtype(at::kFloat);
  Tensor keep_c = at::rand({rows, H}, g, options).lt_(p_c).to(like.scalar_type());
  Tensor keep_h = at::rand({rows, H}, g, options).lt_(p_h).to(like.scalar_type());
  return {keep_c, keep_h};
}

bool has_zoneout(const UnitSpec& u) { return u.zoneout_c > 0.0 || u.zoneout_h > 0.0; }

ItemKeeps zoneout_keeps(const UnitSpec& u, const Tensor& x, int64_t H, bool training, uint64_t seed,
                        const ItemContext& item, const std::vector<Tensor>& saved) {
  if (!has_zoneout(u)) return {};
  const int64_t rows = item.packed ? x.size(0) : x.size(0) * x.size(1);
  if (!training) {
    const auto probability = [&](double p) { return at::full({H}, p, x.options()).expand({rows, H}); };
    return {probability(u.zoneout_c), probability(u.zoneout_h)};
  }
  if (item.replaying) {
    TORCH_CHECK(saved.size() >= 4 && saved[2].defined(), "pipelstm pipeline: ", u.name,
                " replays an item whose zoneout masks were not kept");
    return {saved[2], saved[3]};
  }
  auto [c, h] = zoneout_masks(seed, rows, H, u.zoneout_c, u.zoneout_h, x);
  return {c, h};
}

}  // namespace pipelstm::pipeline
