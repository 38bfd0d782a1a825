// The pipeline engine: units (LSTM layers and time-local layers) grouped into
// stages, one device and one worker thread per stage, run as a wavefront over
// K time chunks x M micro-batches; backward is the reverse wavefront.
//
// See docs/pipeline.md for the design and the schedule. Everything here is
// plain ATen: the worker threads never touch Python or the GIL.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "remote.h"
#include "spec.h"
#include "streams.h"

namespace pipelstm::pipeline {

struct ForwardResult;
struct RunState;

struct BackwardResult {
  OptTensor grad_input;                 // [T, B, I]; nullopt for index input
  std::vector<OptTensor> grad_h0, grad_c0;  // per LSTM layer
  std::vector<std::vector<OptTensor>> grad_params;  // per unit, as UnitParams
};

struct RunOutputs {
  Tensor output;
  std::vector<Tensor> h_n, c_n;
};

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

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  explicit Engine(std::vector<StageSpec> stages);

  // input: [T, B] int64 (when the first unit is an Embedding) or [T, B, I];
  // h0/c0: per LSTM layer, [B, P] / [B, H] (nullopt: zeros); params: per unit
  // in stage order. chunks/micro_batches are clamped to T and B. target:
  // [T, B] class indices, exactly when the last unit is a CrossEntropy (the
  // output is then the loss, a scalar).
  // Runs the forward pass; raises naming the stage and unit that failed.
  std::shared_ptr<Run> forward(const Tensor& input, const std::vector<OptTensor>& h0,
                               const std::vector<OptTensor>& c0,
                               const std::vector<UnitParams>& params, int64_t chunks,
                               int64_t micro_batches, bool training, bool keep_for_backward,
                               Checkpoint checkpoint = Checkpoint::Never,
                               const OptTensor& target = std::nullopt);

  // Makes this engine one part of a pipeline over processes: its first
  // stage receives its input (activations) from `prev` and sends back the
  // gradient of it; its last stage sends its output to `next` and receives
  // the gradient of it. Waits give up after `timeout_s`. `first_stage` (the
  // global index of this engine's first stage) and `process` (e.g. "rank 1")
  // name the stages in messages.
  void connect(const std::optional<RemoteSpec>& prev, const std::optional<RemoteSpec>& next,
               double timeout_s, int64_t first_stage, const std::string& process);
  const std::shared_ptr<RemoteLink>& prev_link() const { return prev_; }
  const std::shared_ptr<RemoteLink>& next_link() const { return next_; }
  // "stage 3 (cpu, rank 1)" for local stage s.
  std::string stage_label(int64_t s) const;

  const std::vector<StageSpec>& stages() const { return stages_; }
  // Stage s's compute stream, the same in every pass (StageStreams);
  // nullopt for a CPU stage.
  std::optional<c10::Stream> stage_stream(int64_t s) const {
    return streams_.get(static_cast<size_t>(s), stages_[s].device);
  }
  int64_t num_units() const { return num_units_; }
  // The global index of local stage s's first unit.
  int64_t first_unit(int64_t s) const { return first_unit_[s]; }
  int64_t num_lstm_layers() const { return num_lstm_; }
  // The last unit, or nullptr: a CrossEntropy loss.
  const UnitSpec* loss() const { return loss_; }

  // What ran last (forward, then the backward of a run of this engine).
  std::vector<TraceEvent> trace() const;

  // Testing: make unit `unit` (global index) raise in `phase` at (m, k).
  void inject_fault(int64_t unit, const std::string& phase, int64_t micro_batch, int64_t chunk);
  void clear_faults();

  // Shared with the runs (internal).
  struct Fault {
    int64_t unit;
    std::string phase;
    int64_t m, k;
  };
  void set_trace(std::vector<TraceEvent> events, bool forward);
  std::vector<Fault> faults() const;

 private:
  std::vector<StageSpec> stages_;
  mutable StageStreams streams_{stages_.size()};
  int64_t num_units_ = 0, num_lstm_ = 0;
  std::vector<int64_t> first_unit_;
  const UnitSpec* loss_ = nullptr;
  mutable std::mutex mutex_;
  std::vector<TraceEvent> forward_trace_, backward_trace_;
  std::vector<Fault> faults_;
  std::shared_ptr<RemoteLink> prev_, next_;
  int64_t first_stage_ = 0;
  std::string process_;
};

}  // namespace pipelstm::pipeline
