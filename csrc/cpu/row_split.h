// How the threads of a layer loop share its steps (fused_loops_cpu.cpp):
// over panels of hidden units, meeting at a barrier after each step, or
// over blocks of batch rows that each run the whole time loop alone. The
// CPU class's bounds on the weights choose, unless PIPELSTM_ROW_SPLIT or
// the call's timed path (cpu_path.h) says otherwise. Either way the
// results are the same bits.
#pragma once

#include <cstdint>

#include "../layer_geometry.h"
#include "../layer_steps.h"
#include "cpu_path.h"

namespace pipelstm {
namespace cpu {

// The blocks of batch rows the forward (or backward) loop of this layer
// over these steps runs as, one thread each; 1: the threads split panels.
int64_t loop_row_blocks(const LayerSteps& steps, const LayerGeometry& geometry, bool backward);

// For a call's path choice: the split that the class's bounds do not pick
// for this loop, where both are possible (dense input, a block of at least
// 8 rows for every thread); Split::kClass where only one is.
Split row_split_alternative(const LayerGeometry& geometry, const LayerSteps& steps, bool backward);

// What loop_row_blocks last returned on this thread (for tests).
int64_t last_row_blocks();

}  // namespace cpu
}  // namespace pipelstm
