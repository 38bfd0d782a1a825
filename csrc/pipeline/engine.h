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

namespace pipelstm::pipeline {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

// CrossEntropy: the loss as the last unit of the last stage; each work item
// computes the loss of its tokens (the pass's output is their mean or sum)
// and its backward the gradient of its logits.
// Activation and LayerNorm (over the last dimension) are the pointwise
// layers that commonly sit between LSTM layers and the decoder.
enum class UnitKind { Lstm, Embedding, Linear, Dropout, Activation, LayerNorm, CrossEntropy };
enum class Activation { Relu, Tanh, Sigmoid, Gelu, GeluTanh, Silu };

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
  // Activation
  Activation activation = Activation::Relu;
  // LayerNorm
  double eps = 1e-5;
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

struct ForwardResult;
struct RunState;

struct BackwardResult {
  OptTensor grad_input;                 // [T, B, I]; nullopt for index input
  std::vector<OptTensor> grad_h0, grad_c0;  // per LSTM layer
  std::vector<std::vector<OptTensor>> grad_params;  // per unit, as UnitParams
};

// A pipelined forward pass that can be differentiated once.
class Run {
 public:
  explicit Run(std::shared_ptr<RunState> state) : state_(std::move(state)) {}
  Tensor output() const;
  std::vector<Tensor> h_n() const;
  std::vector<Tensor> c_n() const;
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
  int64_t num_units() const { return num_units_; }
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
  int64_t num_units_ = 0, num_lstm_ = 0;
  const UnitSpec* loss_ = nullptr;
  mutable std::mutex mutex_;
  std::vector<TraceEvent> forward_trace_, backward_trace_;
  std::vector<Fault> faults_;
  std::shared_ptr<RemoteLink> prev_, next_;
  int64_t first_stage_ = 0;
  std::string process_;
};

}  // namespace pipelstm::pipeline
