// How a pass cuts its input [T, B, ...] into work items (m, k): K time
// chunks along dim 0 by M micro-batches along dim 1, sizes as
// torch.tensor_split gives them (the first pieces one longer), and how it
// puts the items' results back together (scatter and gather); likewise the
// per-sequence states [B, ...] of each LSTM layer, by micro-batch.
//
// Packed input (a PackedSequence's data [N, ...], rows time-major, step t
// holding the first batch_sizes[t] of the B sequences, sorted by decreasing
// length): micro-batch m is still rows [b_off[m], b_off[m] + b_sizes[m]) of
// the sorted sequences, and at each step its running sequences are a prefix
// of them, so item (m, k) is itself packed: micro-batch m's rows over chunk
// k's steps, [N_item, ...], with its own batch sizes. The chunks are cut to
// hold about equal tokens, not equal steps. No padding is made anywhere; a
// micro-batch whose sequences have all ended before a chunk has an item
// without rows there.
#pragma once

#include <ATen/core/Tensor.h>

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "schedule.h"

namespace pipelstm::pipeline {

class ItemGrid {
 public:
  ItemGrid() = default;
  // K = min(chunks, T), M = min(micro_batches, B).
  ItemGrid(int64_t T, int64_t B, int64_t chunks, int64_t micro_batches);
  // Packed: T = batch_sizes.numel(), B = batch_sizes[0] (checked by the caller:
  // 1-D int64 on the CPU, positive, non-increasing).
  static ItemGrid packed_grid(const at::Tensor& batch_sizes, int64_t chunks,
                              int64_t micro_batches);

  int64_t K = 1, M = 1;
  std::vector<int64_t> t_sizes, b_sizes, t_off, b_off;

  // Packed: per item (at index), its batch sizes (undefined: no rows), its
  // rows and where they start among all items' rows, in index order;
  // `order` [N] the packed input's row of each of those rows.
  bool packed = false;
  std::vector<at::Tensor> item_batch_sizes;
  std::vector<int64_t> item_rows, item_start;
  at::Tensor order;

  int64_t count() const { return K * M; }
  // Item (m, k)'s place in per-item vectors.
  int64_t index(int64_t m, int64_t k) const { return m * K + k; }
  int64_t index(Item it) const { return index(it.m, it.k); }

  // Item (m, k) of x [T, B, ...] (a view); dense only.
  at::Tensor piece(const at::Tensor& x, int64_t m, int64_t k) const;
  // Micro-batch m's rows of a per-sequence tensor [B, ...] (a view).
  at::Tensor rows(const at::Tensor& x, int64_t m) const;
  // The sizes of item (m, k) of a tensor of sizes `full` [T, B, ...]
  // (packed: [N, ...]).
  std::vector<int64_t> piece_sizes(std::vector<int64_t> full, int64_t m, int64_t k) const;
  // [T, B, ...] (packed: [N, ...]) from every item's piece (at index(m, k)).
  at::Tensor assemble(const std::vector<at::Tensor>& pieces) const;
  // [B, ...] from each micro-batch's rows.
  at::Tensor join_rows(const std::vector<at::Tensor>& per_m) const;

  // Scatter: every item's piece of x [T, B, ...] (packed: [N, ...]) (at
  // index(m, k)).
  std::vector<at::Tensor> scatter(const at::Tensor& x) const;
  // Every item's piece_sizes.
  std::vector<std::vector<int64_t>> scatter_sizes(const std::vector<int64_t>& full) const;
  // Per-layer states [B, ...] (nullopt: none), split by micro-batch onto
  // their layer's device: [layer * M + m], contiguous.
  std::vector<std::optional<at::Tensor>> scatter_rows(
      const std::vector<std::optional<at::Tensor>>& per_layer,
      const std::vector<c10::Device>& devices) const;
  // Gather: per layer, [B, ...] from parts[layer * M + m]; nullopt where a
  // micro-batch has none.
  template <typename T>
  std::vector<std::optional<at::Tensor>> gather_rows(const std::vector<T>& parts) const {
    std::vector<std::optional<at::Tensor>> out;
    for (size_t l = 0; l * M < parts.size(); ++l) {
      std::vector<at::Tensor> per_m;
      for (int64_t m = 0; m < M; ++m) {
        const at::Tensor* t = present(parts[l * M + m]);
        if (t == nullptr) break;
        per_m.push_back(*t);
      }
      out.push_back(static_cast<int64_t>(per_m.size()) == M
                        ? std::optional<at::Tensor>(join_rows(per_m))
                        : std::nullopt);
    }
    return out;
  }

 private:
  static const at::Tensor* present(const at::Tensor& t) { return t.defined() ? &t : nullptr; }
  static const at::Tensor* present(const std::optional<at::Tensor>& t) {
    return t.has_value() ? &*t : nullptr;
  }
};

// Which consecutive chunks of one micro-batch an LSTM unit's weight task
// joins (copies into one sequence) before its GEMMs, given each chunk's rows
// (-1: a chunk without a piece): runs [begin, end) of chunks with pieces,
// each grown while its rows stay under kJoinRows. A chunk of fewer rows
// gives GEMMs too shallow to run at the kernels' rate; chunks of more add
// their GEMMs in place instead. The simulator counts the joined copies.
constexpr int64_t kJoinRows = 1024;
std::vector<std::pair<int64_t, int64_t>> join_runs(const std::vector<int64_t>& rows);

}  // namespace pipelstm::pipeline
