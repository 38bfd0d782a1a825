// An LSTM layer as a unit: the layer op over each item, its (h, c) carried
// from chunk to chunk by the stage; its weight gradients once per pass,
// over all its items' pieces.
#include <ATen/ATen.h>

#include "../../backend.h"
#include "../../layer_steps.h"
#include "../../layer_weight_grads.h"
#include "../../lstm_ops.h"
#include "../items.h"
#include "kinds.h"

namespace pipelstm::pipeline {
namespace {

// Packed (ItemContext::batch_sizes): the packed layer op over the item's
// rows, from the carried state of the sequences still running at its first
// step (a prefix of the micro-batch's, which is sorted by decreasing length);
// the others keep their state, final since their sequence has ended. An
// item without rows computes nothing.
Tensor forward_packed(const UnitSpec& u, const UnitParams& p, const Tensor& x, bool keep,
                      Tensor& h, Tensor& c, std::vector<Tensor>& saved, const Tensor& bs) {
  const Tensor& w_ih = need(p[0], u, "w_ih");
  const int64_t out_size = p[4].has_value() ? p[4]->size(0) : need(p[1], u, "w_hh").size(1);
  if (!bs.defined()) {
    if (keep) saved.clear();
    return at::empty({0, out_size}, w_ih.options());
  }
  const int64_t n0 = bs.const_data_ptr<int64_t>()[0], rest = h.size(0) - n0;
  const Tensor h0 = h.narrow(0, 0, n0).contiguous(), c0 = c.narrow(0, 0, n0).contiguous();
  auto [out, h_n, c_n, ws] = lstm_packed_layer_forward(x, bs, h0, c0, w_ih, need(p[1], u, "w_hh"),
                                                       p[2], p[3], p[4], /*reverse=*/false);
  if (keep) saved = {x, h, c, out, ws, bs};  // the micro-batch's whole state before the item
  h = rest == 0 ? h_n : at::cat({h_n, h.narrow(0, n0, rest)});
  c = rest == 0 ? c_n : at::cat({c_n, c.narrow(0, n0, rest)});
  return out;
}

Tensor forward(const UnitSpec& u, const UnitParams& p, const Tensor& x, bool, bool keep, Tensor& h,
               Tensor& c, std::vector<Tensor>& saved, uint64_t, const ItemContext& item) {
  // The split backward would form the weight gradients from gate gradients
  // rounded to the reduced dtype, unlike the op's float32 backward on the CPU.
  TORCH_CHECK(!x.is_cpu() || (x.scalar_type() != at::kBFloat16 && x.scalar_type() != at::kHalf),
              "pipelstm pipeline: ", u.name, " on the CPU runs float32 or float64, got ",
              x.scalar_type(), "; cast the model to float32 (or run it on CUDA)");
  if (item.packed) return forward_packed(u, p, x, keep, h, c, saved, item.batch_sizes);
  auto [out, h_n, c_n, ws] = lstm_layer_forward(x, h, c, need(p[0], u, "w_ih"),
                                                need(p[1], u, "w_hh"), p[2], p[3], p[4],
                                                /*reverse=*/false);
  if (keep) saved = {x, h, c, out, ws};
  h = h_n;
  c = c_n;
  return out;
}

// A packed item's piece has its batch sizes after the dense piece's six
// entries (backward_data).
constexpr size_t kPackedPiece = 7;

Tensor backward_packed(const UnitParams& p, const Tensor& g, const std::vector<Tensor>& saved,
                       OptTensor& grad_h, OptTensor& grad_c, Piece& piece) {
  if (saved.empty()) {  // an item without rows
    return g.defined() ? at::zeros({0, p[0]->size(1)}, g.options()) : Tensor();
  }
  const Tensor &x = saved[0], &out = saved[3], &ws = saved[4], &bs = saved[5];
  const int64_t n0 = bs.const_data_ptr<int64_t>()[0], rows = saved[1].size(0);
  const Tensor h0 = saved[1].narrow(0, 0, n0).contiguous(), c0 = saved[2].narrow(0, 0, n0).contiguous();
  auto first = [&](const OptTensor& t) -> OptTensor {
    if (!t.has_value()) return std::nullopt;
    return t->narrow(0, 0, n0).contiguous();
  };
  if (!g.defined() && !grad_h.has_value() && !grad_c.has_value()) return Tensor();
  LayerDataGrads d = lstm_packed_layer_backward_data(
      g.defined() ? OptTensor(g) : std::nullopt, first(grad_h), first(grad_c), x, bs, h0, c0,
      *p[0], *p[1], p[4], out, ws);
  grad_h = join_state_grad(d.grad_h0, grad_h, rows);
  grad_c = join_state_grad(d.grad_c0, grad_c, rows);
  piece = {x, h0, out, d.grad_gates, d.grad_h, d.raw_h, bs};
  return d.grad_input;
}

Tensor backward_data(const UnitSpec&, const UnitParams& p, const Tensor& g,
                     const std::vector<Tensor>& saved, OptTensor& grad_h, OptTensor& grad_c,
                     Piece& piece) {
  if (saved.size() != 5) return backward_packed(p, g, saved, grad_h, grad_c, piece);
  const Tensor &x = saved[0], &h0 = saved[1], &c0 = saved[2], &out = saved[3], &ws = saved[4];
  if (!g.defined() && !grad_h.has_value() && !grad_c.has_value()) return Tensor();
  LayerDataGrads d = lstm_layer_backward_data(g.defined() ? OptTensor(g) : std::nullopt, grad_h,
                                              grad_c, x, h0, c0, *p[0], *p[1], p[4], out, ws);
  grad_h = d.grad_h0;
  grad_c = d.grad_c0;
  piece = {x, h0, out, d.grad_gates, d.grad_h, d.raw_h};
  return d.grad_input;
}

// Per micro-batch, each run of consecutive chunks as sequences (join_runs in
// items.h), all added into one set of gradients: pieces {x, h0, out,
// grad_gates, grad_h, raw_h}, rows time-major, and packed ones the item's
// batch sizes after them (consecutive packed items of a micro-batch joined
// are one packed sequence: its running sequences only end).
std::vector<Tensor> joined_parts(const std::vector<Piece>& row, int64_t k, int64_t end, size_t i) {
  std::vector<Tensor> parts;
  for (int64_t j = k; j < end; ++j) parts.push_back(row[j][i]);
  return parts;
}

void weight_grads(const UnitSpec&, const UnitParams& p, const Pieces& pieces,
                  std::vector<Tensor>& acc) {
  LayerWeightGrads w;  // every group's gradients added in
  for (const auto& row : pieces) {
    std::vector<int64_t> rows;
    for (const auto& piece : row) rows.push_back(piece.empty() ? -1 : piece[3].size(0));
    for (const auto& [k, end] : join_runs(rows)) {
      auto joined = [&](size_t i) -> Tensor {
        if (!row[k][i].defined() || end - k == 1) return row[k][i];
        std::vector<Tensor> parts;
        int64_t n = 0;
        for (int64_t j = k; j < end; ++j) {
          parts.push_back(row[j][i]);
          n += row[j][i].size(0);
        }
        // From the kept mappings (huge_pages.h): the joined gradients of the
        // gates are 4H floats a token, and glibc maps such a buffer afresh
        // and faults in every page on every step.
        std::vector<int64_t> sizes = parts[0].sizes().vec();
        sizes[0] = n;
        Tensor out = backend::empty_buffer(sizes, parts[0].options());
        at::cat_out(out, parts, 0);
        return out;
      };
      LayerDataGrads d;
      d.grad_gates = joined(3);
      d.grad_h = joined(4);
      d.raw_h = joined(5);
      if (row[k].size() == kPackedPiece) {
        add_weight_grads(packed_steps("LSTM unit", at::cat(joined_parts(row, k, end, 6))), d,
                         joined(0), row[k][1], joined(2), /*reverse=*/false, w, backend::kLayerMath);
      } else {
        lstm_layer_add_weight_grads(d, joined(0), row[k][1], joined(2), w, backend::kLayerMath);
      }
    }
  }
  if (!w.w_ih.defined()) return;
  accumulate(acc, 0, w.w_ih);
  accumulate(acc, 1, w.w_hh);
  if (p[2].has_value()) accumulate(acc, 2, w.bias);
  if (p[3].has_value()) accumulate(acc, 3, p[2].has_value() ? w.bias.clone() : w.bias);
  if (p[4].has_value()) accumulate(acc, 4, w.w_hr);
}

// Replaying needs the initial (h, c).
void keep_for_replay(std::vector<Tensor>& saved) { saved = {saved[1], saved[2]}; }

}  // namespace

OptTensor join_state_grad(const Tensor& first, const OptTensor& all, int64_t rows) {
  const int64_t n0 = first.size(0);
  if (n0 == rows) return first;
  const Tensor rest = all.has_value() ? all->narrow(0, n0, rows - n0)
                                      : at::zeros({rows - n0, first.size(1)}, first.options());
  return at::cat({first, rest});
}

const RegisterUnitKind kRegistered{
    {.name = "LSTM layer", .py_name = "lstm", .forward = &forward, .backward_data = &backward_data,
     .weight_grads = &weight_grads, .keep_for_replay = &keep_for_replay,
     .slots = {"weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr"}, .has_state = true}};

}  // namespace pipelstm::pipeline
