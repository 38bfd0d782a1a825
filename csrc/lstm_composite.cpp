// The cell, the layer and the zoneout layer as compositions of ATen ops
// (CompositeImplicitAutograd).
//
// The fused ops have hand-written reverse-mode formulas only. Everything
// else nn.LSTM users differentiate with -- forward-mode AD (torch.func.jvp,
// jacfwd), torch.func's grad/vjp/jacrev/vmap (per-sample gradients), and a
// gradient of a gradient (create_graph=True, gradgradcheck) -- runs on
// these instead: autograd, forward AD and functorch's batching rules all
// know every op below, so each transform is exact by construction.
// python/pipelstm/ops.py decides when to take this path (and the formulas
// of lstm_autograd.cpp, for create_graph=True); it is the same
// math as ATen's own LSTM decomposition (aten/src/ATen/native/RNN.cpp),
// gate order i, f, g, o. A bfloat16 or float16 call on the CPU is computed
// in float32, as the CPU kernels compute it (float32_upcast.h).
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "float32_upcast.h"

namespace pipelstm {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

// Whether this call, with reference tensor `t`, computes in float32 (see
// above). Under CPU autocast it computes as given, each ATen op in the dtype
// autocast picks for it.
bool upcast(const Tensor& t) {
  return computed_in_float32(t) && !at::autocast::is_autocast_enabled(at::kCPU);
}

// gates [B, 4H] (biases included), cx [B, H] -> (hy, cy), both [B, H].
std::tuple<Tensor, Tensor> cell(const Tensor& gates, const Tensor& cx) {
  auto chunks = gates.chunk(4, 1);
  const Tensor i = chunks[0].sigmoid();
  const Tensor f = chunks[1].sigmoid();
  const Tensor g = chunks[2].tanh();
  const Tensor o = chunks[3].sigmoid();
  Tensor cy = f * cx + i * g;
  Tensor hy = o * cy.tanh();
  return {hy, cy};
}

std::tuple<Tensor, Tensor> lstm_cell_composite(const Tensor& input_gates, const Tensor& hidden_gates,
                                               const Tensor& cx, const OptTensor& b_ih,
                                               const OptTensor& b_hh) {
  if (upcast(cx)) {
    return rounded(cx.scalar_type(),
                   cell_in_float32("lstm_cell_composite", input_gates, hidden_gates, cx, b_ih, b_hh,
                                   [](const auto&... a) { return lstm_cell_composite(a...); }));
  }
  Tensor gates = input_gates + hidden_gates;
  if (b_ih) gates = gates + *b_ih;
  if (b_hh) gates = gates + *b_hh;
  return cell(gates, cx);
}

// What one step needs besides its input projection.
struct Recurrence {
  const Tensor& w_hh;
  const OptTensor& w_hr;
  // Zoneout's keep weights of every output row, as the output is laid out
  // ([T, B, H] or [N, H]); undefined without zoneout (never with w_hr).
  Tensor keep_c, keep_h;

