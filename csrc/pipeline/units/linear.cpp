// A Linear as a unit; its weight gradient summed piece by piece in a fixed
// order (no copy of the output gradients, which for a decoder are as large
// as its logits). On the CPU in float32 its three GEMMs go through
// backend.h, on the CPU the LSTM layers' GEMM dispatch (the fused kernels'
// GEMM where PIPELSTM_CPU_GEMM picks it): a 10k-way decoder is most of a
// language model's arithmetic, and at::linear's MKL runs its AVX2 code on
// AMD CPUs (docs/cpu.md, "GEMM backend").
#include <ATen/ATen.h>

#include "../../backend.h"
#include "kinds.h"

namespace pipelstm::pipeline {
namespace {

Tensor forward(const UnitSpec& u, const UnitParams& p, const Tensor& x, bool, bool keep, Tensor&,
               Tensor&, std::vector<Tensor>& saved, uint64_t, const ItemContext&) {
  if (keep) saved = {x};
  return backend::linear(x, need(p[0], u, "weight"), p[1]);
}

Tensor backward_data(const UnitSpec&, const UnitParams& p, const Tensor& g,
                     const std::vector<Tensor>& saved, OptTensor&, OptTensor&, Piece& piece) {
  if (!g.defined()) return Tensor();
  piece = {saved[0], g};
  return backend::linear(g, p[0]->t(), std::nullopt);  // g @ W
}

void weight_grads(const UnitSpec&, const UnitParams& p, const Pieces& pieces,
                  std::vector<Tensor>& acc) {
  const Tensor& w = *p[0];
  for_each_piece(pieces, [&](const Piece& piece) {
    const Tensor x2 = piece[0].reshape({-1, w.size(1)}), g2 = piece[1].reshape({-1, w.size(0)});
    const bool first = !acc[0].defined();
    if (first) acc[0] = at::empty({w.size(0), w.size(1)}, g2.options());
    backend::linear_mm_out(acc[0], g2.t(), x2, /*accumulate=*/!first);  // at::mm off the CPU
    if (p[1].has_value()) accumulate(acc, 1, g2.sum(0));
  });
}

}  // namespace

const RegisterUnitKind kRegistered{{.name = "Linear", .py_name = "linear", .forward = &forward,
                                    .backward_data = &backward_data,
                                    .weight_grads = &weight_grads,
                                    .keep_for_replay = &recompute_input_for_replay,
                                    .slots = {"weight", "bias"},
                                    .replay = Replay::InputIfLast}};

}  // namespace pipelstm::pipeline
