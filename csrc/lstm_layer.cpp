// One direction of one LSTM layer over a whole sequence, dense or packed.
//
// Forward: one GEMM projects the input of every step (biases folded in);
// then per step one recurrent GEMM accumulated in place into that step's
// gates, one fused pointwise call, and (with a projection) one GEMM for
// h = h_raw @ w_hr^T. Backward mirrors it per step, then computes every
// weight gradient with one GEMM over all steps.
//
// Both layouts share one core over rows: a dense [T, B, *] tensor is the
// packed layout with B rows at every step. A packed step only touches the
// rows of sequences still running, so padding costs nothing.
//
// On the CPU in float32 the time loops are cpu/fused_loops_cpu.cpp's: each
// step one fused kernel (GEMM and cell together) on weights packed once per
// call, for small layers with the step's input projection in it too. The
// ATen step loop below serves every other device and dtype.
#include <ATen/ATen.h>

#include <array>
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "checks.h"
#include "cpu/fused_loops_cpu.h"
#include "cpu/gemm_cpu.h"
#include "cpu/huge_pages.h"
#include "graph_replay.h"
#include "layer_gemm.h"
#include "layer_geometry.h"
#include "layer_steps.h"
#include "lstm_ops.h"
#include "pointwise_step.h"
#include "settings.h"

namespace pipelstm {

LayerSteps dense_steps(int64_t T, int64_t B) {
  LayerSteps s;
  s.batch.assign(T, B);
  s.offset.resize(T);
  for (int64_t t = 0; t < T; ++t) s.offset[t] = t * B;
  s.max_batch = B;
  s.rows = T * B;
  s.dense = true;
  return s;
}

LayerSteps packed_steps(const char* op, const at::Tensor& batch_sizes) {
  TORCH_CHECK(batch_sizes.dim() == 1 && batch_sizes.device().is_cpu() &&
                  batch_sizes.scalar_type() == at::kLong,
              "pipelstm::", op, ": expected `batch_sizes` to be a 1-D int64 CPU tensor, got ",
              batch_sizes.dim(), "-D ", batch_sizes.scalar_type(), " on ", batch_sizes.device());
  TORCH_CHECK(batch_sizes.numel() > 0, "pipelstm::", op,
              ": expected `batch_sizes` with at least one time step");
  const auto sizes = batch_sizes.contiguous();
  const int64_t* b = sizes.const_data_ptr<int64_t>();
  LayerSteps s;
  s.dense = true;
  for (int64_t t = 0; t < sizes.numel(); ++t) {
    TORCH_CHECK(b[t] > 0 && (t == 0 || b[t] <= b[t - 1]), "pipelstm::", op,
                ": expected `batch_sizes` positive and non-increasing, got ", batch_sizes);
    s.batch.push_back(b[t]);
    s.offset.push_back(s.rows);
    s.rows = checked_sum(op, "the sum of `batch_sizes`", s.rows, b[t]);
    s.dense = s.dense && b[t] == b[0];
  }
  s.max_batch = b[0];
  return s;
}

namespace {

// Checks the weights and states against `input` ([rows, I] or [T, B, I];
// `batch` sequences, `rows` steps of all sequences together) and returns the
// sizes; the workspace's size (the largest the op computes) fits int64.
LayerGeometry check_weights(const char* op, const Tensor& input, int64_t rows, int64_t batch,
                            const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
                            const Tensor& w_hh, const OptTensor& w_hr) {
  check_dim(op, "w_ih", w_ih, 2, "[4H, I]");
  check_supported_dtype(op, "input", input);
  LayerGeometry s{};
  s.input = input.size(-1);
  TORCH_CHECK(w_ih.size(0) % 4 == 0 && w_ih.size(0) > 0, "pipelstm::", op,
              ": expected `w_ih` of shape [4H, I] with H > 0, got ", w_ih.sizes());
  s.hidden = w_ih.size(0) / 4;
  s.projected = w_hr.has_value();
  if (s.projected) {
    check_dim(op, "w_hr", *w_hr, 2, "[P, H]");
    s.out = w_hr->size(0);
    check_shape(op, "w_hr", *w_hr, {s.out, s.hidden});
    check_same_kind(op, "w_hr", *w_hr, "input", input);
  } else {
    s.out = s.hidden;
  }
  check_shape(op, "w_ih", w_ih, {4 * s.hidden, s.input});
  check_shape(op, "w_hh", w_hh, {4 * s.hidden, s.out});
  check_shape(op, "h0", h0, {batch, s.out});
  check_shape(op, "c0", c0, {batch, s.hidden});
  check_same_kind(op, "w_ih", w_ih, "input", input);
  check_same_kind(op, "w_hh", w_hh, "input", input);
  check_same_kind(op, "h0", h0, "input", input);
  check_same_kind(op, "c0", c0, "input", input);
  checked_product(op, "the workspace, rows x H x 6,", {rows, s.hidden, 6});
  return s;
}

void check_biases(const char* op, const Tensor& input, const LayerGeometry& s,
                  const OptTensor& b_ih, const OptTensor& b_hh) {
  for (const auto& [name, bias] : {std::pair{"b_ih", &b_ih}, std::pair{"b_hh", &b_hh}}) {
    if (bias->has_value()) {
      check_shape(op, name, **bias, {4 * s.hidden});
      check_same_kind(op, name, **bias, "input", input);
    }
  }
}

void check_grads(const char* op, const Tensor& input, const LayerGeometry& s, int64_t rows,
                 int64_t batch, const Tensor& output, const OptTensor& grad_output,
                 const OptTensor& grad_h_n, const OptTensor& grad_c_n, const Tensor& workspace) {
  const auto& out_sizes = output.sizes();
  check_same_kind(op, "output", output, "input", input);
  check_shape(op, "workspace", workspace, {s.workspace_numel(rows)});
  check_same_kind(op, "workspace", workspace, "input", input);
  if (grad_output.has_value()) {
    TORCH_CHECK(grad_output->sizes() == out_sizes, "pipelstm::", op,
                ": expected `grad_output` of shape ", out_sizes, ", got ", grad_output->sizes());
    check_same_kind(op, "grad_output", *grad_output, "input", input);
  }
  if (grad_h_n.has_value()) {
    check_shape(op, "grad_h_n", *grad_h_n, {batch, s.out});
    check_same_kind(op, "grad_h_n", *grad_h_n, "input", input);
  }
  if (grad_c_n.has_value()) {
    check_shape(op, "grad_c_n", *grad_c_n, {batch, s.hidden});
    check_same_kind(op, "grad_c_n", *grad_c_n, "input", input);
  }
}

// PIPELSTM_PERSISTENT=1 opts in to the persistent recurrent kernel where the
// backend has one and it fits (CUDA; opt-in until measured on a GPU). Read
// per call (settings.h): cheap beside a launch.
bool persistent_kernel_requested() { return settings::persistent(); }

// The steps of a PackedSequence whose data is `input`.
LayerSteps packed_input_steps(const char* op, const Tensor& input, const Tensor& batch_sizes) {
  check_dim(op, "input", input, 2, "[rows, I] (PackedSequence.data)");
  LayerSteps steps = packed_steps(op, batch_sizes);
  TORCH_CHECK(input.size(0) == steps.rows, "pipelstm::", op, ": expected `input` with ",
              steps.rows, " rows (the sum of `batch_sizes`), got ", input.size(0));
  return steps;
}

// Row `row` of a [rows, width] tensor.
template <typename T>
const T* row_of(const Tensor& t, int64_t row, int64_t width) {
  return t.const_data_ptr<T>() + row * width;
}
template <typename T>
T* mutable_row_of(const Tensor& t, int64_t row, int64_t width) {
  return t.mutable_data_ptr<T>() + row * width;
}

// The workspace's parts (layer_geometry.h), each [rows, width].
struct Workspace {
  Tensor gates, cells, raw_h;  // activated gates, c of each step, h before projection

