// The CPU backend of the LSTM ops: their kernels under the CPU dispatch key.
//
// float32: the time loops are fused_loops_cpu.cpp's: each step one fused
// kernel (GEMM and cell together) on weights packed once per call, for
// small layers with the step's input projection in it too.
// float64: the step loop (layer_step_loop.h) on this backend's pointwise
// step (the kernels' rows, split over threads below) and the layer GEMMs.
// The cell ops run the pointwise step once (cell_ops.h).
// bfloat16 and float16: the float32 kernels on float32 copies, the results
// rounded to the call's dtype (float32_upcast.h); what the backward needs is
// kept in float32 (see "bfloat16 and float16" below).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>
#include <utility>

#include "../float32_upcast.h"
#include "../layer_ops.h"
#include "../layer_step_loop.h"
#include "pipelstm/kernels/lstm_pointwise.h"
#include "cpu_path.h"
#include "fused_loops_cpu.h"
#include "gemm_cpu.h"
#include "huge_pages.h"
#include "layer_math_cpu.h"
#include "row_split.h"

namespace pipelstm {
namespace {

// rows(b0, b1) over a pointwise step's batch rows on ATen's intra-op
// threads, enough elements per task to amortise the fork.
template <class Rows>
void over_batch_rows(int64_t batch, int64_t hidden, const Rows& rows) {
  constexpr int64_t kElementsPerTask = 16384;
  at::parallel_for(0, batch, std::max<int64_t>(1, kElementsPerTask / std::max<int64_t>(1, 4 * hidden)), rows);
}

struct CpuLayer {
  static constexpr const LayerMath& kMath = cpu::kLayerMath;
  static constexpr auto step_forward = [](const auto& a) {
    over_batch_rows(a.batch, a.hidden, [&](int64_t b0, int64_t b1) { kernels::pointwise_forward_cpu(a, b0, b1); });
  };
  static constexpr auto step_backward = [](const auto& a) {
    over_batch_rows(a.batch, a.hidden, [&](int64_t b0, int64_t b1) { kernels::pointwise_backward_cpu(a, b0, b1); });
  };
  // No whole-sequence kernel: float32 has the fused loops instead.
  template <typename T>
  static bool sequence_forward(const SequenceForward<T>&) {
    return false;
  }
  template <typename T>
  static bool sequence_backward(const SequenceBackward<T>&) {
    return false;
  }
  template <class F>
  static void dispatch_types(at::ScalarType dtype, F&& f) {
    AT_DISPATCH_FLOATING_TYPES(dtype, "pipelstm_cpu_step", [&] { f(scalar_t{}); });
  }

  // Whether the fused loops run this call (float32); raises where
  // PIPELSTM_CPU_ISA names no known ISA.
  static bool fused(const Tensor& x) {
    if (x.scalar_type() != at::kFloat) return false;
    cpu::check_fused_loops_isa();
    return true;
  }

  // The facts a call's path is chosen by (cpu_path.h).
  // in_steps: a forward whose input projection may run inside its steps.
  static cpu::CallShape shape(const char* pass, const LayerSteps& steps, const LayerGeometry& s,
                              bool in_steps = false) {
    const bool backward = std::strcmp(pass, "forward") != 0;
    return {pass, steps.steps(), steps.max_batch, steps.rows, s.input, s.hidden, s.out,
            at::in_parallel_region() ? 1 : at::get_num_threads(), in_steps,
            cpu::row_split_alternative(s, steps, backward)};
  }

  static ForwardResult forward(const LayerSteps& steps, const LayerGeometry& s, const Tensor& x,
                               const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
                               const Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh,
                               const OptTensor& w_hr, bool reverse) {
    if (!fused(x)) {
      return step_loop_forward<CpuLayer>(steps, s, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr,
                                         reverse);
    }
    return cpu::on_chosen_path(shape("forward", steps, s, cpu::input_in_steps_fit(s, steps)), [&] {
      return fused_forward(steps, s, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse);
    });
  }

  static ForwardResult fused_forward(const LayerSteps& steps, const LayerGeometry& s, const Tensor& x,
                                     const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
                                     const Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh,
                                     const OptTensor& w_hr, bool reverse,
                                     const Zoneout* zoneout = nullptr) {
    ForwardResult r = new_forward_result(steps, s, x.options(), kMath);
    if (steps.rows == 0) return r;
    Workspace ws(r.workspace, steps.rows, s);
    // Where the weights are small and the steps have rows enough, each fused
    // step projects its own input. Otherwise the input's pre-activations go
    // straight into the workspace, where the fused steps add the bias and
    // turn them into the activated gates (no pass of addmm copying the bias
    // over the whole buffer first).
    const bool in_steps = cpu::input_projection_in_steps(s, steps);
    if (!in_steps) cpu::layer_mm_out(ws.gates, x, w_ih.t());
    cpu::fused_forward_loop(steps, s, reverse, in_steps ? x : Tensor(), w_ih, h0.contiguous(),
                            c0.contiguous(), w_hh, w_hr, summed_bias(b_ih, b_hh), ws.gates,
                            ws.cells, ws.raw_h, r.output, r.h_n, r.c_n, zoneout);
    return r;
  }

