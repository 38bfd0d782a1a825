// RMSNorm over the last dimension as a unit (torch.nn.RMSNorm): the input
// divided by the root of its mean square plus eps, times an optional
// weight. Forward on ATen's kernel; the backward (ATen has a CPU one only
// through autograd) from the saved rstd:
//   gx = rstd * (gy - x_hat * mean(gy * x_hat)),  x_hat = x * rstd, gy = g * weight,
// in the dtype of rstd (float for half inputs, as ATen's forward). Each
// item's weight gradient comes with its data gradient and is summed in a
// fixed order, as LayerNorm's.
#include <ATen/ATen.h>

#include <optional>

#include "kinds.h"

namespace pipelstm::pipeline {
namespace {

// UnitSpec::eps below zero: torch's default (eps=None), the machine epsilon
// of the input's dtype, which ATen picks when given none.
std::optional<double> eps_of(const UnitSpec& u) {
  return u.eps < 0 ? std::nullopt : std::optional<double>(u.eps);
}

Tensor forward(const UnitSpec& u, const UnitParams& p, const Tensor& x, bool, bool keep, Tensor&,
               Tensor&, std::vector<Tensor>& saved, uint64_t, const ItemContext&) {
  auto [y, rstd] = at::_fused_rms_norm(x, {x.size(-1)}, p[0], eps_of(u));
  if (keep) saved = {x, rstd};
  return y;
}

Tensor backward_data(const UnitSpec&, const UnitParams& p, const Tensor& g,
                     const std::vector<Tensor>& saved, OptTensor&, OptTensor&, Piece& piece) {
  if (!g.defined()) return g;
  const Tensor& rstd = saved[1];
  const Tensor x_hat = saved[0].to(rstd.scalar_type()) * rstd;
  const Tensor go = g.to(rstd.scalar_type());
  const Tensor gy = p[0].has_value() ? go * p[0]->to(rstd.scalar_type()) : go;
  const Tensor gx = rstd * (gy - x_hat * (gy * x_hat).mean(-1, /*keepdim=*/true));
  if (p[0].has_value()) {
    piece = {(go * x_hat).reshape({-1, x_hat.size(-1)}).sum(0).to(p[0]->scalar_type())};
  }
  return gx.to(saved[0].scalar_type());
}

void weight_grads(const UnitSpec&, const UnitParams& p, const Pieces& pieces,
                  std::vector<Tensor>& acc) {
  if (!p[0].has_value()) return;
  for_each_piece(pieces, [&](const Piece& piece) { accumulate(acc, 0, piece[0]); });
}

}  // namespace

const RegisterUnitKind kRegistered{{.name = "RMSNorm", .py_name = "rms_norm", .forward = &forward,
                                    .backward_data = &backward_data,
                                    .weight_grads = &weight_grads,
                                    .keep_for_replay = &recompute_input_for_replay, .slots = {"weight"},
                                    .options = {"eps"}}};

}  // namespace pipelstm::pipeline
