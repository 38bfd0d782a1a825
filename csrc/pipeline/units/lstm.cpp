// An LSTM layer as a unit: the layer op over each item, its (h, c) carried
// from chunk to chunk by the stage; its weight gradients once per pass,
// over all its items' pieces. With zoneout, the zoneout layer op.
#include <ATen/ATen.h>

#include "../../backend.h"
#include "../../layer_steps.h"
#include "../../layer_weight_grads.h"
#include "../../lstm_ops.h"
#include "../items.h"
#include "kinds.h"
#include "lstm_items.h"

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
  const StateRows r(h, bs);
  auto [out, h_n, c_n, ws] = lstm_packed_layer_forward(x, bs, r.first(h), r.first(c), w_ih,
                                                       need(p[1], u, "w_hh"), p[2], p[3], p[4],
                                                       /*reverse=*/false);
  if (keep) saved = {x, h, c, out, ws, bs};  // the micro-batch's whole state before the item
  h = r.after(h_n, h);
  c = r.after(c_n, c);
  return out;
}

// Zoneout (UnitSpec::zoneout_c, zoneout_h): the zoneout layer op over the
// item with its keep weights (zoneout_keeps.h). Saved: x, the
// micro-batch's (h, c) before the item, out, workspace, the batch sizes
// (undefined: dense), keep_c, keep_h. Its backward gives the item's weight
// gradients at once, its piece {w_ih, w_hh, bias}, summed in a fixed order.
constexpr size_t kZonedSaved = 8;

Tensor forward_zoned(const UnitSpec& u, const UnitParams& p, const Tensor& x, bool training, bool keep,
                     Tensor& h, Tensor& c, std::vector<Tensor>& saved, uint64_t seed,
                     const ItemContext& item) {
  const Tensor& w_ih = need(p[0], u, "w_ih");
  const Tensor& w_hh = need(p[1], u, "w_hh");
  const int64_t H = w_hh.size(1);
  const Tensor& bs = item.batch_sizes;
  if (item.packed && !bs.defined()) {
    if (keep) saved.clear();
    return at::empty({0, H}, w_ih.options());
  }
  const ItemKeeps k = zoneout_keeps(u, x, H, training, seed, item, saved);
  return run_lstm_item(x, bs, k, keep, h, c, saved, [&](const Tensor& h0, const Tensor& c0) {
    return lstm_zoneout_layer_forward(x, given(bs), h0, c0, w_ih, w_hh, p[2], p[3], k.c, k.h);
  });
}

Tensor backward_zoned(const UnitSpec& u, const UnitParams& p, const Tensor& g,
                      const std::vector<Tensor>& saved, OptTensor& grad_h, OptTensor& grad_c,
                      Piece& piece) {
  const Tensor& w_ih = need(p[0], u, "w_ih");
  return backward_lstm_item(
      g, w_ih.size(1), saved, grad_h, grad_c, piece,
      [&](const OptTensor& g_out, const OptTensor& g_h, const OptTensor& g_c, const Tensor& x, const OptTensor& bs,
          const Tensor& h0, const Tensor& c0, const Tensor& keep_c, const Tensor& keep_h, const Tensor& out,
          const Tensor& ws) {
        return lstm_zoneout_layer_backward(g_out, g_h, g_c, x, bs, h0, c0, w_ih, need(p[1], u, "w_hh"), keep_c,
                                           keep_h, out, ws);
      });
}

Tensor forward(const UnitSpec& u, const UnitParams& p, const Tensor& x, bool training, bool keep,
               Tensor& h, Tensor& c, std::vector<Tensor>& saved, uint64_t seed,
               const ItemContext& item) {
  // The split backward would form the weight gradients from gate gradients
  // rounded to the reduced dtype, unlike the op's float32 backward on the CPU.
  TORCH_CHECK(!x.is_cpu() || (x.scalar_type() != at::kBFloat16 && x.scalar_type() != at::kHalf),
              "pipelstm pipeline: ", u.name, " on the CPU runs float32 or float64, got ",
              x.scalar_type(), "; cast the model to float32 (or run it on CUDA)");
  if (has_zoneout(u)) return forward_zoned(u, p, x, training, keep, h, c, saved, seed, item);
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
  if (!g.defined() && !grad_h.has_value() && !grad_c.has_value()) return Tensor();
  const Tensor &x = saved[0], &out = saved[3], &ws = saved[4], &bs = saved[5];
  const StateRows r(saved[1], bs);
  const Tensor h0 = r.first(saved[1]);
  LayerDataGrads d = lstm_packed_layer_backward_data(given(g), r.first(grad_h), r.first(grad_c), x, bs, h0,
                                                     r.first(saved[2]), *p[0], *p[1], p[4], out, ws);
  grad_h = join_state_grad(d.grad_h0, grad_h, r.rows);
  grad_c = join_state_grad(d.grad_c0, grad_c, r.rows);
  piece = {x, h0, out, d.grad_gates, d.grad_h, d.raw_h, bs};
  return d.grad_input;
}

Tensor backward_data(const UnitSpec& u, const UnitParams& p, const Tensor& g,
                     const std::vector<Tensor>& saved, OptTensor& grad_h, OptTensor& grad_c,
                     Piece& piece) {
  if (has_zoneout(u)) return backward_zoned(u, p, g, saved, grad_h, grad_c, piece);
  if (saved.size() != 5) return backward_packed(p, g, saved, grad_h, grad_c, piece);
  const Tensor &x = saved[0], &h0 = saved[1], &c0 = saved[2], &out = saved[3], &ws = saved[4];
  if (!g.defined() && !grad_h.has_value() && !grad_c.has_value()) return Tensor();
  LayerDataGrads d = lstm_layer_backward_data(given(g), grad_h,
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

void weight_grads(const UnitSpec& u, const UnitParams& p, const Pieces& pieces,
                  std::vector<Tensor>& acc) {
  if (has_zoneout(u)) {
    for_each_piece(pieces, [&](const Piece& piece) {
      accumulate(acc, 0, piece[0]);
      accumulate(acc, 1, piece[1]);
      if (p[2].has_value()) accumulate(acc, 2, piece[2]);
      if (p[3].has_value()) accumulate(acc, 3, p[2].has_value() ? piece[2].clone() : piece[2]);
    });
    return;
  }
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

// Replaying needs the initial (h, c), and zoneout's masks.
void keep_for_replay(std::vector<Tensor>& saved) {
  saved = saved.size() == kZonedSaved ? std::vector<Tensor>{saved[1], saved[2], saved[6], saved[7]}
                                      : std::vector<Tensor>{saved[1], saved[2]};
}

}  // namespace

StateRows::StateRows(const Tensor& state, const Tensor& batch_sizes)
    : rows(state.size(0)), n0(batch_sizes.defined() ? batch_sizes.const_data_ptr<int64_t>()[0] : rows) {}

Tensor StateRows::first(const Tensor& t) const { return n0 == rows ? t : t.narrow(0, 0, n0).contiguous(); }

OptTensor StateRows::first(const OptTensor& t) const {
  if (!t.has_value()) return t;
  return first(*t);
}

Tensor StateRows::after(const Tensor& ran, const Tensor& before) const {
  return n0 == rows ? ran : at::cat({ran, before.narrow(0, n0, rows - n0)});
}

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
     .slots = {"weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr"},
     .options = {"zoneout_c", "zoneout_h"}, .has_state = true}};

}  // namespace pipelstm::pipeline