  static LayerDataGrads backward_data(const LayerSteps& steps, const LayerGeometry& s,
                                      const OptTensor& grad_output, const OptTensor& grad_h_n,
                                      const OptTensor& grad_c_n, const Tensor& x,
                                      const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
                                      const Tensor& w_hh, const OptTensor& w_hr,
                                      const Tensor& workspace, bool reverse) {
    if (!fused(x)) {
      return step_loop_backward_data<CpuLayer>(steps, s, grad_output, grad_h_n, grad_c_n, x, h0,
                                               c0, w_ih, w_hh, w_hr, workspace, reverse);
    }
    return cpu::on_chosen_path(shape("backward_data", steps, s), [&] {
      return fused_backward_data(steps, s, grad_output, grad_h_n, grad_c_n, x, c0, w_ih, w_hh, w_hr,
                                 workspace, reverse);
    });
  }

  static LayerDataGrads fused_backward_data(const LayerSteps& steps, const LayerGeometry& s,
                                            const OptTensor& grad_output, const OptTensor& grad_h_n,
                                            const OptTensor& grad_c_n, const Tensor& x, const Tensor& c0,
                                            const Tensor& w_ih, const Tensor& w_hh, const OptTensor& w_hr,
                                            const Tensor& workspace, bool reverse,
                                            const Zoneout* zoneout = nullptr) {
    const Workspace ws(workspace.contiguous(), steps.rows, s);
    const Tensor c_init = c0.contiguous();
    cpu::FusedBackward f = cpu::fused_backward_loop(
        steps, s, reverse,
        {.grad_output = grad_output, .grad_h_n = grad_h_n, .grad_c_n = grad_c_n, .c0 = c_init,
         .w_hh = w_hh, .w_hr = w_hr, .act = ws.gates, .cells = ws.cells, .zoneout = zoneout});
    LayerDataGrads r;
    r.grad_input = cpu::empty_huge({steps.rows, s.input}, x.options());
    cpu::layer_mm_out(r.grad_input, f.grad_gates, w_ih);
    r.grad_h0 = f.grad_h0;
    r.grad_c0 = f.grad_c0;
    r.grad_gates = f.grad_gates;
    if (s.projected) {
      r.grad_h = f.grad_h;
      r.raw_h = ws.raw_h;
    }
    return r;
  }

  // Zoneout (zoneout_layer_ops.h): float32 on the fused loops, float64 on
  // the step loop, the keep weights applied inside the steps.
  static ForwardResult zoneout_forward(const LayerSteps& steps, const LayerGeometry& s,
                                       const Tensor& x, const Tensor& h0, const Tensor& c0,
                                       const Tensor& w_ih, const Tensor& w_hh, const OptTensor& b_ih,
                                       const OptTensor& b_hh, bool reverse, const Zoneout& z) {
    if (!fused(x)) {
      return step_loop_forward<CpuLayer>(steps, s, x, h0, c0, w_ih, w_hh, b_ih, b_hh, std::nullopt,
                                         reverse, &z);
    }
    return fused_forward(steps, s, x, h0, c0, w_ih, w_hh, b_ih, b_hh, std::nullopt, reverse, &z);
  }

  static LayerDataGrads zoneout_backward_data(const LayerSteps& steps, const LayerGeometry& s,
                                              const OptTensor& grad_output, const OptTensor& grad_h_n,
                                              const OptTensor& grad_c_n, const Tensor& x,
                                              const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
                                              const Tensor& w_hh, const Tensor& workspace,
                                              bool reverse, const Zoneout& z) {
    if (!fused(x)) {
      return step_loop_backward_data<CpuLayer>(steps, s, grad_output, grad_h_n, grad_c_n, x, h0, c0,
                                               w_ih, w_hh, std::nullopt, workspace, reverse, &z);
    }
    return fused_backward_data(steps, s, grad_output, grad_h_n, grad_c_n, x, c0, w_ih, w_hh,
                               std::nullopt, workspace, reverse, &z);
  }