  Workspace(const Tensor& ws, int64_t rows, const LayerGeometry& s) {
    const int64_t H = s.hidden;
    gates = ws.narrow(0, 0, rows * s.gates()).view({rows, s.gates()});
    cells = ws.narrow(0, s.cells_offset(rows), rows * H).view({rows, H});
    if (s.projected) raw_h = ws.narrow(0, s.raw_h_offset(rows), rows * H).view({rows, H});
  }
};

struct ForwardResult {
  Tensor output, h_n, c_n, workspace;  // output and workspace by rows
};

// The ATen step loop, for every device and dtype the fused CPU loops don't
// serve: per step one recurrent GEMM, one pointwise step for each run of
// rows that start from the same state, and the projection. `input_gates`
// holds every step's input projection with both biases.
template <typename scalar_t>
void aten_forward_loop(const LayerSteps& steps, const LayerGeometry& s, const Tensor& input_gates,
                       const Tensor& h_init, const Tensor& c_init, const Tensor& w_hh,
                       const OptTensor& w_hr, bool reverse, const Workspace& ws,
                       ForwardResult& r) {
  const int64_t T = steps.steps(), H = s.hidden, P = s.out;
  const auto& pointwise = pointwise_step<scalar_t>(input_gates.device().type());
  // Small batches only: there the per-step GEMM is latency-bound; larger
  // batches keep cuBLAS (tensor cores) per step.
  constexpr int64_t kPersistentMaxBatch = 64;
  if (steps.dense && !s.projected && steps.max_batch <= kPersistentMaxBatch &&
      pointwise.sequence_forward && persistent_kernel_requested()) {
    const Tensor w = w_hh.contiguous();
    kernels::PersistentForwardArgs<scalar_t> seq;
    seq.input_gates = input_gates.const_data_ptr<scalar_t>();
    seq.w_hh = w.const_data_ptr<scalar_t>();
    seq.h0 = h_init.const_data_ptr<scalar_t>();
    seq.c0 = c_init.const_data_ptr<scalar_t>();
    seq.output = r.output.mutable_data_ptr<scalar_t>();
    seq.act_gates = ws.gates.mutable_data_ptr<scalar_t>();
    seq.cells = ws.cells.mutable_data_ptr<scalar_t>();
    seq.steps = T;
    seq.batch = steps.max_batch;
    seq.hidden = H;
    seq.reverse = reverse;
    if (pointwise.sequence_forward(seq)) {
      const int64_t last = LayerSteps::step_at(T - 1, T, reverse) * steps.max_batch;
      r.h_n.copy_(r.output.narrow(0, last, steps.max_batch));
      r.c_n.copy_(ws.cells.narrow(0, last, steps.max_batch));
      return;
    }
  }
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
    const Tensor hidden_gates = layer_mm(h_prev, w_hh.t());
    const Tensor& h_out = s.projected ? ws.raw_h : r.output;
    const int64_t h_width = s.projected ? H : P;
    for (const auto& [begin, end] : {std::pair{int64_t{0}, cont}, std::pair{cont, rows}}) {
      if (end <= begin) continue;
      kernels::PointwiseForwardArgs<scalar_t> step;
      step.batch = end - begin;
      step.hidden = H;
      step.gates = row_of<scalar_t>(input_gates, row0 + begin, 4 * H);
      step.hidden_gates = row_of<scalar_t>(hidden_gates, begin, 4 * H);
      step.act_gates = mutable_row_of<scalar_t>(ws.gates, row0 + begin, 4 * H);
      step.c_prev = begin < cont ? row_of<scalar_t>(ws.cells, steps.offset[prev] + begin, H)
                                 : row_of<scalar_t>(c_init, begin, H);
      step.c = mutable_row_of<scalar_t>(ws.cells, row0 + begin, H);
      step.h = mutable_row_of<scalar_t>(h_out, row0 + begin, h_width);
      pointwise.forward(step);
    }
    if (s.projected) {
      Tensor out_t = r.output.narrow(0, row0, rows);
      layer_mm_out(out_t, ws.raw_h.narrow(0, row0, rows), w_hr->t());
    }
    // Sequences that end at this step leave their final state.
    const int64_t on = steps.going_on(p, reverse);
    if (rows > on) {
      r.h_n.narrow(0, on, rows - on).copy_(r.output.narrow(0, row0 + on, rows - on));
      r.c_n.narrow(0, on, rows - on).copy_(ws.cells.narrow(0, row0 + on, rows - on));
    }
    prev = t;
  }
}

// The key of a layer op's graph (graph_replay.h): the op, its steps and
// flags, the tensors its body reads in place and the shapes of those it is
// given afresh.
enum class GraphOp : int64_t { kForward, kBackward };

std::vector<int64_t> graph_key(GraphOp op, const LayerSteps& steps, bool reverse,
                               std::initializer_list<Tensor> in_place,
                               const std::vector<Tensor>& inputs) {
  std::vector<int64_t> key{static_cast<int64_t>(op), reverse, persistent_kernel_requested(),
                           steps.dense};
  key.insert(key.end(), steps.batch.begin(), steps.batch.end());
  for (const auto& t : in_place) add_to_key(key, t, /*in_place=*/true);
  for (const auto& t : inputs) add_to_key(key, t, /*in_place=*/false);
  return key;
}

Tensor or_undefined(const OptTensor& t) { return t.has_value() ? *t : Tensor(); }

// Whether a graph pays for this layer when the user has not said
// (PIPELSTM_CUDA_GRAPHS unset): where a step's launches, not its recurrent
// GEMM (B x H x 4H), set the time. On an H200 (bench gpu, docs/benchmarks.md)
// graphs took 1.04-3.7x off up to B*H*H = 2^25 in fp32 and 2^27 in
// bf16/fp16 (tensor cores), and were even (0.96-1.02x) from 2^27 and 2^29,
// where they would only hold their memory pool: the bounds lie between.
bool graph_pays(const LayerSteps& steps, const LayerGeometry& s, at::ScalarType dtype) {
  const double work = static_cast<double>(steps.max_batch) * s.hidden * s.hidden;
  const bool tensor_cores = dtype == at::kHalf || dtype == at::kBFloat16;
  return work <= (tensor_cores ? 0x1p28 : 0x1p26);
}

// body(inputs) from a captured graph where the device has them
// (graph_replay.h), else run directly.
std::vector<Tensor> run_body(const Tensor& like, const LayerGeometry& s, GraphOp op,
                             const LayerSteps& steps, bool reverse,
                             std::initializer_list<Tensor> in_place,
                             const std::vector<Tensor>& inputs, const GraphBody& body) {
  if (has_graph_runner(like.device().type())) {
    auto out = run_as_graph(like.device().type(), graph_key(op, steps, reverse, in_place, inputs),
                            inputs, body, graph_pays(steps, s, like.scalar_type()));
    if (out.has_value()) return *out;
  }
  return body(inputs);
}

// x: [rows, I] dense; h0 [B, P], c0 [B, H].
ForwardResult forward_eager(const LayerSteps& steps, const LayerGeometry& s,
                            const Tensor& x, const Tensor& h0, const Tensor& c0,
                            const Tensor& w_ih, const Tensor& w_hh, const OptTensor& b_ih,
                            const OptTensor& b_hh, const OptTensor& w_hr, bool reverse) {
  const int64_t N = steps.rows, H = s.hidden, P = s.out;
  const auto opts = x.options();
  ForwardResult r;
  r.workspace = cpu::empty_buffer({s.workspace_numel(N)}, opts);
  r.output = cpu::empty_buffer({N, P}, opts);
  r.h_n = at::empty({steps.max_batch, P}, opts);
  r.c_n = at::empty({steps.max_batch, H}, opts);
  if (N == 0) return r;
  Workspace ws(r.workspace, N, s);

  // Input projection of all steps at once, both biases folded in.
  Tensor bias;
  if (b_ih.has_value() || b_hh.has_value()) {
    bias = b_ih.has_value() && b_hh.has_value() ? *b_ih + *b_hh : b_ih.has_value() ? *b_ih : *b_hh;
  }
  const Tensor h_init = h0.contiguous(), c_init = c0.contiguous();
  if (cpu::fused_loops_serve(x)) {
    // Where the weights are small and the steps have rows enough, each fused
    // step projects its own input. Otherwise the input's pre-activations go
    // straight into the workspace, where the fused steps add the bias and
    // turn them into the activated gates (no pass of addmm copying the bias
    // over the whole buffer first).
    const bool in_steps = cpu::input_projection_in_steps(s, steps);
    if (!in_steps) cpu::layer_mm_out(ws.gates, x, w_ih.t());
    cpu::fused_forward_loop(steps, s, reverse, in_steps ? x : Tensor(), w_ih, h_init, c_init,
                            w_hh, w_hr, bias, ws.gates, ws.cells, ws.raw_h, r.output, r.h_n,
                            r.c_n);
    return r;
  }
  Tensor input_gates;
  if (bias.defined()) {
    input_gates = bias.expand({x.size(0), bias.size(0)}).contiguous();
    layer_mm_out(input_gates, x, w_ih.t(), /*accumulate=*/true);
  } else {
    input_gates = layer_mm(x, w_ih.t());
  }

  PIPELSTM_DISPATCH_STEP_TYPES(x.scalar_type(), "lstm_layer_forward", [&] {
    aten_forward_loop<scalar_t>(steps, s, input_gates, h_init, c_init, w_hh, w_hr, reverse, ws, r);
  });
  return r;
}

ForwardResult forward_core(const LayerSteps& steps, const LayerGeometry& s,
                           const Tensor& x, const Tensor& h0, const Tensor& c0,
                           const Tensor& w_ih, const Tensor& w_hh, const OptTensor& b_ih,
                           const OptTensor& b_hh, const OptTensor& w_hr, bool reverse) {
  if (steps.rows == 0 || cpu::fused_loops_serve(x)) {
    return forward_eager(steps, s, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse);
  }
  const auto body = [&](const std::vector<Tensor>& in) {
    ForwardResult r = forward_eager(steps, s, in[0], in[1], in[2], w_ih, w_hh, b_ih, b_hh, w_hr, reverse);
    return std::vector<Tensor>{r.output, r.h_n, r.c_n, r.workspace};
  };
  const auto out = run_body(x, s, GraphOp::kForward, steps, reverse,
                            {w_ih, w_hh, or_undefined(b_ih), or_undefined(b_hh), or_undefined(w_hr)},
                            {x, h0, c0}, body);
  return {out[0], out[1], out[2], out[3]};
}

struct BackwardResult {
  Tensor grad_input, grad_h0, grad_c0, grad_w_ih, grad_w_hh, grad_bias, grad_w_hr;
};

// sum over steps of grad_gates_t^T @ h_prev_t, where h_prev_t is the hidden
// state each row of step t started from. Dense: one GEMM over the steps that
// follow another (plain views) plus one for h0. Packed: gather, one GEMM.
// grad (+)= the recurrent weight's gradient: `add` adds into grad, else
// overwrites it.
void recurrent_weight_grad(const LayerSteps& steps, const Tensor& grad_gates,
                           const Tensor& output, const Tensor& h0, bool reverse,
                           const Tensor& grad, bool add) {
  const int64_t T = steps.steps(), B = steps.max_batch;
  if (steps.dense) {
    const int64_t first = LayerSteps::step_at(0, T, reverse);
    layer_mm_out(grad, grad_gates.narrow(0, first * B, B).t(), h0, add);
    if (T > 1) {
      const int64_t rest = (T - 1) * B;
      const Tensor dg = reverse ? grad_gates.narrow(0, 0, rest) : grad_gates.narrow(0, B, rest);
      const Tensor h = reverse ? output.narrow(0, B, rest) : output.narrow(0, 0, rest);
      layer_mm_out(grad, dg.t(), h, /*accumulate=*/true);
    }
    return;
  }
  Tensor h_prev = at::empty({steps.rows, output.size(1)}, output.options());
  int64_t prev = -1;
  for (int64_t p = 0; p < T; ++p) {
    const int64_t t = LayerSteps::step_at(p, T, reverse);
    const int64_t rows = steps.batch[t], cont = steps.continuing(p, reverse);
    Tensor dst = h_prev.narrow(0, steps.offset[t], rows);
    if (cont > 0) dst.narrow(0, 0, cont).copy_(output.narrow(0, steps.offset[prev], cont));
    if (rows > cont) dst.narrow(0, cont, rows - cont).copy_(h0.narrow(0, cont, rows - cont));
    prev = t;
  }
  layer_mm_out(grad, grad_gates.t(), h_prev, add);
}

// The data part of backward: the time loop and the input gradient.
LayerDataGrads backward_data_core(const LayerSteps& steps, const LayerGeometry& s,
                                  const OptTensor& grad_output, const OptTensor& grad_h_n,
                                  const OptTensor& grad_c_n, const Tensor& x, const Tensor& h0,
                                  const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
                                  const OptTensor& w_hr, const Tensor& output,
                                  const Tensor& workspace, bool reverse) {
  const int64_t T = steps.steps(), N = steps.rows, B = steps.max_batch, H = s.hidden, P = s.out;
  const auto opts = x.options();
  const Workspace ws(workspace.contiguous(), N, s);
  const Tensor out = output.contiguous();
  const Tensor h_init = h0.contiguous(), c_init = c0.contiguous();
  if (cpu::fused_loops_serve(x)) {
    cpu::FusedBackward f =
        cpu::fused_backward_loop(steps, s, reverse, grad_output, grad_h_n, grad_c_n, h_init,
                                 c_init, w_hh, w_hr, ws.gates, ws.cells);
    LayerDataGrads r;
    r.grad_input = cpu::empty_buffer({N, s.input}, opts);
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
  // Strided (for example expanded) gradients are read in place, not copied.
  const Tensor grad_out = grad_output.has_value() ? *grad_output : Tensor();

  Tensor grad_gates = at::empty({N, 4 * H}, opts);
  // Per-sequence gradient state. Row i holds the gradient of the h (and c)
  // that row i's next processed step started from: grad_h_n/grad_c_n for
  // sequences not yet reached, and grad_h0/grad_c0 once all steps are done.
  Tensor grad_h_state = grad_h_n.has_value() ? grad_h_n->contiguous().clone() : at::zeros({B, P}, opts);
  Tensor grad_c_state = grad_c_n.has_value() ? grad_c_n->contiguous().clone() : at::zeros({B, H}, opts);
  // Total gradient of each step's h: kept for all rows when projecting
  // (w_hr's gradient is one GEMM over them), else one buffer reused.
  Tensor grad_h_all = s.projected ? at::empty({N, P}, opts) : Tensor();
  Tensor grad_h_buf = s.projected ? Tensor() : at::empty({B, P}, opts);
  Tensor grad_raw_h = s.projected ? at::empty({B, H}, opts) : Tensor();

  PIPELSTM_DISPATCH_STEP_TYPES(x.scalar_type(), "lstm_layer_backward", [&] {
    const auto& pointwise = pointwise_step<scalar_t>(x.device().type());
    for (int64_t p = T - 1; p >= 0 && N > 0; --p) {
      const int64_t t = LayerSteps::step_at(p, T, reverse);
      const int64_t rows = steps.batch[t], row0 = steps.offset[t];
      const int64_t cont = steps.continuing(p, reverse);
      const int64_t prev = p > 0 ? LayerSteps::step_at(p - 1, T, reverse) : -1;
      Tensor grad_h_rec = grad_h_state.narrow(0, 0, rows);
      Tensor grad_h = s.projected ? grad_h_all.narrow(0, row0, rows) : grad_h_buf.narrow(0, 0, rows);
      if (grad_out.defined()) {
        at::add_out(grad_h, grad_out.narrow(0, row0, rows), grad_h_rec);
      } else {
        grad_h.copy_(grad_h_rec);
      }
      Tensor grad_raw = s.projected ? grad_raw_h.narrow(0, 0, rows) : grad_h;
      if (s.projected) layer_mm_out(grad_raw, grad_h, *w_hr);
      for (const auto& [begin, end] : {std::pair{int64_t{0}, cont}, std::pair{cont, rows}}) {
        if (end <= begin) continue;
        kernels::PointwiseBackwardArgs<scalar_t> step;
        step.batch = end - begin;
        step.hidden = H;
        step.grad_h = row_of<scalar_t>(grad_raw, begin, H);
        step.grad_c = row_of<scalar_t>(grad_c_state, begin, H);
        step.act_gates = row_of<scalar_t>(ws.gates, row0 + begin, 4 * H);
        step.c_prev = begin < cont ? row_of<scalar_t>(ws.cells, steps.offset[prev] + begin, H)
                                   : row_of<scalar_t>(c_init, begin, H);
        step.c = row_of<scalar_t>(ws.cells, row0 + begin, H);
        step.grad_gates = mutable_row_of<scalar_t>(grad_gates, row0 + begin, 4 * H);
        step.grad_c_prev = mutable_row_of<scalar_t>(grad_c_state, begin, H);
        pointwise.backward(step);
      }
      layer_mm_out(grad_h_rec, grad_gates.narrow(0, row0, rows), w_hh);
    }
  });

  LayerDataGrads r;
  r.grad_input = layer_mm(grad_gates, w_ih);
  r.grad_h0 = grad_h_state;
  r.grad_c0 = grad_c_state;
  r.grad_gates = grad_gates;
  if (s.projected) {
    r.grad_h = grad_h_all;
    r.raw_h = ws.raw_h;
  }
  return r;
}

// The weight part of backward, one GEMM each over all of `d`'s steps, into
// `acc`: added to what it holds where acc.w_ih is defined (the GEMMs
// accumulate in place), else into new buffers.
void add_weight_grads(const LayerSteps& steps, const LayerDataGrads& d, const Tensor& x,
                      const Tensor& h0, const Tensor& output, bool reverse,
                      LayerWeightGrads& acc) {
  const bool add = acc.w_ih.defined();
  if (!add) {
    acc.w_ih = cpu::empty_buffer({d.grad_gates.size(1), x.size(1)}, x.options());
    acc.w_hh = cpu::empty_buffer({d.grad_gates.size(1), h0.size(1)}, h0.options());
  }
  layer_mm_out(acc.w_ih, d.grad_gates.t(), x, add);
  recurrent_weight_grad(steps, d.grad_gates, output, h0.contiguous(), reverse, acc.w_hh, add);
  if (add) {
    acc.bias.add_(d.grad_gates.sum(0));
  } else {
    acc.bias = d.grad_gates.sum(0);
  }
  if (!d.grad_h.defined()) {
    if (!add) acc.w_hr = at::empty({0}, x.options());
  } else {
    if (!add) acc.w_hr = at::empty({d.grad_h.size(1), d.raw_h.size(1)}, x.options());
    layer_mm_out(acc.w_hr, d.grad_h.t(), d.raw_h, add);
  }
}

LayerWeightGrads weight_grads_core(const LayerSteps& steps, const LayerDataGrads& d,
                                   const Tensor& x, const Tensor& h0, const Tensor& output,
                                   bool reverse) {
  LayerWeightGrads r;
  add_weight_grads(steps, d, x, h0, output, reverse, r);
  return r;
}

BackwardResult backward_eager(const LayerSteps& steps, const LayerGeometry& s,
                              const OptTensor& grad_output, const OptTensor& grad_h_n,
                              const OptTensor& grad_c_n, const Tensor& x, const Tensor& h0,
                              const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
                              const OptTensor& w_hr, const Tensor& output,
                              const Tensor& workspace, bool reverse) {
  LayerDataGrads d = backward_data_core(steps, s, grad_output, grad_h_n, grad_c_n, x, h0, c0,
                                        w_ih, w_hh, w_hr, output, workspace, reverse);
  const LayerWeightGrads w = weight_grads_core(steps, d, x, h0, output.contiguous(), reverse);
  return {d.grad_input, d.grad_h0, d.grad_c0, w.w_ih, w.w_hh, w.bias, w.w_hr};
}

BackwardResult backward_core(const LayerSteps& steps, const LayerGeometry& s,
                             const OptTensor& grad_output, const OptTensor& grad_h_n,
                             const OptTensor& grad_c_n, const Tensor& x, const Tensor& h0,
                             const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
                             const OptTensor& w_hr, const Tensor& output,
                             const Tensor& workspace, bool reverse) {
  if (steps.rows == 0 || cpu::fused_loops_serve(x)) {
    return backward_eager(steps, s, grad_output, grad_h_n, grad_c_n, x, h0, c0, w_ih, w_hh, w_hr,
                          output, workspace, reverse);
  }
  // The gradients given are inputs at fixed places after the five tensors
  // every call has; a missing one is none in the body too.
  std::vector<Tensor> inputs{x, h0, c0, output, workspace};
  std::array<int64_t, 3> at{-1, -1, -1};
  const std::array<const OptTensor*, 3> grads{&grad_output, &grad_h_n, &grad_c_n};
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i]->has_value()) {
      at[i] = static_cast<int64_t>(inputs.size());
      inputs.push_back(**grads[i]);
    }
  }
  const auto given = [&](const std::vector<Tensor>& in, size_t i) {
    return at[i] < 0 ? OptTensor() : OptTensor(in[at[i]]);
  };
  const auto body = [&](const std::vector<Tensor>& in) {
    BackwardResult r = backward_eager(steps, s, given(in, 0), given(in, 1), given(in, 2), in[0],
                                      in[1], in[2], w_ih, w_hh, w_hr, in[3], in[4], reverse);
    return std::vector<Tensor>{r.grad_input, r.grad_h0, r.grad_c0, r.grad_w_ih, r.grad_w_hh,
                               r.grad_bias, r.grad_w_hr};
  };
  const auto out = run_body(x, s, GraphOp::kBackward, steps, reverse,
                            {w_ih, w_hh, or_undefined(w_hr)}, inputs, body);
  return {out[0], out[1], out[2], out[3], out[4], out[5], out[6]};
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor> lstm_layer_forward(
    const Tensor& input, const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
    const Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh, const OptTensor& w_hr,
    bool reverse) {
  constexpr const char* op = "lstm_layer_forward";
  const OpGuard guard(input);
  check_dim(op, "input", input, 3, "[T, B, I]");
  const int64_t T = input.size(0), B = input.size(1);
  TORCH_CHECK(T > 0, "pipelstm::", op, ": expected `input` with at least one time step, got ",
              input.sizes());
  const int64_t rows = checked_product(op, "T x B", {T, B});
  const LayerGeometry s = check_weights(op, input, rows, B, h0, c0, w_ih, w_hh, w_hr);
  check_biases(op, input, s, b_ih, b_hh);
  const auto x = input.contiguous().view({T * B, s.input});
  auto r = forward_core(dense_steps(T, B), s, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse);
  return {r.output.view({T, B, s.out}), r.h_n, r.c_n, r.workspace};
}

