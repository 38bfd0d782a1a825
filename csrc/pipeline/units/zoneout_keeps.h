// Zoneout's keep weights for the LSTM kinds' items (units/lstm.cpp,
// units/layernorm_lstm.cpp): masks drawn per item from the pass's seed, as a
// dropout unit's are, so a pass is reproducible under torch.manual_seed
// whatever order the stages run in.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "../units.h"

namespace pipelstm::pipeline {

// The keep weights of item (m, k) of unit `unit` in a pass, seeded with
// dropout_seed(pass_seed, unit, m, k): keep_c then keep_h, each [rows, H] of
// 0 and 1 (1, the previous value kept, with probability p_c or p_h), in
// like's dtype, drawn on the CPU by Philox streams 0 and 1 of the seed
// (cpu/bernoulli_mask_cpu.h), elsewhere by a generator on like's device.
std::pair<Tensor, Tensor> zoneout_masks(uint64_t seed, int64_t rows, int64_t H, double p_c, double p_h,
                                        const Tensor& like);

// What a unit's item runs with: none (undefined) for a unit without
// zoneout; while training the item's masks (replaying: those its
// keep_for_replay kept, saved[2] and saved[3]); in evaluation the
// probabilities, one row expanded.
struct ItemKeeps {
  Tensor c, h;
};
bool has_zoneout(const UnitSpec& u);
// The item's rows are x's: [T, B, ...] dense, [N, ...] packed.
ItemKeeps zoneout_keeps(const UnitSpec& u, const Tensor& x, int64_t H, bool training, uint64_t seed,
                        const ItemContext& item, const std::vector<Tensor>& saved);

}  // namespace pipelstm::pipeline