  // The whole backward (data and weights) on one path where it is fused.
  template <typename... Args>
  static BackwardResult backward(const LayerSteps& steps, const LayerGeometry& s, const Args&... args) {
    const auto both = [&] { return backward_in_two_parts<CpuLayer>(steps, s, args...); };
    const Tensor& x = std::get<3>(std::forward_as_tuple(args...));
    if (x.scalar_type() != at::kFloat) return both();
    return cpu::on_chosen_path(shape("backward", steps, s), both);
  }
};

// --- bfloat16 and float16 ----------------------------------------------------
// Each op's kernel for a call in bfloat16 or float16: the float32 kernel on
// float32 copies, its results rounded to the call's dtype, the same numbers
// as a float32 call on those copies. The forward's workspace stays float32
// and also keeps the float32 state the backward would otherwise read
// rounded from the op's results: a layer's output (each step's h, for the
// recurrent weight's gradient), appended to the workspace as
// [rows * P]; a cell's cy, appended to its workspace as columns [B, H].
// The backward ops take that workspace and compute in float32 too. The
// layer's return every gradient rounded to the call's dtype; the cell's
// return them in float32, since the bias gradient is summed from them
// outside the op (python/pipelstm/ops.py), before they are rounded.

using LayerForward = std::tuple<Tensor, Tensor, Tensor, Tensor>;

// A float32 layer forward's results for a call in `dtype`.
LayerForward layer_forward_results(at::ScalarType dtype, const LayerForward& r) {
  const auto& [output, h_n, c_n, workspace] = r;
  return {output.to(dtype), h_n.to(dtype), c_n.to(dtype), at::cat({workspace, output.reshape(-1)})};
}

// A layer forward's workspace (float32 part, float32 output of `output`'s shape).
std::pair<Tensor, Tensor> split_layer_workspace(const char* op, const Tensor& workspace,
                                                const Tensor& output) {
  TORCH_CHECK(workspace.dim() == 1 && workspace.scalar_type() == at::kFloat &&
                  workspace.numel() >= output.numel(),
              "pipelstm::", op, ": expected `workspace` to be the 1-D float32 workspace of a ",
              output.scalar_type(), " forward on the CPU, got a ", workspace.dim(), "-D ",
              workspace.scalar_type(), " tensor of shape ", workspace.sizes());
  const int64_t n = workspace.numel() - output.numel();
  return {workspace.narrow(0, 0, n), workspace.narrow(0, n, output.numel()).view(output.sizes())};
}

// The forward ops; `kernel(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr)` is the
// dense or packed layer_ops.h kernel with the op's other arguments bound.
template <class Kernel>
LayerForward layer_forward_in_float32(const char* op, const Tensor& input, const Tensor& h0,
                                      const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
                                      const OptTensor& b_ih, const OptTensor& b_hh,
                                      const OptTensor& w_hr, const Kernel& kernel) {
  if (!computed_in_float32(input)) return kernel(input, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr);
  return layer_forward_results(input.scalar_type(), layer_in_float32(op, input, h0, c0, w_ih, w_hh,
                                                                     b_ih, b_hh, w_hr, kernel));
}

LayerForward layer_forward_cpu(const Tensor& input, const Tensor& h0, const Tensor& c0,
                               const Tensor& w_ih, const Tensor& w_hh, const OptTensor& b_ih,
                               const OptTensor& b_hh, const OptTensor& w_hr, bool reverse) {
  return layer_forward_in_float32(
      "lstm_layer_forward", input, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr,
      [&](const auto&... a) { return layer_forward<CpuLayer>(a..., reverse); });
}

LayerForward packed_layer_forward_cpu(const Tensor& input, const Tensor& batch_sizes,
                                      const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
                                      const Tensor& w_hh, const OptTensor& b_ih,
                                      const OptTensor& b_hh, const OptTensor& w_hr, bool reverse) {
  return layer_forward_in_float32(
      "lstm_packed_layer_forward", input, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr,
      [&](const Tensor& x, const auto&... a) {
        return packed_layer_forward<CpuLayer>(x, batch_sizes, a..., reverse);
      });
}

// The backward ops (whole, or their data part); `kernel(grad_output,
// grad_h_n, grad_c_n, x, h0, c0, w_ih, w_hh, w_hr, output, workspace)` as
// above. A reduced-precision call returns every gradient in its dtype.
template <class Kernel>
auto layer_backward_in_float32(const char* op, const OptTensor& grad_output,
                               const OptTensor& grad_h_n, const OptTensor& grad_c_n,
                               const Tensor& input, const Tensor& h0, const Tensor& c0,
                               const Tensor& w_ih, const Tensor& w_hh, const OptTensor& w_hr,
                               const Tensor& output, const Tensor& workspace,
                               const Kernel& kernel) {
  if (!computed_in_float32(input)) {
    return kernel(grad_output, grad_h_n, grad_c_n, input, h0, c0, w_ih, w_hh, w_hr, output,
                  workspace);
  }
  check_same_kind_as(op, "input", input,
                     {{"w_hr", given(w_hr)}, {"w_ih", &w_ih}, {"w_hh", &w_hh}, {"h0", &h0},
                      {"c0", &c0}, {"output", &output}, {"grad_output", given(grad_output)},
                      {"grad_h_n", given(grad_h_n)}, {"grad_c_n", given(grad_c_n)}});
  const auto [float32_workspace, float32_output] = split_layer_workspace(op, workspace, output);
  return rounded(input.scalar_type(),
                 kernel(to_float32(grad_output), to_float32(grad_h_n), to_float32(grad_c_n),
                        to_float32(input), to_float32(h0), to_float32(c0), to_float32(w_ih),
                        to_float32(w_hh), to_float32(w_hr), float32_output, float32_workspace));
}

auto layer_backward_cpu(const OptTensor& grad_output, const OptTensor& grad_h_n,
                        const OptTensor& grad_c_n, const Tensor& input, const Tensor& h0,
                        const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
                        const OptTensor& w_hr, const Tensor& output, const Tensor& workspace,
                        bool reverse) {
  return layer_backward_in_float32(
      "lstm_layer_backward", grad_output, grad_h_n, grad_c_n, input, h0, c0, w_ih, w_hh, w_hr,
      output, workspace, [&](const auto&... a) { return layer_backward<CpuLayer>(a..., reverse); });
}

auto layer_backward_data_cpu(const OptTensor& grad_output, const OptTensor& grad_h_n,
                             const OptTensor& grad_c_n, const Tensor& input, const Tensor& h0,
                             const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
                             const OptTensor& w_hr, const Tensor& output,
                             const Tensor& workspace) {
  return layer_backward_in_float32(
      "lstm_layer_backward_data", grad_output, grad_h_n, grad_c_n, input, h0, c0, w_ih, w_hh, w_hr,
      output, workspace, [](const auto&... a) { return layer_backward_data<CpuLayer>(a...); });
}

// A packed op's `kernel` as the dense one's: batch_sizes after the input.
template <class Kernel>
auto with_batch_sizes(const Tensor& batch_sizes, const Kernel& kernel) {
  return [&](const OptTensor& grad_output, const OptTensor& grad_h_n, const OptTensor& grad_c_n,
             const Tensor& x, const auto&... rest) {
    return kernel(grad_output, grad_h_n, grad_c_n, x, batch_sizes, rest...);
  };
}

auto packed_layer_backward_cpu(const OptTensor& grad_output, const OptTensor& grad_h_n,
                               const OptTensor& grad_c_n, const Tensor& input,
                               const Tensor& batch_sizes, const Tensor& h0, const Tensor& c0,
                               const Tensor& w_ih, const Tensor& w_hh, const OptTensor& w_hr,
                               const Tensor& output, const Tensor& workspace, bool reverse) {
  return layer_backward_in_float32(
      "lstm_packed_layer_backward", grad_output, grad_h_n, grad_c_n, input, h0, c0, w_ih, w_hh,
      w_hr, output, workspace, with_batch_sizes(batch_sizes, [&](const auto&... a) {
        return packed_layer_backward<CpuLayer>(a..., reverse);
      }));
}

auto packed_layer_backward_data_cpu(const OptTensor& grad_output, const OptTensor& grad_h_n,
                                    const OptTensor& grad_c_n, const Tensor& input,
                                    const Tensor& batch_sizes, const Tensor& h0, const Tensor& c0,
                                    const Tensor& w_ih, const Tensor& w_hh, const OptTensor& w_hr,
                                    const Tensor& output, const Tensor& workspace) {
  return layer_backward_in_float32(
      "lstm_packed_layer_backward_data", grad_output, grad_h_n, grad_c_n, input, h0, c0, w_ih,
      w_hh, w_hr, output, workspace, with_batch_sizes(batch_sizes, [&](const auto&... a) {
        return packed_layer_backward_data<CpuLayer>(a...);
      }));
}

// The cell ops: cx is the reference tensor; the backward's gradients stay
// float32 (see above).
std::tuple<Tensor, Tensor, Tensor> cell_forward_cpu(const Tensor& input_gates,
                                                    const Tensor& hidden_gates, const Tensor& cx,
                                                    const OptTensor& b_ih, const OptTensor& b_hh) {
  if (!computed_in_float32(cx)) {
    return cell_forward<CpuLayer>(input_gates, hidden_gates, cx, b_ih, b_hh);
  }
  const auto [hy, cy, workspace] =
      cell_in_float32("lstm_cell_forward", input_gates, hidden_gates, cx, b_ih, b_hh,
                      [](const auto&... a) { return cell_forward<CpuLayer>(a...); });
  return {hy.to(cx.scalar_type()), cy.to(cx.scalar_type()), at::cat({workspace, cy}, 1)};
}

std::tuple<Tensor, Tensor> cell_backward_cpu(const OptTensor& grad_hy, const OptTensor& grad_cy,
                                             const Tensor& cx, const Tensor& cy,
                                             const Tensor& workspace) {
  if (!computed_in_float32(cx)) {
    return cell_backward<CpuLayer>(grad_hy, grad_cy, cx, cy, workspace);
  }
  constexpr const char* op = "lstm_cell_backward";
  check_same_kind_as(op, "cx", cx,
                     {{"cy", &cy}, {"grad_hy", given(grad_hy)}, {"grad_cy", given(grad_cy)}});
  check_dim(op, "cx", cx, 2, "[B, H]");
  const int64_t B = cx.size(0), H = cx.size(1);
  check_shape(op, "cy", cy, {B, H});
  TORCH_CHECK(workspace.scalar_type() == at::kFloat, "pipelstm::", op,
              ": expected `workspace` to be the float32 workspace of a ", cx.scalar_type(),
              " forward on the CPU, got ", workspace.scalar_type());
  check_shape(op, "workspace", workspace, {B, 5 * H});
  return cell_backward<CpuLayer>(to_float32(grad_hy), to_float32(grad_cy), to_float32(cx),
                                 workspace.narrow(1, 4 * H, H), workspace.narrow(1, 0, 4 * H));
}

// Zoneout on the CPU: float32 and float64 (the step loop's types).
void check_zoneout_dtype(const char* op, const Tensor& input) {
  TORCH_CHECK(input.scalar_type() == at::kFloat || input.scalar_type() == at::kDouble,
              "pipelstm::", op, ": zoneout on the CPU computes in float32 or float64, got an `input` of ",
              input.scalar_type(), "; convert the module with .float() (or use a CUDA device)");
}

// The signatures are zoneout_layer_ops.h's: every backend's kernel of an op
// must have the same C++ signature.
std::tuple<Tensor, Tensor, Tensor, Tensor> zoneout_layer_forward_cpu(
    const Tensor& input, const OptTensor& batch_sizes, const Tensor& h0, const Tensor& c0,
    const Tensor& w_ih, const Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh,
    const Tensor& keep_c, const Tensor& keep_h, bool reverse) {
  check_zoneout_dtype("lstm_zoneout_layer_forward", input);
  return zoneout_layer_forward<CpuLayer>(input, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, keep_c,
                                         keep_h, reverse);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> zoneout_layer_backward_cpu(
    const OptTensor& grad_output, const OptTensor& grad_h_n, const OptTensor& grad_c_n,
    const Tensor& input, const OptTensor& batch_sizes, const Tensor& h0, const Tensor& c0,
    const Tensor& w_ih, const Tensor& w_hh, const Tensor& keep_c, const Tensor& keep_h,
    const Tensor& output, const Tensor& workspace, bool reverse) {
  check_zoneout_dtype("lstm_zoneout_layer_backward", input);
  return zoneout_layer_backward<CpuLayer>(grad_output, grad_h_n, grad_c_n, input, batch_sizes, h0, c0,
                                          w_ih, w_hh, keep_c, keep_h, output, workspace, reverse);
}

// The layer ops on the CPU: float16 and bfloat16 computed in float32.
struct CpuOps {
  static constexpr auto cell_forward = &cell_forward_cpu;
  static constexpr auto cell_backward = &cell_backward_cpu;
  static constexpr auto layer_forward = &layer_forward_cpu;
  static constexpr auto layer_backward = &layer_backward_cpu;
  static constexpr auto layer_backward_data = &layer_backward_data_cpu;
  static constexpr auto packed_layer_forward = &packed_layer_forward_cpu;
  static constexpr auto packed_layer_backward = &packed_layer_backward_cpu;
  static constexpr auto packed_layer_backward_data = &packed_layer_backward_data_cpu;
  static constexpr auto zoneout_layer_forward = &zoneout_layer_forward_cpu;
  static constexpr auto zoneout_layer_backward = &zoneout_layer_backward_cpu;
};

}  // namespace

TORCH_LIBRARY_IMPL(pipelstm, CPU, m) { register_lstm_ops<CpuOps>(m); }

}  // namespace pipelstm
