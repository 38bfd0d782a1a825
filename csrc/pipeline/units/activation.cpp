// The pointwise activations as a unit (ReLU, Tanh, Sigmoid, GELU both ways,
// SiLU), on ATen's forward and backward kernels.
#include <ATen/ATen.h>

#include "kinds.h"

namespace pipelstm::pipeline {
namespace {

Tensor forward(const UnitSpec& u, const UnitParams&, const Tensor& x, bool, bool keep, Tensor&,
               Tensor&, std::vector<Tensor>& saved, uint64_t, const Tensor&) {
  Tensor y;
  switch (u.activation) {
    case Activation::Relu: y = at::relu(x); break;
    case Activation::Tanh: y = at::tanh(x); break;
    case Activation::Sigmoid: y = at::sigmoid(x); break;
    case Activation::Gelu: y = at::gelu(x, "none"); break;
    case Activation::GeluTanh: y = at::gelu(x, "tanh"); break;
    case Activation::Silu: y = at::silu(x); break;
  }
  if (keep) saved = {x, y};
  return y;
}

Tensor backward_data(const UnitSpec& u, const UnitParams&, const Tensor& g,
                     const std::vector<Tensor>& saved, OptTensor&, OptTensor&, Piece&) {
  if (!g.defined()) return g;
  const Tensor &x = saved[0], &y = saved[1];
  switch (u.activation) {
    case Activation::Relu: return at::threshold_backward(g, y, 0);
    case Activation::Tanh: return at::tanh_backward(g, y);
    case Activation::Sigmoid: return at::sigmoid_backward(g, y);
    case Activation::Gelu: return at::gelu_backward(g, x, "none");
    case Activation::GeluTanh: return at::gelu_backward(g, x, "tanh");
    case Activation::Silu: return at::silu_backward(g, x);
  }
  TORCH_CHECK(false, "unknown activation");
}

void keep_for_replay(std::vector<Tensor>& saved) { saved.clear(); }  // the input is recomputed

}  // namespace

const UnitKindOps kActivationUnit{UnitKind::Activation, "activation", "activation", &forward,
                                  &backward_data, nullptr, &keep_for_replay};

}  // namespace pipelstm::pipeline
