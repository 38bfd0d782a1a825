// The parameter gradients ("W") of a backward pass as tasks: one per unit
// with parameters, ready once its stage has run its last backward item. A
// stage done with its items runs its own tasks, then those of other stages
// on the same CPU with the same thread budget (a task's result does not
// depend on which of them computes it), so a lighter stage helps a heavier
// one. On accelerators every stage runs only its own.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "spec.h"
#include "stages.h"
#include "sync.h"

namespace pipelstm::pipeline {

class WeightTasks {
 public:
  // params: per unit (global index).
  WeightTasks(const Stages& stages, const std::vector<UnitParams>& params);

  // Stage `s` has run its last backward item: its tasks may start.
  void mark_ready(Sync& sync, int s);

  // The next task stage `s` may run, {owner stage, unit}; waits while one
  // may still become ready; {-1, -1} when none is left or the pass failed.
  std::pair<int, int64_t> claim(Sync& sync, int s);

 private:
  std::vector<std::vector<int64_t>> tasks_;  // per stage, its units with parameters, last first
  std::vector<size_t> next_;
  std::vector<bool> ready_;
  std::vector<int> group_;  // stages that run each other's tasks
};

}  // namespace pipelstm::pipeline
