// The schedule: the order in which each stage runs its work items in a pass.
// The one file to read to see it (docs/design/pipeline.md explains why).
//
// A work item (m, k) is micro-batch m of time chunk k. Every stage has one
// thread and runs the same order:
//   forward:  k = 0..K-1, and within a chunk m = 0..M-1;
//   backward: the reverse, k = K-1..0, m = M-1..0.
// A stage starts an item once the stage before it (after it, backward) has
// handed it that item (pass.cpp: the slots of sync.h) and once it has run
// the item before in its own order, from which the hidden state (h, c) of
// micro-batch m carries over from chunk k-1 (its gradient from k+1). The
// result is a wavefront; S = 3 stages, K = 2 chunks, M = 2 micro-batches,
// each column one tick when all items cost the same, cells (m, k):
//
//   forward                                   backward
//   +----+----+----+----+----+----+           +----+----+----+----+----+----+
//   |0,0 |1,0 |0,1 |1,1 |    |    | stage 0   |    |    |1,1 |0,1 |1,0 |0,0 |
//   +----+----+----+----+----+----+           +----+----+----+----+----+----+
//   |    |0,0 |1,0 |0,1 |1,1 |    | stage 1   |    |1,1 |0,1 |1,0 |0,0 |    |
//   +----+----+----+----+----+----+           +----+----+----+----+----+----+
//   |    |    |0,0 |1,0 |0,1 |1,1 | stage 2   |1,1 |0,1 |1,0 |0,0 |    |    |
//   +----+----+----+----+----+----+           +----+----+----+----+----+----+
//
// A pass takes K*M + S - 1 ticks, of which each stage is busy K*M: the
// bubble is (S-1)/(K*M+S-1). Forward and backward are separate passes (GPipe
// order); in the backward pass each stage runs its units' parameter
// gradients after its last item (weight_tasks.h).
#pragma once

#include <cstdint>
#include <vector>

#include "spec.h"

namespace pipelstm::pipeline {

enum class Direction { Forward, Backward };

struct Item {
  int64_t m, k;
};

// The items of a pass in the order every stage runs them (and in which the
// receives from another process are posted).
inline std::vector<Item> item_order(Direction direction, int64_t K, int64_t M) {
  std::vector<Item> order;
  order.reserve(static_cast<size_t>(K * M));
  for (int64_t i = 0; i < K; ++i) {
    for (int64_t j = 0; j < M; ++j) {
      order.push_back(direction == Direction::Forward ? Item{j, i} : Item{M - 1 - j, K - 1 - i});
    }
  }
  return order;
}

// Whether the forward pass keeps only what replaying item (m, k) needs
// (activation recomputation, spec.h): ExceptLast keeps the last forward
// item whole, since its backward comes first.
inline bool recomputes(Checkpoint policy, Item item, int64_t K, int64_t M) {
  switch (policy) {
    case Checkpoint::Never: return false;
    case Checkpoint::Always: return true;
    case Checkpoint::ExceptLast: return !(item.m == M - 1 && item.k == K - 1);
  }
  return false;
}

// Whether micro-batch m's recurrence ends at this item in this pass: the
// final states come from chunk K-1 forward, the gradients of the initial
// states from chunk 0 backward.
inline bool ends_recurrence(Direction direction, Item item, int64_t K) {
  return direction == Direction::Forward ? item.k == K - 1 : item.k == 0;
}

}  // namespace pipelstm::pipeline
