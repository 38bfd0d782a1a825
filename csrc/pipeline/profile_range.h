// Ranges of the pipeline's work in torch.profiler's trace: each stage's
// pass, each work item (micro-batch m, chunk k), each unit within it, the
// recomputation, the hand-over to the next stage and the parameter
// gradients, on the stage's own thread beside the kernels they launch.
// The stage threads carry the caller's thread-local state (workers.cpp), so
// a profiler started by the caller sees them.
#pragma once

#include <ATen/record_function.h>

#include <cstdint>
#include <sstream>
#include <string>

#include "spec.h"

namespace pipelstm::pipeline {

// What a range names: "pipelstm forward stage 0", then each of unit,
// micro-batch and chunk that is given (>= 0):
// "pipelstm backward stage 1 unit 3 'l2' (LSTM layer) micro-batch 0 chunk 2".
struct RangeName {
  const char* what;  // forward, backward, recompute, transfer, weights
  int64_t stage;
  const UnitSpec* unit = nullptr;
  int64_t unit_index = -1;
  int64_t m = -1, k = -1;

  std::string str() const {
    std::ostringstream os;
    os << "pipelstm " << what << " stage " << stage;
    if (unit != nullptr) {
      os << " unit " << unit_index << " '" << unit->name << "' (" << unit_kind_name(unit->kind) << ")";
    }
    if (m >= 0) os << " micro-batch " << m;
    if (k >= 0) os << " chunk " << k;
    return os.str();
  }
};

// One range for the scope it lives in. The name is built only while a
// profiler listens: otherwise this costs one check of a thread-local flag.
class ProfileRange {
 public:
  explicit ProfileRange(const RangeName& name) {
    if (guard_.isActive()) guard_.before(name.str());
  }
  ProfileRange(const ProfileRange&) = delete;
  ProfileRange& operator=(const ProfileRange&) = delete;

 private:
  at::RecordFunction guard_{at::RecordScope::USER_SCOPE};
};

}  // namespace pipelstm::pipeline
