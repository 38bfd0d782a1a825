// Host harness for the CUDA work-item bodies (no GPU, no CUDA, no torch).
//
// Runs forward_item / backward_item from lstm_pointwise_indexing.h as a host
// simulation of the kernels' grid-stride loop, choosing the vector path the
// same way the launcher does, and compares every output with the CPU entry
// points. Covers VEC 1/2/4, tails (H % VEC != 0), misaligned pointers, every
// optional-pointer combination and the documented aliasing, for float and
// double. Buffers carry guard regions and outputs start as NaN, so skipped or
// out-of-bounds items show up as mismatches.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "pipelstm/kernels/flag_dispatch.h"
#include "pipelstm/kernels/lstm_pointwise.h"
#include "pipelstm/kernels/lstm_pointwise_indexing.h"

using namespace pipelstm::kernels;

namespace {

int g_passed = 0;
int g_failed = 0;
std::mt19937_64 g_rng(12345);

constexpr int kGuard = 16;  // elements either side of each buffer
constexpr double kSentinel = 7777.0;

// A buffer whose data starts 64-byte aligned plus `misalign` elements.
template <typename T>
struct Buf {
  std::vector<T> store;
  T* p = nullptr;
  int64_t n = 0;
  Buf(int64_t n_, int misalign) : store(n_ + 2 * kGuard + 64), n(n_) {
    for (auto& x : store) x = T(kSentinel);
    uintptr_t addr = reinterpret_cast<uintptr_t>(store.data() + kGuard);
    addr = (addr + 63) / 64 * 64;
    p = reinterpret_cast<T*>(addr) + misalign;
  }
  void random(double lo, double hi) {
    std::uniform_real_distribution<double> d(lo, hi);
    for (int64_t i = 0; i < n; ++i) p[i] = T(d(g_rng));
  }
  void fill_nan() {
    for (int64_t i = 0; i < n; ++i) p[i] = std::numeric_limits<T>::quiet_NaN();
  }
  void copy_from(const Buf& o) {
    for (int64_t i = 0; i < n; ++i) p[i] = o.p[i];
  }
  bool guards_intact() const {
    for (const T* q = store.data(); q < p; ++q)
      if (*q != T(kSentinel)) return false;
    for (const T* q = p + n; q < store.data() + store.size(); ++q)
      if (*q != T(kSentinel)) return false;
    return true;
  }
};

template <typename T>
struct Tol;
template <>
struct Tol<float> {
  static constexpr double rel = 1e-5, abs = 1e-6;
};
template <>
struct Tol<double> {
  static constexpr double rel = 1e-12, abs = 1e-14;
};

template <typename T>
bool close(const Buf<T>& got, const Buf<T>& want, std::string* why) {
  if (!got.guards_intact()) {
    *why = "guard region overwritten";
    return false;
  }
  for (int64_t i = 0; i < got.n; ++i) {
    const double g = got.p[i], w = want.p[i];
    if (!(std::fabs(g - w) <= Tol<T>::rel * std::fabs(w) + Tol<T>::abs)) {
      *why = "index " + std::to_string(i) + ": got " + std::to_string(g) + ", want " +
             std::to_string(w);
      return false;
    }
  }
  return true;
}

void report(bool ok, const std::string& name, const std::string& why) {
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    std::printf("FAIL %s: %s\n", name.c_str(), why.c_str());
  }
}

// The kernel's launch, simulated: every thread of the capped grid walks its
// grid-stride sequence. A small max_blocks forces several items per thread.
template <typename F>
void run_grid(int64_t items, int64_t max_blocks, F&& item) {
  const int64_t blocks = indexing::grid_blocks(items, max_blocks);
  const int64_t stride = blocks * indexing::kBlockSize;
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t t = 0; t < indexing::kBlockSize; ++t)
      for (int64_t i = b * indexing::kBlockSize + t; i < items; i += stride) item(i);
}

// The launcher's flag dispatch (lstm_pointwise.cu), on the host, for one chosen VEC.
template <typename T, int VEC>
void forward_grid(const PointwiseForwardArgs<T>& a, int64_t max_blocks) {
  auto run = [&](auto fn) { run_grid(indexing::num_items<VEC>(a.batch, a.hidden), max_blocks, fn); };
  if (a.keep.on()) {
    return run([&](int64_t i) { indexing::forward_item<T, VEC, false, false, false, true>(a, i); });
  }
  with_flags(
      [&](auto hid, auto bih, auto bhh) {
        run([&](int64_t i) { indexing::forward_item<T, VEC, hid, bih, bhh>(a, i); });
      },
      a.hidden_gates != nullptr, a.bias_ih != nullptr, a.bias_hh != nullptr);
}

template <typename T, int VEC>
void backward_grid(const PointwiseBackwardArgs<T>& a, int64_t max_blocks) {
  auto run = [&](auto fn) { run_grid(indexing::num_items<VEC>(a.batch, a.hidden), max_blocks, fn); };
  with_flags(
      [&](auto gh, auto go, auto gc, auto zoned) {
        run([&](int64_t i) { indexing::backward_item<T, VEC, gh, go, gc, zoned>(a, i); });
      },
      a.grad_h != nullptr, a.grad_out != nullptr, a.grad_c != nullptr, a.keep.on());
}

