// On a GPU, without torch: runs the persistent tensor-core kernels
// (lstm_persistent_tc_cuda.h) in fp16 and bf16 against the CPU references
// of kernels/tests/persistent_tc_reference.h (rounded to 16 bits after every
// step, as the kernels store), checks the "does not fit" answers, and times
// forward and backward at T = 100. Exit status 0 only if every check passes.
//
// Build and run commands: docs/cuda.md ("The persistent tensor-core
// kernels"). `--quick` runs only the small checks (for compute-sanitizer).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "persistent_tc_reference.h"
#include "pipelstm/kernels/lstm_persistent_tc_cuda.h"

using namespace pipelstm::kernels;

namespace {

#define CHECK_CUDA(expr)                                                              \
  do {                                                                                \
    const cudaError_t err_ = (expr);                                                  \
    if (err_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,              \
                   cudaGetErrorString(err_));                                         \
      std::exit(2);                                                                   \
    }                                                                                 \
  } while (0)

template <typename T>
struct Type;
template <>
struct Type<__half> {
  static constexpr const char* name = "fp16";
  static constexpr double tol = 1e-2;
  static __half to(float v) { return __float2half_rn(v); }
  static float from(__half v) { return __half2float(v); }
};
template <>
struct Type<__nv_bfloat16> {
  static constexpr const char* name = "bf16";
  static constexpr double tol = 2e-2;
  static __nv_bfloat16 to(float v) { return __float2bfloat16_rn(v); }
  static float from(__nv_bfloat16 v) { return __bfloat162float(v); }
};

template <typename T>
struct Round {
  float operator()(float v) const { return Type<T>::from(Type<T>::to(v)); }
};

std::mt19937 rng(0);

// Random values, already rounded to T (both sides see the same numbers).
template <typename T>
std::vector<float> random_vec(int64_t n, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = Round<T>()(normal(rng));
  return v;
}

