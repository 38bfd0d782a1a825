// The CPU backend of the LSTM ops: their kernels under the CPU dispatch key.
//
// float32: the time loops are fused_loops_cpu.cpp's: each step one fused
// kernel (GEMM and cell together) on weights packed once per call, for
// small layers with the step's input projection in it too.
// float64: the step loop (layer_step_loop.h) on this backend's pointwise
// step (pointwise_cpu.h) and the layer GEMMs.
// The cell ops run the pointwise step once (cell_ops.h).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <optional>

#include "../layer_ops.h"
#include "../layer_step_loop.h"
#include "fused_loops_cpu.h"
#include "gemm_cpu.h"
#include "huge_pages.h"
#include "pointwise_cpu.h"

namespace pipelstm {
namespace {

struct CpuLayer {
  static constexpr auto step_forward = [](const auto& a) { cpu::pointwise_forward(a); };
  static constexpr auto step_backward = [](const auto& a) { cpu::pointwise_backward(a); };
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
    return x.scalar_type() == at::kFloat && cpu::fused_loops_serve(x);
  }

  static ForwardResult forward(const LayerSteps& steps, const LayerGeometry& s, const Tensor& x,
                               const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
                               const Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh,
                               const OptTensor& w_hr, bool reverse) {
    if (!fused(x)) {
      return step_loop_forward<CpuLayer>(steps, s, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr,
                                         reverse);
    }
    ForwardResult r = new_forward_result(steps, s, x.options());
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
                            ws.cells, ws.raw_h, r.output, r.h_n, r.c_n);
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
    const Workspace ws(workspace.contiguous(), steps.rows, s);
    cpu::FusedBackward f =
        cpu::fused_backward_loop(steps, s, reverse, grad_output, grad_h_n, grad_c_n,
                                 h0.contiguous(), c0.contiguous(), w_hh, w_hr, ws.gates, ws.cells);
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

  template <typename... Args>
  static BackwardResult backward(const Args&... args) {
    return backward_in_two_parts<CpuLayer>(args...);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(pipelstm, CPU, m) {
  register_lstm_ops<CpuLayer>(m);
}

}  // namespace pipelstm