template <typename T, int VEC>
void on_grid(const PointwiseForwardArgs<T>& a, int64_t max_blocks) {
  forward_grid<T, VEC>(a, max_blocks);
}

template <typename T, int VEC>
void on_grid(const PointwiseBackwardArgs<T>& a, int64_t max_blocks) {
  backward_grid<T, VEC>(a, max_blocks);
}

// The launcher's choice, simulated: the VEC path where can_vectorize allows
// it, else the scalar one; returns whether the VEC path ran.
template <typename T, int VEC, typename Args>
bool launch(const Args& a, int64_t max_blocks) {
  const bool vec = indexing::can_vectorize<T, VEC>(a);
  if (vec) {
    on_grid<T, VEC>(a, max_blocks);
  } else {
    on_grid<T, 1>(a, max_blocks);
  }
  return vec;
}

// Reports one case: passed if the kernel took the vector path exactly
// where H and the alignment allow it (always, for VEC == 1) and
// outputs_close(&why) holds.
template <typename T, int VEC, typename Close>
void report_case(const char* direction, int64_t B, int64_t H, int misalign, unsigned mask,
                 bool alias, int64_t max_blocks, bool vec, Close outputs_close) {
  const std::string name =
      std::string(direction) + "<" + (sizeof(T) == 4 ? "float" : "double") +
      ",VEC=" + std::to_string(VEC) + "> B=" + std::to_string(B) + " H=" + std::to_string(H) +
      " misalign=" + std::to_string(misalign) + " mask=" + std::to_string(mask) +
      " alias=" + std::to_string(alias) + " max_blocks=" + std::to_string(max_blocks) +
      (vec ? " [vector]" : " [scalar]");
  std::string why;
  const bool want_vec = (VEC == 1) || (H % VEC == 0 && misalign == 0);
  if (vec != want_vec) why = "wrong path choice";
  report(vec == want_vec && outputs_close(&why), name, why);
}

template <typename T, int VEC>
void check_forward(int64_t B, int64_t H, int misalign, unsigned mask, bool alias,
                   int64_t max_blocks) {
  Buf<T> gates(B * 4 * H, misalign), hid(B * 4 * H, misalign), bih(4 * H, misalign),
      bhh(4 * H, misalign), c_prev(B * H, misalign);
  gates.random(-3, 3), hid.random(-3, 3), bih.random(-1, 1), bhh.random(-1, 1);
  c_prev.random(-2, 2);
  Buf<T> act(B * 4 * H, misalign), c(B * H, misalign), h(B * H, misalign);
  Buf<T> ref_act(B * 4 * H, 0), ref_c(B * H, 0), ref_h(B * H, 0);
  act.fill_nan(), c.fill_nan(), h.fill_nan();
  Buf<T> h_prev(B * H, misalign), keep_c(B * H, misalign), keep_h(B * H, misalign);
  h_prev.random(-1, 1), keep_c.random(0, 1), keep_h.random(0, 1);

  PointwiseForwardArgs<T> a;
  a.gates = gates.p;
  a.hidden_gates = (mask & 1) ? hid.p : nullptr;
  a.bias_ih = (mask & 2) ? bih.p : nullptr;
  a.bias_hh = (mask & 4) ? bhh.p : nullptr;
  a.c_prev = c_prev.p;
  a.batch = B, a.hidden = H;
  if (mask & 8) {  // zoneout (16: one row of keep weights for every batch row)
    a.h_prev = h_prev.p;
    a.keep = {keep_c.p, keep_h.p, (mask & 16) ? 0 : H};
  }

  PointwiseForwardArgs<T> ref = a;
  ref.act_gates = ref_act.p, ref.c = ref_c.p, ref.h = ref_h.p;
  pointwise_forward_cpu(ref, 0, B);

  if (alias) {  // act_gates overwrites gates in place
    act.copy_from(gates);
    a.gates = act.p;
  }
  a.act_gates = act.p, a.c = c.p, a.h = h.p;
  const bool vec = launch<T, VEC>(a, max_blocks);
  report_case<T, VEC>("forward", B, H, misalign, mask, alias, max_blocks, vec,
                      [&](std::string* why) {
                        return close(act, ref_act, why) && close(c, ref_c, why) &&
                               close(h, ref_h, why);
                      });
}