// A device copy of a float vector in T (or n elements of NaN where empty).
template <typename T>
struct DeviceBuf {
  T* ptr = nullptr;
  int64_t n = 0;
  DeviceBuf(const std::vector<float>& v, int64_t count = -1) {
    n = count < 0 ? static_cast<int64_t>(v.size()) : count;
    CHECK_CUDA(cudaMalloc(&ptr, std::max<int64_t>(n, 1) * sizeof(T)));
    std::vector<T> h(n, Type<T>::to(NAN));
    for (int64_t i = 0; i < static_cast<int64_t>(v.size()) && i < n; ++i) h[i] = Type<T>::to(v[i]);
    CHECK_CUDA(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  DeviceBuf(const DeviceBuf&) = delete;
  ~DeviceBuf() { cudaFree(ptr); }
  std::vector<float> get() const {
    std::vector<T> h(n);
    CHECK_CUDA(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = Type<T>::from(h[i]);
    return v;
  }
};

// max |got - want| / max |want|; NaN in got (a value never written) is inf.
double error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    diff = std::max(diff, std::fabs(double(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(double(want[i])));
  }
  return diff / scale;
}

int failures = 0;

void report(bool ok, const std::string& what) {
  if (!ok) ++failures;
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
}

// Forward and backward of one shape against the references.
template <typename T>
void check_shape(int64_t steps, int64_t batch, int64_t hidden, int64_t unit_tiles, bool reverse) {
  const int64_t B = batch, H = hidden, N = steps * B;
  const float ws = 1.0f / std::sqrt(float(H));
  const auto xg = random_vec<T>(N * 4 * H, 0.5f), w = random_vec<T>(4 * H * H, ws);
  const auto h0 = random_vec<T>(B * H, 0.5f), c0 = random_vec<T>(B * H, 0.5f);
  const auto go = random_vec<T>(N * H, 0.5f), ghn = random_vec<T>(B * H, 0.5f),
             gcn = random_vec<T>(B * H, 0.5f);
  char name[160];
  std::snprintf(name, sizeof(name), "%s T=%ld B=%ld H=%ld unit_tiles=%ld reverse=%d",
                Type<T>::name, long(steps), long(B), long(H), long(unit_tiles), int(reverse));

  std::vector<float> out(N * H), act(N * 4 * H), cells(N * H);
  PersistentForwardArgs<float> rf;
  rf.input_gates = xg.data();
  rf.w_hh = w.data();
  rf.h0 = h0.data();
  rf.c0 = c0.data();
  rf.output = out.data();
  rf.act_gates = act.data();
  rf.cells = cells.data();
  rf.steps = steps;
  rf.batch = B;
  rf.hidden = H;
  rf.reverse = reverse;
  testing::reference_forward(rf, Round<T>());

  DeviceBuf<T> d_xg(xg), d_w(w), d_h0(h0), d_c0(c0), d_out({}, N * H), d_act({}, N * 4 * H),
      d_cells({}, N * H);
  PersistentForwardArgs<T> f;
  f.input_gates = d_xg.ptr;
  f.w_hh = d_w.ptr;
  f.h0 = d_h0.ptr;
  f.c0 = d_c0.ptr;
  f.output = d_out.ptr;
  f.act_gates = d_act.ptr;
  f.cells = d_cells.ptr;
  f.steps = steps;
  f.batch = B;
  f.hidden = H;
  f.reverse = reverse;
  TcFit fit;
  CHECK_CUDA(tc_persistent_forward_cuda(f, unit_tiles, nullptr, &fit));
  CHECK_CUDA(cudaDeviceSynchronize());
  if (fit != TcFit::kFits) {
    report(false, std::string("forward ") + name + ": " + tc_fit_message(fit));
    return;
  }
  const double ef = std::max({error(d_out.get(), out), error(d_act.get(), act),
                              error(d_cells.get(), cells)});
  report(ef <= Type<T>::tol, std::string("forward ") + name + " error " + std::to_string(ef));

  std::vector<float> gg(N * 4 * H), gh0(B * H), gc0(B * H);
  PersistentBackwardArgs<float> rb;
  rb.grad_output = go.data();
  rb.grad_h_n = ghn.data();
  rb.grad_c_n = gcn.data();
  rb.w_hh = w.data();
  rb.c0 = c0.data();
  rb.act_gates = act.data();
  rb.cells = cells.data();
  rb.grad_gates = gg.data();
  rb.grad_h0 = gh0.data();
  rb.grad_c0 = gc0.data();
  rb.steps = steps;
  rb.batch = B;
  rb.hidden = H;
  rb.reverse = reverse;
  testing::reference_backward(rb, Round<T>());

  // The backward reads the reference's forward workspace (the same numbers).
  DeviceBuf<T> d_ract(act), d_rcells(cells), d_go(go), d_ghn(ghn), d_gcn(gcn),
      d_gg({}, N * 4 * H), d_gh0({}, B * H), d_gc0({}, B * H);
  PersistentBackwardArgs<T> b;
  b.grad_output = d_go.ptr;
  b.grad_h_n = d_ghn.ptr;
  b.grad_c_n = d_gcn.ptr;
  b.w_hh = d_w.ptr;
  b.c0 = d_c0.ptr;
  b.act_gates = d_ract.ptr;
  b.cells = d_rcells.ptr;
  b.grad_gates = d_gg.ptr;
  b.grad_h0 = d_gh0.ptr;
  b.grad_c0 = d_gc0.ptr;
  b.steps = steps;
  b.batch = B;
  b.hidden = H;
  b.reverse = reverse;
  CHECK_CUDA(tc_persistent_backward_cuda(b, 0, nullptr, &fit));
  CHECK_CUDA(cudaDeviceSynchronize());
  if (fit != TcFit::kFits) {
    report(false, std::string("backward ") + name + ": " + tc_fit_message(fit));
    return;
  }
  const double eb = std::max({error(d_gg.get(), gg), error(d_gh0.get(), gh0),
                              error(d_gc0.get(), gc0)});
  report(eb <= Type<T>::tol, std::string("backward ") + name + " error " + std::to_string(eb));
}

// A shape the kernel must refuse, with the reason expected, and nothing written.
template <typename T>
void check_refused(int64_t batch, int64_t hidden, int64_t unit_tiles, TcFit expected) {
  const int64_t steps = 2, B = batch, H = hidden;
  DeviceBuf<T> xg({}, steps * B * 4 * H), w({}, 4 * H * H), h0({}, B * H), c0({}, B * H),
      out({}, steps * B * H), act({}, steps * B * 4 * H), cells({}, steps * B * H);
  PersistentForwardArgs<T> f;
  f.input_gates = xg.ptr;
  f.w_hh = w.ptr;
  f.h0 = h0.ptr;
  f.c0 = c0.ptr;
  f.output = out.ptr;
  f.act_gates = act.ptr;
  f.cells = cells.ptr;
  f.steps = steps;
  f.batch = B;
  f.hidden = H;
  TcFit fit;
  CHECK_CUDA(tc_persistent_forward_cuda(f, unit_tiles, nullptr, &fit));
  CHECK_CUDA(cudaDeviceSynchronize());
  const auto o = out.get();
  const bool untouched = std::all_of(o.begin(), o.end(), [](float v) { return std::isnan(v); });
  char name[160];
  std::snprintf(name, sizeof(name), "%s refuses B=%ld H=%ld unit_tiles=%ld: %s", Type<T>::name,
                long(B), long(H), long(unit_tiles), tc_fit_message(fit));
  report(fit == expected && untouched, name);
}

// Median time of forward and backward (ms) at T steps.
template <typename T>
void time_shape(int64_t steps, int64_t batch, int64_t hidden) {
  const int64_t B = batch, H = hidden, N = steps * B;
  DeviceBuf<T> xg(random_vec<T>(N * 4 * H, 0.5f)), w(random_vec<T>(4 * H * H, 0.03f)),
      h0(random_vec<T>(B * H, 0.5f)), c0(random_vec<T>(B * H, 0.5f)), out({}, N * H),
      act({}, N * 4 * H), cells({}, N * H), go(random_vec<T>(N * H, 0.5f)), gg({}, N * 4 * H),
      gh0({}, B * H), gc0({}, B * H);
  PersistentForwardArgs<T> f;
  f.input_gates = xg.ptr;
  f.w_hh = w.ptr;
  f.h0 = h0.ptr;
  f.c0 = c0.ptr;
  f.output = out.ptr;
  f.act_gates = act.ptr;
  f.cells = cells.ptr;
  f.steps = steps;
  f.batch = B;
  f.hidden = H;
  PersistentBackwardArgs<T> b;
  b.grad_output = go.ptr;
  b.w_hh = w.ptr;
  b.c0 = c0.ptr;
  b.act_gates = act.ptr;
  b.cells = cells.ptr;
  b.grad_gates = gg.ptr;
  b.grad_h0 = gh0.ptr;
  b.grad_c0 = gc0.ptr;
  b.steps = steps;
  b.batch = B;
  b.hidden = H;
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  double ms[2] = {NAN, NAN};
  for (int dir = 0; dir < 2; ++dir) {
    std::vector<float> runs;
    for (int rep = 0; rep < 23; ++rep) {
      TcFit fit;
      CHECK_CUDA(cudaEventRecord(start));
      CHECK_CUDA(dir == 0 ? tc_persistent_forward_cuda(f, 0, nullptr, &fit)
                          : tc_persistent_backward_cuda(b, 0, nullptr, &fit));
      CHECK_CUDA(cudaEventRecord(stop));
      CHECK_CUDA(cudaEventSynchronize(stop));
      if (fit != TcFit::kFits) break;
      float t = 0;
      CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
      if (rep >= 3) runs.push_back(t);
    }
    if (!runs.empty()) {
      std::sort(runs.begin(), runs.end());
      ms[dir] = runs[runs.size() / 2];
    }
  }
  tc::ForwardPlan fp;
  tc::BackwardPlan bp;
  TcFit fit;
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(tc_persistent_forward_plan<T>(B, H, 0, device, &fp, &fit));
  CHECK_CUDA(tc_persistent_backward_plan<T>(B, H, 0, device, &bp, &fit));
  std::printf("time %s T=%ld B=%ld H=%ld: forward %.3f ms (%ld blocks, %ld slices), backward %.3f ms "
              "(%ld blocks, %ld slices)\n",
              Type<T>::name, long(steps), long(B), long(H), ms[0], long(fp.blocks),
              long(fp.slices), ms[1], long(bp.blocks), long(bp.slices));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

template <typename T>
void run_all(bool quick) {
  // {T, B, H, unit tiles (0: default)}: B and H tails, K slices, several
  // N-tiles, several unit tiles per block (explicit and by default).
  const int64_t small[][4] = {{3, 1, 1, 0}, {5, 3, 7, 0}, {4, 5, 100, 0}, {3, 9, 264, 0},
                              {3, 17, 40, 2}, {2, 64, 48, 0}};
  const int64_t large[][4] = {{20, 8, 512, 0}, {4, 32, 1024, 0}, {3, 64, 1024, 0},
                              {3, 2, 1000, 4}, {2, 8, 1536, 0}};
  for (const auto& s : small)
    for (bool reverse : {false, true}) check_shape<T>(s[0], s[1], s[2], s[3], reverse);
  if (quick) return;
  for (const auto& s : large) check_shape<T>(s[0], s[1], s[2], s[3], false);
  check_refused<T>(65, 64, 0, TcFit::kBatchTooLarge);
  check_refused<T>(4, 4096, 0, TcFit::kSharedMemory);
  check_refused<T>(4, 2048, 1, TcFit::kCoResidency);
  for (int64_t H : {256, 512, 1024})
    for (int64_t B : {1, 8, 32, 64}) time_shape<T>(100, B, H);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, %zu bytes shared memory per block (opt-in)\n", prop.name,
              prop.multiProcessorCount, prop.sharedMemPerBlockOptin);
  run_all<__half>(quick);
  run_all<__nv_bfloat16>(quick);
  std::printf("%s: %d failed\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