namespace {

// The checks of the dense backward ops, and their tensors as rows.
struct DenseBackward {
  int64_t T, B;
  LayerGeometry s;
  OptTensor grad_out;
  Tensor x, out;
};

DenseBackward dense_backward(const char* op, const OptTensor& grad_output,
                             const OptTensor& grad_h_n, const OptTensor& grad_c_n,
                             const Tensor& input, const Tensor& h0, const Tensor& c0,
                             const Tensor& w_ih, const Tensor& w_hh, const OptTensor& w_hr,
                             const Tensor& output, const Tensor& workspace) {
  check_dim(op, "input", input, 3, "[T, B, I]");
  const int64_t T = input.size(0), B = input.size(1);
  const int64_t rows = checked_product(op, "T x B", {T, B});
  const LayerGeometry s = check_weights(op, input, rows, B, h0, c0, w_ih, w_hh, w_hr);
  check_shape(op, "output", output, {T, B, s.out});
  check_grads(op, input, s, T * B, B, output, grad_output, grad_h_n, grad_c_n, workspace);
  return {T, B, s,
          grad_output.has_value() ? OptTensor(grad_output->reshape({T * B, s.out})) : std::nullopt,
          input.contiguous().view({T * B, s.input}), output.reshape({T * B, s.out})};
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> lstm_layer_backward(
    const OptTensor& grad_output, const OptTensor& grad_h_n, const OptTensor& grad_c_n,
    const Tensor& input, const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
    const Tensor& w_hh, const OptTensor& w_hr, const Tensor& output, const Tensor& workspace,
    bool reverse) {
  const OpGuard guard(input);
  const DenseBackward a = dense_backward("lstm_layer_backward", grad_output, grad_h_n, grad_c_n,
                                         input, h0, c0, w_ih, w_hh, w_hr, output, workspace);
  auto r = backward_core(dense_steps(a.T, a.B), a.s, a.grad_out, grad_h_n, grad_c_n, a.x, h0, c0,
                         w_ih, w_hh, w_hr, a.out, workspace, reverse);
  return {r.grad_input.view({a.T, a.B, a.s.input}), r.grad_h0, r.grad_c0, r.grad_w_ih, r.grad_w_hh,
          r.grad_bias, r.grad_w_hr};
}

LayerDataGrads lstm_layer_backward_data(const OptTensor& grad_output, const OptTensor& grad_h_n,
                                        const OptTensor& grad_c_n, const Tensor& input,
                                        const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
                                        const Tensor& w_hh, const OptTensor& w_hr,
                                        const Tensor& output, const Tensor& workspace) {
  const OpGuard guard(input);
  const DenseBackward a = dense_backward("lstm_layer_backward_data", grad_output, grad_h_n,
                                         grad_c_n, input, h0, c0, w_ih, w_hh, w_hr, output, workspace);
  LayerDataGrads d = backward_data_core(dense_steps(a.T, a.B), a.s, a.grad_out, grad_h_n, grad_c_n,
                                        a.x, h0, c0, w_ih, w_hh, w_hr, a.out, workspace,
                                        /*reverse=*/false);
  d.grad_input = d.grad_input.view({a.T, a.B, a.s.input});
  return d;
}

void lstm_layer_add_weight_grads(const LayerDataGrads& grads, const Tensor& input, const Tensor& h0,
                                 const Tensor& output, LayerWeightGrads& acc) {
  constexpr const char* op = "lstm_layer_weight_grads";
  const OpGuard guard(input);
  check_dim(op, "input", input, 3, "[T, B, I]");
  const int64_t T = input.size(0), B = input.size(1);
  TORCH_CHECK(grads.grad_gates.dim() == 2 && grads.grad_gates.size(0) == T * B,
              "pipelstm::", op, ": expected grad_gates of ", T * B, " rows, got ",
              grads.grad_gates.sizes());
  TORCH_CHECK(output.dim() == 3 && output.size(0) == T && output.size(1) == B,
              "pipelstm::", op, ": expected output [", T, ", ", B, ", P], got ", output.sizes());
  add_weight_grads(dense_steps(T, B), grads, input.contiguous().view({T * B, -1}), h0,
                   output.contiguous().view({T * B, -1}), /*reverse=*/false, acc);
}

LayerWeightGrads lstm_layer_weight_grads(const LayerDataGrads& grads, const Tensor& input,
                                         const Tensor& h0, const Tensor& output) {
  LayerWeightGrads r;
  lstm_layer_add_weight_grads(grads, input, h0, output, r);
  return r;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> lstm_packed_layer_forward(
    const Tensor& input, const Tensor& batch_sizes, const Tensor& h0, const Tensor& c0,
    const Tensor& w_ih, const Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh,
    const OptTensor& w_hr, bool reverse) {
  constexpr const char* op = "lstm_packed_layer_forward";
  const OpGuard guard(input);
  const LayerSteps steps = packed_input_steps(op, input, batch_sizes);
  const LayerGeometry s =
      check_weights(op, input, steps.rows, steps.max_batch, h0, c0, w_ih, w_hh, w_hr);
  check_biases(op, input, s, b_ih, b_hh);
  auto r = forward_core(steps, s, input.contiguous(), h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr,
                        reverse);
  return {r.output, r.h_n, r.c_n, r.workspace};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> lstm_packed_layer_backward(
    const OptTensor& grad_output, const OptTensor& grad_h_n, const OptTensor& grad_c_n,
    const Tensor& input, const Tensor& batch_sizes, const Tensor& h0, const Tensor& c0,
    const Tensor& w_ih, const Tensor& w_hh, const OptTensor& w_hr, const Tensor& output,
    const Tensor& workspace, bool reverse) {
  constexpr const char* op = "lstm_packed_layer_backward";
  const OpGuard guard(input);
  const LayerSteps steps = packed_input_steps(op, input, batch_sizes);
  const LayerGeometry s =
      check_weights(op, input, steps.rows, steps.max_batch, h0, c0, w_ih, w_hh, w_hr);
  check_shape(op, "output", output, {steps.rows, s.out});
  check_grads(op, input, s, steps.rows, steps.max_batch, output, grad_output, grad_h_n, grad_c_n,
              workspace);
  auto r = backward_core(steps, s, grad_output, grad_h_n, grad_c_n, input.contiguous(), h0, c0,
                         w_ih, w_hh, w_hr, output, workspace, reverse);
  return {r.grad_input, r.grad_h0, r.grad_c0, r.grad_w_ih, r.grad_w_hh, r.grad_bias,
          r.grad_w_hr};
}

}  // namespace pipelstm
