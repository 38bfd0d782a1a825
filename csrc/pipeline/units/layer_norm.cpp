// LayerNorm over the last dimension as a unit; each item's parameter
// gradients come with its data gradient and are summed in a fixed order.
#include <ATen/ATen.h>

#include "kinds.h"

namespace pipelstm::pipeline {
namespace {

Tensor forward(const UnitSpec& u, const UnitParams& p, const Tensor& x, bool, bool keep, Tensor&,
               Tensor&, std::vector<Tensor>& saved, uint64_t, const ItemContext&) {
  auto [y, mean, rstd] = at::native_layer_norm(x, {x.size(-1)}, p[0], p[1], u.eps);
  if (keep) saved = {x, mean, rstd};
  return y;
}

Tensor backward_data(const UnitSpec&, const UnitParams& p, const Tensor& g,
                     const std::vector<Tensor>& saved, OptTensor&, OptTensor&, Piece& piece) {
  if (!g.defined()) return g;
  auto [gx, gw, gb] = at::native_layer_norm_backward(
      g.contiguous(), saved[0], {saved[0].size(-1)}, saved[1], saved[2], p[0], p[1],
      {true, p[0].has_value(), p[1].has_value()});
  piece = {gw, gb};
  return gx;
}

void weight_grads(const UnitSpec&, const UnitParams& p, const Pieces& pieces,
                  std::vector<Tensor>& acc) {
  for_each_piece(pieces, [&](const Piece& piece) {
    if (p[0].has_value()) accumulate(acc, 0, piece[0]);
    if (p[1].has_value()) accumulate(acc, 1, piece[1]);
  });
}

}  // namespace

const RegisterUnitKind kRegistered{{.name = "LayerNorm", .py_name = "layer_norm",
                                    .forward = &forward, .backward_data = &backward_data,
                                    .weight_grads = &weight_grads,
                                    .keep_for_replay = &recompute_input_for_replay,
                                    .slots = {"weight", "bias"}, .options = {"eps"}}};

}  // namespace pipelstm::pipeline
