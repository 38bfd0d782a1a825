// A test hook: make a unit raise at one work item of a pass, to test how a
// failed pass ends (tests/test_pipeline.py). Process-wide, checked before
// each unit runs; with no fault set the check is one relaxed atomic load.
#pragma once

#include <cstdint>

#include "schedule.h"

namespace pipelstm::pipeline::testing {

// Unit `unit` (global index in its engine) raises "injected fault
// (testing)" in `phase` ("forward" or "backward") of item (m, k).
void inject_fault(int64_t unit, const char* phase, int64_t m, int64_t k);
void clear_faults();
// Raises where a fault is set for this unit and item.
void check_fault(int64_t unit, Direction direction, Item item);

}  // namespace pipelstm::pipeline::testing
