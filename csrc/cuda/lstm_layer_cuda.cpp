// The CUDA backend of the LSTM ops: their kernels under the CUDA dispatch
// key. Every dtype runs the step loop (layer_step_loop.h) on this backend's
// pointwise launches and the layer GEMMs (cuBLAS, layer_gemm.h); a dense
// forward without projection may run as one persistent kernel instead
// (where persistent_rule.h says, and it fits: on tensor cores in float16
// and bfloat16, forward and backward); the forward and backward of a
// call are replayed as a captured CUDA graph where that pays
// (graph_replay_cuda.h). A new whole-sequence kernel goes in
// CudaLayer::sequence_forward / sequence_backward. Compiled only in a
// CUDA build.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <array>
#include <initializer_list>
#include <optional>
#include <type_traits>
#include <vector>

#include "../graph_replay.h"
#include "../graph_rule.h"
#include "../layer_gemm.h"
#include "../layer_ops.h"
#include "../layer_step_loop.h"
#include "../lent_buffers.h"
#include "../persistent_rule.h"
#include "../settings.h"
#include "graph_replay_cuda.h"
#include "kernels_cuda.h"
#include "layer_math_cuda.h"

namespace pipelstm {
namespace {

// The key of a layer op's graph (graph_replay.h): the op, its steps and
// flags, the tensors its body reads in place and the shapes of those it is
// given afresh.
enum class GraphOp : int64_t { kForward, kBackward };

std::vector<int64_t> graph_key(GraphOp op, const LayerSteps& steps, bool reverse,
                               std::initializer_list<Tensor> in_place,
                               const std::vector<Tensor>& inputs) {
  const std::optional<bool> persistent = settings::persistent();
  const std::string kernel = settings::persistent_kernel();
  const int64_t kernel_index = kernel == "grid" ? 0 : kernel == "cluster" ? 1 : 2;
  std::vector<int64_t> key{static_cast<int64_t>(op), reverse,
                           persistent.has_value() ? int64_t{*persistent} : int64_t{2}, kernel_index,
                           steps.dense};
  key.insert(key.end(), steps.batch.begin(), steps.batch.end());
  for (const auto& t : in_place) add_to_key(key, t, /*in_place=*/true);
  for (const auto& t : inputs) add_to_key(key, t, /*in_place=*/false);
  return key;
}

Tensor or_undefined(const OptTensor& t) { return t.has_value() ? *t : Tensor(); }

// body(inputs) from a captured graph (graph_replay_cuda.h), or run
// directly where this call is not graphed (by default, where graph_rule.h
// says a graph pays).
std::vector<Tensor> run_body(const Tensor& like, const LayerGeometry& s, GraphOp op,
                             const LayerSteps& steps, bool reverse,
                             std::initializer_list<Tensor> in_place,
                             const std::vector<Tensor>& inputs, const GraphBody& body) {
  const at::ScalarType dtype = like.scalar_type();
  auto out = cuda::run_as_graph(graph_key(op, steps, reverse, in_place, inputs), inputs, body,
                                graph_pays(dtype, layer_gemm_tf32(c10::DeviceType::CUDA, dtype),
                                           steps.max_batch, s.hidden));
  return out.has_value() ? *out : body(inputs);
}

struct CudaLayer {
  static constexpr const LayerMath& kMath = cuda::kLayerMath;
  static constexpr auto step_forward = [](const auto& a) { cuda::pointwise_forward(a); };
  static constexpr auto step_backward = [](const auto& a) { cuda::pointwise_backward(a); };
  template <class F>
  static void dispatch_types(at::ScalarType dtype, F&& f) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "pipelstm_cuda_step",
                                    [&] { f(scalar_t{}); });
  }

  // The persistent kernels where persistent_rule.h says (the switch, read
  // per call, else the measured rule). float16 and bfloat16 run the
  // tensor-core kernels (forward and backward), float32 and a
  // half-precision shape they do not fit the SIMT forward.
  template <typename T>
  static constexpr bool kTensorCores = std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>;

