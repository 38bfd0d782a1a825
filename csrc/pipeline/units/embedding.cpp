// An Embedding as a unit; its weight gradient over all items at once, so
// that scale_grad_by_freq counts over the whole batch, as unsplit.
#include <ATen/ATen.h>

#include "kinds.h"

namespace pipelstm::pipeline {
namespace {

Tensor forward(const UnitSpec& u, const UnitParams& p, const Tensor& x, bool, bool keep, Tensor&,
               Tensor&, std::vector<Tensor>& saved, uint64_t, const ItemContext&) {
  TORCH_CHECK(x.scalar_type() == at::kLong || x.scalar_type() == at::kInt,
              "Embedding expects integer indices, got ", x.scalar_type());
  if (keep) saved = {x};
  return at::embedding(need(p[0], u, "weight"), x, u.padding_idx, u.scale_grad_by_freq,
                       /*sparse=*/false);
}

Tensor backward_data(const UnitSpec&, const UnitParams&, const Tensor& g,
                     const std::vector<Tensor>& saved, OptTensor&, OptTensor&, Piece& piece) {
  if (g.defined()) piece = {saved[0], g};
  return Tensor();  // indices have no gradient
}

void weight_grads(const UnitSpec& u, const UnitParams& p, const Pieces& pieces,
                  std::vector<Tensor>& acc) {
  std::vector<Tensor> indices, grads;
  for_each_piece(pieces, [&](const Piece& piece) {
    indices.push_back(piece[0].reshape({-1}));
    grads.push_back(piece[1].reshape({-1, piece[1].size(-1)}));
  });
  if (indices.empty()) return;
  accumulate(acc, 0,
             at::embedding_dense_backward(at::cat(grads, 0), at::cat(indices, 0), p[0]->size(0),
                                          u.padding_idx, u.scale_grad_by_freq));
}

}  // namespace

const RegisterUnitKind kRegistered{{.name = "Embedding", .py_name = "embedding",
                                    .forward = &forward, .backward_data = &backward_data,
                                    .weight_grads = &weight_grads,
                                    .keep_for_replay = &recompute_input_for_replay, .slots = {"weight"},
                                    .options = {"padding_idx", "scale_grad_by_freq"},
                                    .replay = Replay::InputIfLast}};

}  // namespace pipelstm::pipeline
