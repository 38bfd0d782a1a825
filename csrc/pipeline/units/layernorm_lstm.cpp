// A LayerNorm LSTM layer (pipelstm.LayerNormLSTM) as a unit: the fused
// LayerNorm layer op over each item, its (h, c) carried from chunk to chunk
// by the stage as an LSTM layer's. The op's backward gives every gradient
// at once, so an item's weight gradients come with its data gradient (in
// its piece) and are summed in a fixed order, as a LayerNorm unit's are.
// The op has a CPU kernel only (float32, float64).
#include <ATen/ATen.h>

#include "../../lstm_ops.h"
#include "kinds.h"

namespace pipelstm::pipeline {
namespace {

// Slots: w_ih, w_hh, b_ih, b_hh, the gains of the input's, the recurrent
// and the cell's normalisation, the cell's shift.
LayerNormWeights weights(const UnitSpec& u, const UnitParams& p) {
  LayerNormWeights w;
  w.w_ih = need(p[0], u, "w_ih");
  w.w_hh = need(p[1], u, "w_hh");
  if (p[2].has_value() && p[3].has_value()) {
    w.bias = *p[2] + *p[3];
  } else {
    w.bias = p[2].has_value() ? p[2] : p[3];
  }
  w.gamma_ih = need(p[4], u, "layer_norm_ih_weight");
  w.gamma_hh = need(p[5], u, "layer_norm_hh_weight");
  w.gamma_c = need(p[6], u, "layer_norm_c_weight");
  w.beta_c = p[7];
  return w;
}

// A packed item runs from the carried state of the sequences still running
// at its first step (a prefix of the micro-batch's); the others keep theirs.
// An item without rows computes nothing.
Tensor forward(const UnitSpec& u, const UnitParams& p, const Tensor& x, bool, bool keep, Tensor& h,
               Tensor& c, std::vector<Tensor>& saved, uint64_t, const ItemContext& item) {
  TORCH_CHECK(x.is_cpu(), "pipelstm pipeline: ", u.name,
              " (a LayerNorm LSTM layer) runs on the CPU only, got its input on ", x.device(),
              "; place the stage that holds it on the CPU");
  const LayerNormWeights w = weights(u, p);
  if (!item.packed) {
    auto [out, h_n, c_n, ws] = lstm_layernorm_layer_forward(x, std::nullopt, h, c, w, u.eps);
    if (keep) saved = {x, h, c, out, ws};
    h = h_n;
    c = c_n;
    return out;
  }
  const Tensor& bs = item.batch_sizes;
  if (!bs.defined()) {
    if (keep) saved.clear();
    return at::empty({0, w.w_hh.size(1)}, w.w_ih.options());
  }
  const int64_t n0 = bs.const_data_ptr<int64_t>()[0], rest = h.size(0) - n0;
  const Tensor h0 = h.narrow(0, 0, n0).contiguous(), c0 = c.narrow(0, 0, n0).contiguous();
  auto [out, h_n, c_n, ws] = lstm_layernorm_layer_forward(x, bs, h0, c0, w, u.eps);
  if (keep) saved = {x, h, c, out, ws, bs};  // the micro-batch's whole state before the item
  h = rest == 0 ? h_n : at::cat({h_n, h.narrow(0, n0, rest)});
  c = rest == 0 ? c_n : at::cat({c_n, c.narrow(0, n0, rest)});
  return out;
}

// piece: the item's weight gradients in the slots' order less b_hh's (the
// same as b_ih's): w_ih, w_hh, bias, the three gains, the cell's shift.
Tensor backward_data(const UnitSpec& u, const UnitParams& p, const Tensor& g,
                     const std::vector<Tensor>& saved, OptTensor& grad_h, OptTensor& grad_c,
                     Piece& piece) {
  if (saved.empty()) {  // a packed item without rows
    return g.defined() ? at::zeros({0, need(p[0], u, "w_ih").size(1)}, g.options()) : Tensor();
  }
  if (!g.defined() && !grad_h.has_value() && !grad_c.has_value()) return Tensor();
  const Tensor &x = saved[0], &out = saved[3], &ws = saved[4];
  const bool packed = saved.size() == 6;
  const int64_t rows = saved[1].size(0);
  const int64_t n0 = packed ? saved[5].const_data_ptr<int64_t>()[0] : rows;
  const auto first = [&](const OptTensor& t) -> OptTensor {
    if (!t.has_value() || n0 == rows) return t;
    return t->narrow(0, 0, n0).contiguous();
  };
  const Tensor h0 = saved[1].narrow(0, 0, n0).contiguous(), c0 = saved[2].narrow(0, 0, n0).contiguous();
  const OptTensor bs = packed ? OptTensor(saved[5]) : std::nullopt;
  auto [grad_input, grad_h0, grad_c0, w_ih, w_hh, bias, gamma_ih, gamma_hh, gamma_c, beta_c] =
      lstm_layernorm_layer_backward(g.defined() ? OptTensor(g) : std::nullopt, first(grad_h),
                                    first(grad_c), x, bs, h0, c0, weights(u, p), out, ws);
  grad_h = join_state_grad(grad_h0, grad_h, rows);
  grad_c = join_state_grad(grad_c0, grad_c, rows);
  piece = {w_ih, w_hh, bias, gamma_ih, gamma_hh, gamma_c, beta_c};
  return grad_input;
}

void weight_grads(const UnitSpec&, const UnitParams& p, const Pieces& pieces,
                  std::vector<Tensor>& acc) {
  for (const auto& row : pieces) {
    for (const auto& piece : row) {
      if (piece.empty()) continue;
      accumulate(acc, 0, piece[0]);
      accumulate(acc, 1, piece[1]);
      if (p[2].has_value()) accumulate(acc, 2, piece[2]);
      if (p[3].has_value()) accumulate(acc, 3, p[2].has_value() ? piece[2].clone() : piece[2]);
      for (size_t slot = 4; slot < 7; ++slot) accumulate(acc, slot, piece[slot - 1]);
      if (p[7].has_value()) accumulate(acc, 7, piece[6]);
    }
  }
}

// Replaying needs the initial (h, c).
void keep_for_replay(std::vector<Tensor>& saved) { saved = {saved[1], saved[2]}; }

}  // namespace

const RegisterUnitKind kRegistered{
    {.name = "LayerNorm LSTM layer", .py_name = "layernorm_lstm", .forward = &forward,
     .backward_data = &backward_data, .weight_grads = &weight_grads,
     .keep_for_replay = &keep_for_replay,
     .slots = {"weight_ih", "weight_hh", "bias_ih", "bias_hh", "layer_norm_ih_weight",
               "layer_norm_hh_weight", "layer_norm_c_weight", "layer_norm_c_bias"},
     .options = {"eps"}, .has_state = true}};

}  // namespace pipelstm::pipeline
