#include "prepared_linear.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdlib>
#include <cstring>
#include <optional>

namespace pipelstm {
namespace {

using Scalars = c10::List<std::optional<at::Scalar>>;
using LinearFn = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            c10::string_view, Scalars, std::optional<c10::string_view>);
using ReorderFn = at::Tensor(const at::Tensor&, std::optional<int64_t>);

struct OneDnnOps {
  std::optional<c10::TypedOperatorHandle<ReorderFn>> reorder;
  std::optional<c10::TypedOperatorHandle<LinearFn>> linear;
};

// Looked up once; absent when torch was built without oneDNN, or if a torch
// version renames them (then every GEMM takes the at::mm path).
const OneDnnOps& onednn_ops() {
  static const OneDnnOps ops = [] {
    OneDnnOps o;
    auto& dispatcher = c10::Dispatcher::singleton();
    auto reorder = dispatcher.findSchema({"mkldnn::_reorder_linear_weight", ""});
    auto linear = dispatcher.findSchema({"mkldnn::_linear_pointwise", ""});
    if (reorder && linear) {
      o.reorder = reorder->typed<ReorderFn>();
      o.linear = linear->typed<LinearFn>();
    }
    return o;
  }();
  return ops;
}

// PIPELSTM_CPU_GEMM=aten forces at::mm (for comparisons).
bool onednn_allowed() {
  static const bool allowed = [] {
    const char* v = std::getenv("PIPELSTM_CPU_GEMM");
    return v == nullptr || std::strcmp(v, "aten") != 0;
  }();
  return allowed;
}

bool use_onednn(const at::Tensor& weight) {
  return weight.device().is_cpu() && weight.scalar_type() == at::kFloat && at::hasMKLDNN() &&
         at::globalContext().userEnabledMkldnn() && onednn_allowed() &&
         onednn_ops().linear.has_value();
}

}  // namespace

// Below about this many multiply-adds per call oneDNN's per-call overhead
// outweighs its faster kernel (measured on AVX-512, 1 thread: at::mm wins at
// 4M, oneDNN at 17M and above).
constexpr int64_t kOneDnnMinMacs = int64_t{8} << 20;

PreparedLinear::PreparedLinear(const at::Tensor& weight, int64_t batch_hint) : weight_(weight) {
  if (use_onednn(weight) && batch_hint * weight.size(0) * weight.size(1) >= kOneDnnMinMacs) {
    packed_ = onednn_ops().reorder->call(weight.contiguous(), batch_hint);
  }
}

at::Tensor PreparedLinear::operator()(const at::Tensor& x, const at::Tensor& bias) const {
  if (packed_.defined()) {
    const std::optional<at::Tensor> b = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
    return onednn_ops().linear->call(x.contiguous(), packed_, b, "none", Scalars(), std::nullopt);
  }
  return bias.defined() ? at::addmm(bias, x, weight_.t()) : at::mm(x, weight_.t());
}

void PreparedLinear::into(at::Tensor& out, const at::Tensor& x) const {
  if (packed_.defined()) {
    out.copy_((*this)(x));
  } else {
    at::mm_out(out, x, weight_.t());
  }
}

}  // namespace pipelstm
