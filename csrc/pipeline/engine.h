// The pipeline engine: units (LSTM layers and time-local layers) grouped into
// stages, one device and one worker thread per stage, run as a wavefront over
// K time chunks x M micro-batches; backward is the reverse wavefront.
//
// The engine is the front door the bindings use and nothing else includes:
// it holds the stages (stages.h), the links to other processes and the last
// trace, checks a run's arguments, and hands each pass to forward_pass /
// backward_pass (run_state.h), each one pass::run (pass.h) with its plan.
// See docs/design/pipeline.md for the design and the schedule. Everything here is
// plain ATen: the worker threads never touch Python or the GIL.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "remote.h"
#include "run_state.h"
#include "spec.h"
#include "stages.h"

namespace pipelstm::pipeline {

// A pipelined forward pass that can be differentiated once.
class Run {
 public:
  explicit Run(std::shared_ptr<RunState> state) : state_(std::move(state)) {}
  // The output and the final states per LSTM layer, handed over once (a
  // second call raises): the run keeps no reference to them, because the
  // autograd node that holds the run is reachable from them, and a run
  // holding them back would make a cycle that is never freed.
  RunOutputs take_outputs();
  // Bytes of the tensors this pass keeps for backward (distinct storages),
  // measured when forward finished.
  int64_t saved_bytes() const;
  // Releases what forward saved; a second call raises.
  BackwardResult backward(const OptTensor& grad_output, const std::vector<OptTensor>& grad_h_n,
                          const std::vector<OptTensor>& grad_c_n);

 private:
  std::shared_ptr<RunState> state_;
};

class Engine {
 public:
  explicit Engine(std::vector<StageSpec> stages);

  // input: [T, B] int64 (when the first unit is an Embedding) or [T, B, I];
  // h0/c0: per LSTM layer, [B, P] / [B, H] (nullopt: zeros); params: per unit
  // in stage order. chunks/micro_batches are clamped to T and B. target:
  // [T, B] class indices, exactly when the last unit is a CrossEntropy (the
  // output is then the loss, a scalar). batch_sizes: packed input (items.h),
  // a PackedSequence's: input is then its data, [N] or [N, I], the target [N],
  // the states those of the sorted sequences, the output [N, ...].
  // pass_seed: what the units' masks are drawn from (training); nullopt:
  // drawn from torch's default CPU generator (draw_pass_seed).
  // Runs the forward pass; raises naming the stage and unit that failed.
  std::shared_ptr<Run> forward(const Tensor& input, const std::vector<OptTensor>& h0,
                               const std::vector<OptTensor>& c0,
                               const std::vector<UnitParams>& params, int64_t chunks,
                               int64_t micro_batches, bool training, bool keep_for_backward,
                               Checkpoint checkpoint = Checkpoint::Never,
                               const OptTensor& target = std::nullopt,
                               const OptTensor& batch_sizes = std::nullopt,
                               std::optional<uint64_t> pass_seed = std::nullopt);

  // Makes this engine one part of a pipeline over processes: its first
  // stage receives its input (activations) from `prev` and sends back the
  // gradient of it; its last stage sends its output to `next` and receives
  // the gradient of it. Waits give up after `timeout_s`. `first_stage` and
  // `first_unit` (the global indices of this engine's first stage and of
  // its first unit) and `process` (e.g. "rank 1") place its stages in the
  // whole pipeline (Stages::place).
  void connect(const std::optional<RemoteSpec>& prev, const std::optional<RemoteSpec>& next,
               double timeout_s, int64_t first_stage, int64_t first_unit, const std::string& process);

  const Stages& stages() const { return *stages_; }
  int64_t num_units() const { return stages_->num_units(); }
  int64_t num_lstm_layers() const { return stages_->num_lstm_layers(); }

  // What ran last (forward, then the backward of a run of this engine).
  std::vector<TraceEvent> trace() const { return trace_->all(); }

 private:
  std::shared_ptr<Stages> stages_;
  Links links_;
  std::shared_ptr<TraceLog> trace_ = std::make_shared<TraceLog>();
};

}  // namespace pipelstm::pipeline
