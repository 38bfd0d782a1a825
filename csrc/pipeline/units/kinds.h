// What the engine does with each kind of unit: one UnitKindOps record per
// kind, in a file of its own beside this one (its ops, parameter slots,
// options and what the engine does differently for it), which adds the
// record to the table of kinds (units.cpp) as the module loads, through a
// RegisterUnitKind object. Adding a kind of unit: its file here; the
// bindings, the messages and Python (pipelstm/pipeline/units.py) read the
// table. A new activation is a row of units/activation.cpp's table only.
#pragma once

#include <cstdint>
#include <string>
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
