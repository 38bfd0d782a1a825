// One direction of one LSTM layer over a whole sequence.
//
// Forward: one GEMM projects the input of every step (biases folded in);
// then per step one recurrent GEMM accumulated in place into that step's
// gates, one fused pointwise call, and (with a projection) one GEMM for
// h = w_hr * h_raw. Backward mirrors it per step, then computes every weight
// gradient with one GEMM over all steps.
#include <ATen/ATen.h>

#include "checks.h"
#include "lstm_ops.h"
#include "pointwise_backend.h"

namespace pipelstm {
namespace {

struct LayerShape {
  int64_t T, B, I, H, P;
  bool projected;

  int64_t workspace_numel() const { return T * B * H * (projected ? 6 : 5); }
};

LayerShape check_layer(const char* op, const Tensor& input, const Tensor& h0, const Tensor& c0,
                       const Tensor& w_ih, const Tensor& w_hh, const OptTensor& w_hr) {
  check_dim(op, "input", input, 3, "[T, B, I]");
  check_dim(op, "w_ih", w_ih, 2, "[4H, I]");
  check_supported_dtype(op, "input", input);
  LayerShape s{};
  s.T = input.size(0);
  s.B = input.size(1);
  s.I = input.size(2);
  TORCH_CHECK(s.T > 0, "pipelstm::", op, ": expected `input` with at least one time step, got ",
              input.sizes());
  TORCH_CHECK(w_ih.size(0) % 4 == 0 && w_ih.size(0) > 0, "pipelstm::", op,
              ": expected `w_ih` of shape [4H, I] with H > 0, got ", w_ih.sizes());
  s.H = w_ih.size(0) / 4;
  s.projected = w_hr.has_value();
  if (s.projected) {
    check_dim(op, "w_hr", *w_hr, 2, "[P, H]");
    s.P = w_hr->size(0);
    check_shape(op, "w_hr", *w_hr, {s.P, s.H});
    check_same_kind(op, "w_hr", *w_hr, "input", input);
  } else {
    s.P = s.H;
  }
  check_shape(op, "w_ih", w_ih, {4 * s.H, s.I});
  check_shape(op, "w_hh", w_hh, {4 * s.H, s.P});
  check_shape(op, "h0", h0, {s.B, s.P});
  check_shape(op, "c0", c0, {s.B, s.H});
  check_same_kind(op, "w_ih", w_ih, "input", input);
  check_same_kind(op, "w_hh", w_hh, "input", input);
  check_same_kind(op, "h0", h0, "input", input);
  check_same_kind(op, "c0", c0, "input", input);
  return s;
}

// Byte offset helpers over a dense buffer of rows.
const void* at_row(const Tensor& t, int64_t elements) {
  return static_cast<const char*>(t.const_data_ptr()) + elements * t.element_size();
}
void* at_row_mut(const Tensor& t, int64_t elements) {
  return static_cast<char*>(t.mutable_data_ptr()) + elements * t.element_size();
}

// The step processed at position `p` of the recurrence.
int64_t step_at(int64_t p, int64_t T, bool reverse) { return reverse ? T - 1 - p : p; }

}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor> lstm_layer_forward(
    const Tensor& input, const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
    const Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh, const OptTensor& w_hr,
    bool reverse) {
  constexpr const char* op = "lstm_layer_forward";
  const LayerShape s = check_layer(op, input, h0, c0, w_ih, w_hh, w_hr);
  for (const auto& [name, bias] : {std::pair{"b_ih", &b_ih}, std::pair{"b_hh", &b_hh}}) {
    if (bias->has_value()) {
      check_shape(op, name, **bias, {4 * s.H});
      check_same_kind(op, name, **bias, "input", input);
    }
  }
  const auto T = s.T, B = s.B, H = s.H, P = s.P;
  const auto opts = input.options();

  Tensor workspace = at::empty({s.workspace_numel()}, opts);
  Tensor gates = workspace.narrow(0, 0, T * B * 4 * H).view({T, B, 4 * H});
  Tensor cells = workspace.narrow(0, T * B * 4 * H, T * B * H).view({T, B, H});
  Tensor raw_h = s.projected ? workspace.narrow(0, T * B * 5 * H, T * B * H).view({T, B, H})
                             : Tensor();
  Tensor output = at::empty({T, B, P}, opts);
  if (B == 0) {
    return {output, at::empty({B, P}, opts), at::empty({B, H}, opts), workspace};
  }

  // Input projection of all steps at once, both biases folded in.
  const Tensor x = input.contiguous().view({T * B, s.I});
  Tensor gates_2d = gates.view({T * B, 4 * H});
  if (b_ih.has_value() || b_hh.has_value()) {
    const Tensor bias = b_ih.has_value() && b_hh.has_value() ? *b_ih + *b_hh
                        : b_ih.has_value()                   ? *b_ih
                                                             : *b_hh;
    at::addmm_out(gates_2d, bias, x, w_ih.t());
  } else {
    at::mm_out(gates_2d, x, w_ih.t());
  }

  const Tensor h_init = h0.contiguous(), c_init = c0.contiguous();
  const Tensor w_hh_t = w_hh.t();
  const auto& pointwise = pointwise_backend(input.device().type());
  StepForward step;
  step.batch = B;
  step.hidden = H;
  int64_t prev = -1;
  for (int64_t p = 0; p < T; ++p) {
    const int64_t t = step_at(p, T, reverse);
    const Tensor h_prev = p == 0 ? h_init : output.select(0, prev);
    Tensor gates_t = gates.select(0, t);
    gates_t.addmm_(h_prev, w_hh_t);
    step.gates = gates_t.const_data_ptr();
    step.act_gates = gates_t.mutable_data_ptr();
    step.c_prev = p == 0 ? c_init.const_data_ptr() : at_row(cells, prev * B * H);
    step.c = at_row_mut(cells, t * B * H);
    step.h = s.projected ? at_row_mut(raw_h, t * B * H) : at_row_mut(output, t * B * P);
    pointwise.forward(input.scalar_type(), step);
    if (s.projected) {
      Tensor out_t = output.select(0, t);
      at::mm_out(out_t, raw_h.select(0, t), w_hr->t());
    }
    prev = t;
  }
  return {output, output.select(0, prev).clone(), cells.select(0, prev).clone(), workspace};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> lstm_layer_backward(
    const OptTensor& grad_output, const OptTensor& grad_h_n, const OptTensor& grad_c_n,
    const Tensor& input, const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
    const Tensor& w_hh, const OptTensor& w_hr, const Tensor& output, const Tensor& workspace,
    bool reverse) {
  constexpr const char* op = "lstm_layer_backward";
  const LayerShape s = check_layer(op, input, h0, c0, w_ih, w_hh, w_hr);
  const auto T = s.T, B = s.B, I = s.I, H = s.H, P = s.P;
  check_shape(op, "output", output, {T, B, P});
  check_shape(op, "workspace", workspace, {s.workspace_numel()});
  check_same_kind(op, "output", output, "input", input);
  check_same_kind(op, "workspace", workspace, "input", input);
  if (grad_output.has_value()) {
    check_shape(op, "grad_output", *grad_output, {T, B, P});
    check_same_kind(op, "grad_output", *grad_output, "input", input);
  }
  if (grad_h_n.has_value()) {
    check_shape(op, "grad_h_n", *grad_h_n, {B, P});
    check_same_kind(op, "grad_h_n", *grad_h_n, "input", input);
  }
  if (grad_c_n.has_value()) {
    check_shape(op, "grad_c_n", *grad_c_n, {B, H});
    check_same_kind(op, "grad_c_n", *grad_c_n, "input", input);
  }
  const auto opts = input.options();

  const Tensor ws = workspace.contiguous();
  const Tensor gates = ws.narrow(0, 0, T * B * 4 * H).view({T, B, 4 * H});
  const Tensor cells = ws.narrow(0, T * B * 4 * H, T * B * H).view({T, B, H});
  const Tensor raw_h =
      s.projected ? ws.narrow(0, T * B * 5 * H, T * B * H).view({T, B, H}) : Tensor();
  const Tensor out = output.contiguous();
  const Tensor h_init = h0.contiguous(), c_init = c0.contiguous();
  const Tensor grad_out = grad_output.has_value() ? grad_output->contiguous() : Tensor();

  Tensor grad_gates = at::empty({T, B, 4 * H}, opts);
  // The gradient of h flowing back from the next processed step, and of c.
  Tensor grad_h_rec = grad_h_n.has_value() ? grad_h_n->contiguous().clone() : at::zeros({B, P}, opts);
  Tensor grad_c = grad_c_n.has_value() ? grad_c_n->contiguous().clone() : at::zeros({B, H}, opts);
  // Per-step total gradient of h: kept for all steps when projecting (w_hr's
  // gradient is one GEMM over them), else one buffer reused.
  Tensor grad_h_all = s.projected ? at::empty({T, B, P}, opts) : Tensor();
  Tensor grad_h_step = s.projected ? Tensor() : at::empty({B, P}, opts);
  Tensor grad_raw_h = s.projected ? at::empty({B, H}, opts) : Tensor();

  const auto& pointwise = pointwise_backend(input.device().type());
  StepBackward step;
  step.batch = B;
  step.hidden = H;
  for (int64_t p = T - 1; p >= 0 && B > 0; --p) {
    const int64_t t = step_at(p, T, reverse);
    Tensor grad_h = s.projected ? grad_h_all.select(0, t) : grad_h_step;
    if (grad_out.defined()) {
      at::add_out(grad_h, grad_out.select(0, t), grad_h_rec);
    } else {
      grad_h.copy_(grad_h_rec);
    }
    if (s.projected) at::mm_out(grad_raw_h, grad_h, *w_hr);
    step.grad_h = s.projected ? grad_raw_h.const_data_ptr() : grad_h.const_data_ptr();
    step.grad_c = grad_c.const_data_ptr();
    step.act_gates = at_row(gates, t * B * 4 * H);
    step.c_prev = p == 0 ? c_init.const_data_ptr()
                         : at_row(cells, step_at(p - 1, T, reverse) * B * H);
    step.c = at_row(cells, t * B * H);
    step.grad_gates = at_row_mut(grad_gates, t * B * 4 * H);
    step.grad_c_prev = grad_c.mutable_data_ptr();
    pointwise.backward(input.scalar_type(), step);
    at::mm_out(grad_h_rec, grad_gates.select(0, t), w_hh);
  }

  // Weight gradients: one GEMM each over all steps.
  const Tensor dg = grad_gates.view({T * B, 4 * H});
  const Tensor x = input.contiguous().view({T * B, I});
  Tensor grad_input = at::mm(dg, w_ih).view({T, B, I});
  Tensor grad_w_ih = at::mm(dg.t(), x);
  // Step t saw h_prev = output of the previously processed step, h0 first.
  Tensor grad_w_hh;
  const int64_t first = step_at(0, T, reverse);
  if (T > 1) {
    const Tensor dg_rec = reverse ? grad_gates.narrow(0, 0, T - 1) : grad_gates.narrow(0, 1, T - 1);
    const Tensor h_prev = reverse ? out.narrow(0, 1, T - 1) : out.narrow(0, 0, T - 1);
    grad_w_hh = at::mm(dg_rec.reshape({(T - 1) * B, 4 * H}).t(), h_prev.reshape({(T - 1) * B, P}));
    grad_w_hh.addmm_(grad_gates.select(0, first).t(), h_init);
  } else {
    grad_w_hh = at::mm(grad_gates.select(0, first).t(), h_init);
  }
  Tensor grad_bias = dg.sum(0);
  Tensor grad_w_hr = s.projected ? at::mm(grad_h_all.view({T * B, P}).t(), raw_h.reshape({T * B, H}))
                                 : at::empty({0}, opts);
  return {grad_input, grad_h_rec, grad_c, grad_w_ih, grad_w_hh, grad_bias, grad_w_hr};
}

}  // namespace pipelstm
