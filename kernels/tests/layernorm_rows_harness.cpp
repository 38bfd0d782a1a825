// Host harness for the LayerNorm LSTM's CUDA row kernels (no GPU, no CUDA,
// no torch): the phases of layernorm_lstm_rows_indexing.h run as a block of
// `threads` threads runs them, each phase's block sum taken over the
// threads' parts, and every output compared with the CPU rows
// (layernorm_lstm_rows.h). Covers block sizes below, at and above the row's
// width, every flag combination, float and double. Outputs start as NaN and
// every buffer carries a guard after it, so a column no thread writes, or a
// write past the row, shows up.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "pipelstm/kernels/flag_dispatch.h"
#include "pipelstm/kernels/layernorm_lstm_rows.h"
#include "pipelstm/kernels/layernorm_lstm_rows_indexing.h"

using namespace pipelstm::kernels;
namespace li = pipelstm::kernels::layernorm_indexing;

namespace {

int g_passed = 0, g_failed = 0;
std::mt19937_64 g_rng(2024);
constexpr int kGuard = 8;
constexpr double kSentinel = 4242.0;

template <typename T>
struct Buf {
  std::vector<T> v;
  int64_t n;
  explicit Buf(int64_t n_, double lo = 0, double hi = 0) : v(n_ + kGuard, T(kSentinel)), n(n_) {
    std::uniform_real_distribution<double> d(lo, hi);
    for (int64_t i = 0; i < n; ++i) v[i] = lo == hi ? std::numeric_limits<T>::quiet_NaN() : T(d(g_rng));
  }
  T* p() { return v.data(); }
  bool guard_intact() const {
    for (int64_t i = n; i < n + kGuard; ++i)
      if (v[i] != T(kSentinel)) return false;
    return true;
  }
};

template <typename T>
double tolerance() {
  return sizeof(T) == 4 ? 2e-5 : 1e-12;
}

template <typename T>
void expect_close(const char* what, const std::string& name, const Buf<T>& got, const Buf<T>& want) {
  std::string why;
  if (!got.guard_intact()) why = "guard overwritten";
  for (int64_t i = 0; i < got.n && why.empty(); ++i) {
    const double g = got.v[i], w = want.v[i];
    if (!(std::fabs(g - w) <= tolerance<T>() * (1.0 + std::fabs(w)))) {
      why = "element " + std::to_string(i) + ": " + std::to_string(g) + " vs " + std::to_string(w);
    }
  }
  if (why.empty()) {
    ++g_passed;
  } else {
    ++g_failed;
    std::printf("FAIL %s %s: %s\n", name.c_str(), what, why.c_str());
  }
}

// One phase's block sum: every thread's part, added.
template <typename T, class Phase>
T block_sum(int threads, const Phase& phase) {
  T s = T(0);
  for (int rank = 0; rank < threads; ++rank) s += phase(rank);
  return s;
}

template <typename T, class Phase>
li::Sums<T> block_sums(int threads, const Phase& phase) {
  li::Sums<T> s;
  for (int rank = 0; rank < threads; ++rank) {
    const li::Sums<T> part = phase(rank);
    s.first += part.first;
    s.second += part.second;
  }
  return s;
}

template <typename T, bool kBias, bool kBeta, bool kZoneout>
void forward_block(const LayerNormStepForwardArgs<T>& a, int64_t b, int threads) {
  const int64_t H = a.hidden, G = 4 * H;
  const T* r = a.r + b * G;
  const T r_mean = block_sum<T>(threads, [&](int k) { return li::row_sum(r, G, k, threads); }) / T(G);
  const T r_rstd = li::rstd_of(
      block_sum<T>(threads, [&](int k) { return li::row_deviation(r, G, r_mean, k, threads); }), G, a.eps);
  const T c_mean =
      block_sum<T>(threads, [&](int k) { return li::forward_gates<T, kBias>(a, b, r_mean, r_rstd, k, threads); }) /
      T(H);
  const T c_rstd = li::rstd_of(
      block_sum<T>(threads, [&](int k) { return li::cell_deviation(a, b, c_mean, k, threads); }), H, a.eps);
  for (int k = 0; k < threads; ++k) li::forward_finish<T, kBeta, kZoneout>(a, b, c_mean, c_rstd, r_rstd, k, threads);
}

template <typename T, bool kGradOut, bool kZoneout>
void backward_block(const LayerNormStepBackwardArgs<T>& a, int64_t b, int threads) {
  const li::Sums<T> cell =
      block_sums<T>(threads, [&](int k) { return li::backward_cell<T, kGradOut, kZoneout>(a, b, k, threads); });
  const li::Sums<T> recurrent =
      block_sums<T>(threads, [&](int k) { return li::backward_gates<T, kGradOut, kZoneout>(a, b, cell, k, threads); });
  for (int k = 0; k < threads; ++k) li::backward_recurrent(a, b, recurrent, k, threads);
}

// The buffers of one step of B rows: inputs random, outputs NaN.
template <typename T>
struct Step {
  int64_t B, H;
  Buf<T> g_ih, g_hh, bias, g_c, beta, x_hat, r, c_prev, h_prev, keep_c, keep_h;
  Buf<T> r_rstd, act, c, c_hat, tanh_n, c_rstd, h;
  Step(int64_t B_, int64_t H_)
      : B(B_), H(H_), g_ih(4 * H, 0.5, 1.5), g_hh(4 * H, 0.5, 1.5), bias(4 * H, -0.5, 0.5), g_c(H, 0.5, 1.5),
        beta(H, -0.5, 0.5), x_hat(B * 4 * H, -2, 2), r(B * 4 * H, -3, 5), c_prev(B * H, -1, 1),
        h_prev(B * H, -1, 1), keep_c(B * H, 0, 1), keep_h(B * H, 0, 1), r_rstd(B), act(B * 4 * H),
        c(B * H), c_hat(B * H), tanh_n(B * H), c_rstd(B), h(B * H) {}