// mask: 1 grad_h, 2 grad_c, 4 grad_out (8: one row for every batch row,
// else rows H apart), 16 zoneout (32: one row of keep weights).
template <typename T, int VEC>
void check_backward(int64_t B, int64_t H, int misalign, unsigned mask, bool alias,
                    int64_t max_blocks) {
  Buf<T> grad_h(B * H, misalign), grad_c(B * H, misalign), act(B * 4 * H, misalign),
      c_prev(B * H, misalign), c(B * H, misalign), grad_out(B * H, misalign);
  grad_h.random(-1, 1), grad_c.random(-1, 1), c_prev.random(-2, 2), c.random(-2, 2);
  grad_out.random(-1, 1);
  act.random(0.01, 0.99);
  Buf<T> dg(B * 4 * H, misalign), dcp(B * H, misalign);
  Buf<T> ref_dg(B * 4 * H, 0), ref_dcp(B * H, 0);
  dg.fill_nan(), dcp.fill_nan();
  Buf<T> keep_c(B * H, misalign), keep_h(B * H, misalign), dhp(B * H, misalign), ref_dhp(B * H, 0);
  keep_c.random(0, 1), keep_h.random(0, 1);
  dhp.fill_nan();
  const bool zone = mask & 16;

  PointwiseBackwardArgs<T> a;
  a.grad_h = (mask & 1) ? grad_h.p : nullptr;
  a.grad_c = (mask & 2) ? grad_c.p : nullptr;
  a.grad_out = (mask & 4) ? grad_out.p : nullptr;
  a.grad_out_stride = (mask & 8) ? 0 : H;
  a.act_gates = act.p, a.c_prev = c_prev.p, a.c = c.p;
  a.batch = B, a.hidden = H;
  if (zone) a.keep = {keep_c.p, keep_h.p, (mask & 32) ? 0 : H};

  // The reference gets grad_out already added into grad_h (as one tensor
  // op did before the step took it), not the CPU loop's own grad_out.
  PointwiseBackwardArgs<T> ref = a;
  Buf<T> summed(B * H, 0);
  if (a.grad_out) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < H; ++j)
        summed.p[b * H + j] = (a.grad_h ? a.grad_h[b * H + j] : T(0)) + a.grad_out[b * a.grad_out_stride + j];
    ref.grad_h = summed.p, ref.grad_out = nullptr;
  }
  ref.grad_gates = ref_dg.p, ref.grad_c_prev = ref_dcp.p;
  if (zone) ref.grad_h_prev = ref_dhp.p;
  pointwise_backward_cpu(ref, 0, B);
  if (zone && alias && a.grad_h) {  // grad_h_prev overwrites grad_h in place
    dhp.copy_from(grad_h);
    a.grad_h = dhp.p;
  }
  if (zone) a.grad_h_prev = dhp.p;

  if (alias && a.grad_c) {  // grad_c_prev overwrites grad_c in place
    dcp.copy_from(grad_c);
    a.grad_c = dcp.p;
  }
  a.grad_gates = dg.p, a.grad_c_prev = dcp.p;
  const bool vec = launch<T, VEC>(a, max_blocks);
  report_case<T, VEC>("backward", B, H, misalign, mask, alias, max_blocks, vec,
                      [&](std::string* why) {
                        return close(dg, ref_dg, why) && close(dcp, ref_dcp, why) &&
                               (!zone || close(dhp, ref_dhp, why));
                      });
}

template <typename T, int VEC>
void check_all() {
  const int64_t batches[] = {1, 3, 7};
  const int64_t hiddens[] = {1, 3, 4, 8, 12, 33, 64};
  for (int64_t B : batches)
    for (int64_t H : hiddens)
      for (int misalign : {0, 1})
        for (bool alias : {false, true})
          for (int64_t max_blocks : {indexing::kMaxBlocks, int64_t(1)}) {
            for (unsigned mask : {0u, 1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 24u})
              check_forward<T, VEC>(B, H, misalign, mask, alias, max_blocks);
            for (unsigned mask = 0; mask < 64; ++mask)
              if ((mask & 12) != 8 && (mask & 48) != 32)
                check_backward<T, VEC>(B, H, misalign, mask, alias, max_blocks);
          }
}

// Index decomposition where B * 4H is past 2^31 (no memory needed).
template <int VEC>
void check_large_index() {
  const int64_t B = int64_t(1) << 22, H = 4096 + 4 * VEC;
  const int64_t per_row = H / VEC, items = indexing::num_items<VEC>(B, H);
  bool ok = items == B * per_row && B * 4 * H > (int64_t(1) << 32);
  for (int64_t idx : {int64_t(0), per_row - 1, per_row, items / 2 + 1, items - 1}) {
    const auto it = indexing::item_index<VEC>(idx, H);
    ok = ok && it.row * per_row + it.col / VEC == idx && it.col % VEC == 0 && it.col < H &&
         it.row < B && it.gates == it.row * 4 * H + it.col && it.state == it.row * H + it.col;
  }
  ok = ok && indexing::grid_blocks(items) == indexing::kMaxBlocks;
  report(ok, "large index decomposition VEC=" + std::to_string(VEC), "mismatch");
}

}  // namespace

int main() {
  check_all<float, 1>();
  check_all<float, 2>();
  check_all<float, 4>();
  check_all<double, 1>();
  check_all<double, 2>();
  check_all<double, 4>();
  check_large_index<1>();
  check_large_index<4>();
  check_large_index<8>();
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
