// bfloat16 and float16 on the CPU. The CPU kernels compute in float32 or
// float64, so a call in a reduced-precision dtype is computed in float32 on
// float32 copies of its tensors and its results are rounded to its dtype
// once: at least as accurate as nn.LSTM, which computes in the reduced dtype.
// The CPU backend's kernels (cpu/lstm_layer_cpu.cpp) and the ATen
// compositions (lstm_composite.cpp) both do so, so that a call gives the
// same numbers on either path.
#pragma once

#include <ATen/ATen.h>

#include <initializer_list>
#include <optional>
#include <tuple>
#include <utility>

#include "checks.h"

namespace pipelstm {

// Whether a call whose reference tensor (the input, or cx) is `t` is
// computed in float32: bfloat16 or float16 on the CPU. Meta tensors, which
// stand for any device, count as CPU ones.
inline bool computed_in_float32(const at::Tensor& t) {
  const auto dtype = t.scalar_type();
  return (dtype == at::kBFloat16 || dtype == at::kHalf) && (t.device().is_cpu() || t.is_meta());
}

// A named tensor argument; `tensor` is null for an absent optional one.
using NamedTensor = std::pair<const char*, const at::Tensor*>;

inline const at::Tensor* given(const std::optional<at::Tensor>& t) {
  return t.has_value() ? &*t : nullptr;
}

// Every given tensor has the dtype and device of `ref` (called `ref_name`):
// checked before the copies, since a float32 copy of a float32 tensor would
// hide the mismatch. The lists below follow the order of the ops' own checks.
inline void check_same_kind_as(const char* op, const char* ref_name, const at::Tensor& ref,
                               std::initializer_list<NamedTensor> tensors) {
  for (const auto& [name, t] : tensors) {
    if (t != nullptr) check_same_kind(op, name, *t, ref_name, ref);
  }
}

inline at::Tensor to_float32(const at::Tensor& t) { return t.to(at::kFloat); }

inline std::optional<at::Tensor> to_float32(const std::optional<at::Tensor>& t) {
  return t.has_value() ? std::optional<at::Tensor>(t->to(at::kFloat)) : std::nullopt;
}

// A layer call's `kernel(input, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr)` (a
// forward, with the call's other arguments bound) on float32 copies of its
// tensors, once they are checked to be all of the input's dtype.
template <class Kernel>
auto layer_in_float32(const char* op, const at::Tensor& input, const at::Tensor& h0,
                      const at::Tensor& c0, const at::Tensor& w_ih, const at::Tensor& w_hh,
                      const std::optional<at::Tensor>& b_ih, const std::optional<at::Tensor>& b_hh,
                      const std::optional<at::Tensor>& w_hr, const Kernel& kernel) {
  check_same_kind_as(op, "input", input,
                     {{"w_hr", given(w_hr)}, {"w_ih", &w_ih}, {"w_hh", &w_hh}, {"h0", &h0},
                      {"c0", &c0}, {"b_ih", given(b_ih)}, {"b_hh", given(b_hh)}});
  return kernel(to_float32(input), to_float32(h0), to_float32(c0), to_float32(w_ih),
                to_float32(w_hh), to_float32(b_ih), to_float32(b_hh), to_float32(w_hr));
}

// The same for a cell call, `kernel(input_gates, hidden_gates, cx, b_ih, b_hh)`.
template <class Kernel>
auto cell_in_float32(const char* op, const at::Tensor& input_gates,
                     const at::Tensor& hidden_gates, const at::Tensor& cx,
                     const std::optional<at::Tensor>& b_ih, const std::optional<at::Tensor>& b_hh,
                     const Kernel& kernel) {
  check_same_kind_as(op, "cx", cx,
                     {{"input_gates", &input_gates}, {"hidden_gates", &hidden_gates},
                      {"b_ih", given(b_ih)}, {"b_hh", given(b_hh)}});
  return kernel(to_float32(input_gates), to_float32(hidden_gates), to_float32(cx),
                to_float32(b_ih), to_float32(b_hh));
}

// Every tensor of `results` rounded to `dtype`.
template <typename... Ts>
std::tuple<Ts...> rounded(at::ScalarType dtype, const std::tuple<Ts...>& results) {
  return std::apply([&](const auto&... t) { return std::tuple<Ts...>{t.to(dtype)...}; }, results);
}

}  // namespace pipelstm
