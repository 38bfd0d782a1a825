// The stages of an engine as every part of a pass sees them: their specs,
// devices, compute streams and labels, and where each unit and LSTM layer
// sits. The pass, the workers, the weight tasks and the failure messages
// take this instead of the engine; it depends on nothing above it.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "spec.h"
#include "streams.h"

namespace pipelstm::pipeline {

class Stages {
 public:
  // Checks the specs: at least one stage, each with a unit, the loss (if
  // any) last, the LSTM layers numbered in order.
  explicit Stages(std::vector<StageSpec> specs);

  int64_t size() const { return static_cast<int64_t>(specs_.size()); }
  const StageSpec& operator[](int64_t s) const { return specs_[s]; }
  const std::vector<StageSpec>& specs() const { return specs_; }
  const c10::Device& device(int64_t s) const { return specs_[s].device; }
  // Stage s's compute stream, the same in every pass (StageStreams);
  // nullopt for a CPU stage.
  std::optional<c10::Stream> stream(int64_t s) const;

  int64_t num_units() const { return static_cast<int64_t>(unit_at_.size()); }
  // The global index of stage s's first unit.
  int64_t first_unit(int64_t s) const { return first_unit_[s]; }
  // Unit `gu`'s index in the whole model, the units of the processes
  // before this one counted: what its masks are seeded by, so that they do
  // not depend on how the model is split into stages and processes.
  int64_t model_unit(int64_t gu) const { return units_before_ + gu; }
  // Unit `gu` (global index) and the stage it runs on.
  const UnitSpec& unit(int64_t gu) const;
  int64_t stage_of(int64_t gu) const { return unit_at_[gu].first; }
  int64_t num_lstm_layers() const { return static_cast<int64_t>(layer_stage_.size()); }
  // The device of LSTM layer l (its state lives there).
  const c10::Device& layer_device(int64_t l) const { return device(layer_stage_[l]); }
  // The last unit when it is a CrossEntropy loss, else nullptr.
  const UnitSpec* loss() const { return has_loss_ ? &specs_.back().units.back() : nullptr; }

  // Places the stages in a pipeline over processes: `first_stage` and
  // `first_unit` are the global indices of stage 0 and of its first unit
  // (counting the stages and units of the processes before), `process`
  // (e.g. "rank 1") names them in messages.
  void place(int64_t first_stage, int64_t first_unit, std::string process);
  // "stage 3 (cpu, rank 1)" for local stage s.
  std::string label(int64_t s) const;

 private:
  std::vector<StageSpec> specs_;
  std::shared_ptr<StageStreams> streams_;
  std::vector<int64_t> first_unit_;
  std::vector<std::pair<int64_t, int64_t>> unit_at_;  // global unit -> (stage, index in stage)
  std::vector<int64_t> layer_stage_;                  // LSTM layer -> stage
  bool has_loss_ = false;
  int64_t first_stage_ = 0;
  int64_t units_before_ = 0;
  std::string process_;
};

}  // namespace pipelstm::pipeline
