// The time loops of one LSTM layer direction on the CPU in float32, on the
// fused step kernels (kernels/include/pipelstm/kernels/cpu_recurrent.h):
// the recurrent weights packed once per call, then per step one kernel
// call per thread with no tensor, allocation or dispatcher call inside the
// loop. lstm_layer_cpu.cpp calls these for float32 input; float64 takes
// the shared step loop (layer_step_loop.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "../layer_geometry.h"
#include "../layer_steps.h"
#include "../zoneout_keeps.h"

namespace pipelstm {
namespace cpu {

using at::Tensor;

// Picks the fused loops' kernels for this process (once): raises if
// PIPELSTM_CPU_ISA names no known ISA. They serve every float32 call.
void check_fused_loops_isa();

// The name of the kernels' ISA on this CPU ("avx512", "avx2", "generic").
const char* fused_loops_isa();

// Whether the forward of a layer of this geometry over these steps computes
// the input projection inside the steps (x and w_ih to fused_forward_loop)
// rather than as one GEMM over all steps beforehand: where the weights are
// small enough to be read at every step and the steps have rows enough
// (fused_loops_cpu.cpp). PIPELSTM_INPUT_IN_STEPS=0 never does, =1 always
// (for measuring).
// With a path chosen by timing (cpu_path.h), as that path says.
bool input_projection_in_steps(const LayerGeometry& geometry, const LayerSteps& steps);

// Whether the input projection may run inside the steps at all: rows
// enough per step and weights small enough to read at every step (a
// candidate path for timing where it may).
bool input_in_steps_fit(const LayerGeometry& geometry, const LayerSteps& steps);

// Forward of all steps. In: with x [N, I] and w_ih [4H, I] defined (where
// input_projection_in_steps), each step computes its rows' input
// pre-activations itself; otherwise gates [N, 4H] holds them. bias
// (optional [4H], both biases summed) is added to them. Out: gates the
// activated gates, cells [N, H], raw_h [N, H] (with w_hr only: h before
// the projection), output [N, P], h_n [B, P] and c_n [B, H]. h0/c0
// contiguous [B, P]/[B, H]. With `zoneout`, each step's c and h are blended
// with the previous ones by its keep weights (no projection).
void fused_forward_loop(const LayerSteps& steps, const LayerGeometry& geometry, bool reverse,
                        const Tensor& x, const Tensor& w_ih, const Tensor& h0, const Tensor& c0,
                        const Tensor& w_hh, const std::optional<Tensor>& w_hr,
                        const Tensor& bias, Tensor& gates,
                        Tensor& cells, Tensor& raw_h, Tensor& output, Tensor& h_n, Tensor& c_n,
                        const Zoneout* zoneout = nullptr);

struct FusedBackward {
  Tensor grad_gates;  // [N, 4H]
  Tensor grad_h0, grad_c0;
  Tensor grad_h;  // with w_hr: [N, P], the total gradient of each step's h
};

// What the backward reads: the gradients given (grad_output [N, P] with
// any row stride; each optional), c0 contiguous [B, H], the recurrent
// weights, and what the forward kept: act (the activated gates) and cells.
struct FusedBackwardInputs {
  const std::optional<Tensor>& grad_output;
  const std::optional<Tensor>& grad_h_n;
  const std::optional<Tensor>& grad_c_n;
  const Tensor& c0;
  const Tensor& w_hh;
  const std::optional<Tensor>& w_hr;
  const Tensor& act;
  const Tensor& cells;
  const Zoneout* zoneout = nullptr;  // the forward's keep weights, if it had them
};

// Backward of all steps.
FusedBackward fused_backward_loop(const LayerSteps& steps, const LayerGeometry& geometry,
                                  bool reverse, const FusedBackwardInputs& in);

}  // namespace cpu
}  // namespace pipelstm
