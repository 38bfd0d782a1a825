// What the LSTM kinds (units/lstm.cpp, units/layernorm_lstm.cpp) share: an
// item run from the state its stage carries from chunk to chunk, what it
// saves, and its backward from what it saved. Defined in units/lstm.cpp.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "../units.h"
#include "zoneout_keeps.h"

namespace pipelstm::pipeline {

// t, or nullopt where it is undefined (an op's optional argument).
inline OptTensor given(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

// join_state_grad: the state gradient of a micro-batch's `rows` sequences
// from that of the first n0 = first.size(0) (those a packed item ran) and
// the rest's in `all`, carried through unchanged.
OptTensor join_state_grad(const Tensor& first, const OptTensor& all, int64_t rows);

// StateRows: an item and the carried state (h, c) of its micro-batch's
// `rows` sequences: a dense item (no batch sizes) runs them all, a packed
// item only the first n0 = batch_sizes[0] (those still running, a prefix),
// the others keep theirs.
struct StateRows {
  StateRows(const Tensor& state, const Tensor& batch_sizes);
  int64_t rows, n0;
  // t's rows of the sequences the item runs (nullopt stays nullopt).
  Tensor first(const Tensor& t) const;
  OptTensor first(const OptTensor& t) const;
  // The state after the item: `ran` for its sequences, then before's rest.
  Tensor after(const Tensor& ran, const Tensor& before) const;
};

// An LSTM kind's item through `op(h0, c0) -> (out, h_n, c_n, workspace)`
// from the carried state (StateRows), which it then carries on; with
// `keep`, saves x, the micro-batch's (h, c) before the item, out,
// workspace, the batch sizes (undefined: dense) and zoneout's keep weights
// (undefined: none).
template <class Op>
Tensor run_lstm_item(const Tensor& x, const Tensor& batch_sizes, const ItemKeeps& keeps, bool keep, Tensor& h,
                     Tensor& c, std::vector<Tensor>& saved, Op&& op) {
  const StateRows r(h, batch_sizes);
  auto [out, h_n, c_n, ws] = op(r.first(h), r.first(c));
  if (keep) saved = {x, h, c, out, ws, batch_sizes, keeps.c, keeps.h};
  h = r.after(h_n, h);
  c = r.after(c_n, c);
  return out;
}

// The backward of an item run_lstm_item saved, through `op(grad_output,
// grad_h_n, grad_c_n, x, batch_sizes, h0, c0, keep_c, keep_h, out,
// workspace) -> (grad_input, grad_h0, grad_c0, the weights' gradients...)`:
// the state gradients joined with the rest's (join_state_grad), the
// weights' into `piece`. A packed item without rows gives no gradient, or
// zeros [0, input_size].
template <class Op>
Tensor backward_lstm_item(const Tensor& g, int64_t input_size, const std::vector<Tensor>& saved,
                          OptTensor& grad_h, OptTensor& grad_c, Piece& piece, Op&& op) {
  if (saved.empty()) return g.defined() ? at::zeros({0, input_size}, g.options()) : Tensor();
  if (!g.defined() && !grad_h.has_value() && !grad_c.has_value()) return Tensor();
  const StateRows r(saved[1], saved[5]);
  const auto grads = op(given(g), r.first(grad_h), r.first(grad_c), saved[0], given(saved[5]), r.first(saved[1]),
                        r.first(saved[2]), saved[6], saved[7], saved[3], saved[4]);
  std::apply([&](const Tensor&, const Tensor& grad_h0, const Tensor& grad_c0, const auto&... weights) {
    grad_h = join_state_grad(grad_h0, grad_h, r.rows);
    grad_c = join_state_grad(grad_c0, grad_c, r.rows);
    piece = {weights...};
  }, grads);
  return std::get<0>(grads);
}

}  // namespace pipelstm::pipeline