  template <typename T>
  static bool sequence_forward(const SequenceForward<T>& q) {
    if constexpr (std::is_same_v<T, double>) {
      return false;  // the persistent kernels have float, half and bfloat16
    } else {
      const int64_t T_ = q.steps.steps(), B = q.steps.max_batch;
      if (!use_persistent(c10::CppTypeToScalarType<T>::value, T_, B, q.geometry.hidden)) return false;
      const at::Tensor w = q.w_hh.contiguous();
      kernels::PersistentForwardArgs<T> seq;
      seq.input_gates = q.input_gates.template const_data_ptr<T>();
      seq.w_hh = w.const_data_ptr<T>();
      seq.h0 = q.h0.template const_data_ptr<T>();
      seq.c0 = q.c0.template const_data_ptr<T>();
      seq.output = q.r.output.template mutable_data_ptr<T>();
      seq.act_gates = q.ws.gates.template mutable_data_ptr<T>();
      seq.cells = q.ws.cells.template mutable_data_ptr<T>();
      seq.steps = T_;
      seq.batch = B;
      seq.hidden = q.geometry.hidden;
      seq.reverse = q.reverse;
      bool ran = false;
      if constexpr (kTensorCores<T>) ran = cuda::persistent_tc_forward(seq);
      if (!ran && !cuda::persistent_forward(seq)) return false;
      const int64_t last = LayerSteps::step_at(T_ - 1, T_, q.reverse) * B;
      q.r.h_n.copy_(q.r.output.narrow(0, last, B));
      q.r.c_n.copy_(q.ws.cells.narrow(0, last, B));
      return true;
    }
  }

  template <typename T>
  static bool sequence_backward(const SequenceBackward<T>& q) {
    if constexpr (!kTensorCores<T>) {
      return false;  // the tensor-core backward has half and bfloat16
    } else {
      if (!use_persistent(c10::CppTypeToScalarType<T>::value, q.steps.steps(), q.steps.max_batch,
                          q.geometry.hidden)) {
        return false;
      }
      // The kernel reads the given gradients densely; kept alive until it is queued.
      const auto dense = [](const OptTensor& t) { return t.has_value() ? t->contiguous() : at::Tensor(); };
      const at::Tensor grad_output = dense(q.grad_output), grad_h_n = dense(q.grad_h_n),
                       grad_c_n = dense(q.grad_c_n);
      const auto given = [](const at::Tensor& t) { return t.defined() ? t.const_data_ptr<T>() : nullptr; };
      const at::Tensor w = q.w_hh.contiguous();
      kernels::PersistentBackwardArgs<T> seq;
      seq.grad_output = given(grad_output);
      seq.grad_h_n = given(grad_h_n);
      seq.grad_c_n = given(grad_c_n);
      seq.w_hh = w.const_data_ptr<T>();
      seq.c0 = q.c0.template const_data_ptr<T>();
      seq.act_gates = q.ws.gates.template const_data_ptr<T>();
      seq.cells = q.ws.cells.template const_data_ptr<T>();
      seq.grad_gates = q.grad_gates.template mutable_data_ptr<T>();
      seq.grad_h0 = q.grad_h0.template mutable_data_ptr<T>();
      seq.grad_c0 = q.grad_c0.template mutable_data_ptr<T>();
      seq.steps = q.steps.steps();
      seq.batch = q.steps.max_batch;
      seq.hidden = q.geometry.hidden;
      seq.reverse = q.reverse;
      return cuda::persistent_tc_backward(seq);
    }
  }

