// A Linear as a unit; its weight gradient summed piece by piece in a fixed
// order (no copy of the output gradients, which for a decoder are as large
// as its logits).
#include <ATen/ATen.h>

#include "kinds.h"

namespace pipelstm::pipeline {
namespace {

Tensor forward(const UnitSpec& u, const UnitParams& p, const Tensor& x, bool, bool keep, Tensor&,
               Tensor&, std::vector<Tensor>& saved, uint64_t, const Tensor&) {
  if (keep) saved = {x};
  return at::linear(x, need(p[0], u, "weight"), p[1]);
}

Tensor backward_data(const UnitSpec&, const UnitParams& p, const Tensor& g,
                     const std::vector<Tensor>& saved, OptTensor&, OptTensor&, Piece& piece) {
  if (!g.defined()) return Tensor();
  piece = {saved[0], g};
  return at::matmul(g, *p[0]);
}

void weight_grads(const UnitSpec&, const UnitParams& p, const Pieces& pieces,
                  std::vector<Tensor>& acc) {
  const Tensor& w = *p[0];
  for (const auto& row : pieces) {
    for (const auto& piece : row) {
      if (piece.empty()) continue;
      const Tensor x2 = piece[0].reshape({-1, w.size(1)}), g2 = piece[1].reshape({-1, w.size(0)});
      if (acc[0].defined()) {
        acc[0].addmm_(g2.t(), x2);
      } else {
        acc[0] = at::mm(g2.t(), x2);
      }
      if (p[1].has_value()) accumulate(acc, 1, g2.sum(0));
    }
  }
}

void keep_for_replay(std::vector<Tensor>& saved) { saved.clear(); }  // the input is recomputed

}  // namespace

const UnitKindOps kLinearUnit{UnitKind::Linear, "Linear", "linear", &forward, &backward_data,
                              &weight_grads, &keep_for_replay};

}  // namespace pipelstm::pipeline
