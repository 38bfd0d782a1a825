// The engine's front door (engine.h): a run's arguments checked, then the
// forward pass (forward_pass.cpp) and, once, its backward (backward_pass.cpp).
#include "engine.h"

#include <ATen/ATen.h>

#include <chrono>
#include <utility>

#include "../layer_steps.h"

namespace pipelstm::pipeline {

Engine::Engine(std::vector<StageSpec> stages)
    : stages_(std::make_shared<Stages>(std::move(stages))) {}

void Engine::connect(const std::optional<RemoteSpec>& prev, const std::optional<RemoteSpec>& next,
                     double timeout_s, int64_t first_stage, int64_t first_unit,
                     const std::string& process) {
  TORCH_CHECK(timeout_s > 0, "pipelstm: timeout must be positive, got ", timeout_s);
  stages_->place(first_stage, first_unit, process);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0));
  links_.prev = prev ? std::make_shared<RemoteLink>(*prev, timeout) : nullptr;
  links_.next = next ? std::make_shared<RemoteLink>(*next, timeout) : nullptr;
}

std::shared_ptr<Run> Engine::forward(const Tensor& input, const std::vector<OptTensor>& h0,
                                     const std::vector<OptTensor>& c0,
                                     const std::vector<UnitParams>& params, int64_t chunks,
                                     int64_t micro_batches, bool training,
                                     bool keep_for_backward, Checkpoint checkpoint,
                                     const OptTensor& target, const OptTensor& batch_sizes,
                                     std::optional<uint64_t> pass_seed) {
  const int64_t U = stages_->num_units(), L = stages_->num_lstm_layers();
  TORCH_CHECK(static_cast<int64_t>(params.size()) == U, "pipelstm.Pipeline: expected ", U,
              " parameter lists, got ", params.size());
  TORCH_CHECK(static_cast<int64_t>(h0.size()) == L && static_cast<int64_t>(c0.size()) == L,
              "pipelstm.Pipeline: expected an initial state for each of the ", L,
              " LSTM layers");
  TORCH_CHECK(chunks > 0 && micro_batches > 0,
              "pipelstm.Pipeline: chunks and micro_batches must be positive");
  ItemGrid grid;
  if (batch_sizes.has_value()) {
    const LayerSteps steps = packed_steps("Pipeline", *batch_sizes);  // checks them
    TORCH_CHECK(input.dim() >= 1 && input.size(0) == steps.rows,
                "pipelstm.Pipeline: expected packed input of ", steps.rows,
                " rows (the sum of batch_sizes), got ", input.sizes());
    grid = ItemGrid::packed_grid(*batch_sizes, chunks, micro_batches);
  } else {
    TORCH_CHECK(input.dim() >= 2,
                "pipelstm.Pipeline: expected input of shape [T, B, ...], got ", input.sizes());
    const int64_t T = input.size(0), B = input.size(1);
    TORCH_CHECK(T > 0 && B > 0, "pipelstm.Pipeline: expected a non-empty input, got ",
                input.sizes());
    grid = ItemGrid(T, B, chunks, micro_batches);
  }

  auto st = std::make_shared<RunState>();
  st->stages = stages_;
  st->links = links_;
  st->trace = trace_;
  st->grid = std::move(grid);
  st->training = training;
  st->pass_seed = pass_seed;
  st->kept = keep_for_backward;
  st->index_input = !at::isFloatingType(input.scalar_type());
  st->input_sizes = input.sizes().vec();
  st->input_options = input.options();
  st->params = params;
  forward_pass(*st, input, h0, c0, target, checkpoint);
  return std::make_shared<Run>(st);
}

RunOutputs Run::take_outputs() {
  RunState& st = *state_;
  TORCH_CHECK(!st.outputs_taken, "pipelstm.Pipeline: the outputs of a pass are handed over once");
  st.outputs_taken = true;
  return RunOutputs{std::move(st.output), std::move(st.h_n), std::move(st.c_n)};
}

int64_t Run::saved_bytes() const { return state_->saved_bytes; }

BackwardResult Run::backward(const OptTensor& grad_output, const std::vector<OptTensor>& grad_h_n,
                             const std::vector<OptTensor>& grad_c_n) {
  RunState& st = *state_;
  TORCH_CHECK(st.kept, "pipelstm.Pipeline: this forward pass kept nothing for backward");
  TORCH_CHECK(!st.backward_done,
              "pipelstm.Pipeline: backward through the same pipelined forward twice is not "
              "supported (its saved activations are freed after the first backward)");
  const int64_t L = st.stages->num_lstm_layers();
  TORCH_CHECK(static_cast<int64_t>(grad_h_n.size()) == L &&
                  static_cast<int64_t>(grad_c_n.size()) == L,
              "pipelstm.Pipeline: expected a (possibly None) gradient for each LSTM layer's state");
  return backward_pass(st, grad_output, grad_h_n, grad_c_n);
}

}  // namespace pipelstm::pipeline
