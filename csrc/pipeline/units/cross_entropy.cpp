// The loss as the last unit of the last stage: each item's summed
// cross-entropy over its tokens (the pass divides the total for a mean);
// its backward starts from the gradient of that sum.
#include <ATen/ATen.h>

#include "kinds.h"

namespace pipelstm::pipeline {
namespace {

Tensor forward(const UnitSpec& u, const UnitParams&, const Tensor& x, bool, bool keep, Tensor&,
               Tensor&, std::vector<Tensor>& saved, uint64_t, const Tensor& target) {
  TORCH_CHECK(x.dim() == 3 && target.defined(), "the loss expects logits [T, B, classes], got ",
              x.sizes());
  const Tensor lsm = at::log_softmax(x.reshape({-1, x.size(-1)}), 1);
  auto [loss, total_weight] = at::nll_loss_forward(lsm, target.reshape({-1}), {},
                                                   at::Reduction::Sum, u.ignore_index);
  if (keep) saved = {lsm, target, total_weight};
  return loss;
}

Tensor backward_data(const UnitSpec& u, const UnitParams&, const Tensor& g,
                     const std::vector<Tensor>& saved, OptTensor&, OptTensor&, Piece&) {
  if (!g.defined()) return g;
  const Tensor &lsm = saved[0], &target = saved[1];
  const Tensor grad_lsm = at::nll_loss_backward(g, lsm, target.reshape({-1}), {},
                                                at::Reduction::Sum, u.ignore_index, saved[2]);
  return at::_log_softmax_backward_data(grad_lsm, lsm, 1, lsm.scalar_type())
      .view({target.size(0), target.size(1), lsm.size(1)});
}

void keep_for_replay(std::vector<Tensor>& saved) { saved = {saved[1]}; }  // the target

}  // namespace

const UnitKindOps kCrossEntropyUnit{UnitKind::CrossEntropy, "CrossEntropy", "cross_entropy",
                                    &forward, &backward_data, nullptr, &keep_for_replay};

}  // namespace pipelstm::pipeline
