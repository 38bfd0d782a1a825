// The step loop of one layer direction, for every backend and dtype
// without a fused whole-sequence loop: per step one recurrent GEMM
// (the backend's kMath.mm_out, added in place onto the step's input
// projection in the workspace), one fused pointwise call for each run of
// rows that start from the same state, and (with a projection) one GEMM for
// h = h_raw @ w_hr^T. Backward mirrors it per step; the input gradient is
// one GEMM over all steps.
//
// Both layouts share one loop over rows: a dense [T, B, *] tensor is the
// packed layout with B rows at every step. A packed step only touches the
// rows of sequences still running, so padding costs nothing.
//
// `Backend` is the backend's layer class (cpu/lstm_layer_cpu.cpp,
// cuda/lstm_layer_cuda.cpp) with
//   static constexpr LayerMath kMath: its GEMMs and buffers (layer_math.h);
//   static step_forward(const kernels::PointwiseForwardArgs<T>&),
//   static step_backward(const kernels::PointwiseBackwardArgs<T>&):
//       the backend's pointwise step for every T (a generic lambda);
//   template <typename T> static bool sequence_forward(const SequenceForward<T>&);
//   template <typename T> static bool sequence_backward(const SequenceBackward<T>&);
//       a whole dense sequence's recurrence in one kernel where it has one
//       that fits (true), else nothing (false);
//   template <class F> static void dispatch_types(at::ScalarType, F&& f);
//       f(T{}) for the element type T of each dtype it implements.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <utility>

#include "layer_geometry.h"
#include "layer_math.h"
#include "layer_steps.h"
#include "layer_workspace.h"
#include "lstm_ops.h"
#include "pipelstm/kernels/lstm_pointwise.h"
#include "zoneout_keeps.h"

namespace pipelstm {

// What a whole-sequence forward kernel gets: a dense sequence's input
// projections (both biases in; they are ws.gates, which the kernel
// overwrites with the activated gates) and the results to fill.
template <typename scalar_t>
struct SequenceForward {
  const LayerSteps& steps;
  const LayerGeometry& geometry;
  const at::Tensor &input_gates, &h0, &c0, &w_hh;
  bool reverse;
  const Workspace& ws;
  ForwardResult& r;
};

// What a whole-sequence backward kernel gets (dense, no projection): the
// gradients given (nullopt: none; possibly strided), what the forward
// kept, and the results to fill: every step's pre-activation gradient and
// the gradients of the initial state.
template <typename scalar_t>
struct SequenceBackward {
  const LayerSteps& steps;
  const LayerGeometry& geometry;
  const std::optional<at::Tensor> &grad_output, &grad_h_n, &grad_c_n;
  const at::Tensor &c0, &w_hh;
  bool reverse;
  const Workspace& ws;
  at::Tensor &grad_gates, &grad_h0, &grad_c0;
};

// gates [N, 4H] = every step's input projection x @ w_ih^T with both
// biases added.
inline void input_gates_into(const at::Tensor& gates, const at::Tensor& x, const at::Tensor& w_ih,
                             const std::optional<at::Tensor>& b_ih,
                             const std::optional<at::Tensor>& b_hh, const LayerMath& math) {
  const at::Tensor bias = summed_bias(b_ih, b_hh);
  if (bias.defined()) gates.copy_(bias.expand_as(gates));
  math.mm_out(gates, x, w_ih.t(), /*accumulate=*/bias.defined());
}

// The forward of all steps: x [rows, I] dense; h0 [B, P], c0 [B, H].
template <class Backend>
ForwardResult step_loop_forward(const LayerSteps& steps, const LayerGeometry& s,
                                const at::Tensor& x, const at::Tensor& h0, const at::Tensor& c0,
                                const at::Tensor& w_ih, const at::Tensor& w_hh,
                                const std::optional<at::Tensor>& b_ih,
                                const std::optional<at::Tensor>& b_hh,
                                const std::optional<at::Tensor>& w_hr, bool reverse,
                                const Zoneout* zoneout = nullptr) {
  using at::Tensor;
  const LayerMath& math = Backend::kMath;
  ForwardResult r = new_forward_result(steps, s, x.options(), math);
  if (steps.rows == 0) return r;
  const Workspace ws(r.workspace, steps.rows, s);
  // The input projections go straight into the workspace's gates: each step
  // adds its recurrent product there, and its pointwise step turns the sum
  // into the activated gates in place.
  const Tensor& input_gates = ws.gates;
  input_gates_into(input_gates, x, w_ih, b_ih, b_hh, math);
  const Tensor h_init = h0.contiguous(), c_init = c0.contiguous();
  Backend::dispatch_types(x.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    if (steps.dense && !s.projected && zoneout == nullptr &&
        Backend::sequence_forward(SequenceForward<scalar_t>{steps, s, input_gates, h_init, c_init,
                                                            w_hh, reverse, ws, r})) {
      return;
    }
    const int64_t T = steps.steps(), H = s.hidden, P = s.out;
    int64_t prev = -1;
    for (int64_t p = 0; p < T; ++p) {
      const int64_t t = LayerSteps::step_at(p, T, reverse);
      const int64_t rows = steps.batch[t], row0 = steps.offset[t];
      const int64_t cont = steps.continuing(p, reverse);
      // Rows [0, cont) go on from the previous step, the rest start from h0/c0.
      Tensor h_prev;
      if (cont == rows) {
        h_prev = r.output.narrow(0, steps.offset[prev], rows);
      } else if (cont == 0) {
        h_prev = h_init.narrow(0, 0, rows);
      } else {
        h_prev = at::cat({r.output.narrow(0, steps.offset[prev], cont), h_init.narrow(0, cont, rows - cont)});
      }
      Backend::kMath.mm_out(input_gates.narrow(0, row0, rows), h_prev, w_hh.t(), /*accumulate=*/true);
      const Tensor& h_out = s.projected ? ws.raw_h : r.output;
      const int64_t h_width = s.projected ? H : P;
      for (const auto& [begin, end] : {std::pair{int64_t{0}, cont}, std::pair{cont, rows}}) {
        if (end <= begin) continue;
        kernels::PointwiseForwardArgs<scalar_t> step;
        step.batch = end - begin;
        step.hidden = H;
        step.gates = row_of<scalar_t>(input_gates, row0 + begin, 4 * H);
        step.act_gates = mutable_row_of<scalar_t>(ws.gates, row0 + begin, 4 * H);  // the same rows
        step.c_prev = begin < cont ? row_of<scalar_t>(ws.cells, steps.offset[prev] + begin, H)
                                   : row_of<scalar_t>(c_init, begin, H);
        step.c = mutable_row_of<scalar_t>(ws.cells, row0 + begin, H);
        step.h = mutable_row_of<scalar_t>(h_out, row0 + begin, h_width);
        if (zoneout) {
          step.h_prev = begin < cont ? row_of<scalar_t>(r.output, steps.offset[prev] + begin, P)
                                     : row_of<scalar_t>(h_init, begin, P);
          step.keep = zoneout->template from_row<scalar_t>(row0 + begin);
        }
        Backend::step_forward(step);
      }
      if (s.projected) {
        Tensor out_t = r.output.narrow(0, row0, rows);
        Backend::kMath.mm_out(out_t, ws.raw_h.narrow(0, row0, rows), w_hr->t(), /*accumulate=*/false);
      }
      // Sequences that end at this step leave their final state.
      const int64_t on = steps.going_on(p, reverse);
      if (rows > on) {
        r.h_n.narrow(0, on, rows - on).copy_(r.output.narrow(0, row0 + on, rows - on));
        r.c_n.narrow(0, on, rows - on).copy_(ws.cells.narrow(0, row0 + on, rows - on));
      }
      prev = t;
    }
  });
  return r;
}

