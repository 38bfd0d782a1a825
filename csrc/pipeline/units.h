// What a pipeline stage runs on one work item (micro-batch m, chunk k), unit
// by unit: forward, the data part of backward, the parameter gradients (once
// per unit over all items of a pass) and the replay of a recomputed item.
// Plain ATen, no threads or scheduling: that is the pass's (pass.h).
#pragma once

#include <ATen/core/Generator.h>

#include <cstdint>
#include <vector>

#include "spec.h"

namespace pipelstm::pipeline {

const Tensor& need(const OptTensor& t, const UnitSpec& u, const char* what);

// What a unit may need to know of the work item it runs on besides its
// input: the loss's targets, and for packed input (a PackedSequence) the
// item's own packing.
struct ItemContext {
  // A CrossEntropy unit's targets for the item (time-major [T, B], packed
  // [N]); undefined for the other units.
  Tensor target;
  // Packed input: the item's rows per step (1-D int64 on the CPU, positive
  // and non-increasing; the item's tensors are [N, ...], rows time-major,
  // step t holding the first batch_sizes[t] of the micro-batch's sequences).
  // Undefined for dense items ([T, B, ...]) and for packed items without
  // rows (a micro-batch whose sequences all ended before the chunk).
  Tensor batch_sizes;
  bool packed = false;
  // A recomputed item's forward run again (units.cpp: replay): a unit draws
  // nothing and reuses what its keep_for_replay kept.
  bool replaying = false;
};

// What one stage keeps of one work item for its backward.
struct SavedItem {
  // Recomputed: `units` holds only what replaying the forward needs (each
  // LSTM layer's initial {h, c}, each dropout mask) and `input` the
  // stage's input; otherwise `units[j]` is what unit j's backward needs.
  bool recompute = false;
  Tensor input;
  std::vector<std::vector<Tensor>> units;
};

// What a unit's parameter gradients need of one item (empty: no gradient
// reached the unit there), kept from the data part of backward until the
// unit's weight gradients run: pieces[m][k].
using Piece = std::vector<Tensor>;
using Pieces = std::vector<std::vector<Piece>>;

// The seed of a dropout unit's mask for item (m, k) of a pass: the same
// whatever order the stage threads run in, so a pass is reproducible under
// torch.manual_seed (which governs `pass_seed`).
uint64_t dropout_seed(uint64_t pass_seed, int64_t unit, int64_t m, int64_t k);

// The seed unit_forward gets for item (m, k): dropout_seed's, or with its
// kind's seed_per_micro_batch, one for all chunks of micro-batch m.
uint64_t unit_seed(const UnitSpec& u, uint64_t pass_seed, int64_t unit, int64_t m, int64_t k);

// A generator on `device` seeded with `seed` (the default one's kind, cloned
// on a GPU), for a dropout mask.
at::Generator seeded_generator(const c10::Device& device, uint64_t seed);

// A training pass's seed: one draw from the default CPU generator (so
// torch.manual_seed governs every mask of the pass), whatever the units.
uint64_t draw_pass_seed();

// One unit forward on x; returns the output and updates the carried (h, c)
// of an LSTM layer. With `keep`, fills `saved` with what its backward needs.
// A CrossEntropy unit takes the item's target and returns its loss sum.
Tensor unit_forward(const UnitSpec& u, const UnitParams& p, const Tensor& x, bool training,
                    bool keep, Tensor& h, Tensor& c, std::vector<Tensor>& saved, uint64_t seed,
                    const ItemContext& item = {});

// One unit backward without its parameter gradients ("B"): g (the gradient
// of its output, possibly undefined) -> the gradient of its input; updates
// the carried state gradients of an LSTM layer; what the parameter
// gradients need goes to `piece`.
Tensor unit_backward_data(const UnitSpec& u, const UnitParams& p, const Tensor& g,
                          const std::vector<Tensor>& saved, OptTensor& grad_h, OptTensor& grad_c,
                          Piece& piece);

// The unit's parameter gradients ("W") from the pieces of all items, added
// into `acc` (one slot per parameter, as UnitParams). An LSTM layer runs one
// GEMM per weight over the consecutive chunks of each micro-batch while they
// hold fewer than 1024 rows together (with one micro-batch: bitwise what the
// layer op computes over the whole sequence), and adds larger chunks' GEMMs
// in place; Linear and Embedding one over all items.
void unit_weight_grads(const UnitSpec& u, const UnitParams& p, const Pieces& pieces,
                       std::vector<Tensor>& acc);

// After a recomputed item's forward: keep of a unit's saved tensors only
// what replaying it needs.
void keep_for_replay(const UnitSpec& u, std::vector<Tensor>& saved);

// Runs a recomputed item's forward again from its stage input, leaving in
// item.units what each unit's backward needs (bitwise what the first
// forward saved: the same ops on the same inputs and thread budget).
// `context` as the first forward had it (its target is read from `item`).
void replay(const std::vector<UnitSpec>& units, const std::vector<UnitParams>& params,
            int64_t first_unit, bool training, const ItemContext& context, SavedItem& item);

}  // namespace pipelstm::pipeline
