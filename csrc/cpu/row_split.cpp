#include "row_split.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <optional>

#include "../settings.h"
#include "cpu_identity.h"

namespace pipelstm {
namespace cpu {
namespace {

// A block has at least this many rows.
constexpr int64_t kMinRowsPerBlock = 8;

// The most weights (floats of w_hh and w_hr) for which the forward and the
// backward split rows rather than panels: every thread then reads all of
// them at every step, where a panel split reads each part once, so the
// bound follows the L2. Set per CPU class by timing both splits
// (docs/design/cpu.md, "The constants of the blocking"): half a core's L2
// on an intel-amx Xeon; elsewhere the bounds timed on a Zen 5, H = P = 128
// in the forward and H = P = 512 in the backward.
struct RowSplitBounds {
  int64_t forward = int64_t{1} << 16;
  int64_t backward = int64_t{1} << 20;
};

const RowSplitBounds& row_split_bounds() {
  static const RowSplitBounds bounds = [] {
    const CpuIdentity& id = cpu_identity();
    if (id.microarchitecture != "intel-amx" || id.l2_bytes == 0) return RowSplitBounds{};
    const int64_t half_l2 = id.l2_bytes / 2 / static_cast<int64_t>(sizeof(float));
    return RowSplitBounds{half_l2, half_l2};
  }();
  return bounds;
}

int64_t loop_weights(const LayerGeometry& g) {
  return 4 * g.hidden * g.out + (g.projected ? g.out * g.hidden : 0);
}

int64_t threads_here() { return at::in_parallel_region() ? 1 : at::get_num_threads(); }

// Whether the class's bounds split this layer's loop over rows.
bool class_splits_rows(const LayerGeometry& g, bool backward) {
  const RowSplitBounds& bounds = row_split_bounds();
  return loop_weights(g) <= (backward ? bounds.backward : bounds.forward);
}

// A row needs only its own row of the step before (the backward: of the
// step after, and its own rows of grad_c), so blocks of rows need no
// barrier per step and no row of h or of its gradients crosses cores, but
// every thread reads all the weights. Packed sequences end at different
// steps, so equal blocks would not stay balanced: they split panels.
// PIPELSTM_ROW_SPLIT=0 never splits rows, =1 whenever there are rows for
// two blocks (for measuring).
int64_t row_blocks(const LayerSteps& steps, const LayerGeometry& g, bool backward) {
  if (!steps.dense) return 1;
  const std::optional<bool> forced = settings::row_split();  // read per call: cheap beside a loop
  const int64_t threads = threads_here();
  const int64_t blocks = std::min<int64_t>(threads, steps.max_batch / kMinRowsPerBlock);
  if (forced == false || blocks < 2) return 1;
  if (forced == true) return blocks;
  const CpuPath* path = scoped_path();
  if (path != nullptr && path->split != Split::kClass) return path->split == Split::kRows ? blocks : 1;
  return blocks == threads && class_splits_rows(g, backward) ? blocks : 1;
}

thread_local int64_t t_last_row_blocks = 1;

}  // namespace

int64_t loop_row_blocks(const LayerSteps& steps, const LayerGeometry& geometry, bool backward) {
  t_last_row_blocks = row_blocks(steps, geometry, backward);
  return t_last_row_blocks;
}

Split row_split_alternative(const LayerGeometry& geometry, const LayerSteps& steps, bool backward) {
  const int64_t threads = threads_here();
  if (!steps.dense || threads < 2 || steps.max_batch / kMinRowsPerBlock < threads) return Split::kClass;
  return class_splits_rows(geometry, backward) ? Split::kPanels : Split::kRows;
}

int64_t last_row_blocks() { return t_last_row_blocks; }

}  // namespace cpu
}  // namespace pipelstm