  LayerNormStepForwardArgs<T> args(bool bias_on, bool beta_on, bool zoneout, T eps) {
    LayerNormStepForwardArgs<T> a;
    a.gamma_ih = g_ih.p();
    a.gamma_hh = g_hh.p();
    a.bias = bias_on ? bias.p() : nullptr;
    a.gamma_c = g_c.p();
    a.beta_c = beta_on ? beta.p() : nullptr;
    a.x_hat = x_hat.p();
    a.r = r.p();
    a.r_rstd = r_rstd.p();
    a.c_prev = c_prev.p();
    a.act = act.p();
    a.c = c.p();
    a.c_hat = c_hat.p();
    a.tanh_n = tanh_n.p();
    a.c_rstd = c_rstd.p();
    a.h = h.p();
    if (zoneout) {
      a.h_prev = h_prev.p();
      a.keep = {keep_c.p(), keep_h.p(), H};
    }
    a.batch = B;
    a.hidden = H;
    a.eps = eps;
    return a;
  }
};

template <typename T>
void check_forward(int64_t B, int64_t H, int threads, bool bias, bool beta, bool zoneout) {
  const std::string name = std::string(sizeof(T) == 4 ? "float" : "double") + " forward B=" + std::to_string(B) +
                           " H=" + std::to_string(H) + " threads=" + std::to_string(threads) +
                           (bias ? " bias" : "") + (beta ? " beta" : "") + (zoneout ? " zoneout" : "");
  Step<T> want(B, H);
  Step<T> got = want;
  const T eps = T(1e-5);
  layernorm_step_forward_rows<T>(want.args(bias, beta, zoneout, eps), 0, B);
  const LayerNormStepForwardArgs<T> a = got.args(bias, beta, zoneout, eps);
  for (int64_t b = 0; b < B; ++b) {
    with_flags([&](auto kb, auto kt, auto kz) { forward_block<T, kb, kt, kz>(a, b, threads); }, bias, beta, zoneout);
  }
  expect_close("r_hat", name, got.r, want.r);
  expect_close("r_rstd", name, got.r_rstd, want.r_rstd);
  expect_close("act", name, got.act, want.act);
  expect_close("c", name, got.c, want.c);
  expect_close("c_hat", name, got.c_hat, want.c_hat);
  expect_close("tanh_n", name, got.tanh_n, want.tanh_n);
  expect_close("c_rstd", name, got.c_rstd, want.c_rstd);
  expect_close("h", name, got.h, want.h);
}

template <typename T>
void check_backward(int64_t B, int64_t H, int threads, bool grad_out, bool zoneout) {
  const std::string name = std::string(sizeof(T) == 4 ? "float" : "double") + " backward B=" + std::to_string(B) +
                           " H=" + std::to_string(H) + " threads=" + std::to_string(threads) +
                           (grad_out ? " grad_out" : "") + (zoneout ? " zoneout" : "");
  Step<T> fwd(B, H);
  layernorm_step_forward_rows<T>(fwd.args(true, true, zoneout, T(1e-5)), 0, B);
  Buf<T> go(B * H, -1, 1), gh(B * H, -1, 1), gc(B * H, -1, 1);
  Buf<T> ga(B * 4 * H), gr(B * 4 * H), gn(B * H);
  struct Grads {
    Buf<T> gh, gc, ga, gr, gn;
  };
  Grads want{gh, gc, ga, gr, gn}, got{gh, gc, ga, gr, gn};
  const auto args = [&](Grads& g) {
    LayerNormStepBackwardArgs<T> a;
    a.gamma_hh = fwd.g_hh.p();
    a.gamma_c = fwd.g_c.p();
    a.r_hat = fwd.r.p();
    a.r_rstd = fwd.r_rstd.p();
    a.c_prev = fwd.c_prev.p();
    a.act = fwd.act.p();
    a.c_hat = fwd.c_hat.p();
    a.tanh_n = fwd.tanh_n.p();
    a.c_rstd = fwd.c_rstd.p();
    a.grad_out = grad_out ? go.p() : nullptr;
    a.grad_h = g.gh.p();
    a.grad_c = g.gc.p();
    a.grad_a = g.ga.p();
    a.grad_r = g.gr.p();
    a.grad_n = g.gn.p();
    if (zoneout) a.keep = {fwd.keep_c.p(), fwd.keep_h.p(), H};
    a.batch = B;
    a.hidden = H;
    return a;
  };
  layernorm_step_backward_rows<T>(args(want), 0, B);
  const LayerNormStepBackwardArgs<T> a = args(got);
  for (int64_t b = 0; b < B; ++b) {
    with_flags([&](auto ko, auto kz) { backward_block<T, ko, kz>(a, b, threads); }, grad_out, zoneout);
  }
  if (zoneout) expect_close("grad_h", name, got.gh, want.gh);
  expect_close("grad_c", name, got.gc, want.gc);
  expect_close("grad_a", name, got.ga, want.ga);
  expect_close("grad_r", name, got.gr, want.gr);
  expect_close("grad_n", name, got.gn, want.gn);
}

template <typename T>
void check_rows(int64_t rows, int64_t n, int threads) {
  const std::string name = std::string(sizeof(T) == 4 ? "float" : "double") + " rows=" + std::to_string(rows) +
                           " n=" + std::to_string(n) + " threads=" + std::to_string(threads);
  const T eps = T(1e-5);
  Buf<T> x(rows * n, -3, 5);
  Buf<T> want_x = x, got_x = x, want_rstd(rows), got_rstd(rows);
  layer_norm_rows<T>(want_x.p(), want_rstd.p(), n, eps, 0, rows);
  for (int64_t b = 0; b < rows; ++b) {
    T* row = got_x.p() + b * n;
    const T mean = block_sum<T>(threads, [&](int k) { return li::row_sum(row, n, k, threads); }) / T(n);
    const T rstd =
        li::rstd_of(block_sum<T>(threads, [&](int k) { return li::row_deviation(row, n, mean, k, threads); }), n, eps);
    for (int k = 0; k < threads; ++k) li::row_normalise(row, n, mean, rstd, k, threads);
    got_rstd.v[b] = rstd;
  }
  expect_close("x_hat", name, got_x, want_x);
  expect_close("rstd", name, got_rstd, want_rstd);

  Buf<T> grad(rows * n, -1, 1);
  Buf<T> want_g = grad, got_g = grad;
  layer_norm_backward_rows<T>(want_g.p(), want_x.p(), want_rstd.p(), n, 0, rows);
  for (int64_t b = 0; b < rows; ++b) {
    T* g = got_g.p() + b * n;
    const T* x_hat = want_x.p() + b * n;
    const li::Sums<T> s = block_sums<T>(threads, [&](int k) { return li::row_grad_sums(g, x_hat, n, k, threads); });
    for (int k = 0; k < threads; ++k) li::row_grad_apply(g, x_hat, n, want_rstd.v[b], s, k, threads);
  }
  expect_close("grad", name, got_g, want_g);
}

template <typename T>
void check_all() {
  for (int64_t H : {1, 3, 32, 100, 257}) {
    for (int threads : {1, 32, 96, 256}) {
      for (int flags = 0; flags < 8; ++flags) {
        check_forward<T>(3, H, threads, flags & 1, flags & 2, flags & 4);
      }
      for (int flags = 0; flags < 4; ++flags) check_backward<T>(3, H, threads, flags & 1, flags & 2);
    }
  }
  for (int64_t n : {1, 4, 129, 1000}) {
    for (int threads : {1, 32, 256}) check_rows<T>(3, n, threads);
  }
}

}  // namespace

int main() {
  check_all<float>();
  check_all<double>();
  std::printf("layernorm rows: %d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
