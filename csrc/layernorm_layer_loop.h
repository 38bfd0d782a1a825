// The LayerNorm LSTM layer ops, once for every backend: one direction of
// one layer, dense ([T, B, I]) or packed (batch_sizes given), optionally
// under zoneout, in float32 or float64. The math is layernorm_lstm_rows.h's.
//
// Forward: one GEMM for every step's input projection, normalised row by
// row; then per step one recurrent GEMM and the row kernel over the step's
// rows (split into runs that start from the same state, as a packed step
// may). Backward mirrors it per step; the input and weight gradients and
// the gains' are then one pass or one GEMM over all rows.
//
// The workspace the forward keeps, `rows` rows of each part one after
// another: [4H] x_hat | [4H] r_hat | [4H] activated gates | [H] c |
// [H] c_hat | [H] tanh_n | then the rows' rstd of x, r and c
// (python/pipelstm/layernorm_ops.py's workspace_numel).
//
// `Backend` (cpu/layernorm_layer_cpu.cpp, cuda/layernorm_layer_cuda.cpp):
//   kMath                        its LayerMath (GEMMs and buffers);
//   recurrent(w, rows), recurrent_mm_out(out, a, recurrent, accumulate)
//                                the recurrent GEMM's operand, prepared
//                                once for every step, and out (+)= a @ w;
//   layer_norm_rows(x, rstd, n, eps, rows), layer_norm_backward_rows(grad,
//   x_hat, rstd, n, rows), step_forward(args), step_backward(args)
//                                the row kernels over every row given;
//   column_sums(a, b, b2)        over all rows, the column sums of a * b,
//                                of a * b2 (if given) and of a.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>
#include <vector>

#include "checks.h"
#include "layer_checks.h"
#include "layer_weight_grads.h"
#include "pipelstm/kernels/layernorm_lstm_rows.h"
#include "zoneout_layer_ops.h"

namespace pipelstm {
namespace layernorm {

// The workspace's parts as views (see the top of this file).
struct LayerNormWorkspace {
  Tensor x_hat, r_hat, act, c, c_hat, tanh_n, rstd_x, rstd_r, rstd_c;

  static int64_t numel(int64_t rows, int64_t H) { return rows * (15 * H + 3); }

