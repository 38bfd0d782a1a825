#include "fma_peak.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "phase_team.h"
#include "step_kernels.h"

namespace pipelstm {
namespace cpu {

double fma_loop_flop(int64_t iterations) {
  return static_cast<double>(iterations) * kernels::cpu::kFmaChains * step_kernels().vec * 2;
}

double fma_loop_seconds(int threads, int64_t iterations) {
  TORCH_CHECK(threads >= 1, "fma_loop_seconds: threads must be at least 1, got ", threads);
  TORCH_CHECK(iterations >= 1, "fma_loop_seconds: iterations must be at least 1, got ", iterations);
  const auto loop = step_kernels().fma_loop;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::atomic<float> sink{0.0f};  // keeps the loops' results alive
  std::vector<std::thread> team;
  team.reserve(threads);
  for (int t = 0; t < threads; ++t) {
    team.emplace_back([&] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) cpu_relax();
      // a < 1: every chain settles at b / (1 - a) = 1, no overflow however long it runs
      sink.store(loop(iterations, 0.9999999f, 1e-7f), std::memory_order_relaxed);
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (auto& t : team) t.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

float fma_loop_sum(int64_t iterations, float a, float b) {
  TORCH_CHECK(iterations >= 0, "fma_loop_sum: iterations must be at least 0, got ", iterations);
  return step_kernels().fma_loop(iterations, a, b);
}

}  // namespace cpu
}  // namespace pipelstm