  // x_gates [b, 4H] = x @ w_ih.T + biases for the b rows of this step;
  // (h [b, P], c [b, H]) -> the next (h, c). `rows(keep)`: this step's rows
  // of a keep weight.
  template <class Rows>
  std::tuple<Tensor, Tensor> step(const Tensor& x_gates, const Tensor& h, const Tensor& c,
                                  const Rows& rows) const {
    auto [hy, cy] = cell(x_gates + at::matmul(h, w_hh.t()), c);
    if (keep_c.defined()) {  // h from the new cell, then both blended (gate_math.h, zoned)
      const Tensor kc = rows(keep_c), kh = rows(keep_h);
      cy = cy + kc * (c - cy);
      hy = hy + kh * (h - hy);
    }
    if (w_hr) hy = at::matmul(hy, w_hr->t());
    return {hy, cy};
  }
};

// input [..., I] -> input @ w_ih.T + b_ih + b_hh, computed once for every step.
Tensor input_gates(const Tensor& input, const Tensor& w_ih, const OptTensor& b_ih,
                   const OptTensor& b_hh) {
  Tensor gates = at::matmul(input, w_ih.t());
  if (b_ih) gates = gates + *b_ih;
  if (b_hh) gates = gates + *b_hh;
  return gates;
}

// The dense layer over input [T, B, I] (rec's keep weights [T, B, H]).
std::tuple<Tensor, Tensor, Tensor> dense_layer(const char* op, const Recurrence& rec,
                                               const Tensor& input, const Tensor& h0,
                                               const Tensor& c0, const Tensor& w_ih,
                                               const OptTensor& b_ih, const OptTensor& b_hh,
                                               bool reverse) {
  TORCH_CHECK(input.dim() == 3, "pipelstm::", op, ": expected `input` of shape [T, B, I], got ",
              input.sizes());
  const Tensor gates = input_gates(input, w_ih, b_ih, b_hh);
  const int64_t T = input.size(0);
  std::vector<Tensor> outputs(static_cast<size_t>(T));
  Tensor h = h0, c = c0;
  for (const auto i : c10::irange(T)) {
    const int64_t t = reverse ? T - 1 - i : i;
    std::tie(h, c) = rec.step(gates.select(0, t), h, c, [t](const Tensor& k) { return k.select(0, t); });
    outputs[static_cast<size_t>(t)] = h;
  }
  Tensor output = T > 0 ? at::stack(outputs) : input.new_empty({0, h0.size(0), h0.size(1)});
  return {output, h, c};
}

std::tuple<Tensor, Tensor, Tensor> lstm_layer_composite(const Tensor& input, const Tensor& h0,
                                                        const Tensor& c0, const Tensor& w_ih,
                                                        const Tensor& w_hh, const OptTensor& b_ih,
                                                        const OptTensor& b_hh, const OptTensor& w_hr,
                                                        bool reverse) {
  if (upcast(input)) {
    return rounded(input.scalar_type(),
                   layer_in_float32("lstm_layer_composite", input, h0, c0, w_ih, w_hh, b_ih, b_hh,
                                    w_hr, [&](const auto&... a) {
                                      return lstm_layer_composite(a..., reverse);
                                    }));
  }
  return dense_layer("lstm_layer_composite", Recurrence{w_hh, w_hr}, input, h0, c0, w_ih, b_ih,
                     b_hh, reverse);
}

// As ATen's PackedLayer / ReversedPackedLayer: batch_sizes[t] rows per step,
// sequences sorted by decreasing length; a sequence's final state is taken
// at its own last step. batch_sizes is a list, not a tensor: under
// torch.func every tensor argument is wrapped, and the sizes are never
// differentiated.
std::tuple<Tensor, Tensor, Tensor> packed_layer(const Recurrence& rec, const Tensor& input,
                                                at::IntArrayRef batch_sizes, const Tensor& h0,
                                                const Tensor& c0, const Tensor& w_ih,
                                                const OptTensor& b_ih, const OptTensor& b_hh,
                                                bool reverse) {
  const Tensor gates = input_gates(input, w_ih, b_ih, b_hh);
  const int64_t* bs = batch_sizes.data();
  const int64_t steps = static_cast<int64_t>(batch_sizes.size());
  std::vector<Tensor> outputs;
  outputs.reserve(static_cast<size_t>(steps));
  if (!reverse) {
    // The batch shrinks: rows whose sequence has ended leave the state.
    std::vector<Tensor> done_h, done_c;
    Tensor h = h0, c = c0;
    int64_t offset = 0, last = steps > 0 ? bs[0] : h0.size(0);
    for (const auto t : c10::irange(steps)) {
      if (bs[t] < last) {
        done_h.push_back(h.narrow(0, bs[t], last - bs[t]));
        done_c.push_back(c.narrow(0, bs[t], last - bs[t]));
        h = h.narrow(0, 0, bs[t]);
        c = c.narrow(0, 0, bs[t]);
      }
      last = bs[t];
      const auto rows = [&](const Tensor& k) { return k.narrow(0, offset, bs[t]); };
      std::tie(h, c) = rec.step(gates.narrow(0, offset, bs[t]), h, c, rows);
      offset += bs[t];
      outputs.push_back(h);
    }
    done_h.push_back(h);
    done_c.push_back(c);
    std::reverse(done_h.begin(), done_h.end());
    std::reverse(done_c.begin(), done_c.end());
    Tensor output = steps > 0 ? at::cat(outputs) : input.new_empty({0, h0.size(1)});
    return {output, at::cat(done_h), at::cat(done_c)};
  }
  // Reversed: the batch grows as sequences start (from their last step).
  int64_t offset = input.size(0), last = steps > 0 ? bs[steps - 1] : h0.size(0);
  Tensor h = h0.narrow(0, 0, last), c = c0.narrow(0, 0, last);
  for (int64_t t = steps - 1; t >= 0; --t) {
    if (bs[t] > last) {
      h = at::cat({h, h0.narrow(0, last, bs[t] - last)});
      c = at::cat({c, c0.narrow(0, last, bs[t] - last)});
    }
    last = bs[t];
    offset -= bs[t];
    const auto rows = [&](const Tensor& k) { return k.narrow(0, offset, bs[t]); };
    std::tie(h, c) = rec.step(gates.narrow(0, offset, bs[t]), h, c, rows);
    outputs.push_back(h);
  }
  std::reverse(outputs.begin(), outputs.end());
  Tensor output = steps > 0 ? at::cat(outputs) : input.new_empty({0, h0.size(1)});
  return {output, h, c};
}

std::tuple<Tensor, Tensor, Tensor> lstm_packed_layer_composite(
    const Tensor& input, at::IntArrayRef batch_sizes, const Tensor& h0, const Tensor& c0,
    const Tensor& w_ih, const Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh,
    const OptTensor& w_hr, bool reverse) {
  if (upcast(input)) {
    return rounded(input.scalar_type(),
                   layer_in_float32("lstm_packed_layer_composite", input, h0, c0, w_ih, w_hh, b_ih,
                                    b_hh, w_hr, [&](const Tensor& x, const auto&... a) {
                                      return lstm_packed_layer_composite(x, batch_sizes, a...,
                                                                         reverse);
                                    }));
  }
  return packed_layer(Recurrence{w_hh, w_hr}, input, batch_sizes, h0, c0, w_ih, b_ih, b_hh,
                      reverse);
}

// One direction of one layer under zoneout (no projection): dense input
// [T, B, I] without batch_sizes, packed rows [N, I] with them; keep_c and
// keep_h of the output's shape, not differentiated.
std::tuple<Tensor, Tensor, Tensor> lstm_zoneout_layer_composite(
    const Tensor& input, at::OptionalIntArrayRef batch_sizes, const Tensor& h0, const Tensor& c0,
    const Tensor& w_ih, const Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh,
    const Tensor& keep_c, const Tensor& keep_h, bool reverse) {
  if (upcast(input)) {
    const Tensor kc = keep_c.to(at::kFloat), kh = keep_h.to(at::kFloat);
    return rounded(input.scalar_type(),
                   layer_in_float32("lstm_zoneout_layer_composite", input, h0, c0, w_ih, w_hh, b_ih,
                                    b_hh, std::nullopt,
                                    [&](const Tensor& x, const Tensor& h, const Tensor& c,
                                        const Tensor& wi, const Tensor& wh, const OptTensor& bi,
                                        const OptTensor& bh, const OptTensor&) {
                                      return lstm_zoneout_layer_composite(x, batch_sizes, h, c, wi,
                                                                          wh, bi, bh, kc, kh, reverse);
                                    }));
  }
  const OptTensor no_projection;
  if (batch_sizes.has_value()) {
    const Recurrence rec{w_hh, no_projection, keep_c.detach(), keep_h.detach()};
    return packed_layer(rec, input, *batch_sizes, h0, c0, w_ih, b_ih, b_hh, reverse);
  }
  // The fused op takes a dense call's keep weights as [T, B, H] or [T * B, H].
  TORCH_CHECK(input.dim() == 3, "pipelstm::lstm_zoneout_layer_composite: expected `input` of shape [T, B, I], got ",
              input.sizes());
  const auto as_output = [&](const Tensor& k) {
    return k.detach().reshape({input.size(0), input.size(1), h0.size(-1)});
  };
  const Recurrence rec{w_hh, no_projection, as_output(keep_c), as_output(keep_h)};
  return dense_layer("lstm_zoneout_layer_composite", rec, input, h0, c0, w_ih, b_ih, b_hh, reverse);
}

}  // namespace

TORCH_LIBRARY_IMPL(pipelstm, CompositeImplicitAutograd, m) {
  m.impl("lstm_cell_composite", &lstm_cell_composite);
  m.impl("lstm_layer_composite", &lstm_layer_composite);
  m.impl("lstm_packed_layer_composite", &lstm_packed_layer_composite);
  m.impl("lstm_zoneout_layer_composite", &lstm_zoneout_layer_composite);
}

}  // namespace pipelstm
