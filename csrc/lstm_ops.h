// The layer ops as C++ calls, for C++ callers (the pipeline's LSTM units).
// The forward and the backward's data part go through the dispatcher, which
// picks the backend of the tensors' device (cpu/lstm_layer_cpu.cpp,
// cuda/lstm_layer_cuda.cpp); the weight part is device-generic GEMMs
// (layer_weight_grads.cpp). The op schemas
// are declared once in registration.cpp, their autograd formulas in
// lstm_autograd.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/DeviceGuard.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Optional.h>

#include <tuple>

#include "layer_math.h"

namespace pipelstm {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

// Held by every op while it runs: it makes `t`'s device current, and its
// inner ATen calls are implementation details: they record no autograd graph
// (the ops have their own formulas, lstm_autograd.cpp), and they run at
// the op's own dtype (under autocast a nested at::mm would otherwise drop to
// bfloat16 behind its back).
struct OpGuard {
  explicit OpGuard(const Tensor& t) : device(at::device_of(t)) {}
  c10::OptionalDeviceGuard device;
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  c10::impl::ExcludeDispatchKeyGuard no_autocast{c10::autocast_dispatch_keyset};
};

// One direction of one layer over input [T, B, I] from (h0 [B, P], c0 [B, H]),
// with P = H, or the projection size when w_hr [P, H] is given.
// -> (output [T, B, P], h_n [B, P], c_n [B, H], workspace) where workspace
// is 1-D: activated gates [T, B, 4H], then cell states [T, B, H], then (with
// a projection) the unprojected hidden states [T, B, H]. The op
// pipelstm::lstm_layer_forward.
std::tuple<Tensor, Tensor, Tensor, Tensor> lstm_layer_forward(
    const Tensor& input, const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
    const Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh, const OptTensor& w_hr,
    bool reverse);

// The same over a packed sequence: input [N, I] by rows, step t holding the
// first batch_sizes[t] sequences (1-D int64 on the CPU), h0/c0 of the
// batch_sizes[0] sequences; output [N, P]. The op
// pipelstm::lstm_packed_layer_forward.
std::tuple<Tensor, Tensor, Tensor, Tensor> lstm_packed_layer_forward(
    const Tensor& input, const Tensor& batch_sizes, const Tensor& h0, const Tensor& c0,
    const Tensor& w_ih, const Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh,
    const OptTensor& w_hr, bool reverse);

// pipelstm::lstm_layer_backward in two parts (forward direction, dense), for a
// scheduler that computes the weight gradients later, e.g. once over the
// pieces of several calls (the "B" and "W" of zero-bubble pipeline
// schedules). The data part -> input and state gradients, and what the
// weight part needs: grad_gates [T*B, 4H] and, with a projection, the
// gradient of each step's output grad_h [T*B, P] and the unprojected
// states raw_h [T*B, H]. The data part is the internal op
// pipelstm::lstm_layer_backward_data.
struct LayerDataGrads {
  Tensor grad_input, grad_h0, grad_c0, grad_gates, grad_h, raw_h;
};
LayerDataGrads lstm_layer_backward_data(const OptTensor& grad_output, const OptTensor& grad_h_n,
                                        const OptTensor& grad_c_n, const Tensor& input,
                                        const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
                                        const Tensor& w_hh, const OptTensor& w_hr,
                                        const Tensor& output, const Tensor& workspace);
// The same over a packed sequence (forward direction): input [N, I] and
// output [N, P] by rows, batch_sizes as lstm_packed_layer_forward's. The
// internal op pipelstm::lstm_packed_layer_backward_data.
LayerDataGrads lstm_packed_layer_backward_data(
    const OptTensor& grad_output, const OptTensor& grad_h_n, const OptTensor& grad_c_n,
    const Tensor& input, const Tensor& batch_sizes, const Tensor& h0, const Tensor& c0,
    const Tensor& w_ih, const Tensor& w_hh, const OptTensor& w_hr, const Tensor& output,
    const Tensor& workspace);

// The weight part over T steps: `grads` of those steps (rows time-major),
// input [T, B, I], h0 the state before the first step, output [T, B, P].
// Bitwise what lstm_layer_backward returns for the same steps.
struct LayerWeightGrads {
  Tensor w_ih, w_hh, bias, w_hr;  // w_hr empty without projection
};
// Added into `acc` where acc.w_ih is defined (the GEMMs accumulate in
// place: the weight gradients of several calls' steps without first copying
// their pieces into one sequence), else into new tensors; the GEMMs and
// buffers are `math`'s (layer_math.h: backend.h's front doors for a
// device-generic caller).
void lstm_layer_add_weight_grads(const LayerDataGrads& grads, const Tensor& input, const Tensor& h0,
                                 const Tensor& output, LayerWeightGrads& acc, const LayerMath& math);

// One direction of one layer under zoneout, forward direction: the ops
// pipelstm::lstm_zoneout_layer_forward / _backward, keep_c and keep_h the
// keep weights of each output element ([rows, H] where input has `rows`
// rows). Dense input [T, B, I] with batch_sizes nullopt, or packed rows
// [N, I] with them; no projection. The backward -> grad_input, grad_h0,
// grad_c0, grad_w_ih, grad_w_hh, grad_bias.
std::tuple<Tensor, Tensor, Tensor, Tensor> lstm_zoneout_layer_forward(
    const Tensor& input, const OptTensor& batch_sizes, const Tensor& h0, const Tensor& c0,
    const Tensor& w_ih, const Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh,
    const Tensor& keep_c, const Tensor& keep_h);
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> lstm_zoneout_layer_backward(
    const OptTensor& grad_output, const OptTensor& grad_h_n, const OptTensor& grad_c_n,
    const Tensor& input, const OptTensor& batch_sizes, const Tensor& h0, const Tensor& c0,
    const Tensor& w_ih, const Tensor& w_hh, const Tensor& keep_c, const Tensor& keep_h,
    const Tensor& output, const Tensor& workspace);

// One direction of one LayerNorm LSTM layer, forward direction: the ops
// pipelstm::lstm_layernorm_layer_forward / _backward (registration.cpp
// gives their arguments; `bias` is the sum of the two gate biases). Dense
// input [T, B, I] with batch_sizes nullopt, or packed rows [N, I] with
// them; zoneout's keep weights as above, or nullopt for none.
struct LayerNormWeights {
  Tensor w_ih, w_hh;
  OptTensor bias;
  Tensor gamma_ih, gamma_hh, gamma_c;
  OptTensor beta_c;
};
std::tuple<Tensor, Tensor, Tensor, Tensor> lstm_layernorm_layer_forward(
    const Tensor& input, const OptTensor& batch_sizes, const Tensor& h0, const Tensor& c0,
    const LayerNormWeights& w, double eps, const OptTensor& keep_c = std::nullopt,
    const OptTensor& keep_h = std::nullopt);
// -> grad_input, grad_h0, grad_c0, then the weights' in LayerNormWeights'
// order (grad_bias and grad_beta_c always given).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>
lstm_layernorm_layer_backward(const OptTensor& grad_output, const OptTensor& grad_h_n,
                              const OptTensor& grad_c_n, const Tensor& input,
                              const OptTensor& batch_sizes, const Tensor& h0, const Tensor& c0,
                              const LayerNormWeights& w, const Tensor& output, const Tensor& workspace,
                              const OptTensor& keep_c = std::nullopt,
                              const OptTensor& keep_h = std::nullopt);

}  // namespace pipelstm
