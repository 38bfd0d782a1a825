// The stage threads of a pass: one per stage, each with the caller's
// thread-local state, its stage's intra-op thread budget and (on an
// accelerator) its stage's stream, the same in every pass, outside autograd.
// A pass is ordered on the device as it is on the host: the stages' streams
// wait for the caller's at its start, and the caller's for theirs at its end.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <string>

#include "spec.h"
#include "stages.h"
#include "sync.h"

namespace pipelstm::pipeline {

// Runs body(s) on one thread per stage and joins them all. The first error
// (each body names its stage and unit; `sync.fail`) is raised here.
void run_workers(const Stages& stages, Sync& sync, const std::function<void(int)>& body);

// "pipelstm.Pipeline: stage 1 (cpu), unit 3 'l2' (LSTM layer), forward of
// micro-batch 0, chunk 2 failed: ..." (no unit: unit < 0; no item: m < 0).
std::string describe_failure(const Stages& stages, int s, const UnitSpec* unit,
                             int64_t unit_index, const char* phase, int64_t m, int64_t k,
                             const std::exception& e);

}  // namespace pipelstm::pipeline