  LayerNormWorkspace(const Tensor& ws, int64_t rows, int64_t H) {
    int64_t at = 0;
    const auto part = [&](int64_t width) {
      Tensor t = ws.narrow(0, at, rows * width).view({rows, width});
      at += rows * width;
      return t;
    };
    x_hat = part(4 * H);
    r_hat = part(4 * H);
    act = part(4 * H);
    c = part(H);
    c_hat = part(H);
    tanh_n = part(H);
    rstd_x = part(1).view({rows});
    rstd_r = part(1).view({rows});
    rstd_c = part(1).view({rows});
  }
};

// The checks both ops make: the steps, the sizes, the gains' shapes, and
// zoneout's keep weights (both or neither).
struct LayerNormCall {
  LayerSteps steps;
  LayerGeometry s;
  std::optional<Zoneout> zoneout;
  int64_t H = 0, B = 0, rows = 0;  // s.hidden, steps.max_batch, steps.rows
};

inline void check_vector(const char* op, const char* name, const Tensor& t, int64_t n, const Tensor& input) {
  check_shape(op, name, t, {n});
  check_same_kind(op, name, t, "input", input);
}

inline LayerNormCall check_call(const char* op, const Tensor& input, const OptTensor& batch_sizes,
                         const Tensor& h0, const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
                         const Tensor& gamma_ih, const Tensor& gamma_hh, const Tensor& gamma_c,
                         const OptTensor& keep_c, const OptTensor& keep_h) {
  TORCH_CHECK(input.scalar_type() == at::kFloat || input.scalar_type() == at::kDouble, "pipelstm::", op,
              ": the fused LayerNorm LSTM computes in float32 or float64, got an `input` of ",
              input.scalar_type());
  LayerNormCall call;
  call.steps = zoneout_steps(op, input, batch_sizes);
  call.s = check_weights(op, input, call.steps.rows, call.steps.max_batch, h0, c0, w_ih, w_hh,
                         std::nullopt);
  const int64_t H = call.s.hidden;
  check_vector(op, "gamma_ih", gamma_ih, 4 * H, input);
  check_vector(op, "gamma_hh", gamma_hh, 4 * H, input);
  check_vector(op, "gamma_c", gamma_c, H, input);
  TORCH_CHECK(keep_c.has_value() == keep_h.has_value(), "pipelstm::", op,
              ": expected both `keep_c` and `keep_h` (zoneout) or neither");
  checked_product(op, "the workspace", {call.steps.rows, 15 * H + 3});
  if (keep_c.has_value()) call.zoneout = zoneout_rows(op, input, *keep_c, *keep_h, call.steps.rows, H);
  call.H = H;
  call.B = call.steps.max_batch;
  call.rows = call.steps.rows;
  return call;
}

template <typename T>
const T* ptr(const Tensor& t, int64_t row = 0) {
  return t.data_ptr<T>() + row * t.stride(0);
}
template <typename T>
T* mut(const Tensor& t, int64_t row = 0) {
  return t.data_ptr<T>() + row * t.stride(0);
}
template <typename T>
const T* ptr_or_null(const OptTensor& t) {
  return t.has_value() ? t->data_ptr<T>() : nullptr;
}

// The hidden states step p starts from: rows [0, cont) of the previous
// step's output, the rest h0's.
inline Tensor previous_h(const LayerSteps& steps, const Tensor& output, const Tensor& h0, int64_t p, int64_t prev,
                  bool reverse) {
  const int64_t t = LayerSteps::step_at(p, steps.steps(), reverse);
  const int64_t rows = steps.batch[t], cont = steps.continuing(p, reverse);
  if (cont == 0) return h0.narrow(0, 0, rows);  // also the first step, where there is no prev
  if (cont == rows) return output.narrow(0, steps.offset[prev], rows);
  return at::cat({output.narrow(0, steps.offset[prev], cont), h0.narrow(0, cont, rows - cont)});
}

template <class Backend>
std::tuple<Tensor, Tensor, Tensor, Tensor> layernorm_forward(
    const Tensor& input, const OptTensor& batch_sizes, const Tensor& h0, const Tensor& c0,
    const Tensor& w_ih, const Tensor& w_hh, const OptTensor& bias, const Tensor& gamma_ih,
    const Tensor& gamma_hh, const Tensor& gamma_c, const OptTensor& beta_c, const OptTensor& keep_c,
    const OptTensor& keep_h, bool reverse, double eps) {
  constexpr const char* op = "lstm_layernorm_layer_forward";
  const OpGuard guard(input);
  const auto& [steps, s, zoneout, H, B, rows] =
      check_call(op, input, batch_sizes, h0, c0, w_ih, w_hh, gamma_ih, gamma_hh, gamma_c, keep_c, keep_h);
  check_biases(op, input, s, bias, std::nullopt);
  if (beta_c.has_value()) check_vector(op, "beta_c", *beta_c, H, input);
  TORCH_CHECK(eps >= 0.0, "pipelstm::", op, ": expected `eps` >= 0, got ", eps);

  const Tensor x = input.contiguous().view({rows, s.input});
  const Tensor h_init = h0.contiguous(), c_init = c0.contiguous();
  const Tensor g_ih = gamma_ih.contiguous(), g_hh = gamma_hh.contiguous(), g_c = gamma_c.contiguous();
  const OptTensor b = bias.has_value() ? OptTensor(bias->contiguous()) : std::nullopt;
  const OptTensor beta = beta_c.has_value() ? OptTensor(beta_c->contiguous()) : std::nullopt;
  Tensor workspace = Backend::kMath.empty({LayerNormWorkspace::numel(rows, H)}, x.options());
  const LayerNormWorkspace ws(workspace, rows, H);
  Tensor output = at::empty({rows, H}, x.options());
  Tensor h_n = at::empty({B, H}, x.options()), c_n = at::empty({B, H}, x.options());

  Backend::kMath.mm_out(ws.x_hat, x, w_ih.t(), false);
  const auto recurrent = Backend::recurrent(w_hh.t(), B);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "pipelstm_layernorm_forward", [&] {
    const auto e = static_cast<scalar_t>(eps);
    Backend::layer_norm_rows(mut<scalar_t>(ws.x_hat), mut<scalar_t>(ws.rstd_x), 4 * H, e, rows);
    const int64_t T = steps.steps();
    int64_t prev = -1;
    for (int64_t p = 0; p < T; ++p) {
      const int64_t t = LayerSteps::step_at(p, T, reverse);
      const int64_t n = steps.batch[t], row0 = steps.offset[t], cont = steps.continuing(p, reverse);
      Backend::recurrent_mm_out(ws.r_hat.narrow(0, row0, n), previous_h(steps, output, h_init, p, prev, reverse),
                         recurrent, false);
      for (const auto& [begin, end] : {std::pair{int64_t{0}, cont}, std::pair{cont, n}}) {
        if (end <= begin) continue;
        const bool on = begin < cont;  // rows that go on from the previous step
        const int64_t r = row0 + begin;
        kernels::LayerNormStepForwardArgs<scalar_t> a;
        a.gamma_ih = ptr<scalar_t>(g_ih);
        a.gamma_hh = ptr<scalar_t>(g_hh);
        a.bias = ptr_or_null<scalar_t>(b);
        a.gamma_c = ptr<scalar_t>(g_c);
        a.beta_c = ptr_or_null<scalar_t>(beta);
        a.x_hat = ptr<scalar_t>(ws.x_hat, r);
        a.r = mut<scalar_t>(ws.r_hat, r);
        a.r_rstd = mut<scalar_t>(ws.rstd_r) + r;
        a.c_prev = on ? ptr<scalar_t>(ws.c, steps.offset[prev] + begin) : ptr<scalar_t>(c_init, begin);
        a.act = mut<scalar_t>(ws.act, r);
        a.c = mut<scalar_t>(ws.c, r);
        a.c_hat = mut<scalar_t>(ws.c_hat, r);
        a.tanh_n = mut<scalar_t>(ws.tanh_n, r);
        a.c_rstd = mut<scalar_t>(ws.rstd_c) + r;
        a.h = mut<scalar_t>(output, r);
        if (zoneout) {
          a.h_prev = on ? ptr<scalar_t>(output, steps.offset[prev] + begin) : ptr<scalar_t>(h_init, begin);
          a.keep = zoneout->template from_row<scalar_t>(r);
        }
        a.batch = end - begin;
        a.hidden = H;
        a.eps = e;
        Backend::step_forward(a);
      }
      // Sequences that end at this step leave their final state.
      const int64_t going = steps.going_on(p, reverse);
      if (n > going) {
        h_n.narrow(0, going, n - going).copy_(output.narrow(0, row0 + going, n - going));
        c_n.narrow(0, going, n - going).copy_(ws.c.narrow(0, row0 + going, n - going));
      }
      prev = t;
    }
  });
  if (!batch_sizes.has_value()) output = output.view({input.size(0), input.size(1), H});
  return {output, h_n, c_n, workspace};
}

template <class Backend>
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>
layernorm_backward(const OptTensor& grad_output, const OptTensor& grad_h_n, const OptTensor& grad_c_n,
                   const Tensor& input, const OptTensor& batch_sizes, const Tensor& h0, const Tensor& c0,
                   const Tensor& w_ih, const Tensor& w_hh, const Tensor& gamma_ih, const Tensor& gamma_hh,
                   const Tensor& gamma_c, const OptTensor& keep_c, const OptTensor& keep_h,
                   const Tensor& output, const Tensor& workspace, bool reverse) {
  constexpr const char* op = "lstm_layernorm_layer_backward";
  const OpGuard guard(input);
  const auto& [steps, s, zoneout, H, B, rows] =
      check_call(op, input, batch_sizes, h0, c0, w_ih, w_hh, gamma_ih, gamma_hh, gamma_c, keep_c, keep_h);
  const std::vector<int64_t> out_shape = batch_sizes.has_value()
                                             ? std::vector<int64_t>{rows, H}
                                             : std::vector<int64_t>{input.size(0), input.size(1), H};
  const auto check_out_shape = [&](const char* name, const Tensor& t) {
    TORCH_CHECK(t.sizes() == at::IntArrayRef(out_shape), "pipelstm::", op, ": expected `", name,
                "` of shape ", at::IntArrayRef(out_shape), ", got ", t.sizes());
  };
  check_out_shape("output", output);
  check_same_kind(op, "output", output, "input", input);
  check_shape(op, "workspace", workspace, {LayerNormWorkspace::numel(rows, H)});
  check_same_kind(op, "workspace", workspace, "input", input);
  if (grad_output.has_value()) {
    check_out_shape("grad_output", *grad_output);
    check_same_kind(op, "grad_output", *grad_output, "input", input);
  }
  for (const auto& [name, g] : {std::pair{"grad_h_n", &grad_h_n}, std::pair{"grad_c_n", &grad_c_n}}) {
    if (!g->has_value()) continue;
    check_shape(op, name, **g, {B, H});
    check_same_kind(op, name, **g, "input", input);
  }

  const Tensor x = input.contiguous().view({rows, s.input});
  const Tensor out = output.contiguous().view({rows, H});
  const OptTensor grad_out =
      grad_output.has_value() ? OptTensor(grad_output->contiguous().view({rows, H})) : std::nullopt;
  const Tensor h_init = h0.contiguous(), c_init = c0.contiguous();
  const Tensor g_hh = gamma_hh.contiguous(), g_c = gamma_c.contiguous();
  const LayerNormWorkspace ws(workspace.contiguous(), rows, H);
  Tensor grad_a = Backend::kMath.empty({rows, 4 * H}, x.options());
  Tensor grad_r = Backend::kMath.empty({rows, 4 * H}, x.options());
  Tensor grad_n = at::empty({rows, H}, x.options());
  // The gradients of the state carried into the step being processed, by sequence.
  Tensor carry_h = grad_h_n.has_value() ? grad_h_n->contiguous().clone() : at::zeros({B, H}, x.options());
  Tensor carry_c = grad_c_n.has_value() ? grad_c_n->contiguous().clone() : at::zeros({B, H}, x.options());
  Tensor grad_h0 = at::zeros({B, H}, x.options()), grad_c0 = at::zeros({B, H}, x.options());
  const auto recurrent = Backend::recurrent(w_hh, B);

  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "pipelstm_layernorm_backward", [&] {
    const int64_t T = steps.steps();
    for (int64_t p = T - 1; p >= 0; --p) {
      const int64_t t = LayerSteps::step_at(p, T, reverse);
      const int64_t prev = p > 0 ? LayerSteps::step_at(p - 1, T, reverse) : -1;
      const int64_t n = steps.batch[t], row0 = steps.offset[t], cont = steps.continuing(p, reverse);
      for (const auto& [begin, end] : {std::pair{int64_t{0}, cont}, std::pair{cont, n}}) {
        if (end <= begin) continue;
        const int64_t r = row0 + begin;
        kernels::LayerNormStepBackwardArgs<scalar_t> a;
        a.gamma_hh = ptr<scalar_t>(g_hh);
        a.gamma_c = ptr<scalar_t>(g_c);
        a.r_hat = ptr<scalar_t>(ws.r_hat, r);
        a.r_rstd = ptr<scalar_t>(ws.rstd_r) + r;
        a.c_prev = begin < cont ? ptr<scalar_t>(ws.c, steps.offset[prev] + begin) : ptr<scalar_t>(c_init, begin);
        a.act = ptr<scalar_t>(ws.act, r);
        a.c_hat = ptr<scalar_t>(ws.c_hat, r);
        a.tanh_n = ptr<scalar_t>(ws.tanh_n, r);
        a.c_rstd = ptr<scalar_t>(ws.rstd_c) + r;
        a.grad_out = grad_out.has_value() ? ptr<scalar_t>(*grad_out, r) : nullptr;
        a.grad_h = mut<scalar_t>(carry_h, begin);
        a.grad_c = mut<scalar_t>(carry_c, begin);
        a.grad_a = mut<scalar_t>(grad_a, r);
        a.grad_r = mut<scalar_t>(grad_r, r);
        a.grad_n = mut<scalar_t>(grad_n, r);
        if (zoneout) {
          a.keep = zoneout->template from_row<scalar_t>(r);
        }
        a.batch = end - begin;
        a.hidden = H;
        Backend::step_backward(a);
      }
      // h_prev's gradient: through the recurrent GEMM (plus zoneout's direct
      // part, which the row kernel left in carry_h).
      Backend::recurrent_mm_out(carry_h.narrow(0, 0, n), grad_r.narrow(0, row0, n), recurrent, zoneout.has_value());
      if (n > cont) {  // rows that started from h0/c0
        grad_h0.narrow(0, cont, n - cont).copy_(carry_h.narrow(0, cont, n - cont));
        grad_c0.narrow(0, cont, n - cont).copy_(carry_c.narrow(0, cont, n - cont));
      }
    }
  });

