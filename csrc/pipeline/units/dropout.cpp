// Dropout as a unit: a Bernoulli mask per item, seeded by (pass, unit,
// item) (units.h: dropout_seed), kept for backward and for replaying a
// recomputed item. On the CPU the mask is cpu/bernoulli_mask_cpu.h's,
// elsewhere drawn from a generator of that seed.
#include <ATen/ATen.h>

#include "../../cpu/bernoulli_mask_cpu.h"
#include "kinds.h"

namespace pipelstm::pipeline {
namespace {

Tensor forward(const UnitSpec& u, const UnitParams&, const Tensor& x, bool training, bool keep,
               Tensor&, Tensor&, std::vector<Tensor>& saved, uint64_t seed, const ItemContext&) {
  if (!training || u.p == 0.0) return x;
  Tensor mask;
  if (u.p >= 1.0) {
    mask = at::zeros_like(x, at::MemoryFormat::Contiguous);
  } else if (x.is_cpu()) {  // drawn by every thread (bernoulli_ draws serially)
    mask = cpu::bernoulli_mask(seed, 0, x.sizes(), u.p, 0.0, 1.0 / (1.0 - u.p), x.scalar_type());
  } else {
    mask = at::empty_like(x, at::MemoryFormat::Contiguous);
    mask.bernoulli_(1.0 - u.p, seeded_generator(x.device(), seed)).div_(1.0 - u.p);
  }
  if (keep) saved = {mask};
  return x * mask;
}

}  // namespace

Tensor times_kept_mask(const UnitSpec&, const UnitParams&, const Tensor& g,
                       const std::vector<Tensor>& saved, OptTensor&, OptTensor&, Piece&) {
  if (!g.defined() || saved.empty()) return g;
  return g * saved[0];
}

void keep_mask_for_replay(std::vector<Tensor>&) {}  // the mask

const RegisterUnitKind kRegistered{{.name = "Dropout", .py_name = "dropout", .forward = &forward,
                                    .backward_data = &times_kept_mask, .weight_grads = nullptr,
                                    .keep_for_replay = &keep_mask_for_replay, .options = {"p"},
                                    .replay = Replay::Mask}};

}  // namespace pipelstm::pipeline
