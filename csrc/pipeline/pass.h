// One pass of the pipeline, forward or backward: every stage's thread runs
// its work items in the schedule's order (schedule.h), each item taken from
// the stage's inbox and its result put in its outbox. Between two local
// stages the boxes are the slots of sync.h (with a copy to the next stage's
// device by the courier, streams.h); at the ends of the pipeline in this
// process they are links to other processes (remote.h). What a stage
// computes per item is a StageWork: the forward's and the backward's are in
// engine.cpp.
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
#include "sync.h"

namespace pipelstm::pipeline {

class Engine;

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
  virtual bool finish() { return true; }
};

// The boxes of a pass. channel[c] holds one slot per item: forward, channel
// s feeds stage s and channel S receives the output; backward, channel s+1
// feeds stage s and channel 0 receives the gradient of the input.
struct PassIO {
  PassIO(Direction direction, int64_t stages, const ItemGrid& grid);

  Direction direction;
  Traffic traffic;
  int64_t S;
  std::vector<std::vector<Slot>> channel;
  // The process the first stage to run (forward: 0, backward: S-1) receives
  // its items from, with their receives posted ahead; and the one the last
  // stage to run sends its results to.
  RemoteLink* from = nullptr;
  RemoteLink* to = nullptr;
  std::vector<std::shared_ptr<Transfer>> recvs;
  std::vector<std::vector<TraceEvent>> traces;  // per stage

  // The slots the items of the pass enter with (forward: channel 0) and
  // leave in (forward: channel S).
  std::vector<Slot>& entry() { return channel[direction == Direction::Forward ? 0 : S]; }
  std::vector<Slot>& exit() { return channel[direction == Direction::Forward ? S : 0]; }
  // Posts the receives of every item from `from`, in the schedule's order.
  void post_receives(const ItemGrid& grid, const std::vector<std::vector<int64_t>>& sizes,
                     const at::TensorOptions& options);
  // The trace of the pass, stage by stage.
  std::vector<TraceEvent> all_traces() const;
};

// Runs the pass on one thread per stage (workers.h); make_work(s) gives
// stage s's work. Raises the first failure, naming the stage, the unit and
// the item.
void run_pass(const Engine& engine, Sync& sync, PassIO& io, const ItemGrid& grid,
              const std::function<std::unique_ptr<StageWork>(int)>& make_work);

}  // namespace pipelstm::pipeline
