// What the fused ops' autograd formulas share (lstm_autograd.cpp,
// layernorm_autograd.cpp): a call below autograd, whether a call records a
// node, and the create_graph=True gradient through an op's composition.
#pragma once

#include <torch/autograd.h>

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "op_handle.h"

namespace pipelstm {
namespace op_autograd {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Outputs3 = std::tuple<Tensor, Tensor, Tensor>;
using Outputs4 = std::tuple<Tensor, Tensor, Tensor, Tensor>;

// The op's kernel for the tensors' device (or the fake/functional layers
// below autograd while tracing): what every call without a graph to record
// runs, and what a forward with one runs inside.
template <typename Op, typename... Args>
auto below_autograd(const Op& op, Args&&... args) {
  at::AutoDispatchBelowADInplaceOrView below;
  return op.call(std::forward<Args>(args)...);
}

inline bool needs_graph(std::initializer_list<const Tensor*> tensors) {
  if (!at::GradMode::is_enabled()) return false;
  for (const Tensor* t : tensors) {
    if (t->defined() && t->requires_grad()) return true;
  }
  return false;
}

inline const Tensor& or_undefined(const OptTensor& t) {
  static const Tensor undefined;
  return t.has_value() ? *t : undefined;
}

inline OptTensor given(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

// A packed sequence's batch_sizes as the compositions take them: a list.
inline std::vector<int64_t> sizes_of(const Tensor& batch_sizes) {
  const Tensor sizes = batch_sizes.to(at::kLong).contiguous();
  const int64_t* data = sizes.const_data_ptr<int64_t>();
  return std::vector<int64_t>(data, data + sizes.numel());
}

// Each formula's forward hands the op's workspace out through its last
// argument rather than as an output of the node: it is saved for the backward
// but never differentiated (a node with outputs marked non-differentiable is
// refused by compiled autograd). An output nobody differentiates arrives at
// the backward as an undefined gradient, not zeros.
inline void no_zero_gradients(AutogradContext* ctx) { ctx->set_materialize_grads(false); }

// The gradient for create_graph=True: `composite(inputs)` recomputed with
// grad mode on and differentiated with create_graph, so that the gradient is
// itself differentiable (double backward, gradient penalties). One gradient
// per input, zeros for an input that needs one and gets none, undefined for
// an absent input or one that needs none.
template <typename Composite>
variable_list composed_grads(const variable_list& inputs, const Composite& composite,
                             const variable_list& grad_outputs) {
  std::vector<size_t> wanted;
  variable_list wanted_inputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].defined() && inputs[i].requires_grad()) {
      wanted.push_back(i);
      wanted_inputs.push_back(inputs[i]);
    }
  }
  variable_list grads(inputs.size());
  const bool any_gradient = std::any_of(grad_outputs.begin(), grad_outputs.end(),
                                        [](const Tensor& g) { return g.defined(); });
  if (wanted.empty() || !any_gradient) return grads;
  const variable_list outputs = composite();
  variable_list differentiated, weights;
  for (size_t k = 0; k < outputs.size() && k < grad_outputs.size(); ++k) {
    if (grad_outputs[k].defined()) {
      differentiated.push_back(outputs[k]);
      weights.push_back(grad_outputs[k]);
    }
  }
  const variable_list got =
      torch::autograd::grad(differentiated, wanted_inputs, weights, /*retain_graph=*/true,
                            /*create_graph=*/true, /*allow_unused=*/true);
  for (size_t k = 0; k < wanted.size(); ++k) {
    grads[wanted[k]] = got[k].defined() ? got[k] : at::zeros_like(inputs[wanted[k]]);
  }
  return grads;
}

}  // namespace op_autograd
}  // namespace pipelstm
