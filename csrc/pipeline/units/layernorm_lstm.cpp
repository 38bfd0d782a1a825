// A LayerNorm LSTM layer (pipelstm.LayerNormLSTM) as a unit: the fused
// LayerNorm layer op over each item, its (h, c) carried from chunk to chunk
// by the stage as an LSTM layer's. The op's backward gives every gradient
// at once, so an item's weight gradients come with its data gradient (in
// its piece) and are summed in a fixed order, as a LayerNorm unit's are.
// The op computes in float32 and float64 (on CUDA in a CUDA build) and
// refuses other dtypes by name.
#include <ATen/ATen.h>

#include "../../lstm_ops.h"
#include "kinds.h"
#include "lstm_items.h"

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
// An item without rows computes nothing. Saved: x, the micro-batch's (h, c)
// before the item, out, workspace, the batch sizes (undefined: dense), and
// zoneout's keep weights (undefined: none).
Tensor forward(const UnitSpec& u, const UnitParams& p, const Tensor& x, bool training, bool keep,
               Tensor& h, Tensor& c, std::vector<Tensor>& saved, uint64_t seed, const ItemContext& item) {
  const LayerNormWeights w = weights(u, p);
  const Tensor& bs = item.batch_sizes;
  if (item.packed && !bs.defined()) {
    if (keep) saved.clear();
    return at::empty({0, w.w_hh.size(1)}, w.w_ih.options());
  }
  const ItemKeeps k = zoneout_keeps(u, x, w.w_hh.size(1), training, seed, item, saved);
  return run_lstm_item(x, bs, k, keep, h, c, saved, [&](const Tensor& h0, const Tensor& c0) {
    return lstm_layernorm_layer_forward(x, given(bs), h0, c0, w, u.eps, given(k.c), given(k.h));
  });
}

// piece: the item's weight gradients in the slots' order less b_hh's (the
// same as b_ih's): w_ih, w_hh, bias, the three gains, the cell's shift.
Tensor backward_data(const UnitSpec& u, const UnitParams& p, const Tensor& g,
                     const std::vector<Tensor>& saved, OptTensor& grad_h, OptTensor& grad_c,
                     Piece& piece) {
  const LayerNormWeights w = weights(u, p);
  return backward_lstm_item(
      g, w.w_ih.size(1), saved, grad_h, grad_c, piece,
      [&](const OptTensor& g_out, const OptTensor& g_h, const OptTensor& g_c, const Tensor& x, const OptTensor& bs,
          const Tensor& h0, const Tensor& c0, const Tensor& keep_c, const Tensor& keep_h, const Tensor& out,
          const Tensor& ws) {
        return lstm_layernorm_layer_backward(g_out, g_h, g_c, x, bs, h0, c0, w, out, ws, given(keep_c),
                                             given(keep_h));
      });
}

void weight_grads(const UnitSpec&, const UnitParams& p, const Pieces& pieces,
                  std::vector<Tensor>& acc) {
  for_each_piece(pieces, [&](const Piece& piece) {
    accumulate(acc, 0, piece[0]);
    accumulate(acc, 1, piece[1]);
    if (p[2].has_value()) accumulate(acc, 2, piece[2]);
    if (p[3].has_value()) accumulate(acc, 3, p[2].has_value() ? piece[2].clone() : piece[2]);
    for (size_t slot = 4; slot < 7; ++slot) accumulate(acc, slot, piece[slot - 1]);
    if (p[7].has_value()) accumulate(acc, 7, piece[6]);
  });
}

// Replaying needs the initial (h, c), and zoneout's masks.
void keep_for_replay(std::vector<Tensor>& saved) { saved = {saved[1], saved[2], saved[6], saved[7]}; }

}  // namespace

const RegisterUnitKind kRegistered{
    {.name = "LayerNorm LSTM layer", .py_name = "layernorm_lstm", .forward = &forward,
     .backward_data = &backward_data, .weight_grads = &weight_grads,
     .keep_for_replay = &keep_for_replay,
     .slots = {"weight_ih", "weight_hh", "bias_ih", "bias_hh", "layer_norm_ih_weight",
               "layer_norm_hh_weight", "layer_norm_c_weight", "layer_norm_c_bias"},
     .options = {"eps", "zoneout_c", "zoneout_h"}, .has_state = true}};

}  // namespace pipelstm::pipeline
