// The op schemas, declared once. Kernels are registered per backend, each
// under its own dispatch key (cpu/lstm_layer_cpu.cpp, cuda/lstm_layer_cuda.cpp),
// the autograd formulas under the Autograd key (lstm_autograd.cpp,
// layernorm_autograd.cpp), the fake kernels from Python
// (pipelstm/hooks/fake_kernels.py). The *_composite ops are the
// same math in ATen ops (lstm_composite.cpp), for the transforms the fused
// formulas do not cover.
#include <torch/library.h>

TORCH_LIBRARY(pipelstm, m) {
  m.def(
      "lstm_cell_forward(Tensor input_gates, Tensor hidden_gates, Tensor cx, Tensor? b_ih, "
      "Tensor? b_hh) -> (Tensor hy, Tensor cy, Tensor workspace)");
  m.def(
      "lstm_cell_backward(Tensor? grad_hy, Tensor? grad_cy, Tensor cx, Tensor cy, "
      "Tensor workspace) -> (Tensor grad_gates, Tensor grad_cx)");
  m.def(
      "lstm_layer_forward(Tensor input, Tensor h0, Tensor c0, Tensor w_ih, Tensor w_hh, "
      "Tensor? b_ih, Tensor? b_hh, Tensor? w_hr, bool reverse) -> (Tensor output, Tensor h_n, "
      "Tensor c_n, Tensor workspace)");
  m.def(
      "lstm_layer_backward(Tensor? grad_output, Tensor? grad_h_n, Tensor? grad_c_n, "
      "Tensor input, Tensor h0, Tensor c0, Tensor w_ih, Tensor w_hh, Tensor? w_hr, "
      "Tensor output, Tensor workspace, bool reverse) -> (Tensor grad_input, Tensor grad_h0, "
      "Tensor grad_c0, Tensor grad_w_ih, Tensor grad_w_hh, Tensor grad_bias, "
      "Tensor grad_w_hr)");
  // Internal, for the pipeline engine (lstm_ops.h): lstm_layer_backward's data
  // part; grad_h and raw_h are empty without a projection.
  m.def(
      "lstm_layer_backward_data(Tensor? grad_output, Tensor? grad_h_n, Tensor? grad_c_n, "
      "Tensor input, Tensor h0, Tensor c0, Tensor w_ih, Tensor w_hh, Tensor? w_hr, "
      "Tensor output, Tensor workspace) -> (Tensor grad_input, Tensor grad_h0, Tensor grad_c0, "
      "Tensor grad_gates, Tensor grad_h, Tensor raw_h)");
  // Internal, for the pipeline engine: lstm_packed_layer_backward's data part,
  // as lstm_layer_backward_data.
  m.def(
      "lstm_packed_layer_backward_data(Tensor? grad_output, Tensor? grad_h_n, Tensor? grad_c_n, "
      "Tensor input, Tensor batch_sizes, Tensor h0, Tensor c0, Tensor w_ih, Tensor w_hh, "
      "Tensor? w_hr, Tensor output, Tensor workspace) -> (Tensor grad_input, Tensor grad_h0, "
      "Tensor grad_c0, Tensor grad_gates, Tensor grad_h, Tensor raw_h)");
  m.def(
      "lstm_packed_layer_forward(Tensor input, Tensor batch_sizes, Tensor h0, Tensor c0, "
      "Tensor w_ih, Tensor w_hh, Tensor? b_ih, Tensor? b_hh, Tensor? w_hr, bool reverse) -> "
      "(Tensor output, Tensor h_n, Tensor c_n, Tensor workspace)");
  m.def(
      "lstm_packed_layer_backward(Tensor? grad_output, Tensor? grad_h_n, Tensor? grad_c_n, "
      "Tensor input, Tensor batch_sizes, Tensor h0, Tensor c0, Tensor w_ih, Tensor w_hh, "
      "Tensor? w_hr, Tensor output, Tensor workspace, bool reverse) -> (Tensor grad_input, "
      "Tensor grad_h0, Tensor grad_c0, Tensor grad_w_ih, Tensor grad_w_hh, Tensor grad_bias, "
      "Tensor grad_w_hr)");
  // One direction of one layer under zoneout: dense input [T, B, I], or
  // packed rows with batch_sizes; keep_c/keep_h the keep weights of each
  // output element (zoneout_layer_ops.h). No projection.
  m.def(
      "lstm_zoneout_layer_forward(Tensor input, Tensor? batch_sizes, Tensor h0, Tensor c0, "
      "Tensor w_ih, Tensor w_hh, Tensor? b_ih, Tensor? b_hh, Tensor keep_c, Tensor keep_h, "
      "bool reverse) -> (Tensor output, Tensor h_n, Tensor c_n, Tensor workspace)");
  m.def(
      "lstm_zoneout_layer_backward(Tensor? grad_output, Tensor? grad_h_n, Tensor? grad_c_n, "
      "Tensor input, Tensor? batch_sizes, Tensor h0, Tensor c0, Tensor w_ih, Tensor w_hh, "
      "Tensor keep_c, Tensor keep_h, Tensor output, Tensor workspace, bool reverse) -> "
      "(Tensor grad_input, Tensor grad_h0, Tensor grad_c0, Tensor grad_w_ih, Tensor grad_w_hh, "
      "Tensor grad_bias)");
  // One direction of one layer of the LayerNorm LSTM (Ba et al. 2016):
  // LayerNorm on the input and recurrent pre-activations (gains gamma_ih,
  // gamma_hh; `bias` the sum of both biases) and on the cell (gamma_c,
  // beta_c); zoneout with keep_c/keep_h given. Dense or packed input, no
  // projection (layernorm_layer_loop.h).
  m.def(
      "lstm_layernorm_layer_forward(Tensor input, Tensor? batch_sizes, Tensor h0, Tensor c0, "
      "Tensor w_ih, Tensor w_hh, Tensor? bias, Tensor gamma_ih, Tensor gamma_hh, Tensor gamma_c, "
      "Tensor? beta_c, Tensor? keep_c, Tensor? keep_h, bool reverse, float eps) -> (Tensor output, "
      "Tensor h_n, Tensor c_n, Tensor workspace)");
  m.def(
      "lstm_layernorm_layer_backward(Tensor? grad_output, Tensor? grad_h_n, Tensor? grad_c_n, "
      "Tensor input, Tensor? batch_sizes, Tensor h0, Tensor c0, Tensor w_ih, Tensor w_hh, "
      "Tensor gamma_ih, Tensor gamma_hh, Tensor gamma_c, Tensor? keep_c, Tensor? keep_h, "
      "Tensor output, Tensor workspace, bool reverse) -> (Tensor grad_input, Tensor grad_h0, "
      "Tensor grad_c0, Tensor grad_w_ih, Tensor grad_w_hh, Tensor grad_bias, Tensor grad_gamma_ih, "
      "Tensor grad_gamma_hh, Tensor grad_gamma_c, Tensor grad_beta_c)");
  // A mask of `size`: each element `below` with probability p, else `above`,
  // drawn by Philox from `seed` (0-dim int64, itself drawn from torch's
  // generator, so torch.manual_seed reproduces the mask). CPU only
  // (cpu/bernoulli_mask_cpu.h): on a GPU torch.rand is already parallel.
  m.def(
      "bernoulli_mask(Tensor seed, SymInt[] size, float p, float below, float above, "
      "ScalarType dtype) -> Tensor");
  m.def(
      "lstm_cell_composite(Tensor input_gates, Tensor hidden_gates, Tensor cx, Tensor? b_ih, "
      "Tensor? b_hh) -> (Tensor hy, Tensor cy)");
  m.def(
      "lstm_layer_composite(Tensor input, Tensor h0, Tensor c0, Tensor w_ih, Tensor w_hh, "
      "Tensor? b_ih, Tensor? b_hh, Tensor? w_hr, bool reverse) -> (Tensor output, Tensor h_n, "
      "Tensor c_n)");
  m.def(
      "lstm_packed_layer_composite(Tensor input, int[] batch_sizes, Tensor h0, Tensor c0, "
      "Tensor w_ih, Tensor w_hh, Tensor? b_ih, Tensor? b_hh, Tensor? w_hr, bool reverse) -> "
      "(Tensor output, Tensor h_n, Tensor c_n)");
  // The LayerNorm layer's composition; its kernel is Python
  // (pipelstm/layernorm_ops.py, composed_layer), where ONNX export runs it too.
  m.def(
      "lstm_layernorm_layer_composite(Tensor input, Tensor? batch_sizes, Tensor h0, Tensor c0, "
      "Tensor w_ih, Tensor w_hh, Tensor? bias, Tensor gamma_ih, Tensor gamma_hh, Tensor gamma_c, "
      "Tensor? beta_c, Tensor? keep_c, Tensor? keep_h, bool reverse, float eps) -> (Tensor output, "
      "Tensor h_n, Tensor c_n)");
  m.def(
      "lstm_zoneout_layer_composite(Tensor input, int[]? batch_sizes, Tensor h0, Tensor c0, "
      "Tensor w_ih, Tensor w_hh, Tensor? b_ih, Tensor? b_hh, Tensor keep_c, Tensor keep_h, "
      "bool reverse) -> (Tensor output, Tensor h_n, Tensor c_n)");
}
