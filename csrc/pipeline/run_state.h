// What a pipelined forward keeps for its backward (RunState), what the two
// hand back, and the two passes over it: forward_pass (forward_pass.cpp)
// and backward_pass (backward_pass.cpp), each one pass::run with its plan.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "items.h"
#include "remote.h"
#include "spec.h"
#include "stages.h"
#include "units.h"

namespace pipelstm::pipeline {

// The links of an engine's end stages to the processes before and after it.
struct Links {
  std::shared_ptr<RemoteLink> prev, next;
};

// What ran last: the forward, then the backward of a run of the engine.
class TraceLog {
 public:
  void set(std::vector<TraceEvent> events, bool forward) {
    std::lock_guard<std::mutex> lock(mu_);
    if (forward) {
      forward_ = std::move(events);
      backward_.clear();
    } else {
      backward_ = std::move(events);
    }
  }
  std::vector<TraceEvent> all() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<TraceEvent> all = forward_;
    all.insert(all.end(), backward_.begin(), backward_.end());
    return all;
  }

 private:
  mutable std::mutex mu_;
  std::vector<TraceEvent> forward_, backward_;
};

struct BackwardResult {
  OptTensor grad_input;                 // [T, B, I]; nullopt for index input
  std::vector<OptTensor> grad_h0, grad_c0;  // per LSTM layer
  std::vector<std::vector<OptTensor>> grad_params;  // per unit, as UnitParams
};

struct RunOutputs {
  Tensor output;
  std::vector<Tensor> h_n, c_n;
};

// Everything one forward pass keeps for its backward.
struct RunState {
  std::shared_ptr<const Stages> stages;
  Links links;
  std::shared_ptr<TraceLog> trace;
  ItemGrid grid;
  bool training = false;
  std::optional<uint64_t> pass_seed;  // the caller's, else drawn (training only)
  bool index_input = false;
  double loss_divisor = 1.0;  // the counted targets, for a mean loss
  std::vector<int64_t> input_sizes;
  at::TensorOptions input_options;
  std::vector<UnitParams> params;
  // saved[s][grid.index(m, k)]: what stage s kept of item (m, k).
  std::vector<std::vector<SavedItem>> saved;
  int64_t saved_bytes = 0;
  std::vector<Tensor> h0_parts, c0_parts;  // [layer * M + m]
  Tensor output;                 // until Run::take_outputs
  std::vector<Tensor> h_n, c_n;  // per LSTM layer, until Run::take_outputs
  bool outputs_taken = false;
  // With a next process: the shape and options of each item's output (the
  // gradients that come back have them).
  std::vector<std::vector<int64_t>> out_sizes;
  at::TensorOptions out_options;
  bool kept = false;
  bool backward_done = false;
};

// The forward pass over `input` (on any device; with a previous process
// only its shape and dtype) from the initial states h0/c0 (per LSTM layer;
// nullopt: zeros), with the loss's `target` (checked) where the last unit
// is one. Fills st's outputs and, with st.kept, what backward needs.
void forward_pass(RunState& st, const Tensor& input, const std::vector<OptTensor>& h0,
                  const std::vector<OptTensor>& c0, const OptTensor& target,
                  Checkpoint checkpoint);

// The backward pass of a forward that kept its activations, from the
// gradients of its outputs; frees what the forward kept.
BackwardResult backward_pass(RunState& st, const OptTensor& grad_output,
                             const std::vector<OptTensor>& grad_h_n,
                             const std::vector<OptTensor>& grad_c_n);

}  // namespace pipelstm::pipeline
