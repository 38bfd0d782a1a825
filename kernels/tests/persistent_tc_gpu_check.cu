// On a GPU, without torch: runs the persistent tensor-core kernels
// (lstm_persistent_tc_cuda.h) in fp16 and bf16 against the CPU references
// of kernels/tests/persistent_tc_reference.h (rounded to 16 bits after every
// step, as the kernels store), checks the "does not fit" answers, and times
// forward and backward at T = 100; on Hopper also the cluster-resident
// forward (lstm_persistent_cluster_cuda.h), checked and timed beside the
// tensor-core forward. Exit status 0 only if every check passes.
//
// Build and run commands: docs/design/cuda.md ("The persistent tensor-core
// kernels"). `--quick` runs only the small checks (for compute-sanitizer).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "persistent_tc_reference.h"
#include "persistent_test_support.h"
#include "pipelstm/kernels/lstm_persistent_cluster_cuda.h"
#include "pipelstm/kernels/lstm_persistent_tc_cuda.h"

using namespace pipelstm::kernels;
using testing::backward_args;
using testing::forward_args;
using testing::GradsIn;

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
};
template <>
struct Type<__nv_bfloat16> {
  static constexpr const char* name = "bf16";
  static constexpr double tol = 2e-2;
};

// v rounded to T and back, by the kernels' own conversions (Storage).
template <typename T>
struct Round {
  using S = indexing::Storage<T>;
  float operator()(float v) const { return S::load(S::store(v)); }
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
  using S = indexing::Storage<T>;
  T* ptr = nullptr;
  int64_t n = 0;
  DeviceBuf(const std::vector<float>& v, int64_t count = -1) {
    n = count < 0 ? static_cast<int64_t>(v.size()) : count;
    CHECK_CUDA(cudaMalloc(&ptr, std::max<int64_t>(n, 1) * sizeof(T)));
    std::vector<T> h(n, S::store(NAN));
    for (int64_t i = 0; i < static_cast<int64_t>(v.size()) && i < n; ++i) h[i] = S::store(v[i]);
    CHECK_CUDA(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  DeviceBuf(const DeviceBuf&) = delete;
  ~DeviceBuf() { cudaFree(ptr); }
  std::vector<float> get() const {
    std::vector<T> h(n);
    CHECK_CUDA(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = S::load(h[i]);
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

// After one direction of a shape: whether the kernel ran (a refusal is a
// failure, reported); if it did, reports its largest error over `outputs`,
// each (kernel's, reference's).
template <typename T>
bool check_outputs(const std::string& what, TcFit fit,
                   std::initializer_list<std::pair<const DeviceBuf<T>*, const std::vector<float>*>>
                       outputs) {
  CHECK_CUDA(cudaDeviceSynchronize());
  if (fit != TcFit::kFits) {
    report(false, what + ": " + tc_fit_message(fit));
    return false;
  }
  double err = 0;
  for (const auto& [got, want] : outputs) err = std::max(err, error(got->get(), *want));
  report(err <= Type<T>::tol, what + " error " + std::to_string(err));
  return true;
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
  const PersistentForwardArgs<float> rf =
      forward_args(xg.data(), w.data(), h0.data(), c0.data(), out.data(), act.data(),
                   cells.data(), steps, B, H, reverse);
  testing::reference_forward(rf, Round<T>());

  DeviceBuf<T> d_xg(xg), d_w(w), d_h0(h0), d_c0(c0), d_out({}, N * H), d_act({}, N * 4 * H),
      d_cells({}, N * H);
  PersistentForwardArgs<T> f = forward_args(d_xg.ptr, d_w.ptr, d_h0.ptr, d_c0.ptr, d_out.ptr,
                                            d_act.ptr, d_cells.ptr, steps, B, H, reverse);
  TcFit fit;
  CHECK_CUDA(tc_persistent_forward_cuda(f, unit_tiles, nullptr, &fit));
  if (!check_outputs<T>(std::string("forward ") + name, fit,
                        {{&d_out, &out}, {&d_act, &act}, {&d_cells, &cells}}))
    return;

  std::vector<float> gg(N * 4 * H), gh0(B * H), gc0(B * H);
  testing::reference_backward(
      backward_args(rf, GradsIn<float>{go.data(), ghn.data(), gcn.data()}, gg.data(),
                    gh0.data(), gc0.data()),
      Round<T>());

  // The backward reads the reference's forward workspace (the same numbers).
  DeviceBuf<T> d_ract(act), d_rcells(cells), d_go(go), d_ghn(ghn), d_gcn(gcn),
      d_gg({}, N * 4 * H), d_gh0({}, B * H), d_gc0({}, B * H);
  f.act_gates = d_ract.ptr;
  f.cells = d_rcells.ptr;
  const PersistentBackwardArgs<T> b = backward_args(
      f, GradsIn<T>{d_go.ptr, d_ghn.ptr, d_gcn.ptr}, d_gg.ptr, d_gh0.ptr, d_gc0.ptr);
  CHECK_CUDA(tc_persistent_backward_cuda(b, 0, nullptr, &fit));
  check_outputs<T>(std::string("backward ") + name, fit,
                   {{&d_gg, &gg}, {&d_gh0, &gh0}, {&d_gc0, &gc0}});
}

// The cluster forward of one shape against the reference (Hopper only:
// elsewhere its refusal is checked instead).
const char* sync_name(cluster::Sync sync) {
  return sync == cluster::Sync::kAsyncStores ? "st.async" : "barrier";
}

template <typename T>
void check_cluster_shape(int64_t steps, int64_t batch, int64_t hidden, int64_t blocks, bool reverse,
                         cluster::Sync sync) {
  const int64_t B = batch, H = hidden, N = steps * B;
  const auto xg = random_vec<T>(N * 4 * H, 0.5f), w = random_vec<T>(4 * H * H, 1.0f / std::sqrt(float(H)));
  const auto h0 = random_vec<T>(B * H, 0.5f), c0 = random_vec<T>(B * H, 0.5f);
  char name[160];
  std::snprintf(name, sizeof(name), "cluster forward (%s) %s T=%ld B=%ld H=%ld blocks=%ld reverse=%d",
                sync_name(sync), Type<T>::name, long(steps), long(B), long(H), long(blocks), int(reverse));
  std::vector<float> out(N * H), act(N * 4 * H), cells(N * H);
  testing::reference_forward(forward_args(xg.data(), w.data(), h0.data(), c0.data(), out.data(), act.data(),
                                          cells.data(), steps, B, H, reverse),
                             Round<T>());
  DeviceBuf<T> d_xg(xg), d_w(w), d_h0(h0), d_c0(c0), d_out({}, N * H), d_act({}, N * 4 * H),
      d_cells({}, N * H);
  const PersistentForwardArgs<T> f = forward_args(d_xg.ptr, d_w.ptr, d_h0.ptr, d_c0.ptr, d_out.ptr, d_act.ptr,
                                                  d_cells.ptr, steps, B, H, reverse);
  TcFit fit;
  CHECK_CUDA(cluster_forward_cuda(f, blocks, sync, nullptr, &fit));
  CHECK_CUDA(cudaGetLastError());
  check_outputs<T>(name, fit, {{&d_out, &out}, {&d_act, &act}, {&d_cells, &cells}});
}

// The cluster backward of one shape against the reference, from the
// reference's forward workspace.
template <typename T>
void check_cluster_backward(int64_t steps, int64_t batch, int64_t hidden, int64_t blocks, bool reverse) {
  const int64_t B = batch, H = hidden, N = steps * B;
  const auto xg = random_vec<T>(N * 4 * H, 0.5f), w = random_vec<T>(4 * H * H, 1.0f / std::sqrt(float(H)));
  const auto h0 = random_vec<T>(B * H, 0.5f), c0 = random_vec<T>(B * H, 0.5f);
  const auto go = random_vec<T>(N * H, 0.5f), ghn = random_vec<T>(B * H, 0.5f), gcn = random_vec<T>(B * H, 0.5f);
  std::vector<float> out(N * H), act(N * 4 * H), cells(N * H), gg(N * 4 * H), gh0(B * H), gc0(B * H);
  const PersistentForwardArgs<float> rf = forward_args(xg.data(), w.data(), h0.data(), c0.data(), out.data(),
                                                       act.data(), cells.data(), steps, B, H, reverse);
  testing::reference_forward(rf, Round<T>());
  testing::reference_backward(
      backward_args(rf, GradsIn<float>{go.data(), ghn.data(), gcn.data()}, gg.data(), gh0.data(), gc0.data()),
      Round<T>());
  DeviceBuf<T> d_xg(xg), d_w(w), d_h0(h0), d_c0(c0), d_out(out), d_act(act), d_cells(cells), d_go(go),
      d_ghn(ghn), d_gcn(gcn), d_gg({}, N * 4 * H), d_gh0({}, B * H), d_gc0({}, B * H);
  const PersistentForwardArgs<T> f = forward_args(d_xg.ptr, d_w.ptr, d_h0.ptr, d_c0.ptr, d_out.ptr, d_act.ptr,
                                                  d_cells.ptr, steps, B, H, reverse);
  const PersistentBackwardArgs<T> b =
      backward_args(f, GradsIn<T>{d_go.ptr, d_ghn.ptr, d_gcn.ptr}, d_gg.ptr, d_gh0.ptr, d_gc0.ptr);
  char name[160];
  std::snprintf(name, sizeof(name), "cluster backward %s T=%ld B=%ld H=%ld blocks=%ld reverse=%d", Type<T>::name,
                long(steps), long(B), long(H), long(blocks), int(reverse));
  TcFit fit;
  CHECK_CUDA(cluster_backward_cuda(b, blocks, nullptr, &fit));
  CHECK_CUDA(cudaGetLastError());
  check_outputs<T>(name, fit, {{&d_gg, &gg}, {&d_gh0, &gh0}, {&d_gc0, &gc0}});
}

// Median time (ms) of a call `run(&fit)` (after 3 warm-up calls), or NaN
// where it did not fit.
template <typename Run>
double median_ms(Run run) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<float> runs;
  for (int rep = 0; rep < 23; ++rep) {
    TcFit fit;
    CHECK_CUDA(cudaEventRecord(start));
    CHECK_CUDA(run(&fit));
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    if (fit != TcFit::kFits) break;
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    if (rep >= 3) runs.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (runs.empty()) return NAN;
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

// The cluster forward beside the tensor-core forward: microseconds a step.
template <typename T>
void time_cluster(int64_t steps, int64_t batch, int64_t hidden) {
  const int64_t B = batch, H = hidden, N = steps * B;
  DeviceBuf<T> xg(random_vec<T>(N * 4 * H, 0.5f)), w(random_vec<T>(4 * H * H, 0.03f)),
      h0(random_vec<T>(B * H, 0.5f)), c0(random_vec<T>(B * H, 0.5f)), out({}, N * H),
      act({}, N * 4 * H), cells({}, N * H);
  const PersistentForwardArgs<T> f = forward_args(xg.ptr, w.ptr, h0.ptr, c0.ptr, out.ptr, act.ptr,
                                                  cells.ptr, steps, B, H, false);
  const double grid_ms = median_ms([&](TcFit* fit) { return tc_persistent_forward_cuda(f, 0, nullptr, fit); });
  std::printf("time %s T=%ld B=%ld H=%ld, us a forward step: tensor-core %.2f", Type<T>::name, long(steps),
              long(B), long(H), 1e3 * grid_ms / steps);
  for (cluster::Sync sync : {cluster::Sync::kClusterBarrier, cluster::Sync::kAsyncStores}) {
    for (int64_t blocks : {0, 4, 8, 16}) {
      const double ms =
          median_ms([&](TcFit* fit) { return cluster_forward_cuda(f, blocks, sync, nullptr, fit); });
      std::printf(", %s(%ld) %.2f", sync_name(sync), long(blocks), 1e3 * ms / steps);
    }
  }
  // The backward over the forward just timed, its output's values standing in for grad_output.
  DeviceBuf<T> gg({}, N * 4 * H), gh0({}, B * H), gc0({}, B * H);
  const PersistentBackwardArgs<T> bw =
      backward_args(f, GradsIn<T>{out.ptr, nullptr, nullptr}, gg.ptr, gh0.ptr, gc0.ptr);
  const double grid_bw = median_ms([&](TcFit* fit) { return tc_persistent_backward_cuda(bw, 0, nullptr, fit); });
  std::printf("; a backward step: tensor-core %.2f", 1e3 * grid_bw / steps);
  for (int64_t blocks : {0, 4, 8, 16}) {
    const double ms = median_ms([&](TcFit* fit) { return cluster_backward_cuda(bw, blocks, nullptr, fit); });
    std::printf(", cluster(%ld) %.2f", long(blocks), 1e3 * ms / steps);
  }
  std::printf("\n");
}

// A shape the kernel must refuse, with the reason expected, and nothing written.
template <typename T>
void check_refused(int64_t batch, int64_t hidden, int64_t unit_tiles, TcFit expected) {
  const int64_t steps = 2, B = batch, H = hidden;
  DeviceBuf<T> xg({}, steps * B * 4 * H), w({}, 4 * H * H), h0({}, B * H), c0({}, B * H),
      out({}, steps * B * H), act({}, steps * B * 4 * H), cells({}, steps * B * H);
  const PersistentForwardArgs<T> f = forward_args(xg.ptr, w.ptr, h0.ptr, c0.ptr, out.ptr, act.ptr,
                                                  cells.ptr, steps, B, H, false);
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
  const PersistentForwardArgs<T> f = forward_args(xg.ptr, w.ptr, h0.ptr, c0.ptr, out.ptr, act.ptr,
                                                  cells.ptr, steps, B, H, false);
  const PersistentBackwardArgs<T> b =
      backward_args(f, GradsIn<T>{go.ptr, nullptr, nullptr}, gg.ptr, gh0.ptr, gc0.ptr);
  const double ms[2] = {median_ms([&](TcFit* fit) { return tc_persistent_forward_cuda(f, 0, nullptr, fit); }),
                        median_ms([&](TcFit* fit) { return tc_persistent_backward_cuda(b, 0, nullptr, fit); })};
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
}

// Below compute capability 9.0 the cluster forward refuses, launching nothing.
template <typename T>
void check_refused_cluster() {
  DeviceBuf<T> xg({}, 2 * 4 * 8 * 4), w({}, 4 * 8 * 8), h0({}, 4 * 8), c0({}, 4 * 8), out({}, 2 * 4 * 8),
      act({}, 2 * 4 * 4 * 8), cells({}, 2 * 4 * 8);
  const PersistentForwardArgs<T> f =
      forward_args(xg.ptr, w.ptr, h0.ptr, c0.ptr, out.ptr, act.ptr, cells.ptr, 2, 4, 8, false);
  TcFit fit;
  CHECK_CUDA(cluster_forward_cuda(f, 0, cluster::Sync::kClusterBarrier, nullptr, &fit));
  report(fit == TcFit::kArchitecture, std::string(Type<T>::name) + " cluster forward refuses below sm_90: " +
                                          tc_fit_message(fit));
}

template <typename T>
void run_all(bool quick) {
  // {T, B, H, unit tiles (0: default)}: B and H tails, K slices, several
  // N-tiles, several unit tiles per block (explicit and by default).
  const int64_t small[][4] = {{3, 1, 1, 0}, {5, 3, 7, 0}, {4, 5, 100, 0}, {3, 9, 264, 0},
                              {3, 17, 40, 2}, {2, 64, 48, 0}};
  const int64_t large[][4] = {{20, 8, 512, 0}, {4, 32, 1024, 0}, {3, 64, 1024, 0},
                              {3, 2, 600, 2}, {2, 8, 1536, 0}};
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

// The cluster forward: tails, K slices, several N-tiles, each cluster size
// and the default; then its timings. Skipped below compute capability 9.0,
// where it must refuse.
template <typename T>
void run_cluster(bool quick, int major) {
  if (major < 9) {
    check_refused_cluster<T>();
    return;
  }
  const int64_t shapes[][4] = {{3, 1, 1, 2}, {5, 3, 7, 2}, {4, 5, 100, 0}, {3, 9, 264, 4},
                               {3, 17, 40, 3}, {2, 64, 48, 0}, {6, 8, 256, 0}, {6, 8, 512, 0},
                               {4, 8, 512, 16}, {3, 33, 256, 8}};
  for (cluster::Sync sync : {cluster::Sync::kClusterBarrier, cluster::Sync::kAsyncStores})
    for (const auto& s : shapes)
      for (bool reverse : {false, true}) check_cluster_shape<T>(s[0], s[1], s[2], s[3], reverse, sync);
  // The backward's blocks hold more (two grad_gates copies): B = 9,
  // H = 264 needs 8 of them where the forward fits 4.
  const int64_t backward_shapes[][4] = {{3, 1, 1, 2}, {5, 3, 7, 2}, {4, 5, 100, 0}, {3, 9, 264, 8},
                                        {3, 17, 40, 3}, {2, 64, 48, 0}, {6, 8, 256, 0}, {6, 8, 512, 0},
                                        {4, 8, 512, 16}, {3, 33, 256, 8}};
  for (const auto& s : backward_shapes)
    for (bool reverse : {false, true}) check_cluster_backward<T>(s[0], s[1], s[2], s[3], reverse);
  cluster::BackwardClusterPlan too_small;
  TcFit fit;
  CHECK_CUDA(cluster_backward_plan<T>(9, 264, 4, 0, &too_small, &fit));
  report(fit == TcFit::kSharedMemory,
         std::string(Type<T>::name) + " cluster backward B=9 H=264 refuses 4 blocks: " + tc_fit_message(fit));
  if (quick) return;
  for (int64_t H : {256, 512})
    for (int64_t B : {1, 8, 32}) time_cluster<T>(100, B, H);
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
  run_cluster<__half>(quick, prop.major);
  run_cluster<__nv_bfloat16>(quick, prop.major);
  std::printf("%s: %d failed\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