// The data part of backward (the time loop and the input gradient) from
// the forward's output and workspace; grad_output [N, P] may be strided.
template <class Backend>
LayerDataGrads step_loop_backward_data(const LayerSteps& steps, const LayerGeometry& s,
                                       const std::optional<at::Tensor>& grad_output,
                                       const std::optional<at::Tensor>& grad_h_n,
                                       const std::optional<at::Tensor>& grad_c_n,
                                       const at::Tensor& x, const at::Tensor& h0,
                                       const at::Tensor& c0, const at::Tensor& w_ih,
                                       const at::Tensor& w_hh,
                                       const std::optional<at::Tensor>& w_hr,
                                       const at::Tensor& workspace, bool reverse,
                                       const Zoneout* zoneout = nullptr) {
  using at::Tensor;
  const int64_t T = steps.steps(), N = steps.rows, B = steps.max_batch, H = s.hidden, P = s.out;
  const auto opts = x.options();
  const Workspace ws(workspace.contiguous(), N, s);
  const Tensor c_init = c0.contiguous();
  // Strided (for example expanded) gradients are read in place, not copied.
  // Without a projection the pointwise step adds grad_output's rows itself
  // (one kernel fewer a step): rows with adjacent columns, any row stride (0
  // for an expanded gradient, as of a sum). Columns that are not adjacent
  // become one shared row if every row is the same, else a dense copy.
  const Tensor grad_out = grad_output.has_value() ? *grad_output : Tensor();
  Tensor grad_out_rows;
  if (grad_out.defined() && !s.projected && N > 0) {
    grad_out_rows = grad_out;
    if (grad_out.size(1) > 1 && grad_out.stride(1) != 1) {
      grad_out_rows = grad_out.stride(0) == 0 ? grad_out.narrow(0, 0, 1).contiguous().expand_as(grad_out)
                                              : grad_out.contiguous();
    }
  }

  Tensor grad_gates = at::empty({N, 4 * H}, opts);
  // Per-sequence gradient state. Row i holds the gradient of the h (and c)
  // that row i's next processed step started from: grad_h_n/grad_c_n for
  // sequences not yet reached, and grad_h0/grad_c0 once all steps are done.
  Tensor grad_h_state = grad_h_n.has_value() ? grad_h_n->contiguous().clone() : at::zeros({B, P}, opts);
  Tensor grad_c_state = grad_c_n.has_value() ? grad_c_n->contiguous().clone() : at::zeros({B, H}, opts);
  // Total gradient of each step's h: kept for all rows when projecting
  // (w_hr's gradient is one GEMM over them), else one buffer reused.
  Tensor grad_h_all = s.projected ? at::empty({N, P}, opts) : Tensor();
  Tensor grad_raw_h = s.projected ? at::empty({B, H}, opts) : Tensor();

  Backend::dispatch_types(x.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    if (steps.dense && !s.projected && N > 0 && zoneout == nullptr &&
        Backend::sequence_backward(SequenceBackward<scalar_t>{steps, s, grad_output, grad_h_n,
                                                              grad_c_n, c_init, w_hh, reverse, ws,
                                                              grad_gates, grad_h_state,
                                                              grad_c_state})) {
      return;
    }
    for (int64_t p = T - 1; p >= 0 && N > 0; --p) {
      const int64_t t = LayerSteps::step_at(p, T, reverse);
      const int64_t rows = steps.batch[t], row0 = steps.offset[t];
      const int64_t cont = steps.continuing(p, reverse);
      const int64_t prev = p > 0 ? LayerSteps::step_at(p - 1, T, reverse) : -1;
      Tensor grad_h_rec = grad_h_state.narrow(0, 0, rows);
      // The gradient of the raw h the cell gave: without a projection the
      // recurrent one, to which the pointwise step adds grad_output's row;
      // with one, the total through w_hr (kept for w_hr's gradient).
      Tensor grad_raw = grad_h_rec;
      if (s.projected) {
        Tensor grad_h = grad_h_all.narrow(0, row0, rows);
        if (grad_out.defined()) {
          at::add_out(grad_h, grad_out.narrow(0, row0, rows), grad_h_rec);
        } else {
          grad_h.copy_(grad_h_rec);
        }
        grad_raw = grad_raw_h.narrow(0, 0, rows);
        Backend::kMath.mm_out(grad_raw, grad_h, *w_hr, /*accumulate=*/false);
      }
      for (const auto& [begin, end] : {std::pair{int64_t{0}, cont}, std::pair{cont, rows}}) {
        if (end <= begin) continue;
        kernels::PointwiseBackwardArgs<scalar_t> step;
        step.batch = end - begin;
        step.hidden = H;
        step.grad_h = row_of<scalar_t>(grad_raw, begin, H);
        if (grad_out_rows.defined()) {
          step.grad_out = grad_out_rows.const_data_ptr<scalar_t>() +
                          (row0 + begin) * grad_out_rows.stride(0);
          step.grad_out_stride = grad_out_rows.stride(0);
        }
        step.grad_c = row_of<scalar_t>(grad_c_state, begin, H);
        step.act_gates = row_of<scalar_t>(ws.gates, row0 + begin, 4 * H);
        step.c_prev = begin < cont ? row_of<scalar_t>(ws.cells, steps.offset[prev] + begin, H)
                                   : row_of<scalar_t>(c_init, begin, H);
        step.c = row_of<scalar_t>(ws.cells, row0 + begin, H);
        step.grad_gates = mutable_row_of<scalar_t>(grad_gates, row0 + begin, 4 * H);
        step.grad_c_prev = mutable_row_of<scalar_t>(grad_c_state, begin, H);
        if (zoneout) {
          // The part of h's gradient that goes straight to the previous h,
          // in place: the recurrent GEMM below adds onto it.
          step.grad_h_prev = mutable_row_of<scalar_t>(grad_raw, begin, H);
          step.keep = zoneout->template from_row<scalar_t>(row0 + begin);
        }
        Backend::step_backward(step);
      }
      Backend::kMath.mm_out(grad_h_rec, grad_gates.narrow(0, row0, rows), w_hh,
                            /*accumulate=*/zoneout != nullptr);
    }
  });

  LayerDataGrads r;
  r.grad_input = Backend::kMath.mm(grad_gates, w_ih);
  r.grad_h0 = grad_h_state;
  r.grad_c0 = grad_c_state;
  r.grad_gates = grad_gates;
  if (s.projected) {
    r.grad_h = grad_h_all;
    r.raw_h = ws.raw_h;
  }
  return r;
}


}  // namespace pipelstm
