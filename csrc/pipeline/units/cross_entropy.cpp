// The loss as the last unit of the last stage: each item's summed
// cross-entropy over its tokens (the pass divides the total for a mean);
// its backward starts from the gradient of that sum.
//
// On the CPU in float32 the log-softmax is written to a buffer from the
// kept mappings (huge_pages.h) and the backward turns that buffer, which
// only this unit holds, into the logits' gradient in place:
// g * (softmax - onehot(target)), zero on ignored tokens. ATen's path
// (below, for other devices and dtypes) allocates the log-softmax, a
// zero-filled gradient for nll_loss and the logits' gradient afresh: for a
// 10k-way decoder three buffers of the logits' size per item, each mapped
// and faulted in by glibc every time.
#include <ATen/ATen.h>

#include "../../backend.h"
#include "kinds.h"

namespace pipelstm::pipeline {
namespace {

bool cpu_float(const Tensor& x) { return x.device().is_cpu() && x.scalar_type() == at::kFloat; }

Tensor forward(const UnitSpec& u, const UnitParams&, const Tensor& x, bool, bool keep, Tensor&,
               Tensor&, std::vector<Tensor>& saved, uint64_t, const ItemContext& item) {
  const Tensor& target = item.target;
  TORCH_CHECK(target.defined() && x.dim() == target.dim() + 1,
              "the loss expects logits [T, B, classes] (packed: [N, classes]), got ", x.sizes());
  const Tensor x2 = x.reshape({-1, x.size(-1)});
  Tensor lsm;
  if (cpu_float(x)) {
    lsm = backend::empty_buffer(x2.sizes(), x2.options());
    at::_log_softmax_out(lsm, x2.contiguous(), 1, false);
  } else {
    lsm = at::log_softmax(x2, 1);
  }
  auto [loss, total_weight] = at::nll_loss_forward(lsm, target.reshape({-1}), {},
                                                   at::Reduction::Sum, u.ignore_index);
  if (keep) saved = {lsm, target, total_weight};
  return loss;
}

// d(sum of -lsm[r, target[r]]) / d(logits) times g, in place in `lsm`.
// nll_loss_forward has checked every target against the classes.
Tensor gradient_in_place(const Tensor& lsm, const Tensor& target, const Tensor& g,
                         int64_t ignore_index) {
  const float scale = g.item<float>();
  lsm.exp_().mul_(scale);
  const Tensor t = target.reshape({-1}).to(at::kLong).contiguous();
  const int64_t* tp = t.data_ptr<int64_t>();
  float* row = lsm.data_ptr<float>();
  const int64_t rows = lsm.size(0), classes = lsm.size(1);
  for (int64_t r = 0; r < rows; ++r, row += classes) {
    if (tp[r] == ignore_index) {
      std::fill(row, row + classes, 0.0f);
    } else {
      row[tp[r]] -= scale;
    }
  }
  return lsm;
}

Tensor backward_data(const UnitSpec& u, const UnitParams&, const Tensor& g,
                     const std::vector<Tensor>& saved, OptTensor&, OptTensor&, Piece&) {
  if (!g.defined()) return g;
  const Tensor &lsm = saved[0], &target = saved[1];
  std::vector<int64_t> shape = target.sizes().vec();  // [T, B] or packed [N]
  shape.push_back(lsm.size(1));
  if (cpu_float(lsm) && lsm.is_contiguous()) {
    return gradient_in_place(lsm, target, g, u.ignore_index).view(shape);
  }
  const Tensor grad_lsm = at::nll_loss_backward(g, lsm, target.reshape({-1}), {},
                                                at::Reduction::Sum, u.ignore_index, saved[2]);
  return at::_log_softmax_backward_data(grad_lsm, lsm, 1, lsm.scalar_type()).view(shape);
}

void keep_for_replay(std::vector<Tensor>& saved) { saved = {saved[1]}; }  // the target

}  // namespace

const RegisterUnitKind kRegistered{{.name = "CrossEntropy", .py_name = "cross_entropy",
                                    .forward = &forward, .backward_data = &backward_data,
                                    .weight_grads = nullptr, .keep_for_replay = &keep_for_replay,
                                    .options = {"ignore_index", "mean"}, .is_loss = true}};

}  // namespace pipelstm::pipeline