  static ForwardResult forward(const LayerSteps& steps, const LayerGeometry& s, const Tensor& x,
                               const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
                               const Tensor& w_hh, const OptTensor& b_ih, const OptTensor& b_hh,
                               const OptTensor& w_hr, bool reverse) {
    const auto eager = [&](const Tensor& x_, const Tensor& h0_, const Tensor& c0_) {
      return step_loop_forward<CudaLayer>(steps, s, x_, h0_, c0_, w_ih, w_hh, b_ih, b_hh, w_hr,
                                          reverse);
    };
    if (steps.rows == 0) return eager(x, h0, c0);
    const auto body = [&](const std::vector<Tensor>& in) {
      ForwardResult r = eager(in[0], in[1], in[2]);
      return std::vector<Tensor>{r.output, r.h_n, r.c_n, r.workspace};
    };
    const auto out = run_body(x, s, GraphOp::kForward, steps, reverse,
                              {w_ih, w_hh, or_undefined(b_ih), or_undefined(b_hh), or_undefined(w_hr)},
                              {x, h0, c0}, body);
    return {out[0], out[1], out[2], out[3]};
  }

  // The step loop's, as layer_ops.h calls it (steps, geometry, the
  // gradients, x, h0, c0, the weights, workspace, reverse).
  template <typename... Args>
  static LayerDataGrads backward_data(const Args&... args) {
    return step_loop_backward_data<CudaLayer>(args...);
  }

  static BackwardResult backward(const LayerSteps& steps, const LayerGeometry& s,
                                 const OptTensor& grad_output, const OptTensor& grad_h_n,
                                 const OptTensor& grad_c_n, const Tensor& x, const Tensor& h0,
                                 const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
                                 const OptTensor& w_hr, const Tensor& output,
                                 const Tensor& workspace, bool reverse) {
    if (steps.rows == 0) {
      return backward_in_two_parts<CudaLayer>(steps, s, grad_output, grad_h_n, grad_c_n, x, h0,
                                              c0, w_ih, w_hh, w_hr, output, workspace, reverse);
    }
    // The forward's output and workspace, where its graph lent them, are
    // read in place rather than copied into the graph's own: their
    // addresses recur (one pair per capture of the forward), and so does
    // the key. The gradients given are inputs at places after the tensors
    // every call has; a missing one is none in the body too.
    const bool saved_in_place = LentBuffers::is_lent(output) && LentBuffers::is_lent(workspace);
    std::vector<Tensor> inputs{x, h0, c0};
    if (!saved_in_place) {
      inputs.push_back(output);
      inputs.push_back(workspace);
    }
    std::array<int64_t, 3> slot{-1, -1, -1};
    const std::array<const OptTensor*, 3> grads{&grad_output, &grad_h_n, &grad_c_n};
    for (size_t i = 0; i < grads.size(); ++i) {
      if (grads[i]->has_value()) {
        slot[i] = static_cast<int64_t>(inputs.size());
        inputs.push_back(**grads[i]);
      }
    }
    const auto given = [&](const std::vector<Tensor>& in, size_t i) {
      return slot[i] < 0 ? OptTensor() : OptTensor(in[slot[i]]);
    };
    const auto body = [&](const std::vector<Tensor>& in) {
      BackwardResult r = backward_in_two_parts<CudaLayer>(
          steps, s, given(in, 0), given(in, 1), given(in, 2), in[0], in[1], in[2], w_ih, w_hh, w_hr,
          saved_in_place ? output : in[3], saved_in_place ? workspace : in[4], reverse);
      return std::vector<Tensor>{r.grad_input, r.grad_h0, r.grad_c0, r.grad_w_ih, r.grad_w_hh,
                                 r.grad_bias, r.grad_w_hr};
    };
    const Tensor none;
    const auto out = run_body(x, s, GraphOp::kBackward, steps, reverse,
                              {w_ih, w_hh, or_undefined(w_hr), saved_in_place ? output : none,
                               saved_in_place ? workspace : none},
                              inputs, body);
    return {out[0], out[1], out[2], out[3], out[4], out[5], out[6]};
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(pipelstm, CUDA, m) {
  register_lstm_ops<LayerOps<CudaLayer>>(m);
}

}  // namespace pipelstm
