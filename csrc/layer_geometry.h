// The geometry of one LSTM layer direction: its sizes, read from its
// weights, and the layout of the workspace its forward saves for backward.
// The one C++ source of both (python/pipelstm/geometry.py is the Python one).
//
//   w_ih [4H, I]   w_hh [4H, P]   w_hr [P, H] (optional projection)
//   h is P wide (P = H without a projection), c is H wide.
//   workspace, `rows` rows of every part one after another:
//     [rows, 4H] activated gates | [rows, H] c | [rows, H] h before the
//     projection (with w_hr only)
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace pipelstm {

struct LayerGeometry {
  int64_t input = 0;   // I
  int64_t hidden = 0;  // H
  int64_t out = 0;     // P: the width of h (and of the output)
  bool projected = false;

  // Read from weights of the shapes above; unchecked (the ops check them).
  static LayerGeometry of(const at::Tensor& w_ih, const at::Tensor& w_hh,
                          const std::optional<at::Tensor>& w_hr) {
    return {w_ih.size(1), w_hh.size(0) / 4, w_hh.size(1), w_hr.has_value()};
  }

  int64_t gates() const { return 4 * hidden; }

  // The workspace: elements per row, and where each part starts.
  int64_t workspace_width() const { return (projected ? 6 : 5) * hidden; }
  int64_t workspace_numel(int64_t rows) const { return rows * workspace_width(); }
  int64_t cells_offset(int64_t rows) const { return rows * 4 * hidden; }
  int64_t raw_h_offset(int64_t rows) const { return rows * 5 * hidden; }
};

}  // namespace pipelstm
