// What the pipeline engine runs: the kinds of unit, their specs, the
// stages, each unit's parameter slots and the trace a pass leaves. Shared by
// the stages (stages.h), the passes, the units (units.h) and the bindings; depends on
// nothing of theirs.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pipelstm::pipeline {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

// A kind of unit (an LSTM layer, Linear, the CrossEntropy loss, ...): its
// index in the engine's table of kinds, to which each kind's own file
// (units/<kind>.cpp) adds its record (units/kinds.h). No list of the kinds
// here: the bindings name each value after its record.
enum class UnitKind : int32_t {};

// Activation recomputation: which work items keep only what replaying their
// forward needs (the stage input, each LSTM layer's initial (h, c) and the
// dropout masks) and run that forward again just before their backward.
// ExceptLast leaves out a stage's last forward item, whose backward comes
// first and would replay it at once.
enum class Checkpoint { Never, ExceptLast, Always };

struct UnitSpec {
  UnitKind kind;
  std::string name;  // for messages and traces, e.g. "1.l2 (LSTM layer 2)"
  // Embedding
  int64_t padding_idx = -1;
  bool scale_grad_by_freq = false;
  // Dropout
  double p = 0.0;
  // Activation: its row in the table of units/activation.cpp (by name:
  // activation_index, units/kinds.h)
  int64_t activation = 0;
  // LayerNorm, LayerNorm LSTM
  double eps = 1e-5;
  // LSTM, LayerNorm LSTM: zoneout's probabilities of keeping the previous
  // cell and hidden state (both 0: no zoneout)
  double zoneout_c = 0.0, zoneout_h = 0.0;
  // Lstm: index of this layer among all LSTM layers (its h0/c0 slot)
  int64_t state_index = -1;
  // CrossEntropy: targets equal to ignore_index do not count; mean or sum
  int64_t ignore_index = -100;
  bool mean = true;
};

struct StageSpec {
  c10::Device device{c10::kCPU};
  std::vector<UnitSpec> units;
  int threads = 0;  // intra-op threads of the stage's worker; 0 leaves it alone
};

// Per unit, its parameters in a fixed order (absent ones nullopt):
//   Lstm: w_ih, w_hh, b_ih, b_hh, w_hr;  Embedding: weight;
//   Linear, LayerNorm: weight, bias;  Dropout, Activation, CrossEntropy: none.
using UnitParams = std::vector<OptTensor>;

struct TraceEvent {
  int stage;
  std::string phase;  // "forward", "recompute", "backward", "transfer"
  int micro_batch, chunk;
  int64_t start_ns, end_ns;  // steady clock
};

// "LSTM layer", "Embedding", ...: for messages.
const char* unit_kind_name(UnitKind kind);
// Whether units of this kind carry a recurrent state (h, c) from chunk to
// chunk, in the slot UnitSpec::state_index (an LSTM layer).
bool unit_kind_has_state(UnitKind kind);
// Whether this kind is the loss: the last unit, taking each item's target.
bool unit_kind_is_loss(UnitKind kind);

}  // namespace pipelstm::pipeline
