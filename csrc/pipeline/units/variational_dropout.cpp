// Variational (locked) dropout as a unit: one mask row per sequence of the
// micro-batch, the same at every step and in every chunk (Gal & Ghahramani
// 2016). Its seed is one per micro-batch (seed_per_micro_batch), and row s
// comes from a generator seeded by (that seed, s), so a sequence gets its
// row whichever chunk it is in and however many sequences that chunk has
// (a packed chunk holds only those still running). Kept for backward and
// for replaying a recomputed item.
#include <ATen/ATen.h>

#include "kinds.h"

namespace pipelstm::pipeline {
namespace {

// Row r of a packed item (step t holding its first batch_sizes[t]
// sequences) is sequence r - (rows before step t).
Tensor sequence_of_rows(const Tensor& batch_sizes, const c10::Device& device) {
  std::vector<Tensor> steps;
  const int64_t* b = batch_sizes.const_data_ptr<int64_t>();
  for (int64_t t = 0; t < batch_sizes.numel(); ++t) steps.push_back(at::arange(b[t], at::kLong));
  return at::cat(steps).to(device);
}

Tensor forward(const UnitSpec& u, const UnitParams&, const Tensor& x, bool training, bool keep,
               Tensor&, Tensor&, std::vector<Tensor>& saved, uint64_t seed, const ItemContext& item) {
  if (!training || u.p == 0.0 || x.numel() == 0) return x;
  const int64_t sequences = item.packed ? item.batch_sizes.const_data_ptr<int64_t>()[0] : x.size(1);
  Tensor rows = at::empty({sequences, x.size(-1)}, x.options());
  if (u.p >= 1.0) {
    rows.zero_();
  } else {
    for (int64_t s = 0; s < sequences; ++s) {
      rows[s].bernoulli_(1.0 - u.p, seeded_generator(x.device(), dropout_seed(seed, s, 0, 0)));
    }
    rows.div_(1.0 - u.p);
  }
  const Tensor mask = item.packed ? rows.index_select(0, sequence_of_rows(item.batch_sizes, x.device()))
                                  : rows.unsqueeze(0).expand_as(x);
  if (keep) saved = {mask};
  return x * mask;
}

}  // namespace

const RegisterUnitKind kRegistered{{.name = "VariationalDropout", .py_name = "variational_dropout",
                                    .forward = &forward, .backward_data = &times_kept_mask,
                                    .weight_grads = nullptr, .keep_for_replay = &keep_mask_for_replay,
                                    .options = {"p"}, .replay = Replay::Mask,
                                    .seed_per_micro_batch = true}};

}  // namespace pipelstm::pipeline
