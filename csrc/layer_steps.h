// The time-step layout of a layer's rows: a dense [T, B] sequence, or a
// packed one (torch.nn.utils.rnn.PackedSequence) where step t holds the
// first batch[t] sequences, sorted by decreasing length.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace pipelstm {

struct LayerSteps {
  std::vector<int64_t> batch;   // rows at each step
  std::vector<int64_t> offset;  // first row of each step
  int64_t max_batch = 0;        // rows at step 0: the number of sequences
  int64_t rows = 0;             // all rows
  bool dense = true;            // every step has max_batch rows

  int64_t steps() const { return static_cast<int64_t>(batch.size()); }

  // The step processed at position p of the recurrence.
  static int64_t step_at(int64_t p, int64_t T, bool reverse) { return reverse ? T - 1 - p : p; }

  // Rows of step t that continue from the step processed just before it
  // (the others start from h0/c0): rows [0, continuing) and [continuing, batch[t]).
  int64_t continuing(int64_t p, bool reverse) const {
    if (p == 0) return 0;
    const int64_t t = step_at(p, steps(), reverse), prev = step_at(p - 1, steps(), reverse);
    return std::min(batch[t], batch[prev]);
  }

  // Rows of step t whose sequence ends there (the final state): rows
  // [batch[t] - ending, batch[t]) where ending = batch[t] - rows that go on.
  int64_t going_on(int64_t p, bool reverse) const {
    if (p == steps() - 1) return 0;
    const int64_t t = step_at(p, steps(), reverse), next = step_at(p + 1, steps(), reverse);
    return std::min(batch[t], batch[next]);
  }
};

LayerSteps dense_steps(int64_t T, int64_t B);

// Validates `batch_sizes` (1-D int64 on the CPU, positive, non-increasing).
LayerSteps packed_steps(const char* op, const at::Tensor& batch_sizes);

}  // namespace pipelstm
