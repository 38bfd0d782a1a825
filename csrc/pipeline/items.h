// How a pass cuts its input [T, B, ...] into work items (m, k): K time
// chunks along dim 0 by M micro-batches along dim 1, sizes as
// torch.tensor_split gives them (the first pieces one longer), and how it
// puts the items' results back together.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "schedule.h"

namespace pipelstm::pipeline {

class ItemGrid {
 public:
  ItemGrid() = default;
  // K = min(chunks, T), M = min(micro_batches, B).
  ItemGrid(int64_t T, int64_t B, int64_t chunks, int64_t micro_batches);

  int64_t K = 1, M = 1;
  std::vector<int64_t> t_sizes, b_sizes, t_off, b_off;

  int64_t count() const { return K * M; }
  // Item (m, k)'s place in per-item vectors.
  int64_t index(int64_t m, int64_t k) const { return m * K + k; }
  int64_t index(Item it) const { return index(it.m, it.k); }

  // Item (m, k) of x [T, B, ...] (a view).
  at::Tensor piece(const at::Tensor& x, int64_t m, int64_t k) const;
  // Micro-batch m's rows of a per-sequence tensor [B, ...] (a view).
  at::Tensor rows(const at::Tensor& x, int64_t m) const;
  // The sizes of item (m, k) of a tensor of sizes `full` [T, B, ...].
  std::vector<int64_t> piece_sizes(std::vector<int64_t> full, int64_t m, int64_t k) const;
  // [T, B, ...] from every item's piece (at index(m, k)).
  at::Tensor assemble(const std::vector<at::Tensor>& pieces) const;
  // [B, ...] from each micro-batch's rows.
  at::Tensor join_rows(const std::vector<at::Tensor>& per_m) const;
};

}  // namespace pipelstm::pipeline
