// What the engine does with each kind of unit: one UnitKindOps record per
// kind, in a file of its own beside this one (its ops, parameter slots,
// options and what the engine does differently for it), which adds the
// record to the table of kinds (units.cpp) as the module loads, through a
// RegisterUnitKind object. Adding a kind of unit: its file here; the
// bindings, the messages and Python (pipelstm/pipeline/units.py) read the
// table. A new activation is a row of units/activation.cpp's table only.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../units.h"

namespace pipelstm::pipeline {

// How a recomputed item runs a unit again (units.cpp, replay), from what
// its keep_for_replay left of its saved tensors.
enum class Replay {
  Forward,      // its forward again (a state's initial (h, c), a loss's target kept)
  InputIfLast,  // its forward; as the stage's last unit only its input (all its backward needs)
  Mask,         // multiplies by the mask it kept (saved[0]); never draws another
};

struct UnitKindOps {
  const char* name;     // for messages, e.g. "LSTM layer"
  const char* py_name;  // its name in the bindings' UnitKind, e.g. "lstm"
  // unit_forward, unit_backward_data, unit_weight_grads and keep_for_replay
  // (units.h) for this kind; weight_grads is null for a kind without
  // parameters.
  Tensor (*forward)(const UnitSpec& u, const UnitParams& p, const Tensor& x, bool training,
                    bool keep, Tensor& h, Tensor& c, std::vector<Tensor>& saved, uint64_t seed,
                    const ItemContext& item);
  Tensor (*backward_data)(const UnitSpec& u, const UnitParams& p, const Tensor& g,
                          const std::vector<Tensor>& saved, OptTensor& grad_h, OptTensor& grad_c,
                          Piece& piece);
  void (*weight_grads)(const UnitSpec& u, const UnitParams& p, const Pieces& pieces,
                       std::vector<Tensor>& acc);
  void (*keep_for_replay)(std::vector<Tensor>& saved);
  // Its parameter slots in UnitParams' order (an LSTM layer's are suffixed
  // with _l<layer> on the module), and the UnitSpec options it reads; Python
  // (pipelstm/pipeline/units.py) reads both through the bindings.
  std::vector<std::string> slots = {};
  std::vector<std::string> options = {};
  // unit_kind_has_state and unit_kind_is_loss (spec.h); how it replays.
  bool has_state = false;
  bool is_loss = false;
  Replay replay = Replay::Forward;
  // Its forward's seed is the same for every chunk of a micro-batch (a mask
  // per sequence), not one per (micro-batch, chunk) item (units.h: unit_seed).
  bool seed_per_micro_batch = false;
};

// Adds its record to the table of kinds; one per units/<kind>.cpp, at
// namespace scope, so it runs as the module loads:
//   const RegisterUnitKind kRegistered{{.name = "Linear", .py_name = "linear", ...}};
// It keeps the record (the table points to it).
struct RegisterUnitKind {
  explicit RegisterUnitKind(UnitKindOps record);
  const UnitKindOps record;
};

// Every kind, ordered by py_name: UnitKind{i} is the i-th. Fixed from its
// first call, which every registration has run before (they run as the
// module loads; nothing calls this until its bindings are made). Raises for
// two kinds of one name.
const std::vector<const UnitKindOps*>& unit_kinds();

// The activations an Activation unit runs (units/activation.cpp): their
// names, in the table's order, and UnitSpec::activation for a name (raises
// for an unknown one).
std::vector<std::string> activation_names();
int64_t activation_index(const std::string& name);

// Zoneout in the LSTM kinds (units/zoneout_keeps.cpp). zoneout_masks: the
// keep weights of item (m, k) of unit `unit` in a pass (its seed
// dropout_seed(pass_seed, unit, m, k)): keep_c then keep_h, each [rows, H]
// of 0 and 1 (1, the previous value kept, with probability p_c or p_h),
// drawn from a generator on like's device, in like's dtype.
std::pair<Tensor, Tensor> zoneout_masks(uint64_t seed, int64_t rows, int64_t H, double p_c, double p_h,
                                        const Tensor& like);
// What a unit's item runs with: none (undefined) for a unit without
// zoneout; while training the item's masks (replaying: those its
// keep_for_replay kept, saved[2] and saved[3]); in evaluation the
// probabilities, one row expanded.
struct ItemKeeps {
  Tensor c, h;
};
bool has_zoneout(const UnitSpec& u);
ItemKeeps zoneout_keeps(const UnitSpec& u, const Tensor& like, int64_t rows, int64_t H, bool training,
                        uint64_t seed, const ItemContext& item, const std::vector<Tensor>& saved);

// t, or nullopt where it is undefined (an op's optional argument).
inline OptTensor given(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

// The LSTM kinds' (units/lstm.cpp). join_state_grad: the state gradient of
// a micro-batch's `rows` sequences from that of the first n0 = first.size(0)
// (those a packed item ran) and the rest's in `all`, carried through
// unchanged.
OptTensor join_state_grad(const Tensor& first, const OptTensor& all, int64_t rows);

// StateRows: an item and the carried
// state (h, c) of its micro-batch's `rows` sequences: a dense item (no
// batch sizes) runs them all, a packed item only the first n0 =
// batch_sizes[0] (those still running, a prefix), the others keep theirs.
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

// The dropout kinds' backward_data (the gradient times the mask the forward
// kept, saved[0]) and keep_for_replay (the mask stays): units/dropout.cpp.
Tensor times_kept_mask(const UnitSpec& u, const UnitParams& p, const Tensor& g,
                       const std::vector<Tensor>& saved, OptTensor& grad_h, OptTensor& grad_c,
                       Piece& piece);
void keep_mask_for_replay(std::vector<Tensor>& saved);

// Adds `t` (if defined) into acc[i].
void accumulate(std::vector<Tensor>& acc, size_t i, const Tensor& t);

// Calls `f(piece)` for each piece the backward tasks left for weight_grads
// (an empty piece: a task that had nothing to give).
template <class F>
void for_each_piece(const Pieces& pieces, F&& f) {
  for (const auto& row : pieces) {
    for (const auto& piece : row) {
      if (!piece.empty()) f(piece);
    }
  }
}

// keep_for_replay of the kinds whose replay recomputes what they saved from
// their input: nothing is kept.
void recompute_input_for_replay(std::vector<Tensor>& saved);

}  // namespace pipelstm::pipeline
