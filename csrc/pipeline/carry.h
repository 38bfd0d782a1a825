// The recurrent state a stage carries from chunk to chunk, per (unit,
// micro-batch): (h, c) forward, their gradients backward. Only its LSTM
// units have any; the per-layer vectors it starts from and stores into are
// indexed [layer * M + m] (ItemGrid::scatter_rows, gather_rows).
#pragma once

#include <cstdint>
#include <vector>

#include "spec.h"

namespace pipelstm::pipeline {

template <typename T>
class CarriedState {
 public:
  CarriedState(const StageSpec& stage, int64_t M, const std::vector<T>& h_by_layer,
               const std::vector<T>& c_by_layer)
      : stage_(stage), M_(M), h_(stage.units.size() * M), c_(stage.units.size() * M) {
    for_each_layer([&](int64_t j, int64_t l) {
      for (int64_t m = 0; m < M_; ++m) {
        h_[j * M_ + m] = h_by_layer[l * M_ + m];
        c_[j * M_ + m] = c_by_layer[l * M_ + m];
      }
    });
  }

  T& h(int64_t j, int64_t m) { return h_[j * M_ + m]; }
  T& c(int64_t j, int64_t m) { return c_[j * M_ + m]; }

  // Micro-batch m's state of every LSTM unit, into the per-layer vectors.
  void store(int64_t m, std::vector<T>& h_by_layer, std::vector<T>& c_by_layer) const {
    for_each_layer([&](int64_t j, int64_t l) {
      h_by_layer[l * M_ + m] = h_[j * M_ + m];
      c_by_layer[l * M_ + m] = c_[j * M_ + m];
    });
  }

 private:
  template <typename F>
  void for_each_layer(F f) const {
    for (size_t j = 0; j < stage_.units.size(); ++j) {
      const UnitSpec& u = stage_.units[j];
      if (unit_kind_has_state(u.kind)) f(static_cast<int64_t>(j), u.state_index);
    }
  }

  const StageSpec& stage_;
  int64_t M_;
  std::vector<T> h_, c_;
};

}  // namespace pipelstm::pipeline