  const auto [grad_gamma_ih, grad_gamma_hh, grad_bias] = Backend::column_sums(grad_a, ws.x_hat, ws.r_hat);
  const auto [grad_gamma_c, unused, grad_beta_c] = Backend::column_sums(grad_n, ws.c_hat, std::nullopt);
  // grad_a becomes the gradient of the input projections.
  grad_a.mul_(gamma_ih);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "pipelstm_layernorm_input_grad", [&] {
    Backend::layer_norm_backward_rows(mut<scalar_t>(grad_a), ptr<scalar_t>(ws.x_hat), ptr<scalar_t>(ws.rstd_x),
                                      4 * H, rows);
  });
  Tensor grad_input = at::empty({rows, s.input}, x.options());
  Backend::kMath.mm_out(grad_input, grad_a, w_ih, false);
  Tensor grad_w_ih = at::empty_like(w_ih), grad_w_hh = at::empty_like(w_hh);
  Backend::kMath.mm_out(grad_w_ih, grad_a.t(), x, false);
  recurrent_weight_grad(steps, grad_r, out, h_init, reverse, grad_w_hh, false, Backend::kMath);
  if (!batch_sizes.has_value()) grad_input = grad_input.view(input.sizes());
  return {grad_input, grad_h0,       grad_c0,       grad_w_ih,    grad_w_hh,
          grad_bias,  grad_gamma_ih, grad_gamma_hh, grad_gamma_c, grad_beta_c};
}

}  // namespace layernorm
}  // namespace pipelstm
