// The pointwise activations as a unit (ReLU, Tanh, Sigmoid, GELU both ways,
// SiLU, Mish), on ATen's forward and backward
// kernels. Each is one row of the table below; the bindings and Python
// (pipelstm/pipeline/units.py, ACTIVATIONS) read its names from here, so a
// new activation is its row, its module type in units.py and its test.
#include <ATen/ATen.h>

#include <string>

#include "kinds.h"

namespace pipelstm::pipeline {
namespace {

struct ActivationOps {
  const char* name;  // as UnitSpec and Python name it, e.g. "gelu_tanh"
  Tensor (*forward)(const Tensor& x);
  // The gradient of the input from that of the output `g`, the input `x`
  // and the output `y`.
  Tensor (*backward)(const Tensor& g, const Tensor& x, const Tensor& y);
};

const ActivationOps kActivations[] = {
    {"relu", [](const Tensor& x) { return at::relu(x); },
     [](const Tensor& g, const Tensor&, const Tensor& y) { return at::threshold_backward(g, y, 0); }},
    {"tanh", [](const Tensor& x) { return at::tanh(x); },
     [](const Tensor& g, const Tensor&, const Tensor& y) { return at::tanh_backward(g, y); }},
    {"sigmoid", [](const Tensor& x) { return at::sigmoid(x); },
     [](const Tensor& g, const Tensor&, const Tensor& y) { return at::sigmoid_backward(g, y); }},
    {"gelu", [](const Tensor& x) { return at::gelu(x, "none"); },
     [](const Tensor& g, const Tensor& x, const Tensor&) { return at::gelu_backward(g, x, "none"); }},
    {"gelu_tanh", [](const Tensor& x) { return at::gelu(x, "tanh"); },
     [](const Tensor& g, const Tensor& x, const Tensor&) { return at::gelu_backward(g, x, "tanh"); }},
    {"silu", [](const Tensor& x) { return at::silu(x); },
     [](const Tensor& g, const Tensor& x, const Tensor&) { return at::silu_backward(g, x); }},
    {"mish", [](const Tensor& x) { return at::mish(x); },
     [](const Tensor& g, const Tensor& x, const Tensor&) { return at::mish_backward(g, x); }},
};
constexpr int64_t kCount = static_cast<int64_t>(sizeof(kActivations) / sizeof(kActivations[0]));

const ActivationOps& activation_of(const UnitSpec& u) {
  TORCH_CHECK(u.activation >= 0 && u.activation < kCount, "unknown activation ", u.activation);
  return kActivations[u.activation];
}

Tensor forward(const UnitSpec& u, const UnitParams&, const Tensor& x, bool, bool keep, Tensor&,
               Tensor&, std::vector<Tensor>& saved, uint64_t, const ItemContext&) {
  Tensor y = activation_of(u).forward(x);
  if (keep) saved = {x, y};
  return y;
}

Tensor backward_data(const UnitSpec& u, const UnitParams&, const Tensor& g,
                     const std::vector<Tensor>& saved, OptTensor&, OptTensor&, Piece&) {
  if (!g.defined()) return g;
  return activation_of(u).backward(g, saved[0], saved[1]);
}

}  // namespace

std::vector<std::string> activation_names() {
  std::vector<std::string> names;
  for (const auto& a : kActivations) names.emplace_back(a.name);
  return names;
}

int64_t activation_index(const std::string& name) {
  for (int64_t i = 0; i < kCount; ++i) {
    if (name == kActivations[i].name) return i;
  }
  TORCH_CHECK(false, "pipelstm.Pipeline: unknown activation '", name, "'");
}

const RegisterUnitKind kRegistered{{.name = "activation", .py_name = "activation",
                                    .forward = &forward, .backward_data = &backward_data,
                                    .weight_grads = nullptr,
                                    .keep_for_replay = &recompute_input_for_replay,
                                    .options = {"activation"}}};

}  // namespace pipelstm::pipeline
