// One pass of the pipeline, forward or backward: every stage's thread runs
// its work items in the schedule's order (schedule.h), each item taken from
// the stage's inbox and its result put in its outbox. Between two local
// stages the boxes are the slots of sync.h (with a copy to the next stage's
// device by the courier, streams.h); at the ends of the pipeline in this
// process they are the plan's entering items and the caller's results, or
// links to other processes (remote.h). What a stage computes per item is a
// StageWork (forward_work.cpp, backward_work.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "items.h"
#include "remote.h"
#include "schedule.h"
#include "spec.h"
#include "stages.h"
#include "sync.h"

namespace pipelstm::pipeline {

// Steady-clock nanoseconds, for traces.
int64_t now_ns();

// What one stage computes in a pass.
class StageWork {
 public:
  virtual ~StageWork() = default;
  // Item `it`'s result from its input `x`. While a unit runs, `unit` is its
  // index in the stage (for the error message), else -1.
  virtual Tensor run(Item it, Tensor x, int64_t& unit) = 0;
  // The result as it is sent to another process.
  virtual Tensor for_remote(Item it, Tensor x) { return x; }
  // After the stage's last item (the backward's parameter gradients); false
  // when the pass failed.
  virtual bool finish(Sync&) { return true; }
};

// What one pass takes and gives, in its own direction: forward, items enter
// stage 0 and leave stage S-1; backward, the reverse.
struct PassPlan {
  // What enters: per item (at grid.index) its value, or, with `from`, what
  // is received from that process, in `receive_sizes[i]` and
  // `receive_options` (all receives posted ahead, in the schedule's order).
  std::vector<Tensor> enter;
  RemoteLink* from = nullptr;
  std::vector<std::vector<int64_t>> receive_sizes;
  at::TensorOptions receive_options;
  // Where what leaves goes: to this process, or back to the caller.
  RemoteLink* to = nullptr;
  // Stage s's work; it appends its spans to `trace`.
  std::function<std::unique_ptr<StageWork>(int s, std::vector<TraceEvent>& trace)> work;
};

struct PassResult {
  // Per item (at grid.index), what left the pass, ready on the caller's
  // streams; empty when it went to another process.
  std::vector<Tensor> leave;
  std::vector<TraceEvent> trace;  // stage by stage
};

// Runs the pass on one thread per stage (workers.h). Raises the first
// failure, naming the stage, the unit and the item.
PassResult run(Direction direction, const Stages& stages, const ItemGrid& grid, PassPlan& plan);

}  // namespace pipelstm::pipeline
