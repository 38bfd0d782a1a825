// What the engine does with each kind of unit: one UnitKindOps per kind, in
// a file of its own beside this one (its ops, parameter slots and options),
// and one table (units.cpp) from UnitKind to it. Adding a kind of unit: its
// enum value (spec.h), its file here, and its entry in the table; the
// bindings, the messages and Python read the table. A new activation is a
// row of units/activation.cpp's table only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../units.h"

namespace pipelstm::pipeline {

struct UnitKindOps {
  UnitKind kind;
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
  std::vector<std::string> slots;
  std::vector<std::string> options;
};

extern const UnitKindOps kLstmUnit;
extern const UnitKindOps kEmbeddingUnit;
extern const UnitKindOps kLinearUnit;
extern const UnitKindOps kDropoutUnit;
extern const UnitKindOps kActivationUnit;
extern const UnitKindOps kLayerNormUnit;
extern const UnitKindOps kCrossEntropyUnit;

// Every kind, in UnitKind's order.
const std::vector<const UnitKindOps*>& unit_kinds();

// The activations an Activation unit runs (units/activation.cpp): their
// names, in the table's order, and UnitSpec::activation for a name (raises
// for an unknown one).
std::vector<std::string> activation_names();
int64_t activation_index(const std::string& name);

// Adds `t` (if defined) into acc[i].
void accumulate(std::vector<Tensor>& acc, size_t i, const Tensor& t);

}  // namespace pipelstm::pipeline
